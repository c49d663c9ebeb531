//! The scsi-disk scaling test from the QEMU epoll discussion (1..256 disks on one IOThread) in
//! miniature: many attached "disks" (doorbell notifiers) of which one is busy. With epoll a
//! wakeup costs the same whether 1 or 1024 doorbells are registered.
//!
//! ```text
//! cargo run --release -p aio-backend-epoll --example idle_disks -- 1024
//! ```

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_core::Notifier;
use aio_loop::{AioContext, FdHandler};

fn main() {
    let disks: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("disk count"))
        .unwrap_or(256);
    let ctx = AioContext::new(EpollLoop::new().expect("epoll")).expect("context");
    let doorbells: Vec<Rc<Notifier>> = (0..disks)
        .map(|_| Rc::new(Notifier::new().expect("notifier")))
        .collect();
    let served = Rc::new(Cell::new(0u64));
    for d in &doorbells {
        let (s, d2) = (served.clone(), d.clone());
        ctx.set_fd_handler(
            d,
            FdHandler::new().on_read(move |_| {
                if d2.test_and_clear() {
                    s.set(s.get() + 1);
                }
            }),
        )
        .expect("register doorbell");
    }
    let busy = &doorbells[disks / 2];
    const RINGS: u64 = 100_000;
    let start = Instant::now();
    for _ in 0..RINGS {
        busy.notify().unwrap();
        ctx.poll(true);
    }
    let per_ring = start.elapsed() / RINGS as u32;
    assert_eq!(served.get(), RINGS);
    println!("{disks} doorbells registered, one busy: {per_ring:?} per ring + dispatch");
    println!("{:?}", ctx.counters());
}
