//! One disk's vhost-user socket on a control loop: accept a frontend, read its
//! messages, and when it goes, drain its queues and accept the next one.
//!
//! This module owns the listening socket (created under a temporary name and renamed into
//! place once it listens, so a client never finds a socket that refuses it), the connection
//! and the `vhost` crate's request handler driven from a read handler; one frontend at a time
//! per disk: while one is connected the listener is not watched, so the next one waits in the
//! backlog and is accepted once the first has gone and its requests have completed.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};

use aio_core::engine::IoEngine;
use aio_core::EventLoop;
use aio_loop::{AioContext, FdHandler};
use vhost::vhost_user::{BackendReqHandler, Error as VuError};

use crate::vhost::{BlkBackend, DiskIndex, IoThreads};
use aio_virtio_blk::device::BlockDevice;

type Handler<L, E> = BackendReqHandler<Mutex<BlkBackend<L, E>>>;

/// How long a frontend's connection waits for a disk opened
/// [inactive](BlockDevice::open_inactive) to get its image's lock (an upgrade: the old
/// daemon draining); the frontend is refused after it, and its next connection tries again.
pub const HANDOFF_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A connected frontend.
struct Connection<L: EventLoop + 'static, E: IoEngine + 'static> {
    stream: UnixStream,
    handler: Handler<L, E>,
    backend: Arc<Mutex<BlkBackend<L, E>>>,
}

/// One disk's socket and its current frontend.
pub struct DiskSocket<L: EventLoop + 'static, E: IoEngine + 'static> {
    disk: DiskIndex,
    path: PathBuf,
    listener: UnixListener,
    /// The socket file's device and inode once bound: the path is removed at the end only
    /// while it is still this socket (a successor may have bound it since, an upgrade).
    bound: Option<(u64, u64)>,
    device: Arc<BlockDevice>,
    iothreads: IoThreads<L, E>,
    connection: RefCell<Option<Connection<L, E>>>,
    /// Frontends served so far.
    served: std::cell::Cell<u64>,
}

/// Binds `path` under a temporary name, listens, and renames it into place.
fn listen_at(path: &Path) -> io::Result<UnixListener> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    listener.set_nonblocking(true)?;
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(listener)
}

/// The device and inode of the file at `path`, if any.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether a request handler's error ends the connection (the socket failed or the frontend
/// broke the protocol), rather than refusing one request.
fn ends_connection(e: &VuError) -> bool {
    !matches!(
        e,
        VuError::ReqHandlerError(_)
            | VuError::InvalidParam
            | VuError::InvalidOperation(_)
            | VuError::InactiveFeature(_)
            | VuError::InactiveOperation(_)
            | VuError::SocketRetry(_)
    )
}

impl<L: EventLoop + 'static, E: IoEngine + 'static> DiskSocket<L, E> {
    /// Creates the socket of disk `disk` at `path` and serves it on `ctx`.
    pub fn serve(
        ctx: &AioContext<L>,
        disk: DiskIndex,
        path: &Path,
        device: Arc<BlockDevice>,
        iothreads: IoThreads<L, E>,
    ) -> io::Result<Rc<Self>> {
        let listener = listen_at(path)?;
        let bound = file_id(path);
        let socket = Rc::new(DiskSocket {
            disk,
            path: path.to_path_buf(),
            listener,
            bound,
            device,
            iothreads,
            connection: RefCell::new(None),
            served: std::cell::Cell::new(0),
        });
        socket.listen(ctx)?;
        Ok(socket)
    }

    /// Watches the listener for the next frontend.
    fn listen(self: &Rc<Self>, ctx: &AioContext<L>) -> io::Result<()> {
        let s = self.clone();
        ctx.set_fd_handler(
            self.listener.as_fd(),
            FdHandler::new().on_read(move |ctx| s.accept(ctx)),
        )
        .map_err(io::Error::from)
    }

    /// Whether a frontend is connected now.
    pub fn is_connected(&self) -> bool {
        self.connection.borrow().is_some()
    }

