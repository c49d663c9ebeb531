//! QMP, QEMU's machine protocol, on the daemon's monitors (`--chardev
//! socket,...,server=on,wait=off`, a client socket or `stdio`, with `--monitor chardev=...`), so that QEMU's own client (the
//! `qemu.qmp` Python library, `qmp-shell`) and tools written for qemu-storage-daemon drive
//! this daemon.
//!
//! - The wire is QEMU's: a greeting on connect, `qmp_capabilities` before anything else,
//!   `execute` / `arguments` / `id` answered by `return` or `error` (QEMU's error classes and
//!   texts), the `id` echoed, events (`BLOCK_EXPORT_DELETED`) to every client past
//!   negotiation.
//! - Commands (QEMU's names for commands, arguments and results): `query-version`,
//!   `query-commands`, `query-iothreads`, `qom-get` / `qom-set` of an iothread's polling
//!   parameters (applied at once), `query-named-block-nodes` (each node's `active`),
//!   `query-block-exports`, `blockdev-set-active` (a migration's handover, `active`'s),
//!   `blockdev-add`, `blockdev-del`, `block-export-add` (served at once, beside the others;
//!   an NBD export's dirty bitmaps held busy while it serves them), `nbd-server-start`,
//!   `-stop` and the deprecated `nbd-server-add` (`nbd`'s),
//!   `block-export-del` (refused while a client is connected unless `mode=hard`, which
//!   disconnects it once its requests completed), `query-blockstats`,
//!   `block-latency-histogram-set`, `block_resize` (the
//!   guest told through vhost-user's config-change message), `object-add` / `object-del` of
//!   iothreads, the `block-dirty-bitmap-*` commands (`bitmaps`') and `transaction` of them,
//!   all or nothing (`transaction`'s), `blockdev-create` as a job (`create`'s) and the job
//!   commands (`query-jobs`, `job-*`, `query-block-jobs`: `jobs`'), `quit` (the daemon stops
//!   as on SIGTERM, with no `SHUTDOWN` event: qemu-storage-daemon sends none).
//! - A bad client cannot stop the daemon or its disks: malformed JSON, a message that is not
//!   an object, unknown commands and wrong argument types get QEMU's error replies; a message
//!   over 1 MiB, or a client that leaves more than 1 MiB of replies unread, is disconnected;
//!   any number of clients may connect, and one leaving mid-command changes nothing.
//!
//! This module owns the monitor sockets and their connections on the daemon's control loop
//! (non-blocking reads and writes: a client that does not read never blocks the loop); the
//! wire format is `wire`'s, the commands `commands`' (resizing `resize`'s, iothread objects
//! `iothreads`', statistics `stats`').

mod active;
mod backup;
mod bitmaps;
mod commands;
mod create;
mod iothreads;
mod jobs;
mod nbd;
mod nodes;
mod registry;
mod resize;
mod staged;
mod stats;
mod transaction;
mod wire;

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::rc::Rc;

use serde_json::Value;

use aio::{Choice, EngineKind};
use aio_core::EventLoop;
use aio_loop::{AioContext, FdHandler};

use crate::blockdev::Graph;
use crate::daemon::{Control, Event};
use crate::qsd::Chardev;
use commands::State;
use wire::{QmpError, Splitter, MAX_MESSAGE};

type Ctx = AioContext<Box<dyn EventLoop>>;

/// The monitor: its sockets' listeners, its clients and the commands' state.
pub struct Monitor {
    listeners: Vec<(UnixListener, PathBuf)>,
    clients: RefCell<Vec<Rc<Client>>>,
    state: RefCell<State>,
}

/// What a client's messages come in on and its replies go out on.
enum Conn {
    /// A socket: accepted on a listening chardev, or connected to a listening client.
    Socket(UnixStream),
    /// The daemon's standard input (non-blocking) and output (blocking: a reply is written
    /// whole, as QEMU's stdio chardev writes it).
    Stdio { input: File, output: File },
}

impl Conn {
    /// The standard input and output, as a client's connection.
    fn stdio() -> io::Result<Conn> {
        let input = File::from(io::stdin().as_fd().try_clone_to_owned()?);
        let output = File::from(io::stdout().as_fd().try_clone_to_owned()?);
        set_nonblocking(input.as_fd())?;
        Ok(Conn::Stdio { input, output })
    }

