//! An RBD image open for I/O (`rbd_image_t`): opening, its size and features, resizing,
//! creating and removing, and closing after the requests in flight.
//!
//! This module owns the image handle and the count of requests librbd still holds; it never
//! submits a request (`queue.rs` does) nor takes the exclusive lock (`lock.rs`).
//!
//! * **Drain before close.** Closing an image while librbd still runs requests on it is a
//!   use-after-free inside librbd (fixed upstream in Ceph 16 only in part): [`RbdImage::close`]
//!   (and drop) wait for every request's completion first.
//! * **Shared.** An image is `Send + Sync` and lives in an `Arc`: every context serving it
//!   submits on its own [`RbdQueue`](crate::RbdQueue); librbd's image handle takes requests
//!   from any thread.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};

use crate::cluster::{Cluster, Pool};
use crate::error::{c_string, check, RbdError};
use crate::spec::ImageSpec;
use crate::sys::{self, Lib};

/// An RBD image open for I/O.
pub struct RbdImage {
    pub(crate) handle: sys::Image,
    pub(crate) lib: &'static Lib,
    spec: ImageSpec,
    read_only: bool,
    object_size: u64,
    /// Requests submitted whose completion librbd has not yet called back, and whether the
    /// handle is closed.
    in_flight: Mutex<(usize, bool)>,
    drained: Condvar,
    pub(crate) pool: Pool,
    /// The exclusive lock, while held (`lock.rs`).
    pub(crate) lock: Mutex<Option<HeldLock>>,
    /// The thread that runs this image's blocking calls for its queues (`diff.rs`).
    pub(crate) worker: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
}

// SAFETY: librbd's image handle takes I/O, size and lock calls from any thread (its image
// context locks inside); the handle is closed once, by `close`, after every request is done.
unsafe impl Send for RbdImage {}
// SAFETY: as above.
unsafe impl Sync for RbdImage {}

impl std::fmt::Debug for RbdImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RbdImage")
            .field("spec", &self.spec.to_string())
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// The error of a call on the image `spec` names.
pub(crate) fn call_error(call: &'static str, spec: &ImageSpec, errno: i32) -> RbdError {
    match errno {
        libc::ENOENT => RbdError::NoSuchImage {
            image: spec.to_string(),
        },
        libc::EACCES | libc::EPERM => RbdError::PermissionDenied {
            what: format!("{call} on {spec}"),
        },
        errno => RbdError::Call {
            call,
            target: spec.to_string(),
            errno,
        },
    }
}

impl RbdImage {
    /// Opens `spec` on `cluster`: read-only when `read_only` or when it names a snapshot.
    pub fn open(
        cluster: &Arc<Cluster>,
        spec: &ImageSpec,
        read_only: bool,
    ) -> Result<Arc<Self>, RbdError> {
        let lib = cluster.lib();
        let pool = Pool::open(cluster, spec)?;
        let name = c_string(&spec.image, "image name")?;
        let snap = spec
            .snapshot
            .as_deref()
            .map(|s| c_string(s, "snapshot name"))
            .transpose()?;
        let snap_ptr = snap.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
        let read_only = read_only || spec.snapshot.is_some();
        let open = match read_only {
            true => lib.rbd_open_read_only,
            false => lib.rbd_open,
        };
        let mut handle: sys::Image = std::ptr::null_mut();
        // SAFETY: a live pool context; a live out-pointer; NUL-terminated names (the snapshot
        // null for the head).
        let ret = unsafe { open(pool.ctx, name.as_ptr(), &mut handle, snap_ptr) };
        check(ret.into()).map_err(|errno| call_error("rbd_open", spec, errno))?;
        let mut image = RbdImage {
            handle,
            lib,
            spec: spec.clone(),
            read_only,
            object_size: 0,
            in_flight: Mutex::new((0, false)),
            drained: Condvar::new(),
            pool,
            lock: Mutex::new(None),
            worker: Mutex::new(None),
        };
        let mut info = std::mem::MaybeUninit::<sys::ImageInfo>::zeroed();
        // SAFETY: an open image; `info` is writable for the size passed.
        let ret = unsafe {
            (lib.rbd_stat)(
                handle,
                info.as_mut_ptr(),
                std::mem::size_of::<sys::ImageInfo>(),
            )
        };
        check(ret.into()).map_err(|errno| call_error("rbd_stat", spec, errno))?;
        // SAFETY: zero-initialised plain integers, filled in by `rbd_stat`.
        image.object_size = unsafe { info.assume_init() }.obj_size.max(512);
        Ok(Arc::new(image))
    }

