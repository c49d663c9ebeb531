//! What the NBD server's integration tests share: a server on a thread of its own, a raw
//! protocol client for what no real client sends, and the client tools run to completion.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use aio::poll::PollLoop;
use aio::{AioContext, Choice, EngineKind, EngineOptions, NotifyHandle};
use aio_nbd::proto::{self, opt};
use aio_nbd::{Clients, ExportSet, Limits, ListenAddr, NbdServer};

/// A server serving `exports` on a thread of its own, on a Unix socket in a temporary
/// directory; stopped (clients drained) when dropped.
pub struct TestServer {
    pub socket: PathBuf,
    pub clients: Clients,
    stop: Arc<AtomicBool>,
    wake: NotifyHandle,
    thread: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Serves `exports` with `limits`, at most `max_connections` clients.
    pub fn start(exports: ExportSet, limits: Limits, max_connections: Option<u32>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let addr = ListenAddr::Unix(socket.clone());
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let ctx = std::rc::Rc::new(AioContext::new(PollLoop::new()).unwrap());
            let options = EngineOptions::default().with_fallback_pool(true);
            let engine = Choice::<EngineKind>::Auto.build(&options).unwrap().built;
            let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
            let server = NbdServer::bind(&addr, exports, limits, max_connections).unwrap();
            let on = ctx.clone();
            server
                .listen(&ctx, move |client| {
                    aio_nbd::serve(&on, engine.clone(), client).unwrap();
                })
                .unwrap();
            tx.send((ctx.notify_handle(), server.clients().clone()))
                .unwrap();
            while !stopped.load(Ordering::SeqCst) {
                ctx.poll(true);
            }
            server.stop(&ctx);
            while server.clients().count() > 0 {
                ctx.poll(true);
            }
        });
        let (wake, clients) = rx.recv().unwrap();
        TestServer {
            socket,
            clients,
            stop,
            wake,
            thread: Some(thread),
            _dir: dir,
        }
    }

    /// The URI of export `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify();
        if let Some(t) = self.thread.take() {
            let panicked = t.join().is_err();
            if !std::thread::panicking() {
                assert!(!panicked, "the server's thread panicked");
            }
        }
    }
}

/// Runs `program` with `args`; its standard output. A failure is the test's, with the
/// tool's words and the package that has it.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = tool(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `program` with `args` whatever its exit status.
pub fn tool(program: &str, args: &[&str]) -> std::process::Output {
    let package = match program {
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "nbdsh" => "python3-libnbd",
        "fio" => "fio",
        _ => "qemu-utils",
    };
    // nbdsh is `python3 -m nbd` of the system's Python (python3-libnbd): run with that one,
    // whatever `python3` a user's PATH finds first.
    let mut command = match program {
        "nbdsh" if Path::new("/usr/bin/nbdsh").exists() => {
            let mut c = Command::new("/usr/bin/python3");
            c.args(["-m", "nbd"]);
            c
        }
        _ => Command::new(program),
    };
    command
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (install {package}; .ci/run does)"))
}

/// A raw NBD client over a Unix socket, for the bytes no real client sends.
pub struct Raw {
    pub stream: UnixStream,
}

impl Raw {
    /// Connects and reads the greeting (checked).
    pub fn connect(socket: &Path) -> Raw {
        let stream = UnixStream::connect(socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut raw = Raw { stream };
        let g = raw.read_exact(18);
        assert_eq!(&g[..8], &proto::NBD_MAGIC.to_be_bytes());
        assert_eq!(&g[8..16], &proto::OPTS_MAGIC.to_be_bytes());
        raw
    }

    /// Connects and sends the fixed-newstyle client flags (no zeroes).
    pub fn fixed(socket: &Path) -> Raw {
        let mut raw = Raw::connect(socket);
        raw.send(&3u32.to_be_bytes());
        raw
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    pub fn read_exact(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        self.stream.read_exact(&mut buf).unwrap();
        buf
    }

    /// Whether the server closed the connection (reads the end of the stream).
    pub fn closed(&mut self) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => return false,
            }
        }
    }

    /// Sends option `option` with `payload`.
    pub fn option(&mut self, option: u32, payload: &[u8]) {
        let mut m = proto::OPTS_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&option.to_be_bytes());
        m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        m.extend_from_slice(payload);
        self.send(&m);
    }

    /// Reads one option reply: (option, type, payload).
    pub fn option_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let h = self.read_exact(20);
        assert_eq!(&h[..8], &proto::REP_MAGIC.to_be_bytes(), "reply magic");
        let option = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        (option, kind, self.read_exact(len as usize))
    }

    /// `NBD_OPT_GO` for `name` asking for the block sizes; the export's size and flags.
    pub fn go(&mut self, name: &str) -> (u64, u16) {
        let mut p = (name.len() as u32).to_be_bytes().to_vec();
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&1u16.to_be_bytes());
        p.extend_from_slice(&proto::info::BLOCK_SIZE.to_be_bytes());
        self.option(opt::GO, &p);
        let mut export = None;
        loop {
            let (_, kind, payload) = self.option_reply();
            match kind {
                proto::rep::INFO if payload[..2] == proto::info::EXPORT.to_be_bytes() => {
                    let size = u64::from_be_bytes(payload[2..10].try_into().unwrap());
                    let flags = u16::from_be_bytes(payload[10..12].try_into().unwrap());
                    export = Some((size, flags));
                }
                proto::rep::INFO => {}
                proto::rep::ACK => return export.expect("NBD_INFO_EXPORT before the ACK"),
                other => panic!(
                    "NBD_OPT_GO answered {other:#x}: {}",
                    String::from_utf8_lossy(&payload)
                ),
            }
        }
    }

    /// Sends a compact request.
    pub fn request(&mut self, flags: u16, kind: u16, cookie: u64, offset: u64, len: u32) {
        let mut m = proto::REQUEST_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        self.send(&m);
    }

    /// Reads a simple reply: (error, cookie).
    pub fn simple_reply(&mut self) -> (u32, u64) {
        let r = self.read_exact(16);
        assert_eq!(
            &r[..4],
            &proto::SIMPLE_REPLY_MAGIC.to_be_bytes(),
            "simple reply magic"
        );
        let error = u32::from_be_bytes(r[4..8].try_into().unwrap());
        (error, u64::from_be_bytes(r[8..16].try_into().unwrap()))
    }

    /// Reads one structured reply chunk: (flags, type, cookie, payload).
    pub fn chunk(&mut self) -> (u16, u16, u64, Vec<u8>) {
        let h = self.read_exact(20);
        assert_eq!(
            &h[..4],
            &proto::STRUCTURED_REPLY_MAGIC.to_be_bytes(),
            "chunk magic"
        );
        let flags = u16::from_be_bytes(h[4..6].try_into().unwrap());
        let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        (flags, kind, cookie, self.read_exact(len as usize))
    }
}

/// A raw image of `size` bytes in a directory that has `O_DIRECT` (not tmpfs), filled with
/// `byte` over its first `filled` bytes.
pub fn raw_image(dir: &Path, name: &str, size: u64, byte: u8, filled: usize) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&vec![byte; filled]).unwrap();
    f.set_len(size).unwrap();
    path
}

/// A directory for images, where `O_DIRECT` works.
pub fn image_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("aio-nbd-test")
        .tempdir_in("/var/tmp")
        .unwrap()
}