    fn input(&self) -> BorrowedFd<'_> {
        match self {
            Conn::Socket(s) => s.as_fd(),
            Conn::Stdio { input, .. } => input.as_fd(),
        }
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Socket(s) => (&*s).read(buf),
            Conn::Stdio { input, .. } => (&*input).read(buf),
        }
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Socket(s) => (&*s).write(buf),
            Conn::Stdio { output, .. } => (&*output).write(buf),
        }
    }

    /// Whether replies may wait for the connection to take them (a write handler); the
    /// standard output is written whole instead.
    fn buffers_output(&self) -> bool {
        matches!(self, Conn::Socket(_))
    }

    fn shutdown(&self) {
        if let Conn::Socket(s) = self {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Sets `O_NONBLOCK` on `fd`'s open file description.
fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL reads the status flags of a descriptor the borrow keeps open; no memory
    // is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above, F_SETFL sets them.
    let set = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
    if set < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` is a regular file (which an fd monitor cannot watch: it is always readable).
fn is_regular_file(fd: BorrowedFd<'_>) -> bool {
    fd.try_clone_to_owned()
        .and_then(|fd| File::from(fd).metadata())
        .is_ok_and(|m| m.is_file())
}

/// One connected client.
struct Client {
    conn: Conn,
    input: RefCell<Splitter>,
    output: RefCell<Vec<u8>>,
    negotiated: Cell<bool>,
    /// Whether its handler is registered on the loop (then updated, not set).
    watched: Cell<bool>,
    closed: Cell<bool>,
}

impl Monitor {
    /// Serves QMP on each of `chardevs` on `control`'s loop (a listening socket replaces a
    /// stale socket file; a client socket is connected to now), over the command line's
    /// `graph` (its exports served, in order, as the disks numbered from 0) and the daemon's
    /// `engine`.
    pub(crate) fn serve(
        control: &Control,
        chardevs: &[Chardev],
        graph: Graph,
        engine: Choice<EngineKind>,
    ) -> io::Result<Rc<Monitor>> {
        let thread_ids = control
            .iothreads
            .handles()
            .iter()
            .map(|t| t.call(|_, _| iothreads::gettid()).unwrap_or(0))
            .collect();
        let state = State {
            graph,
            exports: control.exports.clone(),
            iothreads: control.iothreads.clone(),
            engine: match engine {
                Choice::Named(kind) => Some(kind),
                Choice::Auto => None,
            },
            thread_ids,
            stop: control.stop.clone(),
            nbd: control.nbd.clone(),
            events: control.events.clone(),
            nodes: control.nodes.clone(),
            jobs: crate::job::Jobs::new(control.events.clone()),
        };
        // The command line's qcow2 and null nodes hold their images, as `blockdev-add`'s do.
        state.hold_opened_nodes().map_err(|(name, e)| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("--blockdev node-name={name}: {}", e.desc),
            )
        })?;
        let mut listeners = Vec::new();
        let mut connected = Vec::new();
        for chardev in chardevs {
            match chardev {
                Chardev::Listen(path) => {
                    let _ = std::fs::remove_file(path);
                    let listener = UnixListener::bind(path)?;
                    listener.set_nonblocking(true)?;
                    listeners.push((listener, path.clone()));
                }
                Chardev::Connect(path) => {
                    let stream = UnixStream::connect(path).map_err(|e| {
                        io::Error::new(
                            e.kind(),
                            format!("Failed to connect to '{}': {e}", path.display()),
                        )
                    })?;
                    stream.set_nonblocking(true)?;
                    connected.push(Conn::Socket(stream));
                }
                Chardev::Stdio => connected.push(Conn::stdio()?),
            }
        }
        let monitor = Rc::new(Monitor {
            listeners,
            clients: RefCell::new(Vec::new()),
            state: RefCell::new(state),
        });
        // Events any module sends reach every client, on this loop. (A weak reference: the
        // monitor lives as long as its handlers on the loop.)
        let weak = Rc::downgrade(&monitor);
        control.events.attach(control.ctx, move |event| {
            if let Some(m) = weak.upgrade() {
                m.broadcast(event);
            }
        });
        for (i, (listener, _)) in monitor.listeners.iter().enumerate() {
            let m = monitor.clone();
            control
                .ctx
                .set_fd_handler(
                    listener.as_fd(),
                    FdHandler::new().on_read(move |ctx| m.accept(ctx, i)),
                )
                .map_err(io::Error::from)?;
        }
        for conn in connected {
            monitor.add_client(control.ctx, conn);
        }
        Ok(monitor)
    }

    /// Greets a new client and watches its input. Input from a regular file (`stdio` given
    /// `< commands`), which no fd monitor watches, is read whole now.
    fn add_client(self: &Rc<Self>, ctx: &Ctx, conn: Conn) {
        let from_file = is_regular_file(conn.input());
        let client = Rc::new(Client {
            conn,
            input: RefCell::default(),
            output: RefCell::default(),
            negotiated: Cell::new(false),
            watched: Cell::new(false),
            closed: Cell::new(false),
        });
        self.clients.borrow_mut().push(client.clone());
        client.send(&wire::greeting());
        client.flush();
        if from_file {
            self.on_readable(ctx, &client);
        } else {
            self.watch(ctx, &client);
        }
    }

    fn accept(self: &Rc<Self>, ctx: &Ctx, i: usize) {
        while let Ok((stream, _)) = self.listeners[i].0.accept() {
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            self.add_client(ctx, Conn::Socket(stream));
        }
    }

    /// (Re)sets the client's handlers: reading always, writing while replies wait.
    fn watch(self: &Rc<Self>, ctx: &Ctx, client: &Rc<Client>) {
        if client.closed.get() {
            return;
        }
        let (m, c) = (self.clone(), client.clone());
        let mut handler = FdHandler::new().on_read(move |ctx| m.on_readable(ctx, &c));
        if client.conn.buffers_output() && !client.output.borrow().is_empty() {
            let (m, c) = (self.clone(), client.clone());
            handler = handler.on_write(move |ctx| {
                c.flush();
                m.watch(ctx, &c);
            });
        }
        let fd = client.conn.input();
        let done = if client.watched.replace(true) {
            ctx.update_fd_handler(fd, handler)
        } else {
            ctx.set_fd_handler(fd, handler)
        };
        if done.is_err() {
            self.drop_client(ctx, client);
        }
    }

    fn on_readable(self: &Rc<Self>, ctx: &Ctx, client: &Rc<Client>) {
        let mut buf = [0u8; 16 << 10];
        let mut gone = false;
        loop {
            match client.conn.read(&mut buf) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(n) => {
                    client.input.borrow_mut().push(&buf[..n]);
                    // A client that never stops sending does not hold the loop.
                    if client.input.borrow().pending() > MAX_MESSAGE {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        loop {
            let next = client.input.borrow_mut().next_value();
            match next {
                None => break,
                Some(Ok(message)) => self.handle(ctx, client, message),
                Some(Err(desc)) => client.send(&wire::failure(None, &QmpError::generic(desc))),
            }
        }
        if client.input.borrow().pending() > MAX_MESSAGE {
            let too_big = QmpError::generic(format!(
                "JSON parse error, message exceeds {MAX_MESSAGE} bytes"
            ));
            client.send(&wire::failure(None, &too_big));
            gone = true;
        }
        client.flush();
        if gone || client.output.borrow().len() > MAX_MESSAGE {
            self.drop_client(ctx, client);
        } else {
            self.watch(ctx, client);
        }
    }

    fn handle(self: &Rc<Self>, ctx: &Ctx, client: &Rc<Client>, message: Value) {
        let request = match wire::request(message) {
            Ok(r) => r,
            Err((id, error)) => return client.send(&wire::failure(id, &error)),
        };
        let id = request.id.clone();
        if !client.negotiated.get() {
            let reply = if request.execute == "qmp_capabilities" {
                match wire::Args::new(request.arguments).capabilities() {
                    Ok(()) => {
                        client.negotiated.set(true);
                        wire::success(id, Value::Object(Default::default()))
                    }
                    Err(e) => wire::failure(id, &e),
                }
            } else {
                let e = QmpError::command_not_found(
                    "Expecting capabilities negotiation with 'qmp_capabilities'",
                );
                wire::failure(id, &e)
            };
            return client.send(&reply);
        }
        let result = registry::execute(&mut self.state.borrow_mut(), ctx, request);
        client.send(&match result {
            Ok(value) => wire::success(id, value),
            Err(e) => wire::failure(id, &e),
        });
    }

    /// Sends `event` to every client past negotiation.
    fn broadcast(&self, event: &Event) {
        let message = event.to_json();
        let clients = self.clients.borrow().clone();
        for c in clients.iter().filter(|c| c.negotiated.get()) {
            c.send(&message);
            c.flush();
        }
    }

    fn drop_client(&self, ctx: &Ctx, client: &Rc<Client>) {
        client.close(ctx);
        self.clients.borrow_mut().retain(|c| !Rc::ptr_eq(c, client));
    }
}

impl Drop for Monitor {
    /// The control loop ended (its handlers, which hold the monitor, went with it): the
    /// socket files go too.
    fn drop(&mut self) {
        for (_, path) in &self.listeners {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Client {
    /// Queues `message` (one JSON object and a newline) for the client.
    fn send(&self, message: &Value) {
        let mut out = self.output.borrow_mut();
        let _ = serde_json::to_writer(&mut *out, message);
        out.extend_from_slice(b"\r\n");
    }

    /// Writes what the socket takes now.
    fn flush(&self) {
        let mut out = self.output.borrow_mut();
        while !out.is_empty() {
            match self.conn.write(&out) {
                Ok(0) => break,
                Ok(n) => {
                    out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    fn close(&self, ctx: &Ctx) {
        if !self.closed.replace(true) {
            if self.watched.get() {
                let _ = ctx.remove_fd_handler(self.conn.input());
            }
            self.conn.shutdown();
        }
    }
}
