//! The hybrid monitor's switching: at the threshold, back below half of it, refusal of an fd by
//! epoll, and readiness carried across a switch.

use std::os::fd::AsFd;

use aio::Hybrid;
use aio::HybridSide;
use aio_backend_epoll::EpollLoop;
use aio_backend_poll::PollLoop;
use aio_conformance::Pipe;
use aio_core::{Event, EventLoop, Interest, Token};

fn hybrid(threshold: usize) -> Hybrid<PollLoop, EpollLoop> {
    Hybrid::with_threshold(PollLoop::new(), EpollLoop::new().unwrap(), threshold)
}

#[test]
fn switches_up_at_the_threshold_and_down_below_half_without_losing_readiness() {
    aio_conformance::raise_fd_limit();
    let mut h = hybrid(8);
    let pipes: Vec<Pipe> = (0..8).map(|_| Pipe::new()).collect();
    pipes[0].poke();
    for (i, p) in pipes.iter().take(7).enumerate() {
        h.register(p.read.as_fd(), Token(i as u64), Interest::READABLE)
            .unwrap();
    }
    assert_eq!(
        (h.side(), h.describe().as_str()),
        (HybridSide::Small, "hybrid(poll)")
    );
    h.register(pipes[7].read.as_fd(), Token(7), Interest::READABLE)
        .unwrap();
    assert_eq!(h.side(), HybridSide::Large);
    assert_eq!(h.describe(), "hybrid(epoll)");
    let mut events: Vec<Event> = Vec::new();
    h.wait(Some(std::time::Duration::ZERO), &mut events)
        .unwrap();
    assert_eq!(
        events.len(),
        1,
        "the fd ready before the switch is reported after it"
    );
    assert_eq!(events[0].token, Token(0));
    // 8 -> 4 registered: still large (hysteresis); 3: back to small.
    for i in 0..4 {
        h.deregister(pipes[7 - i].read.as_fd()).unwrap();
    }
    assert_eq!(h.side(), HybridSide::Large);
    h.deregister(pipes[3].read.as_fd()).unwrap();
    assert_eq!(h.side(), HybridSide::Small);
    assert_eq!(h.switches(), 2);
    events.clear();
    h.wait(Some(std::time::Duration::ZERO), &mut events)
        .unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(h.registered(), 3);
}

#[test]
fn a_regular_file_keeps_it_on_poll_until_removed() {
    let mut h = hybrid(2);
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let pipes: Vec<Pipe> = (0..3).map(|_| Pipe::new()).collect();
    h.register(file.as_fd(), Token(100), Interest::READABLE)
        .unwrap();
    h.register(pipes[0].read.as_fd(), Token(0), Interest::READABLE)
        .unwrap();
    assert_eq!(h.side(), HybridSide::Small, "epoll refuses regular files");
    assert_eq!(h.failed_upgrades(), 1);
    h.register(pipes[1].read.as_fd(), Token(1), Interest::READABLE)
        .unwrap();
    assert_eq!(
        h.failed_upgrades(),
        1,
        "no retry while the refused fd stays"
    );
    h.deregister(file.as_fd()).unwrap();
    assert_eq!(
        h.side(),
        HybridSide::Large,
        "upgrade once the refused fd is gone"
    );
    // On the large side a regular file sends it back to the small one.
    h.register(file.as_fd(), Token(100), Interest::READABLE)
        .unwrap();
    assert_eq!(h.side(), HybridSide::Small);
    assert_eq!(h.registered(), 3);
}

#[test]
fn duplicate_and_unknown_fds_are_errors() {
    let mut h = hybrid(64);
    let p = Pipe::new();
    let fd = p.read.as_fd();
    h.register(fd, Token(1), Interest::READABLE).unwrap();
    let e = h.register(fd, Token(2), Interest::READABLE).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    let e = h
        .modify(p.write.as_fd(), Token(3), Interest::WRITABLE)
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    let e = h.deregister(p.write.as_fd()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
}
