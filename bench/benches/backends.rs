//! The backends side by side, in one criterion run:
//!
//! * `notifier`: `notify()` + `test_and_clear()` for eventfd and pipe;
//! * `bottom_half`: schedule -> run in one `poll(false)`;
//! * `iteration/<N>`: one loop iteration with N registered idle fds and one active fd
//!   (write a byte, `poll(true)`, the handler reads it) for poll, epoll, hybrid and uring, next to
//!   `bare-epoll`: the same write + `epoll_wait` + read with no loop around it;
//! * `round_trip`: one 4 KiB O_DIRECT read submitted and completed through an `AioContext`
//!   (QD1, polling off) for each engine (pool, linux-aio, uring, and uring on the loop's own
//!   ring), next to `pread`: the raw syscall on the same file; then the same on the fast
//!   device (`loop/...`: a loop device with direct I/O over tmpfs, set up when run as root,
//!   `skipped:` otherwise), with polling off and at QEMU's IOThread default (`.../poll`),
//!   where the device answers in 10-20 µs and the loop's own cost shows;
//! * `registrations`: a batch of 32 buffered 4 KiB reads from the page cache (completed inline,
//!   so the batch costs CPU only) through the io_uring engine alone, `plain`, with registered
//!   files (`files`), registered buffers (`buffers`) and both (`both`): what each saves per
//!   request.
//!
//! Run: `cargo bench -p aio-bench --bench backends` (then `python3 scripts/criterion_ratios.py`).
//! Compare within one run: the ratio of `iteration/256/*` to `iteration/1/*` is the per-fd cost
//! of a monitor; `round_trip/<engine>` over `round_trip/pread` is an engine's overhead (on a
//! tmpfs temp dir, `TMPDIR=/dev/shm`, where the read itself costs least).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::hint::black_box;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use aio::EngineKind;
use aio::Hybrid;
use aio_backend_epoll::EpollLoop;
use aio_backend_poll::PollLoop;
use aio_bench::targets::image::DiskImage;
use aio_bench::targets::loopdev::{LoopDevice, LoopSpec};
use aio_conformance::{drain_fd, raise_fd_limit, write_byte, Pipe};
use aio_core::engine::{AlignedBuf, IoEngine, Request};
use aio_core::{EventLoop, Notifier};
use aio_loop::{AioContext, FdHandler, PollParams};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const FD_COUNTS: [usize; 4] = [1, 64, 256, 1024];

fn notifier(c: &mut Criterion) {
    let mut g = c.benchmark_group("notifier");
    for (name, n) in [
        ("eventfd", Notifier::new_eventfd().unwrap()),
        ("pipe", Notifier::new_pipe().unwrap()),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                n.notify().unwrap();
                black_box(n.test_and_clear())
            })
        });
    }
    g.finish();
}

fn bottom_half(c: &mut Criterion) {
    let ctx = AioContext::new(EpollLoop::new().unwrap()).unwrap();
    let bh = ctx.bh_new(|_| {});
    c.bench_function("bottom_half/schedule_run", |b| {
        b.iter(|| {
            bh.schedule();
            black_box(ctx.poll(false))
        })
    });
}

/// Registers `idle` idle pipes plus one active one; returns the idle pipes and the active one.
fn setup<L: EventLoop>(ctx: &AioContext<L>, idle: usize) -> (Vec<Pipe>, Rc<Pipe>) {
    let pipes: Vec<Pipe> = (0..idle).map(|_| Pipe::new()).collect();
    for p in &pipes {
        ctx.set_fd_handler(&p.read, FdHandler::new().on_read(|_| {}))
            .unwrap();
    }
    let active = Rc::new(Pipe::new());
    let a = active.clone();
    ctx.set_fd_handler(
        &active.read,
        FdHandler::new().on_read(move |_| {
            drain_fd(&a.read);
        }),
    )
    .unwrap();
    (pipes, active)
}

fn bench_monitor<L: EventLoop>(c: &mut Criterion, name: &str, make: impl Fn() -> L) {
    let mut g = c.benchmark_group("iteration");
    for n in FD_COUNTS {
        let ctx = Rc::new(AioContext::new(make()).unwrap());
        let (_pipes, active) = setup(&ctx, n - 1);
        g.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
            b.iter(|| {
                write_byte(&active.write);
                black_box(ctx.poll(true))
            })
        });
    }
    g.finish();
}

