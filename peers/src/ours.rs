//! aio-rs's side: an `AioContext` on the calling thread over the job's fd monitor (epoll, an
//! io_uring of its own, or one io_uring shared with the io_uring engine), adaptive polling as the job says, one engine attached, and the workers as engine futures (one spawned task per
//! worker, the peers' shape), as per-request callbacks that submit the next read themselves,
//! or as `pread` offloaded with `PoolContext::run_async`.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::unix::fs::FileExt;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use aio_backend_epoll::EpollLoop;
use aio_backend_uring::{shared_ring, UringConfig, UringLoop, MAX_REGISTERED_BUFFERS};
use aio_core::engine::{AlignedBuf, IoEngine, IoFile, Request, SubmitError};
use aio_core::EventLoop;
use aio_loop::task::join_all;
use aio_loop::AioContext;
use aio_loop::AttachedEngine;
use aio_pool::{PoolConfig, PoolContext, ThreadPool};

use aio::{Choice, EngineKind, EngineOptions, MonitorKind, Pairing};

use super::{open_direct, Job, Outcome, Variant, Worker};

/// The io_uring engine's configuration: the defaults, or with `--uring-registered` each file
/// and each worker's buffer registered with the ring (`IORING_OP_READ_FIXED`, as glommio
/// reads).
fn uring_config(job: &Job) -> UringConfig {
    let config = UringConfig::default();
    if !job.uring_registered {
        return config;
    }
    config
        .with_register_files(true)
        .with_fixed_buffers((job.qd as u32).min(MAX_REGISTERED_BUFFERS))
}

/// Runs one of aio-rs's variants (a peer's is refused as invalid input).
pub fn run(variant: Variant, job: &Job) -> io::Result<Outcome> {
    let uring_variant = matches!(variant, Variant::AioUringAsync | Variant::AioUringCallback);
    // The loops the peers are compared on are concrete types (no dynamic dispatch).
    match job.fdmon {
        Pairing::Apart(Choice::Named(MonitorKind::Epoll)) => {
            run_on(variant, job, EpollLoop::new()?, None)
        }
        Pairing::SharedRing if uring_variant => {
            let (monitor, engine) = shared_ring(uring_config(job)).map_err(io::Error::other)?;
            run_on(variant, job, monitor, Some(Box::new(engine)))
        }
        Pairing::Apart(Choice::Named(MonitorKind::Uring)) | Pairing::SharedRing => run_on(
            variant,
            job,
            UringLoop::new().map_err(io::Error::other)?,
            None,
        ),
        Pairing::Apart(other) => run_on(variant, job, other.build()?.built, None),
    }
}

/// Runs `variant` (an aio-rs one) on a context over `monitor`; an io_uring variant uses
/// `shared` if given (the engine on the monitor's ring).
fn run_on<L: EventLoop + 'static>(
    variant: Variant,
    job: &Job,
    monitor: L,
    shared: Option<Box<dyn IoEngine>>,
) -> io::Result<Outcome> {
    let ctx = AioContext::new(monitor)?;
    // The job's polling limit, QEMU's IOThread rule otherwise.
    ctx.set_poll_params(job.poll_max_ns.params());
    let uring = || match shared {
        Some(engine) => Ok(engine),
        None => EngineKind::Uring
            .build(&EngineOptions::default().with_uring(uring_config(job)))
            .map_err(io::Error::from),
    };
    match variant {
        Variant::AioUringAsync => futures(&ctx, job, uring()?),
        Variant::AioUringCallback => callbacks(&ctx, job, uring()?),
        Variant::AioLinuxAioAsync => futures(
            &ctx,
            job,
            EngineKind::LinuxAio.build(&EngineOptions::default())?,
        ),
        Variant::AioLinuxAioCallback => callbacks(
            &ctx,
            job,
            EngineKind::LinuxAio.build(&EngineOptions::default())?,
        ),
        Variant::AioPoolAsync => futures(
            &ctx,
            job,
            EngineKind::Pool.build(&EngineOptions::default())?,
        ),
        Variant::AioPoolRunAsync => pool_run_async(&ctx, job),
        peer => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{peer} is not an aio-rs variant"),
        )),
    }
}

