//! The command set of a virtual disk on io_uring: a write from guest memory with FUA, a read
//! straight back into guest memory, a discard and a write-zeroes, each with its own completion
//! callback. The "guest RAM" is an anonymous mmap, as a VMM's would be.
//!
//! ```text
//! cargo run --release -p aio-backend-uring --example virtual_disk
//! ```
//! It works on a disk image it creates (and removes) in the system temp dir.

use std::cell::Cell;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::rc::Rc;

use aio_backend_poll::PollLoop;
use aio_backend_uring::UringEngine;
use aio_core::engine::{IoFile, LentMemory, Request, RwFlags, WithFallback};
use aio_loop::AioContext;
use aio_pool::ThreadPool;

const MIB: usize = 1 << 20;

fn main() -> std::io::Result<()> {
    let image = tempfile::NamedTempFile::new()?;
    image.as_file().set_len(16 * MIB as u64)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(image.path())?;
    let disk = IoFile::from(f);

    // Guest RAM: 2 MiB of anonymous shared memory.
    // SAFETY: a fresh anonymous mapping; no existing memory is affected.
    let ram = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * MIB,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ram == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ram = ram.cast::<u8>();
    // SAFETY: the first MiB of the mapping, which nothing else uses yet.
    unsafe { std::ptr::write_bytes(ram, 0xab, MIB) };

    // io_uring for data and file discards; a block device's discard (an ioctl) would go to
    // the pool. Each request below has its own callback, so the engine-wide one sees nothing.
    let ctx = AioContext::new(PollLoop::new())?;
    let engine = WithFallback::new(
        UringEngine::new(Default::default())?,
        ThreadPool::new(Default::default())?,
    );
    let engine = ctx.attach_engine(engine, |_, _| {})?;
    let done = Rc::new(Cell::new(false));

    // SAFETY: the first MiB of the mapping stays mapped until the end of main, after the loop
    // has delivered every completion, and nothing writes it meanwhile.
    let first_mib = unsafe { LentMemory::new([(ram, MIB)], None) };
    // SAFETY: the second MiB likewise, and nothing reads it until the read below completes.
    let second_mib = unsafe { LentMemory::new([(ram.wrapping_add(MIB), MIB)], None) };
    let write = Request::write_guest(&disk, 0, first_mib, 1).with_flags(RwFlags::FUA);
    let (read, d) = (Request::read_guest(&disk, 0, second_mib, 2), done.clone());
    engine
        .submit_with(write, move |_, engine, c| {
            println!("FUA write from guest RAM: {:?}", c.result);
            // The completion submits the next request itself.
            engine
                .submit_with(read, move |_, _, c| {
                    println!("read into guest RAM:      {:?}", c.result);
                    d.set(true);
                })
                .expect("read");
        })
        .expect("write");
    while !done.get() {
        ctx.poll(true);
    }
    // SAFETY: the read has completed; nothing writes the mapping any more.
    let second = unsafe { std::slice::from_raw_parts(ram.add(MIB), MIB) };
    assert!(
        second.iter().all(|&b| b == 0xab),
        "the read brought the data back"
    );

    let finished = Rc::new(Cell::new(0));
    let discard = Request::discard(&disk, 0, 8 * MIB as u64, 3);
    let zeroes = Request::write_zeroes(&disk, 8 * MIB as u64, MIB as u64, true, 4);
    for (name, request) in [
        ("discard of 8 MiB:", discard),
        ("write-zeroes of 1 MiB:", zeroes),
    ] {
        let f = finished.clone();
        engine
            .submit_with(request, move |_, _, c| {
                println!("{name:<25} {:?}", c.result);
                f.set(f.get() + 1);
            })
            .expect("range op");
    }
    while finished.get() < 2 {
        ctx.poll(true);
    }
    let blocks = image.as_file().metadata()?.blocks();
    println!("image: {} MiB, {} KiB allocated", 16, blocks / 2);
    drop(engine.detach(&ctx).map_err(|(e, _)| e)?);
    // SAFETY: every request is complete and the engine is gone: nothing uses the mapping.
    unsafe { libc::munmap(ram.cast(), 2 * MIB) };
    Ok(())
}
