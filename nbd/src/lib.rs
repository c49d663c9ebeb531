//! An NBD server on aio-rs: each client a socket on an `AioContext` (an iothread's, no
//! thread per connection), its requests on the block layer's request path
//! ([`aio_block::ImageQueue`]) with that context's engine, its replies sent as they
//! complete, in any order.
//!
//! The contract:
//!
//! * **The protocol** is the NBD project's `doc/proto.md`, fixed newstyle: `NBD_OPT_GO`,
//!   `NBD_OPT_INFO` (block sizes, description), `NBD_OPT_EXPORT_NAME`, `NBD_OPT_LIST`,
//!   `NBD_OPT_ABORT`, `NBD_OPT_STRUCTURED_REPLY`, `NBD_OPT_EXTENDED_HEADERS`,
//!   `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT` with `base:allocation`,
//!   `qemu:allocation-depth` and `qemu:dirty-bitmap:NAME` ([`meta`]: QEMU's names, ids and
//!   query rules);
//!   commands `READ`, `WRITE` (FUA), `FLUSH`, `TRIM`, `WRITE_ZEROES` (`NO_HOLE`,
//!   `FAST_ZERO`), `CACHE`, `BLOCK_STATUS` (`REQ_ONE`), `DISC`.
//! * **Bad input is answered, never a panic**: a malformed option gets `NBD_REP_ERR_*` and
//!   the handshake goes on; a bad request gets `EINVAL`, `ENOSPC`, `EPERM` or `ENOTSUP` and
//!   the connection goes on; only a client out of step (a bad magic) is disconnected.
//! * **Bounded**: a handshake deadline, at most `max_in_flight` requests and
//!   `max_held_bytes` of buffers and unsent replies per connection (past them the socket is
//!   not read), requests of at most 32 MiB (QEMU's), `max-connections` per server.
//! * **Requests are whole sectors** (the image's `O_DIRECT` alignment, at least 512 bytes,
//!   told as `NBD_INFO_BLOCK_SIZE`'s minimum); others are refused with `EINVAL`.
//! * **Ending drains**: a client that sends `NBD_CMD_DISC` or closes its end gets the
//!   replies of the requests it sent; a server that stops (or removes an export) shuts its
//!   clients' sockets down and they end once their requests have.
//!
//! * **TLS** with QEMU's x509 credentials ([`TlsCreds`], [`NbdServer::bind_tls`]): every
//!   option before `NBD_OPT_STARTTLS` is refused with `NBD_REP_ERR_TLS_REQD`; client
//!   certificates are checked against the CA when asked (QEMU's `verify-peer`).
//!
//! * **Dirty bitmaps** ([`NbdExport::dirty_bitmap`], QEMU's `bitmaps=`): each served as
//!   `qemu:dirty-bitmap:NAME`, its extents dirty (`NBD_STATE_DIRTY`, 1) or clean, in 32-bit
//!   or 64-bit (extended headers) block status chunks; the caller holds the bitmap busy
//!   while it is offered.
//!
//! `examples/serve_image.rs` serves an image on one thread; the daemon
//! (`aio-storage-daemon --nbd-server`) serves exports on its iothreads. In short:
//!
//! ```no_run
//! # use std::rc::Rc;
//! # use std::sync::Arc;
//! # use aio::{AioContext, Choice, EngineKind, EngineOptions, MonitorKind};
//! # use aio_block::{format::ImageFormat, Image, ImageOptions};
//! use aio_nbd::{ExportSet, Limits, ListenAddr, NbdExport, NbdServer};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let image = Arc::new(Image::open("disk.img".as_ref(), ImageOptions::new(ImageFormat::Raw))?);
//! let exports = ExportSet::new();
//! exports.insert(NbdExport::new("disk", image)?.writable(true)?)?;
//! let ctx = Rc::new(AioContext::new(Choice::<MonitorKind>::Auto.build()?.built)?);
//! let engine = Choice::<EngineKind>::Auto.build(&EngineOptions::default())?.built;
//! let engine = ctx.attach_engine(engine, |_, _| {})?;
//! let addr = ListenAddr::Unix("/tmp/nbd.sock".into());
//! let server = NbdServer::bind(&addr, exports, Limits::default(), None)?;
//! let on = ctx.clone();
//! server.listen(&ctx, move |client| {
//!     let _ = aio_nbd::serve(&on, engine.clone(), client);
//! })?;
//! loop {
//!     ctx.poll(true);
//! }
//! # }
//! ```

mod connection;
pub mod export;
pub mod meta;
// The wire's pieces the connection is made of: public only for the fuzz target (`nbd/fuzz`,
// feature `fuzzing`), which drives them without a socket. `proto` (the wire's numbers) is
// public API: clients and tests of NBD servers name its constants.
#[cfg(feature = "fuzzing")]
pub mod negotiate;
#[cfg(not(feature = "fuzzing"))]
mod negotiate;
pub mod proto;
#[cfg(feature = "fuzzing")]
pub mod reply;
#[cfg(not(feature = "fuzzing"))]
mod reply;
#[cfg(feature = "fuzzing")]
pub mod request;
#[cfg(not(feature = "fuzzing"))]
mod request;
mod server;
mod stream;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tls;

pub use connection::serve;
pub use export::{ExportError, ExportSet, NbdExport};
pub use server::{Accepted, Clients, Limits, ListenAddr, NbdServer};
pub use tls::{TlsCreds, TlsError};
