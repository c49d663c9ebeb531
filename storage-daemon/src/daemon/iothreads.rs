//! The daemon's iothreads: those its [`Config`] asks for, and those a monitor adds and removes
//! while it runs (QMP's `object-add` / `object-del` of an iothread).
//!
//! This module owns starting and stopping them; what runs on them is the disks'. An iothread
//! keeps its number for the daemon's life: a removed one leaves a stopped handle in its
//! place (its calls fail), so the numbers disks were given stay right.
//!
//! * A disk serves its queues on the iothreads of the list it was given when it was added; a
//!   later [`IoThreadSet::add`] gives new disks a longer list and changes nothing for the
//!   others.
//! * [`IoThreadSet::remove`] stops a thread and waits for it: its caller makes sure no disk
//!   uses it (the monitor refuses to remove an iothread an export names).

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;

use aio::process::CpuList;
use aio::{Choice, EngineKind, MonitorKind};
use aio_core::{EventLoop, IoEngine};
use aio_loop::{AioContext, IoThread, IoThreadError, PollParams};
use aio_virtio_blk::dataplane::DataPlane;

use super::config::Config;
use super::error::DaemonError;
use aio_vhost_user_blk::vhost::IoThreads;

pub(super) type Plane = DataPlane<Box<dyn EventLoop>, Box<dyn IoEngine>>;
/// One of the daemon's iothreads.
pub(super) type Worker = IoThread<Box<dyn EventLoop>, Plane>;

/// The daemon's engines: each with a thread pool behind it for the discards and write-zeroes
/// it refuses, as QEMU sends them to its thread pool with `aio=native`.
pub fn engine_options() -> aio::EngineOptions {
    aio::EngineOptions::default().with_fallback_pool(true)
}

/// What every iothread is built with.
#[derive(Debug, Clone)]
struct Recipe {
    engine: Choice<EngineKind>,
    fdmon: Choice<MonitorKind>,
    cpus: Option<CpuList>,
}

struct Inner {
    /// By number; None once removed.
    workers: Vec<Option<Worker>>,
    /// Every iothread's handle by number, removed ones included (stopped).
    handles: IoThreads<Box<dyn EventLoop>, Box<dyn IoEngine>>,
    recipe: Recipe,
}

/// The daemon's iothreads; cheap to clone, used on the control loop's thread.
#[derive(Clone)]
pub struct IoThreadSet(Rc<RefCell<Inner>>);

impl IoThreadSet {
    /// Starts the iothreads `config` asks for (at least one), each with its own polling.
    pub(super) fn start(config: &Config) -> Result<Self, DaemonError> {
        let set = IoThreadSet(Rc::new(RefCell::new(Inner {
            workers: Vec::new(),
            handles: Arc::new(Vec::new()),
            recipe: Recipe {
                engine: config.engine,
                fdmon: config.fdmon,
                cpus: config.cpus.clone(),
            },
        })));
        for k in 0..usize::from(config.iothreads.max(1)) {
            let poll = config
                .iothread_poll
                .get(k)
                .copied()
                .unwrap_or_else(|| config.poll_max_ns.params());
            if let Err(e) = set.add(poll) {
                // The ones started stop before the error is told.
                let _ = set.stop_all();
                return Err(e);
            }
        }
        Ok(set)
    }

    /// Every iothread's handle, by number (a removed one's calls fail).
    pub fn handles(&self) -> IoThreads<Box<dyn EventLoop>, Box<dyn IoEngine>> {
        self.0.borrow().handles.clone()
    }

    /// How many iothreads were ever started (the next one's number).
    pub fn len(&self) -> usize {
        self.0.borrow().workers.len()
    }

    /// Whether no iothread was ever started.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether iothread `k` runs (was started and not removed).
    pub fn is_running(&self, k: usize) -> bool {
        matches!(self.0.borrow().workers.get(k), Some(Some(_)))
    }

    /// Starts one more iothread polling as `poll` says; returns its number.
    pub fn add(&self, poll: PollParams) -> Result<usize, DaemonError> {
        let (k, recipe) = {
            let inner = self.0.borrow();
            (inner.workers.len(), inner.recipe.clone())
        };
        let cpu = recipe.cpus.as_ref().and_then(|c| c.nth_wrapping(k));
        let (engine, fdmon) = (recipe.engine, recipe.fdmon);
        let worker = aio_loop::IoThread::spawn(&format!("iothread{k}"), move || {
            if let Some(cpu) = cpu {
                aio::process::pin_current_thread(&[cpu])?;
            }
            let ctx = AioContext::new(fdmon.build()?.built).map_err(io::Error::from)?;
            ctx.set_poll_params(poll);
            let engine = engine.build(&engine_options())?.built;
            let plane: Plane = DataPlane::new(&ctx, engine).map_err(io::Error::from)?;
            Ok::<_, io::Error>((ctx, plane))
        })?;
        let mut inner = self.0.borrow_mut();
        let mut handles = inner.handles.as_ref().clone();
        handles.push(worker.handle());
        inner.handles = Arc::new(handles);
        inner.workers.push(Some(worker));
        Ok(k)
    }

    /// Stops iothread `k` and waits for it. False: no such iothread running.
    pub fn remove(&self, k: usize) -> Result<bool, IoThreadError> {
        let worker = match self.0.borrow_mut().workers.get_mut(k) {
            Some(slot) => slot.take(),
            None => None,
        };
        match worker {
            Some(w) => w.stop().map(|()| true),
            None => Ok(false),
        }
    }

    /// Stops every iothread still running, in order; the first error is returned once all
    /// have stopped.
    pub(super) fn stop_all(&self) -> Result<(), IoThreadError> {
        let workers: Vec<Worker> = self
            .0
            .borrow_mut()
            .workers
            .iter_mut()
            .filter_map(Option::take)
            .collect();
        let mut result = Ok(());
        for w in workers {
            if let Err(e) = w.stop() {
                result = result.and(Err(e));
            }
        }
        result
    }
}