    /// Tells the connected frontend, if any, that the disk's config space changed (see
    /// [`BlkBackend::announce_config_change`]): true when one was told.
    pub fn announce_config_change(&self) -> io::Result<bool> {
        match self.connection.borrow().as_ref() {
            Some(c) => c
                .backend
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .announce_config_change(),
            None => Ok(false),
        }
    }

    /// Frontends accepted so far.
    pub fn served(&self) -> u64 {
        self.served.get()
    }

    fn accept(self: &Rc<Self>, ctx: &AioContext<L>) {
        if self.connection.borrow().is_some() {
            return;
        }
        if let Ok((stream, _)) = self.listener.accept() {
            // An upgrade's disk takes its image's lock once the old daemon has let it go (a
            // migration's inactive disk waits for its owner instead: reads are served).
            let activated = match self.device.activates_on_connect() {
                true => self.device.activate_within(HANDOFF_WAIT),
                false => Ok(()),
            };
            if let Err(e) = activated {
                eprintln!(
                    "aio-vhost-user-blk: {}: refusing a frontend: {e}",
                    self.path.display()
                );
                return;
            }
            match self.connect(ctx, stream) {
                // The next frontend waits in the backlog until this one has gone.
                Ok(()) => {
                    let _ = ctx.remove_fd_handler(self.listener.as_fd());
                }
                Err(e) => eprintln!("aio-vhost-user-blk: {}: {e}", self.path.display()),
            }
        }
    }

    fn connect(self: &Rc<Self>, ctx: &AioContext<L>, stream: UnixStream) -> io::Result<()> {
        // Messages are read whole, with blocking reads, once the socket is readable.
        stream.set_nonblocking(false)?;
        let watched = stream.try_clone()?;
        let backend = Arc::new(Mutex::new(BlkBackend::new(
            self.disk,
            self.device.clone(),
            self.iothreads.clone(),
        )));
        let handler = BackendReqHandler::from_stream(stream, backend.clone());
        let s = self.clone();
        ctx.set_fd_handler(
            watched.as_fd(),
            FdHandler::new().on_read(move |ctx| s.on_message(ctx)),
        )
        .map_err(io::Error::from)?;
        *self.connection.borrow_mut() = Some(Connection {
            stream: watched,
            handler,
            backend,
        });
        self.served.set(self.served.get() + 1);
        Ok(())
    }

    fn on_message(self: &Rc<Self>, ctx: &AioContext<L>) {
        let result = match self.connection.borrow_mut().as_mut() {
            Some(c) => c.handler.handle_request(),
            None => return,
        };
        match result {
            Ok(()) => {}
            Err(e) if !ends_connection(&e) => {
                eprintln!(
                    "aio-vhost-user-blk: {}: request refused: {e}",
                    self.path.display()
                );
            }
            Err(e) => {
                if !matches!(e, VuError::Disconnected | VuError::PartialMessage) {
                    eprintln!(
                        "aio-vhost-user-blk: {}: closing the connection: {e}",
                        self.path.display()
                    );
                }
                self.disconnect(ctx);
                if let Err(e) = self.listen(ctx) {
                    eprintln!(
                        "aio-vhost-user-blk: {}: listening again: {e}",
                        self.path.display()
                    );
                }
            }
        }
    }

    /// Ends the current connection: every queue drains (its requests complete) before the
    /// memory table is dropped and the socket closed.
    pub fn disconnect(&self, ctx: &AioContext<L>) {
        let Some(c) = self.connection.borrow_mut().take() else {
            return;
        };
        let _ = ctx.remove_fd_handler(c.stream.as_fd());
        c.backend
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .disconnect();
        drop(c);
    }

    /// Stops listening, ends the connection (its requests complete first) and removes the
    /// socket file, unless another daemon has bound the path since.
    pub fn close(&self, ctx: &AioContext<L>) {
        let _ = ctx.remove_fd_handler(self.listener.as_fd());
        self.disconnect(ctx);
        if self.bound.is_some() && file_id(&self.path) == self.bound {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
