//! The worker threads: waiting for jobs, the idle accounting, and the blocking syscalls.
//!
//! This module owns what runs on a pool thread. It touches the shared state only under its
//! lock, counts a thread as idle exactly while it waits on the condition variable (QEMU's
//! thread-pool idle-thread accounting), and owns a job's buffers while it runs it, so nothing
//! else can see them meanwhile.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, BorrowedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, PoisonError};
use std::time::Instant;

use aio_core::backend::{Step, Transfer};
use aio_core::engine::AlignedBuf;
use aio_core::engine::{Op, Request};
use nix::errno::Errno;
use nix::sys::uio::{preadv, pwritev};
use nix::unistd::{fdatasync, fsync};

use crate::{Job, Shared, State};

/// Starts one worker. Called with the state locked; counts it as arriving until it reaches
/// the queue.
pub(crate) fn spawn(shared: &Arc<Shared>, st: &mut MutexGuard<'_, State>) -> io::Result<()> {
    st.handles.retain(|h| !h.is_finished());
    let s = shared.clone();
    // Counted before the thread exists, so that it cannot reach `arrived` first.
    st.reserve_thread();
    match std::thread::Builder::new()
        .name("aio-pool".into())
        .spawn(move || run(&s))
    {
        Ok(handle) => {
            st.handles.push(handle);
            st.thread_started();
            Ok(())
        }
        Err(e) => {
            st.unreserve_thread();
            Err(e)
        }
    }
}