fn bare_epoll(c: &mut Criterion) {
    let mut g = c.benchmark_group("iteration");
    for n in FD_COUNTS {
        let pipes: Vec<Pipe> = (0..n).map(|_| Pipe::new()).collect();
        // SAFETY: plain epoll syscalls on fds this function owns; `events` outlives each wait.
        unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            assert!(
                ep >= 0,
                "epoll_create1: {}",
                std::io::Error::last_os_error()
            );
            for (i, p) in pipes.iter().enumerate() {
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: i as u64,
                };
                libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, p.read.as_raw_fd(), &mut ev);
            }
            let active = pipes.last().unwrap();

            let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 128];
            g.bench_with_input(BenchmarkId::new("bare-epoll", n), &n, |b, _| {
                b.iter(|| {
                    write_byte(&active.write);
                    let k = libc::epoll_wait(ep, events.as_mut_ptr(), 128, -1);
                    // EINTR: nothing was returned; the next iteration waits again.
                    for ev in &events[..k.max(0) as usize] {
                        let idx = ev.u64 as usize;
                        black_box(idx);
                        drain_fd(&active.read);
                    }
                })
            });
            libc::close(ep);
        }
    }
    g.finish();
}

fn iteration(c: &mut Criterion) {
    raise_fd_limit();
    bare_epoll(c);
    bench_monitor(c, "epoll", || EpollLoop::new().unwrap());
    bench_monitor(c, "hybrid", || {
        Hybrid::new(PollLoop::new(), EpollLoop::new().unwrap())
    });
    match aio_backend_uring::UringLoop::new() {
        Ok(_) => bench_monitor(c, "uring", || aio_backend_uring::UringLoop::new().unwrap()),
        Err(e) => eprintln!("skipped: uring monitor: {e}"),
    }
    bench_monitor(c, "poll", PollLoop::new);
}

const BLOCK: usize = 4096;
const FILE_BLOCKS: u64 = 4096; // 16 MiB

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// QD1 read round trips through `engine` attached to a context over `monitor`, polling up to
/// `poll_max_ns`.
fn bench_engine<L, E>(
    g: &mut Group<'_>,
    name: &str,
    monitor: L,
    engine: E,
    image: &DiskImage,
    poll_max_ns: u64,
) where
    L: EventLoop + 'static,
    E: IoEngine + 'static,
{
    let blocks = image.size() / BLOCK as u64;
    let ctx = AioContext::new(monitor).unwrap();
    ctx.set_poll_params(PollParams::iothread().with_max_ns(poll_max_ns));
    let done: Rc<std::cell::Cell<Option<AlignedBuf>>> = Rc::default();
    let d = done.clone();
    let attached = ctx
        .attach_engine(engine, move |_, c| {
            assert!(c.result.is_ok(), "{:?}", c.result);
            d.set(c.buf.into_one());
        })
        .unwrap();
    let mut buf = Some(AlignedBuf::new(BLOCK));
    let mut block = 0u64;
    g.bench_function(name, |b| {
        b.iter(|| {
            block = (block + 7919) % blocks;
            let req = Request::read(image.file(), block * BLOCK as u64, buf.take().unwrap(), 0);
            attached.submit(req).unwrap();
            loop {
                if let Some(b) = done.take() {
                    buf = Some(b);
                    break;
                }
                ctx.poll(true);
            }
        })
    });
    let Ok(engine) = attached.detach(&ctx) else {
        panic!("detach refused");
    };
    drop(engine);
}