/// Engine futures: one task per worker, each awaiting `engine.read` in a loop.
fn futures<L: EventLoop + 'static, E: IoEngine + 'static>(
    ctx: &AioContext<L>,
    job: &Job,
    engine: E,
) -> io::Result<Outcome> {
    let file = IoFile::from(open_direct(&job.path)?);
    let engine = ctx.attach_engine(engine, |_, _| {})?;
    let bs = job.bs;
    let tasks: Vec<_> = job
        .workers()
        .into_iter()
        .map(|w| {
            let (engine, file) = (engine.clone(), file.clone());
            ctx.spawn(w.read_until_done(AlignedBuf::new(bs), move |buf, offset| {
                let read = engine.read(&file, offset, buf);
                async move { Ok(read.await) }
            }))
        })
        .collect();
    let mut workers = Vec::with_capacity(tasks.len());
    for w in ctx.block_on(join_all(tasks)) {
        workers.push(w.map_err(io::Error::other)??);
    }
    drop(engine);
    Ok((workers, ctx.counters().named()))
}

/// What the callbacks share: the file, the workers, and the reads still in flight.
struct Shared {
    file: IoFile,
    bs: usize,
    workers: RefCell<Vec<Worker>>,
    in_flight: Cell<usize>,
}

/// Submits worker `i`'s next read into `buf`, issued at `now`, unless the worker's deadline
/// has passed (then it is no longer in flight); its callback records it and submits the one
/// after.
fn issue<L: EventLoop + 'static, E: IoEngine + 'static>(
    engine: &AttachedEngine<L, E>,
    shared: &Rc<Shared>,
    i: usize,
    buf: AlignedBuf,
    now: Instant,
) -> Result<(), SubmitError> {
    let Some(offset) = shared.workers.borrow_mut()[i].start(now) else {
        shared.in_flight.set(shared.in_flight.get() - 1);
        return Ok(());
    };
    let s = shared.clone();
    let request = Request::read(&shared.file, offset, buf, i as u64);
    let sent = engine.submit_with(request, move |_ctx, engine, c| {
        let now = s.workers.borrow_mut()[i].finish(&c.result);
        // A read's completion always carries its one buffer back.
        let buf = c.buf.into_one().unwrap_or_else(|| AlignedBuf::new(s.bs));
        if let Err(e) = issue(engine, &s, i, buf, now) {
            let errno = io::Error::from(e).raw_os_error().unwrap_or(libc::EINVAL);
            s.workers.borrow_mut()[i].refused(errno);
            s.in_flight.set(s.in_flight.get() - 1);
        }
    });
    sent.map(drop)
}

/// Per-request callbacks: every worker's first read submitted in one batch, then each
/// completion's callback submits that worker's next read (`submit_with` refill).
fn callbacks<L: EventLoop + 'static, E: IoEngine + 'static>(
    ctx: &AioContext<L>,
    job: &Job,
    engine: E,
) -> io::Result<Outcome> {
    let shared = Rc::new(Shared {
        file: IoFile::from(open_direct(&job.path)?),
        bs: job.bs,
        workers: RefCell::new(job.workers()),
        in_flight: Cell::new(0),
    });
    let engine = ctx.attach_engine(engine, |_, _| {})?;
    engine.plug();
    for i in 0..job.qd {
        shared.in_flight.set(shared.in_flight.get() + 1);
        let sent = issue(&engine, &shared, i, AlignedBuf::new(job.bs), Instant::now());
        if let Err(e) = sent {
            engine.unplug();
            return Err(io::Error::from(e));
        }
    }
    engine.unplug();
    while shared.in_flight.get() > 0 {
        ctx.poll(true);
    }
    drop(engine);
    let workers = shared.workers.replace(Vec::new());
    Ok((workers, ctx.counters().named()))
}

/// aio-rs's `spawn_blocking`: one task per worker, each read a `PoolContext::run_async`
/// closure that `pread`s into a buffer it moves to a pool thread and back.
fn pool_run_async<L: EventLoop + 'static>(ctx: &AioContext<L>, job: &Job) -> io::Result<Outcome> {
    let file = Arc::new(open_direct(&job.path)?);
    // `PoolContext` takes the pool itself, not an engine built by name.
    let pool = ThreadPool::new(PoolConfig::default()).map_err(io::Error::other)?;
    let pool = Rc::new(PoolContext::attach(ctx, pool, |_, _| {}).map_err(io::Error::other)?);
    let bs = job.bs;
    let tasks: Vec<_> = job
        .workers()
        .into_iter()
        .map(|w| {
            let (pool, file) = (pool.clone(), file.clone());
            ctx.spawn(
                w.read_until_done(AlignedBuf::new(bs), move |mut buf, offset| {
                    let file = file.clone();
                    pool.run_async(move || (file.read_at(&mut buf, offset), buf))
                }),
            )
        })
        .collect();
    let mut workers = Vec::with_capacity(tasks.len());
    for w in ctx.block_on(join_all(tasks)) {
        workers.push(w.map_err(io::Error::other)??);
    }
    drop(pool);
    Ok((workers, ctx.counters().named()))
}
