//! The log's bit arithmetic on a real shared mapping: pages and their bits, writes that
//! straddle pages and bytes, empty writes, the log's end, an offset into its file, and bits
//! the frontend set left alone.

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::*;

/// A memfd of `size` bytes, zeroed.
fn memfd(size: u64) -> File {
    // SAFETY: a NUL-terminated name and flags; the fd is checked, then owned by the `File`.
    let file = unsafe {
        let fd = libc::memfd_create(c"aio-vhost-user-blk-log-test".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        <File as std::os::fd::FromRawFd>::from_raw_fd(fd)
    };
    file.set_len(size).unwrap();
    file
}

/// The bytes of `file` from `offset`, as the frontend reads them.
fn bytes(file: &File, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    file.read_exact_at(&mut out, offset).unwrap();
    out
}

/// The pages whose bits are set in `log`.
fn pages(log: &[u8]) -> Vec<u64> {
    (0..log.len() as u64 * 8)
        .filter(|p| log[(p / 8) as usize] & (1 << (p % 8)) != 0)
        .collect()
}

fn log_of(bytes_: u64) -> (File, DirtyLog) {
    let file = memfd(bytes_);
    let log = DirtyLog::map(&file, 0, bytes_).unwrap();
    (file, log)
}

#[test]
fn page_range_covers_the_first_to_the_last_byte() {
    assert_eq!(page_range(0, 0), None);
    assert_eq!(page_range(4095, 0), None);
    assert_eq!(page_range(0, 1), Some((0, 0)));
    assert_eq!(page_range(0, 4096), Some((0, 0)));
    assert_eq!(page_range(0, 4097), Some((0, 1)));
    assert_eq!(page_range(4095, 1), Some((0, 0)));
    assert_eq!(page_range(4095, 2), Some((0, 1)));
    assert_eq!(page_range(4096, 1), Some((1, 1)));
    assert_eq!(page_range(0x1800, 0x1000), Some((1, 2)));
    assert_eq!(
        page_range(u64::MAX, 10),
        Some((u64::MAX / 4096, u64::MAX / 4096))
    );
}

#[test]
fn a_write_marks_the_pages_it_touches_and_no_other() {
    let (file, log) = log_of(8);
    log.mark(4095, 1);
    assert_eq!(pages(&bytes(&file, 0, 8)), [0]);
    log.mark(4096, 1);
    assert_eq!(pages(&bytes(&file, 0, 8)), [0, 1]);
    // Straddling pages 3 and 4 (one byte each side of the boundary).
    log.mark(4 * 4096 - 1, 2);
    assert_eq!(pages(&bytes(&file, 0, 8)), [0, 1, 3, 4]);
    // Empty writes mark nothing, wherever they are.
    log.mark(10 * 4096, 0);
    log.mark(0, 0);
    assert_eq!(pages(&bytes(&file, 0, 8)), [0, 1, 3, 4]);
    // A buffer of one page not aligned to one: two pages.
    log.mark(0x7800, 0x1000);
    assert_eq!(pages(&bytes(&file, 0, 8)), [0, 1, 3, 4, 7, 8]);
    assert_eq!(bytes(&file, 0, 3), [0b1001_1011, 0b0000_0001, 0]);
    assert_eq!(log.missed(), 0);
}

#[test]
fn a_long_write_sets_whole_bytes_and_the_partial_ends() {
    let (file, log) = log_of(8);
    // Pages 6 to 25: bits 6-7 of byte 0, bytes 1 and 2, bits 0-1 of byte 3.
    log.mark(6 * 4096 + 100, 19 * 4096);
    assert_eq!(
        bytes(&file, 0, 5),
        [0b1100_0000, 0xff, 0xff, 0b0000_0011, 0]
    );
    assert_eq!(pages(&bytes(&file, 0, 8)), (6..=25).collect::<Vec<_>>());
}

#[test]
fn bits_already_set_stay_set() {
    let (file, log) = log_of(4);
    file.write_all_at(&[0b0101_0000, 0x80], 0).unwrap();
    log.mark(0, 1);
    log.mark(9 * 4096, 1);
    assert_eq!(bytes(&file, 0, 4), [0b0101_0001, 0b1000_0010, 0, 0]);
}

#[test]
fn pages_past_the_end_are_left_out_and_counted() {
    // Two bytes: pages 0 to 15.
    let (file, log) = log_of(2);
    log.mark(16 * 4096, 1);
    assert_eq!(bytes(&file, 0, 2), [0, 0]);
    assert_eq!(log.missed(), 1);
    // Pages 15 to 17: 15 marked, the rest left out.
    log.mark(15 * 4096, 3 * 4096);
    assert_eq!(bytes(&file, 0, 2), [0, 0x80]);
    assert_eq!(log.missed(), 2);
    log.mark(u64::MAX - 10, 100);
    assert_eq!(log.missed(), 3);
}

#[test]
fn a_log_at_an_offset_lands_there_in_the_file() {
    let file = memfd(3 * 4096);
    // Not page-aligned: the mapping starts at the page before.
    let log = DirtyLog::map(&file, 4096 + 100, 16).unwrap();
    assert_eq!(log.len(), 16);
    log.mark(0, 1);
    log.mark(127 * 4096, 1);
    let all = bytes(&file, 0, 3 * 4096);
    let set: Vec<usize> = (0..all.len()).filter(|&i| all[i] != 0).collect();
    assert_eq!(set, [4096 + 100, 4096 + 115]);
    assert_eq!(all[4096 + 100], 1);
    assert_eq!(all[4096 + 115], 0x80);
}

#[test]
fn a_log_outside_its_file_or_empty_is_refused() {
    let file = memfd(4096);
    assert!(matches!(
        DirtyLog::map(&file, 0, 4097),
        Err(LogError::BadSize { size: 4097, .. })
    ));
    assert!(matches!(
        DirtyLog::map(&file, 4000, 100),
        Err(LogError::BadSize { .. })
    ));
    assert!(matches!(
        DirtyLog::map(&file, 0, 0),
        Err(LogError::BadSize { .. })
    ));
    assert!(matches!(
        DirtyLog::map(&file, u64::MAX, 2),
        Err(LogError::BadSize { .. })
    ));
    assert!(DirtyLog::map(&file, 4000, 96).is_ok());
}

#[test]
fn threads_marking_pages_of_the_same_bytes_lose_none() {
    let (file, log) = log_of(64);
    let log = Arc::new(log);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let log = log.clone();
            // Thread t marks every page p with p % 8 == t, 1000 times over: all eight share
            // every byte.
            std::thread::spawn(move || {
                for _ in 0..1000 {
                    for p in (t..512).step_by(8) {
                        log.mark(p * 4096, 1);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(bytes(&file, 0, 64), vec![0xff; 64]);
}
