//! The peers, each in its own idiomatic form: its runtime on the calling thread, its file type,
//! its buffers, and one spawned task per worker that loops over reads.
//!
//! tokio-uring and monoio take any owned buffer; O_DIRECT needs one aligned to the device's
//! logical block, so each task owns a `Vec<u8>` of two blocks and reads into the aligned block
//! inside it (the runtimes' own `slice` views: no `unsafe`, no copy). glommio allocates its
//! DMA buffers itself (`read_at_aligned`). tokio's `spawn_blocking` moves an aligned buffer to
//! a blocking thread and back, as a `pread` caller would.

use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::rc::Rc;
use std::sync::Arc;

use aio_core::engine::AlignedBuf;

use super::{open_direct, Job, Worker};

/// Submission queue entries for the io_uring runtimes (each default: 256 in tokio-uring,
/// 1024 in monoio; 256 covers any `--qd` up to 256 either way).
const ENTRIES: u32 = 256;

/// A `Vec<u8>` with room for one `bs` block aligned to `align`, and where that block starts.
fn aligned_vec(bs: usize, align: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; bs + align];
    let pad = v.as_ptr().align_offset(align);
    (v, pad)
}

/// Alignment of the buffers handed to the io_uring runtimes (covers 512 and 4096 byte
/// logical blocks).
const ALIGN: usize = 4096;

/// tokio-uring: `tokio_uring::start`, `fs::File::read_at`, `tokio_uring::spawn` per worker.
pub fn tokio_uring(job: &Job) -> io::Result<Vec<Worker>> {
    let bs = job.bs;
    tokio_uring::builder().entries(ENTRIES).start(async {
        let file = tokio_uring::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&job.path)
            .await?;
        let file = Rc::new(file);
        let tasks: Vec<_> = job
            .workers()
            .into_iter()
            .map(|w| {
                use tokio_uring::buf::BoundedBuf;
                let file = file.clone();
                let (buf, pad) = aligned_vec(bs, ALIGN);
                tokio_uring::spawn(w.read_until_done(buf, move |buf, offset| {
                    let file = file.clone();
                    async move {
                        let (r, slice) = file.read_at(buf.slice(pad..pad + bs), offset).await;
                        Ok((r, slice.into_inner()))
                    }
                }))
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.map_err(io::Error::other)??);
        }
        if let Ok(file) = Rc::try_unwrap(file) {
            file.close().await?;
        }
        Ok(out)
    })
}

/// monoio with its io_uring driver: `RuntimeBuilder::<IoUringDriver>`, `fs::File::read_at`,
/// `monoio::spawn` per worker.
pub fn monoio(job: &Job) -> io::Result<Vec<Worker>> {
    let bs = job.bs;
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .with_entries(ENTRIES)
        .build()?;
    rt.block_on(async {
        let file = monoio::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&job.path)
            .await?;
        let file = Rc::new(file);
        let tasks: Vec<_> = job
            .workers()
            .into_iter()
            .map(|w| {
                use monoio::buf::IoBufMut;
                let file = file.clone();
                let (buf, pad) = aligned_vec(bs, ALIGN);
                monoio::spawn(w.read_until_done(buf, move |buf, offset| {
                    let file = file.clone();
                    async move {
                        let (r, slice) = file.read_at(buf.slice_mut(pad..pad + bs), offset).await;
                        Ok((r, slice.into_inner()))
                    }
                }))
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await?);
        }
        if let Ok(file) = Rc::try_unwrap(file) {
            file.close().await?;
        }
        Ok(out)
    })
}

/// glommio: a `LocalExecutor` made on this thread, `DmaFile::read_at_aligned` (opened with
/// O_DIRECT),
/// `glommio::spawn_local` per worker.
pub fn glommio(job: &Job) -> io::Result<Vec<Worker>> {
    let bs = job.bs;
    let glommio_err = |e: glommio::GlommioError<()>| io::Error::other(e.to_string());
    let ex = glommio::LocalExecutorBuilder::default()
        .ring_depth(ENTRIES as usize)
        .make()
        .map_err(glommio_err)?;
    ex.run(async {
        // `DmaFile::open` leaves O_DIRECT off where `statfs` says tmpfs, which a device node
        // on devtmpfs (`/dev/loopN`) also says: ask for it, as every other variant does.
        let file = glommio::io::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .dma_open(&job.path)
            .await
            .map_err(glommio_err)?;
        let file = Rc::new(file);
        let tasks: Vec<_> = job
            .workers()
            .into_iter()
            .map(|w| {
                let file = file.clone();
                // glommio allocates each read's DMA buffer itself: there is none to hand back.
                glommio::spawn_local(w.read_until_done((), move |(), offset| {
                    let file = file.clone();
                    async move {
                        let r = file.read_at_aligned(offset, bs).await;
                        let r = r
                            .map(|buf| buf.len())
                            .map_err(|e| io::Error::other(e.to_string()));
                        Ok((r, ()))
                    }
                }))
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await?);
        }
        if let Ok(file) = Rc::try_unwrap(file) {
            file.close().await.map_err(glommio_err)?;
        }
        Ok(out)
    })
}

/// tokio's current-thread runtime, one `tokio::spawn`ed task per worker, each read a
/// `spawn_blocking` closure that `pread`s into a buffer it moves there and back.
pub fn tokio_spawn_blocking(job: &Job) -> io::Result<Vec<Worker>> {
    let bs = job.bs;
    let rt = tokio::runtime::Builder::new_current_thread().build()?;
    let file = Arc::new(open_direct(&job.path)?);
    rt.block_on(async {
        let tasks: Vec<_> = job
            .workers()
            .into_iter()
            .map(|w| {
                let file = file.clone();
                tokio::spawn(
                    w.read_until_done(AlignedBuf::new(bs), move |mut buf, offset| {
                        let file = file.clone();
                        async move {
                            let read = move || (file.read_at(&mut buf, offset), buf);
                            tokio::task::spawn_blocking(read)
                                .await
                                .map_err(io::Error::other)
                        }
                    }),
                )
            })
            .collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await.map_err(io::Error::other)??);
        }
        Ok(out)
    })
}
