//! Serving one queue of a device on this thread while a guest thread drives it through the
//! in-process split-ring driver (shared by the integration tests).

use std::sync::Arc;

use aio::poll::PollLoop;
use aio::{AioContext, IoEngine};
use aio_test_support::loop_thread::Stop;
use aio_virtio_blk::device::BlockDevice;
use aio_virtio_blk::driver::SplitRingDriver;
use aio_virtio_blk::queue::VirtioBlkQueue;

/// The ring the guest sets up: its size, the requests it keeps in flight (slots) and each
/// slot's data buffer in bytes.
#[derive(Clone, Copy)]
pub struct Ring {
    pub size: u16,
    pub slots: u16,
    pub data_bytes: u32,
}

/// Serves one queue of `device` with `engine` on this thread while `guest` drives it from
/// another; returns the guest's result and the queue's next avail index at stop.
pub fn serve<E: IoEngine + 'static, T: Send + 'static>(
    engine: E,
    device: Arc<BlockDevice>,
    ring: Ring,
    guest: impl FnOnce(&mut SplitRingDriver) -> T + Send + 'static,
) -> (T, u16) {
    let ctx = AioContext::new(PollLoop::new()).unwrap();
    let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
    let (mut driver, side) = SplitRingDriver::new(ring.size, ring.slots, ring.data_bytes).unwrap();
    let queue = VirtioBlkQueue::start(
        &ctx,
        engine,
        device,
        side.queue,
        side.memory,
        side.kick,
        Some(side.call),
    )
    .unwrap();
    // The guest's thread stops the loop when it ends, even by a panic (a failed assertion),
    // so the test reports the failure instead of hanging.
    let (stop, stopped) = Stop::new(&ctx);
    let guest = std::thread::spawn(move || {
        let _stop = stop;
        guest(&mut driver)
    });
    stopped.run(&ctx);
    let next = queue.stop(&ctx);
    (guest.join().unwrap(), next)
}
