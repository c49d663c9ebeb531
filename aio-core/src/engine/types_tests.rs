//! Unit tests of the small contracts of the types every engine shares: a buffer's alignment,
//! equality and the live-buffer count; what a completion's buffers hand back; lent memory's
//! segments; an op's emptiness and flag sets; and the vectored and guest requests' checks
//! (segment counts, buffers that break `O_DIRECT`'s alignment).

use super::*;

#[test]
fn a_buffer_has_its_alignment_equality_by_content_and_counts_while_it_lives() {
    let b = AlignedBuf::with_alignment(512, 65536).unwrap();
    assert_eq!(b.alignment(), 65536);
    assert_eq!(AlignedBuf::from_slice(b"ab"), AlignedBuf::from_slice(b"ab"));
    assert_ne!(AlignedBuf::from_slice(b"ab"), AlignedBuf::from_slice(b"ac"));
    let before = crate::kit::live_buffers();
    let c = AlignedBuf::new(1);
    assert_eq!(crate::kit::live_buffers(), before + 1);
    drop(c);
    assert_eq!(crate::kit::live_buffers(), before);
}

/// Two segments of `mem` (100 bytes at 0, 300 at 200).
fn two_segments(mem: &mut [u8]) -> LentMemory {
    assert!(mem.len() >= 500);
    let base = mem.as_mut_ptr();
    // SAFETY: both segments lie inside `mem`, which each test keeps alive and untouched while
    // the iovecs exist.
    unsafe { LentMemory::new([(base, 100), (base.wrapping_add(200), 300)], None) }
}

#[test]
fn a_completions_buffers_hand_back_what_the_request_owned() {
    let one = IoBuffers::One(AlignedBuf::from_slice(b"x"));
    assert_eq!(one.first().map(|b| &b[..]), Some(&b"x"[..]));
    assert_eq!(one.into_vec().len(), 1);
    let many = IoBuffers::Many(vec![AlignedBuf::new(1), AlignedBuf::new(2)]);
    assert_eq!(many.first().map(|b| b.len()), Some(1));
    assert_eq!(many.into_vec().len(), 2);
    let mut mem = vec![0u8; 512];
    let guest = IoBuffers::Guest(two_segments(&mut mem));
    assert!(guest.first().is_none(), "caller memory is no owned buffer");
    let g = guest.into_guest().expect("the iovecs handed back");
    assert_eq!(g.len(), 400);
    assert!(IoBuffers::None.into_guest().is_none());
}

#[test]
fn lent_memory_is_its_segments() {
    let mut mem = vec![0u8; 512];
    let base = mem.as_mut_ptr() as usize;
    let g = two_segments(&mut mem);
    let segments: Vec<(usize, usize)> = g
        .as_iovecs()
        .iter()
        .map(|v| (v.iov_base as usize - base, v.iov_len))
        .collect();
    assert_eq!(segments, [(0, 100), (200, 300)]);
    assert!(!g.is_empty());
    // SAFETY: no segment, no memory.
    let empty = unsafe { LentMemory::new([], None) };
    assert!(empty.is_empty());
    let text = format!("{g:?}");
    assert!(
        text.contains("LentMemory") && text.contains("400"),
        "{text}"
    );
}

#[test]
fn ops_know_their_emptiness_and_flags_combine() {
    let null = IoFile::from(std::fs::File::open("/dev/null").unwrap());
    assert!(Request::fsync(&null, 1).op.is_empty());
    assert!(!Request::read(&null, 0, AlignedBuf::new(512), 1)
        .op
        .is_empty());
    assert_eq!(RwFlags::FUA | RwFlags::FUA, RwFlags::FUA);
    let both = RwFlags::FUA | RwFlags::NOWAIT;
    assert!(both.contains(RwFlags::FUA) && both.contains(RwFlags::NOWAIT));
}

#[test]
fn guest_requests_count_their_segments_and_iov_max_is_allowed() {
    let null = IoFile::from(std::fs::File::open("/dev/null").unwrap());
    let mut mem = vec![0u8; IOV_MAX + 1];
    let base = mem.as_mut_ptr();
    let segments = |n: usize| {
        // SAFETY: `n` one-byte segments inside `mem`, alive and untouched while the request
        // exists (it is only validated).
        unsafe { LentMemory::new((0..n).map(|i| (base.wrapping_add(i), 1)), None) }
    };
    assert!(Request::read_guest(&null, 0, segments(IOV_MAX), 1)
        .validate()
        .is_ok());
    assert!(matches!(
        Request::read_guest(&null, 0, segments(IOV_MAX + 1), 1).validate(),
        Err(RequestError::TooManyBuffers { count }) if count == IOV_MAX + 1
    ));
    let bufs = (0..IOV_MAX).map(|_| AlignedBuf::new(1)).collect();
    assert!(Request::readv(&null, 0, bufs, 1).validate().is_ok());
}

#[test]
fn a_request_may_end_at_the_largest_file_offset() {
    let null = IoFile::from(std::fs::File::open("/dev/null").unwrap());
    let last = i64::MAX as u64 - 1;
    assert!(Request::write(&null, last, AlignedBuf::new(1), 1)
        .validate()
        .is_ok());
    assert!(matches!(
        Request::write(&null, last, AlignedBuf::new(2), 1).validate(),
        Err(RequestError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn a_vectored_request_on_an_o_direct_file_checks_every_buffer() {
    let tmp = aio_conformance::engine::TempFile::with_len(8192, 0);
    let file = open(tmp.path(), libc::O_DIRECT).expect("O_DIRECT in the system temp dir");
    let align = file.direct_io_alignment().expect("direct");
    // The second buffer's length breaks the offset alignment.
    let bufs = vec![
        AlignedBuf::new(align.offset),
        AlignedBuf::new(align.offset + 1),
    ];
    let e = Request::readv(&file, 0, bufs, 1).validate().unwrap_err();
    let want = (align.offset + 1) as u64;
    assert!(
        matches!(e, RequestError::Misaligned { what: "segment length", value, .. } if value == want),
        "{e}"
    );
}

/// `path` opened read-write with `flags`. (The suite's `TempFile::open` gives the suite's own
/// `IoFile`: in these unit tests that is another build of this crate.)
pub(crate) fn open(path: &std::path::Path, flags: i32) -> std::io::Result<IoFile> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)?;
    Ok(IoFile::from(f))
}
