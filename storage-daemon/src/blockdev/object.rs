//! Objects (`--object`, `object-add`): the object types, one row each in [`OBJECT_TYPES`],
//! their options read into an [`Object`].
//!
//! This module owns the types' options; what an object does once added (an iothread started,
//! credentials kept for the NBD server) is the graph's (`super`) and the monitor's.
//! A new object type is one reader here, one [`Object`] variant and one row.

use aio_loop::PollParams;

use super::error::QsdError;
use super::keyval::Opts;
use crate::daemon::NbdTlsSpec;

/// One `--object iothread`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IoThreadObject {
    pub(crate) id: String,
    pub(crate) poll: PollParams,
    /// The number of the daemon's iothread it is (the command line's in order; one a monitor
    /// adds gets the next free number).
    pub(crate) thread: usize,
}

/// An object as read, before the graph keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Object {
    /// `qom-type=iothread` (its `thread` not yet given).
    IoThread(IoThreadObject),
    /// `qom-type=tls-creds-x509`: its id and credentials.
    TlsCredsX509(String, NbdTlsSpec),
}

impl Object {
    /// The object's `id`.
    pub(crate) fn id(&self) -> &str {
        match self {
            Object::IoThread(t) => &t.id,
            Object::TlsCredsX509(id, _) => id,
        }
    }
}

/// One object type: QEMU's `qom-type` and its reader (its `qom-type` taken).
pub(crate) struct ObjectType {
    /// QEMU's name.
    pub(crate) qom_type: &'static str,
    read: fn(&mut Opts) -> Result<Object, QsdError>,
}

/// The object types served, one row each.
pub(crate) const OBJECT_TYPES: &[ObjectType] = &[
    ObjectType {
        qom_type: "iothread",
        read: iothread,
    },
    ObjectType {
        qom_type: "tls-creds-x509",
        read: tls_creds_x509,
    },
];

impl ObjectType {
    /// The row of `qom_type`, if it is served.
    pub(crate) fn find(qom_type: &str) -> Option<&'static ObjectType> {
        OBJECT_TYPES.iter().find(|t| t.qom_type == qom_type)
    }
}

/// Reads an object's options (`qom-type` and what that type takes).
pub(crate) fn object(o: &mut Opts) -> Result<Object, QsdError> {
    let kind = o.required("qom-type")?;
    match ObjectType::find(&kind) {
        Some(t) => (t.read)(o),
        None => Err(o.not_served(format!("an object of type '{kind}'"))),
    }
}

/// `iothread`: `id`, QEMU's polling parameters.
fn iothread(o: &mut Opts) -> Result<Object, QsdError> {
    let id = o.required("id")?;
    let mut poll = PollParams::iothread();
    poll.max_ns = o.take_u64("poll-max-ns", aio_loop::DEFAULT_POLL_MAX_NS)?;
    poll.grow = o.take_u64("poll-grow", 0)?;
    poll.shrink = o.take_u64("poll-shrink", 0)?;
    Ok(Object::IoThread(IoThreadObject {
        id,
        poll,
        thread: 0,
    }))
}

/// `tls-creds-x509` (server endpoint): `id`, `dir`, `verify-peer`.
fn tls_creds_x509(o: &mut Opts) -> Result<Object, QsdError> {
    let id = o.required("id")?;
    match o.take("endpoint").as_deref() {
        Some("server") => {}
        None => return Err(o.invalid("endpoint=server is missing (QEMU's default is client)")),
        Some(other) => return Err(o.not_served(format!("endpoint={other} (server only)"))),
    }
    let dir = std::path::PathBuf::from(o.required("dir")?);
    let verify_peer = o.take_bool("verify-peer", true)?;
    if let Some(v) = o.take("priority") {
        return Err(o.not_served(format!("priority={v} (rustls's safe defaults are used)")));
    }
    Ok(Object::TlsCredsX509(id, NbdTlsSpec { dir, verify_peer }))
}