fn round_trip(c: &mut Criterion) {
    let path = std::env::temp_dir().join(format!("aio-bench-backends-{}.img", std::process::id()));
    let image = match DiskImage::create(path, FILE_BLOCKS * BLOCK as u64, 3) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("skipped: round_trip: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("round_trip");
    round_trips(&mut g, "", &image, &[0]);
    // The fast device: where a read takes 10-20 µs, the loop's own cost and polling show.
    match LoopDevice::attach(LoopSpec {
        size: FILE_BLOCKS * BLOCK as u64,
    })
    .and_then(|dev| Ok((dev.whole()?, dev)))
    {
        Ok((image, _device)) => round_trips(&mut g, "loop/", &image, &[0, 32_768]),
        Err(e) => eprintln!("skipped: round_trip/loop: {e}"),
    }
    g.finish();
}

/// `pread` and every engine on `image`, named `<prefix><engine>`, once per polling limit
/// (`/poll` added to the name where it is not 0).
fn round_trips(g: &mut Group<'_>, prefix: &str, image: &DiskImage, poll_max_ns: &[u64]) {
    let blocks = image.size() / BLOCK as u64;
    let mut buf = AlignedBuf::new(BLOCK);
    let mut block = 0u64;
    let fd = image.file().raw_fd();
    g.bench_function(format!("{prefix}pread"), |b| {
        b.iter(|| {
            block = (block + 7919) % blocks;
            // SAFETY: `buf` is a live, exclusively borrowed buffer of BLOCK bytes.
            let n = unsafe {
                libc::pread(
                    fd,
                    buf.as_mut_ptr().cast(),
                    BLOCK,
                    (block * BLOCK as u64) as libc::off_t,
                )
            };
            assert_eq!(n, BLOCK as isize);
        })
    });
    for &poll in poll_max_ns {
        let suffix = if poll == 0 { "" } else { "/poll" };
        for kind in EngineKind::ALL {
            let name = format!("{prefix}{kind}{suffix}");
            match kind.build(&aio::EngineOptions::default()) {
                Ok(engine) => {
                    bench_engine(g, &name, EpollLoop::new().unwrap(), engine, image, poll)
                }
                Err(e) => eprintln!("skipped: round_trip/{name}: {e}"),
            }
        }
        let name = format!("{prefix}uring-shared-ring{suffix}");
        match aio_backend_uring::shared_ring(aio_backend_uring::UringConfig::default()) {
            Ok((monitor, engine)) => bench_engine(g, &name, monitor, engine, image, poll),
            Err(e) => eprintln!("skipped: round_trip/{name}: {e}"),
        }
    }
}

const BATCH: usize = 32;

fn registrations(c: &mut Criterion) {
    use aio_backend_uring::{UringConfig, UringEngine};
    let path =
        std::env::temp_dir().join(format!("aio-bench-registered-{}.img", std::process::id()));
    let image = match DiskImage::create_buffered(path, FILE_BLOCKS * BLOCK as u64, 5) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("skipped: registrations: {e}");
            return;
        }
    };
    let mut g = c.benchmark_group("registrations");
    for (name, register_files, fixed_buffers) in [
        ("plain", false, 0),
        ("files", true, 0),
        ("buffers", false, BATCH as u32),
        ("both", true, BATCH as u32),
    ] {
        let config = UringConfig::default()
            .with_register_files(register_files)
            .with_fixed_buffers(fixed_buffers);
        let mut engine = match UringEngine::new(config) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("skipped: registrations/{name}: {e}");
                continue;
            }
        };
        let mut bufs: Vec<AlignedBuf> = (0..BATCH).map(|_| AlignedBuf::new(BLOCK)).collect();
        let mut block = 0u64;
        g.bench_function(name, |b| {
            b.iter(|| {
                engine.plug();
                for (t, buf) in bufs.drain(..).enumerate() {
                    block = (block + 7919) % FILE_BLOCKS;
                    let req = Request::read(image.file(), block * BLOCK as u64, buf, t as u64);
                    engine.submit(req).unwrap();
                }
                engine.unplug();
                for c in aio_conformance::engine::wait_for(&mut engine, BATCH) {
                    assert_eq!(c.result.as_ref().ok(), Some(&BLOCK));
                    bufs.push(c.buf.into_one().unwrap());
                }
            })
        });
        let stats = engine.stats();
        if stats.entries_submitted == 0 {
            continue; // filtered out of this run
        }
        assert_eq!(stats.fixed_file_requests > 0, register_files, "{stats:?}");
        assert_eq!(
            stats.fixed_buffer_requests > 0,
            fixed_buffers > 0,
            "{stats:?}"
        );
    }
    g.finish();
}

criterion_group!(
    benches,
    notifier,
    bottom_half,
    iteration,
    round_trip,
    registrations
);
criterion_main!(benches);
