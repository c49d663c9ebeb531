//! A VMM's view of the device: one virtio-blk queue over an image file, served on an
//! `AioContext` with the thread pool engine, and driven from another thread the way a
//! guest's vCPU drives it (descriptors in guest memory, a kick, an interrupt, the used ring).
//! Here the guest side is aio-virtio-blk's in-process driver; a VMM hands the queue its own
//! guest memory and eventfds instead.
//!
//! ```sh
//! cargo run -p aio-virtio-blk --example embed_queue -- /var/tmp/disk.img
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aio::{AioContext, Backends, Choice, EngineKind, EngineOptions, MonitorKind, Pairing};
use aio_virtio_blk::device::{BlockDevice, DiskOptions};
use aio_virtio_blk::driver::{DriverRequest, Finished, SplitRingDriver};
use aio_virtio_blk::queue::VirtioBlkQueue;
use aio_virtio_blk::spec;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "/var/tmp/aio-virtio-blk-example.img".into());
    std::fs::File::create(&path)?.set_len(16 << 20)?;
    let options = DiskOptions {
        serial: "example".into(),
        ..DiskOptions::default()
    };
    let device = Arc::new(BlockDevice::open(path.as_ref(), options)?);

    // The device side: a context and an engine (any pair the `aio` crate builds).
    let backends = Backends::build(
        Pairing::Apart(Choice::Named(MonitorKind::Poll)),
        Choice::Named(EngineKind::Pool),
        &EngineOptions::default(),
    )?;
    let ctx = AioContext::new(backends.monitor.built)?;
    let engine = ctx.attach_engine(backends.engine.built, |_, _| {})?;

    // The guest side: a 256-entry ring with 64 request slots of 4 KiB.
    let (mut driver, side) = SplitRingDriver::new(256, 64, 4096)?;
    let queue = VirtioBlkQueue::start(
        &ctx,
        engine,
        device,
        side.queue,
        side.memory,
        side.kick,
        Some(side.call),
    )?;

    let done = Arc::new(AtomicBool::new(false));
    let (finished, wake) = (done.clone(), ctx.notify_handle());
    let guest = std::thread::spawn(move || -> Result<String, String> {
        let result = guest(&mut driver);
        finished.store(true, Ordering::SeqCst);
        wake.notify();
        result
    });
    while !done.load(Ordering::SeqCst) {
        ctx.poll(true);
    }
    let next_avail = queue.stop(&ctx);
    println!("{}", guest.join().expect("the guest thread")?);
    println!("the device took {next_avail} requests");
    std::fs::remove_file(&path)?;
    Ok(())
}

/// The guest: writes a sector, reads it back, asks for the serial.
fn guest(driver: &mut SplitRingDriver) -> Result<String, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let pattern = [0x5au8; 4096];
    driver.write_data(0, &pattern).map_err(|x| e(&x))?;
    run(
        driver,
        0,
        DriverRequest {
            kind: spec::T_OUT,
            sector: 8,
            len: 4096,
        },
    )?;
    run(
        driver,
        1,
        DriverRequest {
            kind: spec::T_IN,
            sector: 8,
            len: 4096,
        },
    )?;
    let mut back = [0u8; 4096];
    driver.read_data(1, &mut back).map_err(|x| e(&x))?;
    if back != pattern {
        return Err("read back other bytes than written".into());
    }
    run(
        driver,
        2,
        DriverRequest {
            kind: spec::T_GET_ID,
            sector: 0,
            len: 20,
        },
    )?;
    let mut id = [0u8; 20];
    driver.read_data(2, &mut id).map_err(|x| e(&x))?;
    let serial = String::from_utf8_lossy(&id)
        .trim_end_matches('\0')
        .to_string();
    Ok(format!(
        "wrote and read back 4 KiB at sector 8; the serial is '{serial}'"
    ))
}

/// Posts one request, kicks, and waits for its completion.
fn run(driver: &mut SplitRingDriver, slot: u16, request: DriverRequest) -> Result<(), String> {
    driver.post(slot, request).map_err(|e| e.to_string())?;
    driver.notify().map_err(|e| e.to_string())?;
    let mut used: Vec<Finished> = Vec::new();
    while used.is_empty() {
        driver
            .wait_interrupt(Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        driver.take_used(&mut used).map_err(|e| e.to_string())?;
    }
    match used[0].status {
        spec::S_OK => Ok(()),
        status => Err(format!("request {request:?}: status {status}")),
    }
}
