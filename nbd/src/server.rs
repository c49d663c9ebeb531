//! The listening side: a Unix or TCP socket on a control loop, the limits every connection
//! is held to, and the clients a server has (to count them against `max-connections` and to
//! end them when an export or the server goes).
//!
//! This module owns accepting and the client registry; a connection's protocol is the
//! `connection` module's. Accepted sockets go to a dispatch function the caller gives, which
//! sends each to the context that serves it (an iothread) and calls [`serve`](crate::serve)
//! there.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aio_core::EventLoop;
use aio_loop::{AioContext, FdHandler};

use crate::export::ExportSet;
use crate::stream::Stream;
use crate::tls::TlsCreds;

/// What one connection may do and hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests in flight at once; past it the connection stops reading until one ends.
    pub max_in_flight: u16,
    /// Bytes one connection may hold (its requests' buffers and the replies not yet sent):
    /// past it the connection stops reading, so a client that sends but never reads its
    /// replies stops being read instead of growing the server.
    pub max_held_bytes: usize,
    /// How long a client may take to choose an export (QEMU's `handshake-max-seconds`,
    /// default 10 s).
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_in_flight: 128,
            max_held_bytes: 64 << 20,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

/// Where a server listens (qemu-storage-daemon's `--nbd-server addr.type=`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// A Unix socket at this path (replaced if a stale one is there).
    Unix(PathBuf),
    /// A TCP address: host and port (port 0: any free one, see [`NbdServer::local_port`]).
    Inet {
        /// Host name or address.
        host: String,
        /// Port (NBD's is 10809).
        port: u16,
    },
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    /// `unix:PATH` or `HOST:PORT` (`[V6ADDR]:PORT` too), as `Display` writes it.
    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a path".into());
            }
            return Ok(ListenAddr::Unix(path.into()));
        }
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("{text}: expected unix:PATH or HOST:PORT"))?;
        let port = port
            .parse()
            .map_err(|_| format!("{text}: '{port}' is not a port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{text}: the host is missing"));
        }
        Ok(ListenAddr::Inet {
            host: host.to_owned(),
            port,
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ListenAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            ListenAddr::Inet { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

/// One registered client.
#[derive(Debug)]
struct Client {
    /// A second handle on its socket, to shut it down from any thread.
    socket: Stream,
    /// The export it chose, once it has.
    export: Option<String>,
}

#[derive(Debug, Default)]
struct ClientTable {
    live: HashMap<u64, Client>,
}

/// A server's clients, from any thread: counted, ended by export or all at once, waited for.
#[derive(Debug, Clone, Default)]
pub struct Clients {
    table: Arc<(Mutex<ClientTable>, Condvar)>,
    next: Arc<AtomicU64>,
}

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, ClientTable> {
        self.table.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a client whose socket `socket` is a second handle on, unless `max` are
    /// already there.
    fn join(&self, socket: Stream, max: Option<u32>) -> Option<u64> {
        let mut table = self.lock();
        if max.is_some_and(|m| table.live.len() >= m as usize) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        table.live.insert(
            id,
            Client {
                socket,
                export: None,
            },
        );
        Some(id)
    }

    /// Client `id` chose `export`.
    pub(crate) fn chose(&self, id: u64, export: &str) {
        if let Some(c) = self.lock().live.get_mut(&id) {
            c.export = Some(export.to_owned());
        }
    }

    /// Client `id` is gone.
    pub(crate) fn leave(&self, id: u64) {
        self.lock().live.remove(&id);
        self.table.1.notify_all();
    }

    /// How many clients are connected.
    pub fn count(&self) -> usize {
        self.lock().live.len()
    }

    /// How many clients use the export named `name`.
    pub fn count_on(&self, name: &str) -> usize {
        self.lock()
            .live
            .values()
            .filter(|c| c.export.as_deref() == Some(name))
            .count()
    }

    /// Shuts down the socket of every client (`None`) or of those on export `name`: each
    /// ends once its requests in flight have (as QEMU's `client_close`).
    pub fn shut_down(&self, name: Option<&str>) {
        for c in self.lock().live.values() {
            if name.is_none() || c.export.as_deref() == name {
                c.socket.shutdown();
            }
        }
    }

    /// Waits until no client (`None`) or none on export `name` is left, at most `timeout`:
    /// whether none is. Call it from a thread that does not serve them.
    pub fn wait_gone(&self, name: Option<&str>, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut table = self.lock();
        loop {
            let left = table
                .live
                .values()
                .any(|c| name.is_none() || c.export.as_deref() == name);
            let now = Instant::now();
            if !left {
                return true;
            }
            if now >= deadline {
                return false;
            }
            table = self
                .table
                .1
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// What every connection of a server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) exports: ExportSet,
    pub(crate) limits: Limits,
    pub(crate) clients: Clients,
    /// TLS credentials: when given, every client must start TLS before anything else.
    pub(crate) tls: Option<TlsCreds>,
}

/// An accepted client on its way to the context that serves it ([`serve`](crate::serve)).
/// Dropped unserved (its context gone), it leaves the server's clients and its socket closes.
#[derive(Debug)]
pub struct Accepted {
    inner: Option<(Stream, Arc<Shared>, u64)>,
}

impl Accepted {
    /// The socket, what the server's connections share, and the client's id.
    pub(crate) fn take(mut self) -> (Stream, Arc<Shared>, u64) {
        self.inner.take().expect("taken once, by value")
    }
}

impl Drop for Accepted {
    fn drop(&mut self) {
        if let Some((_, shared, id)) = self.inner.take() {
            shared.clients.leave(id);
        }
    }
}

/// Where accepted clients go.
type Dispatch = Box<dyn Fn(Accepted)>;

enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

/// A listening NBD server. Lives on its control loop's thread.
pub struct NbdServer {
    listener: Listener,
    addr: ListenAddr,
    shared: Arc<Shared>,
    max_connections: Option<u32>,
    dispatch: RefCell<Option<Dispatch>>,
}

impl std::fmt::Debug for NbdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl NbdServer {
    /// Binds `addr` for `exports`; `max_connections`: at most that many clients at once
    /// (more are closed as they come).
    pub fn bind(
        addr: &ListenAddr,
        exports: ExportSet,
        limits: Limits,
        max_connections: Option<u32>,
    ) -> io::Result<Rc<Self>> {
        Self::bind_tls(addr, exports, limits, max_connections, None)
    }

    /// [`bind`](Self::bind), requiring TLS with `tls` when given (QEMU's `tls-creds`): a
    /// client is refused every option but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT` until its
    /// session is encrypted.
    pub fn bind_tls(
        addr: &ListenAddr,
        exports: ExportSet,
        limits: Limits,
        max_connections: Option<u32>,
        tls: Option<TlsCreds>,
    ) -> io::Result<Rc<Self>> {
        let listener = match addr {
            ListenAddr::Unix(path) => {
                if std::fs::symlink_metadata(path)
                    .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
                {
                    std::fs::remove_file(path)?;
                }
                let l = UnixListener::bind(path)?;
                l.set_nonblocking(true)?;
                Listener::Unix(l, path.clone())
            }
            ListenAddr::Inet { host, port } => {
                let l = TcpListener::bind((host.as_str(), *port))?;
                l.set_nonblocking(true)?;
                Listener::Tcp(l)
            }
        };
        Ok(Rc::new(NbdServer {
            listener,
            addr: addr.clone(),
            shared: Arc::new(Shared {
                exports,
                limits,
                clients: Clients::default(),
                tls,
            }),
            max_connections,
            dispatch: RefCell::new(None),
        }))
    }

    /// Accepts clients on `ctx` and hands each to `dispatch`, which sends it to the context
    /// that serves it (or calls [`serve`](crate::serve) on `ctx` itself).
    pub fn listen<L: EventLoop + 'static>(
        self: &Rc<Self>,
        ctx: &AioContext<L>,
        dispatch: impl Fn(Accepted) + 'static,
    ) -> io::Result<()> {
        *self.dispatch.borrow_mut() = Some(Box::new(dispatch));
        let me = Rc::downgrade(self);
        let handler = FdHandler::new().on_read(move |_| {
            if let Some(me) = me.upgrade() {
                me.accept_all();
            }
        });
        ctx.set_fd_handler(self.fd(), handler)
            .map_err(io::Error::from)
    }

    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        match &self.listener {
            Listener::Unix(l, _) => l.as_fd(),
            Listener::Tcp(l) => l.as_fd(),
        }
    }

    fn accept_all(&self) {
        loop {
            let stream = match &self.listener {
                Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
                Listener::Tcp(l) => l.accept().map(|(s, _)| Stream::Tcp(s)),
            };
            let stream = match stream {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Would block, or out of fds (the next readiness retries).
                Err(_) => return,
            };
            let Ok(second) = stream.try_clone() else {
                continue;
            };
            if stream.prepare().is_err() {
                continue;
            }
            // Over `max-connections`: closed as it comes.
            let Some(id) = self.shared.clients.join(second, self.max_connections) else {
                continue;
            };
            let accepted = Accepted {
                inner: Some((stream, self.shared.clone(), id)),
            };
            if let Some(dispatch) = self.dispatch.borrow().as_ref() {
                dispatch(accepted);
            }
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> &ListenAddr {
        &self.addr
    }

    /// The TCP port bound (the one chosen for port 0); None for a Unix socket.
    pub fn local_port(&self) -> Option<u16> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr().ok().map(|a| a.port()),
            Listener::Unix(..) => None,
        }
    }

    /// The exports offered (add and remove them while it runs).
    pub fn exports(&self) -> &ExportSet {
        &self.shared.exports
    }

    /// Its clients.
    pub fn clients(&self) -> &Clients {
        &self.shared.clients
    }

    /// Stops accepting (the Unix socket is removed) and shuts every client down; each ends
    /// once its requests in flight have. Wait for them with [`Clients::wait_gone`] from
    /// another thread, or run the loop that serves them until [`Clients::count`] is 0.
    pub fn stop<L: EventLoop + 'static>(&self, ctx: &AioContext<L>) {
        let _ = ctx.remove_fd_handler(self.fd());
        self.dispatch.borrow_mut().take();
        if let Listener::Unix(_, path) = &self.listener {
            let _ = std::fs::remove_file(path);
        }
        self.shared.clients.shut_down(None);
    }
}
