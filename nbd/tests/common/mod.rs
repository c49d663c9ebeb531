//! What the NBD server's integration tests share: a server on a thread of its own, a raw
//! protocol client for what no real client sends, and the client tools run to completion.
// Each test file uses part of it.
#![allow(dead_code, unused_imports)]

use std::path::PathBuf;

use aio::{Choice, EngineKind, EngineOptions};
#[allow(unused_imports)] // hostile.rs uses it, clients.rs does not
pub use aio_nbd::testing::Raw;
use aio_nbd::{Clients, ExportSet, Limits, ListenAddr, NbdServer, TlsCreds};
use aio_test_support::loop_thread::LoopThread;

/// A server serving `exports` on a thread of its own, on a Unix socket in a temporary
/// directory; stopped (clients drained) when dropped.
pub struct TestServer {
    pub socket: PathBuf,
    /// The TCP port, for a server started with [`TestServer::start_tcp`].
    pub port: Option<u16>,
    pub clients: Clients,
    /// Dropped before the directory: the server stops before its socket goes.
    _loop: LoopThread,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// Serves `exports` with `limits`, at most `max_connections` clients.
    pub fn start(exports: ExportSet, limits: Limits, max_connections: Option<u32>) -> Self {
        Self::launch(exports, limits, max_connections, None)
    }

    /// Serves `exports` requiring TLS with `creds`.
    pub fn start_tls(exports: ExportSet, limits: Limits, creds: TlsCreds) -> Self {
        Self::launch(exports, limits, None, Some(creds))
    }

    /// Serves `exports` on a free TCP port of 127.0.0.1.
    pub fn start_tcp(exports: ExportSet) -> Self {
        let addr = ListenAddr::Inet {
            host: "127.0.0.1".into(),
            port: 0,
        };
        Self::launch_at(Some(addr), exports, Limits::default(), None, None)
    }

    fn launch(
        exports: ExportSet,
        limits: Limits,
        max_connections: Option<u32>,
        tls: Option<TlsCreds>,
    ) -> Self {
        Self::launch_at(None, exports, limits, max_connections, tls)
    }

    fn launch_at(
        tcp: Option<ListenAddr>,
        exports: ExportSet,
        limits: Limits,
        max_connections: Option<u32>,
        tls: Option<TlsCreds>,
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nbd.sock");
        let addr = tcp.unwrap_or_else(|| ListenAddr::Unix(socket.clone()));
        let (thread, (clients, port)) = LoopThread::start(
            "nbd-server",
            move |ctx| {
                let options = EngineOptions::default().with_fallback_pool(true);
                let engine = Choice::<EngineKind>::Auto.build(&options).unwrap().built;
                let engine = ctx.attach_engine(engine, |_, _| {}).unwrap();
                let server =
                    NbdServer::bind_tls(&addr, exports, limits, max_connections, tls).unwrap();
                let on = ctx.clone();
                server
                    .listen(ctx, move |client| {
                        aio_nbd::serve(&on, engine.clone(), client).unwrap();
                    })
                    .unwrap();
                ((server.clients().clone(), server.local_port()), server)
            },
            |ctx, server| {
                server.stop(ctx);
                while server.clients().count() > 0 {
                    ctx.poll(true);
                }
            },
        );
        TestServer {
            socket,
            port,
            clients,
            _loop: thread,
            _dir: dir,
        }
    }

    /// The URI of export `name`.
    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.socket.display())
    }
}

pub use aio_test_support::images::raw_image;
pub use aio_test_support::tool::{output as tool, run};

/// A directory for images, where `O_DIRECT` works.
pub fn image_dir() -> tempfile::TempDir {
    aio_test_support::images::image_dir("nbd-test")
}
