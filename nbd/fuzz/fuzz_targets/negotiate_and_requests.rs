//! The handshake and the request checks against a hostile client: the input is a byte of
//! server mode (TLS required or not) and everything a client sends on one connection (client
//! flags, options, then request headers), fed to the
//! same parsers the server runs. Nothing may panic; every option is answered with well-formed
//! option replies; a request that passes its checks lies inside the export, within the
//! largest request, and changes nothing on a read-only export; a refusal never asks the
//! connection to skip more than the largest payload.

#![no_main]

use std::sync::{Arc, OnceLock};

use aio_block::{Image, ImageOptions};
use aio_nbd::negotiate::{self, Negotiation, ReplyStyle, Step};
use aio_nbd::proto::{self, Wire, MAX_PAYLOAD};
use aio_nbd::request::{self, Checked, Command};
use aio_nbd::{ExportSet, NbdExport};
use libfuzzer_sys::fuzz_target;

/// An export "w" (writable, 1 GiB) and an export "r" (read-only, 1 MiB + 512 bytes).
fn exports() -> &'static ExportSet {
    static SET: OnceLock<ExportSet> = OnceLock::new();
    SET.get_or_init(|| {
        let set = ExportSet::new();
        let null =
            |size, ro| Arc::new(Image::null(size, ImageOptions::default().read_only(ro)).unwrap());
        let w = NbdExport::new("w", null(1 << 30, false)).unwrap();
        set.insert(w.writable(true).unwrap()).unwrap();
        set.insert(NbdExport::new("r", null((1 << 20) + 512, true)).unwrap())
            .unwrap();
        set
    })
}

/// Every option reply in `out` has the reply magic and a length that fits.
fn well_formed(out: &[u8]) {
    let mut w = Wire::new(out);
    while w.remaining() > 0 {
        assert_eq!(w.u64("magic").unwrap(), proto::REP_MAGIC);
        w.u32("option").unwrap();
        w.u32("type").unwrap();
        let len = w.u32("length").unwrap() as usize;
        w.bytes(len, "payload").unwrap();
    }
}

fuzz_target!(|input: &[u8]| {
    let set = exports();
    // The first byte: whether the server requires TLS (bit 0); then the client's bytes.
    let Some((&mode, input)) = input.split_first() else {
        return;
    };
    let Some((flags, mut rest)) = input.split_first_chunk::<4>() else {
        return;
    };
    let mut n = Negotiation::new(mode & 1 == 1);
    if n.client_flags(u32::from_be_bytes(*flags)).is_err() {
        return;
    }
    let export = loop {
        let Some((header, after)) = rest.split_first_chunk::<16>() else {
            return;
        };
        let Ok((option, len)) = negotiate::option_header(header) else {
            return;
        };
        let len = (len as usize).min(after.len());
        let (payload, after) = after.split_at(len);
        rest = after;
        let mut out = Vec::new();
        let step = if len > 4096 && option % 2 == 0 {
            n.oversized(option, &mut out)
        } else {
            n.option(option, payload, set, &mut out)
        };
        well_formed_unless_export_name(option, &out);
        match step {
            Step::Next => {}
            Step::StartTls => n.tls_started(),
            Step::Transmit(export) => break export,
            Step::Abort | Step::Close(_) => return,
        }
    };
    let style = n.style();
    let block_status = n.meta().base_allocation && n.meta().export == export.name();
    let need = request::header_len(style);
    for header in rest.chunks_exact(need) {
        let Ok(h) = request::parse_header(header, style) else {
            continue;
        };
        let size = export.size();
        match request::check(&h, style, &export, block_status) {
            Checked::Refuse(r) => {
                assert!(r.skip <= u64::from(MAX_PAYLOAD));
                assert_ne!(r.errno, 0);
            }
            Checked::Run(c) => {
                let changes = matches!(
                    c,
                    Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. }
                );
                assert!(!changes || export.is_writable());
                let range = match c {
                    Command::Read { offset, len } | Command::Write { offset, len, .. } => {
                        assert!(len <= MAX_PAYLOAD);
                        Some((offset, u64::from(len)))
                    }
                    Command::Trim { offset, len, .. }
                    | Command::WriteZeroes { offset, len, .. }
                    | Command::BlockStatus { offset, len, .. } => Some((offset, len)),
                    _ => None,
                };
                if let Some((offset, len)) = range {
                    assert!(offset.checked_add(len).is_some_and(|end| end <= size));
                }
                if let Command::BlockStatus { .. } = c {
                    assert!(block_status);
                }
            }
        }
        if style == ReplyStyle::Extended {
            let mut out = Vec::new();
            aio_nbd::reply::error(
                &mut out,
                style,
                aio_nbd::reply::Answering {
                    cookie: h.cookie,
                    offset: h.offset,
                },
                22,
                "x",
            );
            assert_eq!(out.len(), 32 + 6 + 1);
        }
    }
});

/// `NBD_OPT_EXPORT_NAME`'s answer is the export's size and flags, not option replies.
fn well_formed_unless_export_name(option: u32, out: &[u8]) {
    if option != proto::opt::EXPORT_NAME {
        well_formed(out);
    }
}
