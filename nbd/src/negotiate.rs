//! The handshake, without I/O: what the server says first, and its answer to each option a
//! client sends, until the client chooses an export, aborts, or breaks the protocol.
//!
//! This module owns the option parsers and the negotiated state (reply style, metadata
//! contexts, TLS); it never touches a socket, so that tests and the fuzz target drive it
//! with bytes. The connection reads whole options (`NBD_OPT_*` header and payload) and
//! writes what [`Negotiation::option`] puts in `out`.
//!
//! * An option's payload is parsed in full and must end where its length says: a short or
//!   long one is `NBD_REP_ERR_INVALID`, and the session goes on.
//! * Nothing a client sends panics: every read is through [`Wire`], which refuses to pass a
//!   message's end.
//! * A server that requires TLS answers every option before `NBD_OPT_STARTTLS` with
//!   `NBD_REP_ERR_TLS_REQD` (`NBD_OPT_ABORT` ends the session; `NBD_OPT_EXPORT_NAME`, which
//!   cannot be answered with an error, ends the connection).

use std::sync::Arc;

use crate::export::{ExportSet, NbdExport};
pub use crate::meta::MetaContexts;
use crate::proto::{info, opt, rep, Truncated, Wire, MAX_STRING};
use crate::proto::{FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, FLAG_NO_ZEROES};
use crate::proto::{NBD_MAGIC, OPTS_MAGIC, REP_MAGIC};

/// How replies are framed, as negotiated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ReplyStyle {
    /// Simple replies only.
    Simple,
    /// Structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    Structured,
    /// Extended headers (`NBD_OPT_EXTENDED_HEADERS`): 64-bit requests and replies, every
    /// reply structured.
    Extended,
}

/// Where the TLS upgrade stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tls {
    /// The server offers no TLS: `NBD_OPT_STARTTLS` is refused by policy.
    Off,
    /// The server requires TLS and the client has not started it yet.
    Required,
    /// The session is encrypted.
    Active,
}

/// Why the connection ends during the handshake.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NegotiationError {
    /// Client flags the server does not know.
    #[error("unknown client flags {0:#x}")]
    ClientFlags(u32),
    /// An option header without `IHAVEOPT`.
    #[error("bad option magic {0:#x}")]
    Magic(u64),
    /// An option only fixed newstyle allows, from a client that did not ask for it.
    #[error("option {0} from a client without fixed newstyle")]
    NotFixed(u32),
    /// `NBD_OPT_EXPORT_NAME` for an export that is not offered (it cannot be told).
    #[error("NBD_OPT_EXPORT_NAME: no export named '{0}'")]
    UnknownExport(String),
    /// `NBD_OPT_EXPORT_NAME` before TLS on a server that requires it.
    #[error("NBD_OPT_EXPORT_NAME before TLS")]
    TlsRequired,
    /// `NBD_OPT_STARTTLS` with a payload, which QEMU also drops.
    #[error("NBD_OPT_STARTTLS with a payload")]
    BadStartTls,
}

/// What the connection does after an option.
#[derive(Debug)]
pub enum Step {
    /// Wait for the next option.
    Next,
    /// Write `out`, then serve `export` (transmission starts).
    Transmit(Arc<NbdExport>),
    /// Write `out`, then start TLS as the server.
    StartTls,
    /// Write `out` (if it can), then close: the client aborted.
    Abort,
    /// Close at once: the client broke the protocol.
    Close(NegotiationError),
}

/// One connection's handshake.
#[derive(Debug)]
pub struct Negotiation {
    fixed: bool,
    no_zeroes: bool,
    style: ReplyStyle,
    tls: Tls,
    meta: MetaContexts,
}