fn run(shared: &Shared) {
    let mut st = shared.lock();
    st.arrived();
    // Whether this idle period already spun (spin once, then sleep).
    let mut spun = false;
    loop {
        if let Some(job) = st.take_job() {
            spun = false;
            shared.jobs_len.store(st.jobs.len(), Ordering::Release);
            drop(st);
            let completion = execute(job);
            // This thread is busy until it waits again: a request submitted meanwhile sees no
            // idle thread and may spawn one (QEMU's idle-thread accounting). On VMs that extra
            // thread is also what keeps a QD1 round trip from paying a cross-vCPU wake-up every
            // time.
            shared.finish(completion);
            st = shared.lock();
            st.job_done();
            shared.progress.notify_all();
            continue;
        }
        if st.must_exit() {
            break;
        }
        let spin = st.config.spin;
        if !spin.is_zero() && !spun {
            // Busy-wait a little for the next job before paying for a sleep and a wake-up.
            // A spinning thread is not idle (it is not waiting on the condvar), but it will
            // take the next job, so submitters count it and do not spawn for that job.
            st.spinning += 1;
            drop(st);
            let deadline = Instant::now() + spin;
            while shared.jobs_len.load(Ordering::Acquire) == 0 && Instant::now() < deadline {
                std::hint::spin_loop();
            }
            st = shared.lock();
            st.spinning -= 1;
            spun = true;
            // Re-check jobs and shutdown at the top: a notify_all sent while we spun did
            // not reach us.
            continue;
        }
        // Idle only while waiting: a thread that has work is never counted idle.
        st.idle_begin();
        let timeout = st.config.idle_timeout;
        let (guard, result) = shared
            .work
            .wait_timeout(st, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        st = guard;
        if st.idle_end(result.timed_out()) {
            break;
        }
    }
    st.retire();
    shared.progress.notify_all();
}

fn execute(job: Job) -> aio_core::Completion {
    match job {
        Job::Io(mut request) => {
            let result = run_io(&mut request);
            request.complete(result)
        }
        Job::Work { token, run } => {
            let result = catch_unwind(AssertUnwindSafe(run))
                .unwrap_or_else(|_| Err(io::Error::other("offloaded work panicked")));
            aio_core::Completion {
                token,
                result,
                buf: Default::default(),
            }
        }
    }
}

/// Retries a syscall on `EINTR` / `EAGAIN`.
fn retry(mut f: impl FnMut() -> nix::Result<usize>) -> io::Result<usize> {
    loop {
        match f() {
            Ok(n) => return Ok(n),
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs one request to the end: the whole transfer (short reads and writes continue with
/// the remainder), or the sync.
fn run_io(request: &mut Request) -> io::Result<usize> {
    let fd = request.file.as_fd();
    let op = &mut request.op;
    match op {
        Op::Fsync => retry(|| fsync(fd).map(|()| 0)),
        Op::Fdatasync => retry(|| fdatasync(fd).map(|()| 0)),
        _ => {
            let is_read = op.is_read();
            let mut transfer = Transfer::default();
            loop {
                let offset = transfer.offset(op) as libc::off_t;
                let done = transfer.done;
                let n = retry(|| vectored(fd, is_read, op.buffers_mut(), done, offset))?;
                match transfer.advance(op, n)? {
                    Step::Done(total) => return Ok(total),
                    Step::Again => continue,
                }
            }
        }
    }
}

/// One `preadv` / `pwritev` at `offset` over the buffers' bytes after the first `done`.
///
/// The `IoSlice`s borrow the buffers (nothing is copied) and have `iovec`'s layout (std
/// guarantees it on Unix), so nix passes the slice to the syscall as it is. A single buffer
/// (`Request::read` / `write`) goes as a one-element array on the stack, with no allocation;
/// several are gathered in a vector, one allocation per attempt (a short transfer is the only
/// reason for a second one).
fn vectored(
    fd: BorrowedFd<'_>,
    is_read: bool,
    bufs: &mut [AlignedBuf],
    done: usize,
    offset: libc::off_t,
) -> nix::Result<usize> {
    match (bufs, is_read) {
        ([buf], true) => preadv(fd, &mut [IoSliceMut::new(&mut buf[done..])], offset),
        ([buf], false) => pwritev(fd, &[IoSlice::new(&buf[done..])], offset),
        (bufs, true) => {
            let mut iov: Vec<IoSliceMut<'_>> = remaining(bufs, done).map(IoSliceMut::new).collect();
            preadv(fd, &mut iov, offset)
        }
        (bufs, false) => {
            let iov: Vec<IoSlice<'_>> = remaining(bufs, done).map(|b| IoSlice::new(b)).collect();
            pwritev(fd, &iov, offset)
        }
    }
}

/// The parts of `bufs` after their first `skip` bytes, in order.
fn remaining(bufs: &mut [AlignedBuf], mut skip: usize) -> impl Iterator<Item = &mut [u8]> {
    bufs.iter_mut().filter_map(move |buf| {
        let len = buf.len();
        if skip >= len {
            skip -= len;
            return None;
        }
        Some(&mut buf[std::mem::take(&mut skip)..])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(bufs: &mut [AlignedBuf], skip: usize) -> Vec<usize> {
        remaining(bufs, skip).map(|b| b.len()).collect()
    }

    #[test]
    fn remaining_skips_the_bytes_done() {
        let mut bufs = vec![
            AlignedBuf::new(512),
            AlignedBuf::new(1024),
            AlignedBuf::new(512),
        ];
        assert_eq!(lens(&mut bufs, 0), [512, 1024, 512]);
        assert_eq!(lens(&mut bufs, 100), [412, 1024, 512]);
        assert_eq!(lens(&mut bufs, 512), [1024, 512]);
        assert_eq!(lens(&mut bufs, 1600), [448]);
        assert_eq!(lens(&mut bufs, 2048), [] as [usize; 0]);
        // The parts are the buffers' own memory, not copies.
        let second = bufs[1].as_ptr();
        let part = remaining(&mut bufs, 612).next().unwrap().as_ptr();
        assert_eq!(part, second.wrapping_add(100));
    }

    #[test]
    fn a_transfer_continues_after_the_bytes_done() {
        let path = std::env::temp_dir().join(format!("aio-pool-vectored-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        let data: Vec<u8> = (0..4 * 512).map(|i| (i % 251) as u8).collect();
        let mut bufs: Vec<AlignedBuf> = data.chunks(512).map(AlignedBuf::from_slice).collect();
        // Several buffers at offset 0, 700 bytes already written: the rest lands at 700.
        let n = vectored(file.as_fd(), false, &mut bufs, 700, 700).unwrap();
        assert_eq!(n, data.len() - 700);
        // One buffer at offset 800, 100 bytes already read: the rest (from 900) fills its tail.
        let mut one = [AlignedBuf::new(1000)];
        let n = vectored(file.as_fd(), true, &mut one, 100, 900).unwrap();
        assert_eq!(n, 900);
        assert_eq!(&one[0][100..], &data[900..1800]);
        assert!(one[0][..100].iter().all(|&b| b == 0));
    }
}