    /// Creates an image of `size` bytes (Ceph's default features, order 22: 4 MiB objects).
    pub fn create(cluster: &Arc<Cluster>, spec: &ImageSpec, size: u64) -> Result<(), RbdError> {
        let pool = Pool::open(cluster, spec)?;
        let name = c_string(&spec.image, "image name")?;
        let mut order = 0;
        // SAFETY: a live pool context; a NUL-terminated name; `order` a live out-value (0:
        // the default).
        let ret = unsafe { (cluster.lib().rbd_create)(pool.ctx, name.as_ptr(), size, &mut order) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_create", spec, errno))
    }

    /// Removes the image (with its data).
    pub fn remove(cluster: &Arc<Cluster>, spec: &ImageSpec) -> Result<(), RbdError> {
        let pool = Pool::open(cluster, spec)?;
        let name = c_string(&spec.image, "image name")?;
        // SAFETY: a live pool context; a NUL-terminated name.
        let ret = unsafe { (cluster.lib().rbd_remove)(pool.ctx, name.as_ptr()) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_remove", spec, errno))
    }

    /// Which image this is.
    pub fn spec(&self) -> &ImageSpec {
        &self.spec
    }

    /// The connection it was opened on.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.pool.cluster
    }

    /// Whether it was opened read-only (asked, or a snapshot).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The size of its objects (4 MiB by default): the granularity of block status.
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    /// The size in bytes, as the cluster has it now (another client may have resized it).
    pub fn size(&self) -> Result<u64, RbdError> {
        let mut size = 0;
        // SAFETY: an open image; a live out-value.
        let ret = unsafe { (self.lib.rbd_get_size)(self.open_handle()?, &mut size) };
        check(ret.into()).map_err(|errno| call_error("rbd_get_size", &self.spec, errno))?;
        Ok(size)
    }

    /// The image's features (`RBD_FEATURE_*` bits).
    pub fn features(&self) -> Result<u64, RbdError> {
        let mut features = 0;
        // SAFETY: an open image; a live out-value.
        let ret = unsafe { (self.lib.rbd_get_features)(self.open_handle()?, &mut features) };
        check(ret.into()).map_err(|errno| call_error("rbd_get_features", &self.spec, errno))?;
        Ok(features)
    }

    /// Makes the image `bytes` long (blocking: a round trip to the cluster, more to shrink).
    pub fn resize(&self, bytes: u64) -> Result<(), RbdError> {
        // SAFETY: an open image.
        let ret = unsafe { (self.lib.rbd_resize)(self.open_handle()?, bytes) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_resize", &self.spec, errno))
    }

    /// Writes what librbd's cache holds to the cluster (blocking; `rbd_flush`).
    pub fn flush(&self) -> Result<(), RbdError> {
        // SAFETY: an open image.
        let ret = unsafe { (self.lib.rbd_flush)(self.open_handle()?) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_flush", &self.spec, errno))
    }

    /// Drops what librbd's cache holds, so that the next reads see what other clients wrote
    /// (blocking; `rbd_invalidate_cache`, as QEMU's rbd driver does on activation).
    pub fn invalidate_cache(&self) -> Result<(), RbdError> {
        // SAFETY: an open image.
        let ret = unsafe { (self.lib.rbd_invalidate_cache)(self.open_handle()?) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_invalidate_cache", &self.spec, errno))
    }

    /// Reads `buf.len()` bytes at `offset` (blocking; for a format probe or a tool, not for
    /// a serving loop: [`RbdQueue`](crate::RbdQueue) reads without blocking).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<usize, RbdError> {
        // SAFETY: an open image; `buf` is writable for its length, which is passed, and
        // librbd is done with it when the call returns.
        let ret = unsafe {
            (self.lib.rbd_read)(
                self.open_handle()?,
                offset,
                buf.len(),
                buf.as_mut_ptr().cast(),
            )
        };
        check(ret as i64)
            .map(|n| n as usize)
            .map_err(|errno| call_error("rbd_read", &self.spec, errno))
    }

    /// The handle, or `EBADF` once closed.
    pub(crate) fn open_handle(&self) -> Result<sys::Image, RbdError> {
        match self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).1 {
            true => Err(call_error("rbd_image", &self.spec, libc::EBADF)),
            false => Ok(self.handle),
        }
    }

    /// Counts a request about to be submitted; false once the image is closed.
    pub(crate) fn begin_request(&self) -> bool {
        let mut state = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if state.1 {
            return false;
        }
        state.0 += 1;
        true
    }

    /// A request's completion has been called back (or its submission failed).
    pub(crate) fn end_request(&self) {
        let mut state = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        state.0 -= 1;
        if state.0 == 0 {
            self.drained.notify_all();
        }
    }

    /// Requests librbd still holds.
    pub fn in_flight(&self) -> usize {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner()).0
    }

    /// Waits for every request in flight, releases the exclusive lock if held, and closes the
    /// image (its cache written back). Later requests end with `EBADF`; a second call does
    /// nothing. Blocking: call it from a thread that does not deliver this image's
    /// completions' bottom halves only if they need not run (librbd's callbacks do not wait
    /// for them).
    pub fn close(&self) -> Result<(), RbdError> {
        let mut state = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if state.1 {
            return Ok(());
        }
        state.1 = true;
        while state.0 > 0 {
            state = self.drained.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        drop(state);
        // The worker ends when its queue closes, after the job it runs (which counted itself
        // in flight, so none runs now).
        self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        let released = self.release_lock_closing();
        // SAFETY: no request is in flight (counted above) and none can start (`closed`); the
        // handle is closed once, here.
        let ret = unsafe { (self.lib.rbd_close)(self.handle) };
        released?;
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_close", &self.spec, errno))
    }
}

impl Drop for RbdImage {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// A blocking call for the worker.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The lock this process holds, and its record.
#[derive(Debug)]
pub(crate) struct HeldLock {
    pub(crate) record: Option<PathBuf>,
}

impl RbdImage {
    /// Runs `job` on the image's worker thread (started now if it is not running).
    pub(crate) fn run_on_worker(&self, job: Job) {
        let mut worker = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        let job = match worker.as_ref() {
            None => job,
            Some(tx) => match tx.send(job) {
                Ok(()) => return,
                Err(mpsc::SendError(job)) => job,
            },
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("rbd-worker".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            });
        match spawned {
            Ok(_) => {
                let _ = tx.send(job);
                *worker = Some(tx);
            }
            // No thread: the job runs here (blocking its caller, but answered).
            Err(_) => job(),
        }
    }

    /// The release of a closing image (whose handle `open_handle` no longer gives).
    pub(crate) fn release_lock_closing(&self) -> Result<(), RbdError> {
        self.release_held(self.handle)
    }

    pub(crate) fn release_held(&self, handle: sys::Image) -> Result<(), RbdError> {
        let Some(held) = self.lock.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Ok(());
        };
        // SAFETY: an open image (closing ones are closed after this).
        let ret = unsafe { (self.lib.rbd_lock_release)(handle) };
        if let Some(path) = held.record {
            let _ = std::fs::remove_file(path);
        }
        check(ret.into())
            .map(drop)
            .map_err(|errno| call_error("rbd_lock_release", self.spec(), errno))
    }
}