/// The server's first 18 bytes: `NBDMAGIC`, `IHAVEOPT`, its handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut g = [0; 18];
    g[..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    g[8..16].copy_from_slice(&OPTS_MAGIC.to_be_bytes());
    g[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    g
}

/// An option's 16-byte header: the option and its payload's length.
pub fn option_header(bytes: &[u8; 16]) -> Result<(u32, u32), NegotiationError> {
    let mut w = Wire::new(bytes);
    let magic = w.u64("magic").unwrap_or_default();
    if magic != OPTS_MAGIC {
        return Err(NegotiationError::Magic(magic));
    }
    let option = w.u32("option").unwrap_or_default();
    Ok((option, w.u32("length").unwrap_or_default()))
}

/// Appends an option reply of `kind` to `option` with `payload`.
fn reply(out: &mut Vec<u8>, option: u32, kind: u32, payload: &[u8]) {
    out.extend_from_slice(&REP_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A string field: a 32-bit length, then that many bytes of UTF-8 without NUL.
fn string<'a>(w: &mut Wire<'a>, what: &'static str) -> Result<&'a str, Invalid> {
    let len = w.u32(what)? as usize;
    if len > MAX_STRING {
        return Err(Invalid::new(format!(
            "{what} longer than {MAX_STRING} bytes"
        )));
    }
    let bytes = w.bytes(len, what)?;
    let s = std::str::from_utf8(bytes).map_err(|_| Invalid::new(format!("{what} is not UTF-8")))?;
    if s.contains('\0') {
        return Err(Invalid::new(format!("{what} contains NUL")));
    }
    Ok(s)
}

/// An option the server answers with an error and goes on.
#[derive(Debug)]
struct Invalid {
    kind: u32,
    message: String,
}

impl Invalid {
    fn new(message: String) -> Self {
        Invalid {
            kind: rep::ERR_INVALID,
            message,
        }
    }

    fn of(kind: u32, message: impl Into<String>) -> Self {
        Invalid {
            kind,
            message: message.into(),
        }
    }
}

impl From<Truncated> for Invalid {
    fn from(t: Truncated) -> Self {
        Invalid::new(format!("option too short: {t}"))
    }
}

impl Negotiation {
    /// A handshake whose server requires TLS (`tls_required`) or offers none.
    pub fn new(tls_required: bool) -> Self {
        Negotiation {
            fixed: false,
            no_zeroes: false,
            style: ReplyStyle::Simple,
            tls: if tls_required {
                Tls::Required
            } else {
                Tls::Off
            },
            meta: MetaContexts::default(),
        }
    }

    /// The client's 4-byte flags, read after the greeting.
    pub fn client_flags(&mut self, flags: u32) -> Result<(), NegotiationError> {
        if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            return Err(NegotiationError::ClientFlags(flags));
        }
        self.fixed = flags & FLAG_C_FIXED_NEWSTYLE != 0;
        self.no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
        Ok(())
    }

    /// The reply style negotiated so far.
    pub fn style(&self) -> ReplyStyle {
        self.style
    }

    /// The metadata contexts chosen (valid for the export named in them).
    pub fn meta(&self) -> &MetaContexts {
        &self.meta
    }

    /// TLS is now running on the connection.
    pub fn tls_started(&mut self) {
        self.tls = Tls::Active;
    }

    /// The answer to an option whose payload was too long to read (the connection skipped
    /// it): `NBD_REP_ERR_TOO_BIG`.
    pub fn oversized(&mut self, option: u32, out: &mut Vec<u8>) -> Step {
        if option == opt::EXPORT_NAME {
            return Step::Close(NegotiationError::UnknownExport("(too long)".into()));
        }
        reply(out, option, rep::ERR_TOO_BIG, b"option payload too long");
        Step::Next
    }

    /// The answer to `option` with `payload`, appended to `out`.
    pub fn option(
        &mut self,
        option: u32,
        payload: &[u8],
        exports: &ExportSet,
        out: &mut Vec<u8>,
    ) -> Step {
        if !self.fixed && option != opt::EXPORT_NAME {
            return Step::Close(NegotiationError::NotFixed(option));
        }
        if self.tls == Tls::Required {
            return match option {
                opt::STARTTLS if !payload.is_empty() => Step::Close(NegotiationError::BadStartTls),
                opt::STARTTLS => {
                    reply(out, option, rep::ACK, &[]);
                    Step::StartTls
                }
                opt::EXPORT_NAME => Step::Close(NegotiationError::TlsRequired),
                _ => {
                    let msg = format!("option {option} not permitted before TLS");
                    reply(out, option, rep::ERR_TLS_REQD, msg.as_bytes());
                    if option == opt::ABORT {
                        Step::Abort
                    } else {
                        Step::Next
                    }
                }
            };
        }
        match self.answer(option, payload, exports, out) {
            Ok(step) => step,
            Err(e) => {
                reply(out, option, e.kind, e.message.as_bytes());
                Step::Next
            }
        }
    }

    fn answer(
        &mut self,
        option: u32,
        payload: &[u8],
        exports: &ExportSet,
        out: &mut Vec<u8>,
    ) -> Result<Step, Invalid> {
        let empty = || {
            if payload.is_empty() {
                Ok(())
            } else {
                Err(Invalid::new(format!("option {option} takes no payload")))
            }
        };
        match option {
            opt::EXPORT_NAME => Ok(self.export_name(payload, exports, out)),
            opt::ABORT => {
                reply(out, option, rep::ACK, &[]);
                Ok(Step::Abort)
            }
            opt::LIST => {
                empty()?;
                for e in exports.list() {
                    let name = e.name().as_bytes();
                    let mut p = (name.len() as u32).to_be_bytes().to_vec();
                    p.extend_from_slice(name);
                    p.extend_from_slice(e.description_text().unwrap_or("").as_bytes());
                    reply(out, option, rep::SERVER, &p);
                }
                reply(out, option, rep::ACK, &[]);
                Ok(Step::Next)
            }
            opt::STARTTLS => {
                empty()?;
                if self.tls == Tls::Active {
                    Err(Invalid::new("TLS already started".into()))
                } else {
                    Err(Invalid::of(rep::ERR_POLICY, "TLS not configured"))
                }
            }
            opt::INFO | opt::GO => self.info(option, payload, exports, out),
            opt::STRUCTURED_REPLY | opt::EXTENDED_HEADERS => {
                empty()?;
                let (wanted, what) = if option == opt::STRUCTURED_REPLY {
                    (ReplyStyle::Structured, "structured replies")
                } else {
                    (ReplyStyle::Extended, "extended headers")
                };
                if self.style >= wanted {
                    return Err(Invalid::new(format!("{what} already negotiated")));
                }
                self.style = wanted;
                reply(out, option, rep::ACK, &[]);
                Ok(Step::Next)
            }
            opt::LIST_META_CONTEXT | opt::SET_META_CONTEXT => {
                self.meta_contexts(option, payload, exports, out)
            }
            _ => Err(Invalid::of(
                rep::ERR_UNSUP,
                format!("option {option} is not supported"),
            )),
        }
    }

    /// `NBD_OPT_EXPORT_NAME`: the name is the whole payload; the answer is the size and
    /// flags, and an unknown name can only close the connection.
    fn export_name(&mut self, payload: &[u8], exports: &ExportSet, out: &mut Vec<u8>) -> Step {
        let name = String::from_utf8_lossy(payload);
        let Some(export) = exports.get(&name) else {
            return Step::Close(NegotiationError::UnknownExport(name.into_owned()));
        };
        out.extend_from_slice(&export.size().to_be_bytes());
        out.extend_from_slice(
            &export
                .flags(self.style >= ReplyStyle::Structured)
                .to_be_bytes(),
        );
        if !self.no_zeroes {
            out.extend_from_slice(&[0; 124]);
        }
        self.forget_meta_unless(export.name());
        Step::Transmit(export)
    }

    /// `NBD_OPT_INFO` and `NBD_OPT_GO`.
    fn info(
        &mut self,
        option: u32,
        payload: &[u8],
        exports: &ExportSet,
        out: &mut Vec<u8>,
    ) -> Result<Step, Invalid> {
        let mut w = Wire::new(payload);
        let name = string(&mut w, "export name")?;
        let count = w.u16("information request count")?;
        let (mut send_name, mut block_size) = (false, false);
        for _ in 0..count {
            match w.u16("information request")? {
                info::NAME => send_name = true,
                info::BLOCK_SIZE => block_size = true,
                _ => {}
            }
        }
        if w.remaining() != 0 {
            return Err(Invalid::new("option longer than its fields".into()));
        }
        let export = exports.get(name).ok_or_else(|| {
            Invalid::of(
                rep::ERR_UNKNOWN,
                format!("export '{}' not present", sane(name)),
            )
        })?;
        let info_reply = |out: &mut Vec<u8>, kind: u16, body: &[u8]| {
            let mut p = kind.to_be_bytes().to_vec();
            p.extend_from_slice(body);
            reply(out, option, rep::INFO, &p);
        };
        if send_name {
            info_reply(out, info::NAME, name.as_bytes());
        }
        if let Some(d) = export.description_text() {
            info_reply(out, info::DESCRIPTION, d.as_bytes());
        }
        let sizes: Vec<u8> = export
            .block_sizes()
            .iter()
            .flat_map(|s| s.to_be_bytes())
            .collect();
        info_reply(out, info::BLOCK_SIZE, &sizes);
        let mut body = export.size().to_be_bytes().to_vec();
        body.extend_from_slice(
            &export
                .flags(self.style >= ReplyStyle::Structured)
                .to_be_bytes(),
        );
        info_reply(out, info::EXPORT, &body);
        if option == opt::INFO && !block_size {
            // As QEMU: a client that asks about an export whose requests must be aligned,
            // without asking for the alignment, is told to ask.
            return Err(Invalid::of(
                rep::ERR_BLOCK_SIZE_REQD,
                "request NBD_INFO_BLOCK_SIZE to use this export",
            ));
        }
        reply(out, option, rep::ACK, &[]);
        if option == opt::INFO {
            return Ok(Step::Next);
        }
        self.forget_meta_unless(export.name());
        Ok(Step::Transmit(export))
    }

    /// Contexts chosen for another export do not apply to this one.
    fn forget_meta_unless(&mut self, export: &str) {
        if self.meta.export != export {
            self.meta = MetaContexts::default();
        }
    }

    /// `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
    fn meta_contexts(
        &mut self,
        option: u32,
        payload: &[u8],
        exports: &ExportSet,
        out: &mut Vec<u8>,
    ) -> Result<Step, Invalid> {
        let set = option == opt::SET_META_CONTEXT;
        if set && self.style < ReplyStyle::Structured {
            return Err(Invalid::new(
                "NBD_OPT_SET_META_CONTEXT needs structured replies".into(),
            ));
        }
        if set {
            // As QEMU: a set starts from none, whatever it ends with.
            self.meta = MetaContexts::default();
        }
        let mut w = Wire::new(payload);
        let name = string(&mut w, "export name")?.to_owned();
        let count = w.u32("query count")?;
        let mut queries = Vec::new();
        for _ in 0..count {
            queries.push(string(&mut w, "query")?);
        }
        if w.remaining() != 0 {
            return Err(Invalid::new("option longer than its fields".into()));
        }
        let Some(export) = exports.get(&name) else {
            return Err(Invalid::of(
                rep::ERR_UNKNOWN,
                format!("export '{}' not present", sane(&name)),
            ));
        };
        let meta = if !set && queries.is_empty() {
            MetaContexts::all(&export)
        } else {
            let mut meta = MetaContexts::for_export(&export);
            for query in queries {
                meta.query(query, !set, &export);
            }
            meta
        };
        for (id, context) in meta.chosen(&export) {
            let id = if set { id } else { 0 };
            let mut p = id.to_be_bytes().to_vec();
            p.extend_from_slice(context.as_bytes());
            reply(out, option, rep::META_CONTEXT, &p);
        }
        reply(out, option, rep::ACK, &[]);
        if set {
            self.meta = meta;
        }
        Ok(Step::Next)
    }
}

/// A client's name, cut short for an error message (as QEMU's `nbd_sanitize_name`).
fn sane(name: &str) -> String {
    match name.char_indices().nth(80) {
        Some((at, _)) => format!("{}...", &name[..at]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::NbdExport;
    use crate::meta::BASE_ALLOCATION;
    use aio_block::{Image, ImageOptions};

    fn exports() -> ExportSet {
        let set = ExportSet::new();
        let image = Arc::new(Image::null(1 << 20, ImageOptions::default()).unwrap());
        set.insert(NbdExport::new("a", image).unwrap()).unwrap();
        set
    }

    /// The reply types in `out`, in order.
    fn kinds(out: &[u8]) -> Vec<u32> {
        let mut w = Wire::new(out);
        let mut kinds = Vec::new();
        while w.remaining() > 0 {
            w.u64("magic").unwrap();
            w.u32("option").unwrap();
            kinds.push(w.u32("type").unwrap());
            let len = w.u32("length").unwrap() as usize;
            w.bytes(len, "payload").unwrap();
        }
        kinds
    }

    #[test]
    fn options_are_answered_in_order_and_go_starts_transmission() {
        let set = exports();
        let mut n = Negotiation::new(false);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        assert!(matches!(
            n.option(opt::STRUCTURED_REPLY, &[], &set, &mut out),
            Step::Next
        ));
        let mut meta = 1u32.to_be_bytes().to_vec();
        meta.extend_from_slice(b"a");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
        meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
        n.option(opt::SET_META_CONTEXT, &meta, &set, &mut out);
        assert!(n.meta().base_allocation);
        let go = [0, 0, 0, 1, b'a', 0, 1, 0, 3];
        assert!(matches!(
            n.option(opt::GO, &go, &set, &mut out),
            Step::Transmit(_)
        ));
        assert_eq!(
            kinds(&out),
            [
                rep::ACK,
                rep::META_CONTEXT,
                rep::ACK,
                rep::INFO,
                rep::INFO,
                rep::ACK
            ]
        );
        assert_eq!(n.style(), ReplyStyle::Structured);
    }

    #[test]
    fn a_server_that_requires_tls_refuses_everything_before_it() {
        let set = exports();
        let mut n = Negotiation::new(true);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        assert!(matches!(
            n.option(opt::LIST, &[], &set, &mut out),
            Step::Next
        ));
        assert_eq!(kinds(&out), [rep::ERR_TLS_REQD]);
        assert!(matches!(
            n.option(opt::EXPORT_NAME, b"a", &set, &mut out),
            Step::Close(_)
        ));
        assert!(matches!(
            n.option(opt::STARTTLS, &[], &set, &mut out),
            Step::StartTls
        ));
        // Once it runs, a second STARTTLS is refused and everything else answered.
        n.tls_started();
        out.clear();
        n.option(opt::STARTTLS, &[], &set, &mut out);
        n.option(opt::LIST, &[], &set, &mut out);
        assert_eq!(kinds(&out), [rep::ERR_INVALID, rep::SERVER, rep::ACK]);
    }
}
