//! The `qemu:dirty-bitmap:NAME` metadata context: listed, chosen, and answered in block
//! status replies of both widths (32-bit `NBD_REPLY_TYPE_BLOCK_STATUS` with structured
//! replies, 64-bit `NBD_REPLY_TYPE_BLOCK_STATUS_EXT` with extended headers), to the raw
//! client, libnbd's `nbdinfo` and QEMU's client (`qemu-img map` with `x-dirty-bitmap`,
//! which negotiates extended headers).

mod common;

use std::sync::Arc;

use aio_block::bitmap::DirtyBitmap;
use aio_block::{Image, ImageOptions};
use aio_nbd::proto::{chunk, cmd, cmd_flag, opt, rep};
use aio_nbd::{ExportSet, Limits, NbdExport};
use common::{run, Raw, TestServer};

const SIZE: u64 = 4 << 20;
const K64: u64 = 65536;

/// The dirty extents `serve` makes, as (length, flags).
const EXPECTED: [(u64, u32); 5] = [
    (K64, 0),
    (K64, 1),
    ((1 << 20) - 2 * K64, 0),
    (3 * K64, 1),
    (SIZE - (1 << 20) - 3 * K64, 0),
];

/// Export "d" of a 4 MiB null image serving bitmap "b" (64 KiB chunks), dirty at
/// [64K, 128K) and [1M, 1M + 192K) (a write of 128K + 1 bytes at 1M dirties three chunks).
fn serve() -> TestServer {
    let image = Arc::new(Image::null(SIZE, ImageOptions::default()).unwrap());
    let bitmap = Arc::new(DirtyBitmap::new("b", SIZE, K64 as u32).unwrap());
    bitmap.set(K64, K64);
    bitmap.set(1 << 20, 2 * K64 + 1);
    let exports = ExportSet::new();
    exports
        .insert(NbdExport::new("d", image).unwrap().dirty_bitmap(bitmap))
        .unwrap();
    TestServer::start(exports, Limits::default(), None)
}

/// A `NBD_OPT_SET_META_CONTEXT` payload for export "d" with `queries`.
fn set_payload(queries: &[&str]) -> Vec<u8> {
    let mut p = 1u32.to_be_bytes().to_vec();
    p.push(b'd');
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    p
}

/// Negotiates `style_option` (structured replies or extended headers), sets `queries` and
/// goes to "d"; the contexts the server chose, (id, name).
fn connect(server: &TestServer, style_option: u32, queries: &[&str]) -> (Raw, Vec<(u32, String)>) {
    let mut c = Raw::fixed(&server.socket);
    c.option(style_option, &[]);
    assert_eq!(c.option_reply().1, rep::ACK);
    c.option(opt::SET_META_CONTEXT, &set_payload(queries));
    let mut chosen = Vec::new();
    loop {
        let (_, kind, payload) = c.option_reply();
        if kind == rep::ACK {
            break;
        }
        assert_eq!(kind, rep::META_CONTEXT);
        let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
        chosen.push((id, String::from_utf8(payload[4..].to_vec()).unwrap()));
    }
    assert_eq!(c.go("d").0, SIZE);
    (c, chosen)
}

/// A 32-bit block status payload: (context id, [(length, flags)]).
fn narrow(payload: &[u8]) -> (u32, Vec<(u64, u32)>) {
    let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
    let extents = payload[4..]
        .chunks_exact(8)
        .map(|e| {
            let len = u32::from_be_bytes(e[..4].try_into().unwrap());
            (
                u64::from(len),
                u32::from_be_bytes(e[4..].try_into().unwrap()),
            )
        })
        .collect();
    (id, extents)
}

/// A 64-bit block status payload: (context id, [(length, flags)]), its count checked.
fn wide(payload: &[u8]) -> (u32, Vec<(u64, u32)>) {
    let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
    let count = u32::from_be_bytes(payload[4..8].try_into().unwrap()) as usize;
    let extents: Vec<(u64, u32)> = payload[8..]
        .chunks_exact(16)
        .map(|e| {
            let len = u64::from_be_bytes(e[..8].try_into().unwrap());
            let flags = u64::from_be_bytes(e[8..].try_into().unwrap());
            (len, u32::try_from(flags).unwrap())
        })
        .collect();
    assert_eq!(extents.len(), count, "descriptor count");
    (id, extents)
}

#[test]
fn structured_replies_carry_the_bitmap_in_32_bit_extents() {
    let server = serve();
    let (mut c, chosen) = connect(&server, opt::STRUCTURED_REPLY, &["qemu:dirty-bitmap:b"]);
    assert_eq!(chosen, [(2, "qemu:dirty-bitmap:b".to_owned())]);
    c.request(0, cmd::BLOCK_STATUS, 7, 0, SIZE as u32);
    let (flags, kind, cookie, payload) = c.chunk();
    assert_eq!(
        (flags, kind, cookie),
        (chunk::FLAG_DONE, chunk::BLOCK_STATUS, 7)
    );
    assert_eq!(narrow(&payload), (2, EXPECTED.to_vec()));
    // One extent only, from an offset inside a dirty run.
    c.request(
        cmd_flag::REQ_ONE,
        cmd::BLOCK_STATUS,
        8,
        (1 << 20) + 4096,
        1 << 20,
    );
    let (_, kind, _, payload) = c.chunk();
    assert_eq!(kind, chunk::BLOCK_STATUS);
    assert_eq!(narrow(&payload), (2, vec![(3 * K64 - 4096, 1)]));
}

#[test]
fn extended_headers_carry_the_bitmap_in_64_bit_extents_beside_the_allocation() {
    let server = serve();
    let (mut c, chosen) = connect(
        &server,
        opt::EXTENDED_HEADERS,
        &["qemu:dirty-bitmap:b", "base:allocation"],
    );
    assert_eq!(
        chosen,
        [
            (0, "base:allocation".to_owned()),
            (2, "qemu:dirty-bitmap:b".to_owned())
        ]
    );
    c.request_ext(0, cmd::BLOCK_STATUS, 9, 0, SIZE);
    // A chunk per context, in either order; the second ends the reply.
    let mut seen = Vec::new();
    for i in 0..2 {
        let (flags, kind, cookie, offset, payload) = c.chunk_ext();
        assert_eq!((kind, cookie, offset), (chunk::BLOCK_STATUS_EXT, 9, 0));
        assert_eq!(
            flags == chunk::FLAG_DONE,
            i == 1,
            "only the last chunk is done"
        );
        seen.push(wide(&payload));
    }
    seen.sort();
    assert_eq!(
        seen[0],
        (0, vec![(SIZE, 3)]),
        "the null image reads as a hole"
    );
    assert_eq!(seen[1], (2, EXPECTED.to_vec()));
}

/// `nbdinfo --map=CONTEXT`'s lines as (offset, length, flags).
fn nbdinfo_map(context: &str, uri: &str) -> Vec<(u64, u64, u32)> {
    let out = run("nbdinfo", &[&format!("--map={context}"), uri]);
    out.lines()
        .map(|line| {
            let mut f = line
                .split_whitespace()
                .map(|w| w.parse().unwrap_or(u64::MAX));
            let (at, len, flags) = (f.next(), f.next(), f.next());
            (at.unwrap(), len.unwrap(), flags.unwrap() as u32)
        })
        .collect()
}

#[test]
fn nbdinfo_and_qemu_img_read_the_bitmap_and_the_listing_names_it() {
    let server = serve();
    let uri = server.uri("d");
    let mut at = 0;
    let expected: Vec<(u64, u64, u32)> = EXPECTED
        .iter()
        .map(|&(len, flags)| {
            at += len;
            (at - len, len, flags)
        })
        .collect();
    assert_eq!(nbdinfo_map("qemu:dirty-bitmap:b", &uri), expected);
    let list = run("nbdinfo", &["--list", &uri]);
    assert!(list.contains("\tqemu:dirty-bitmap:b\n"), "{list}");
    assert!(list.contains("\tbase:allocation\n"), "{list}");
    // QEMU's client reads the bitmap as its allocation: dirty is "data": false.
    let opts = format!(
        "driver=nbd,export=d,server.type=unix,server.path={},x-dirty-bitmap=qemu:dirty-bitmap:b",
        server.socket.display()
    );
    let out = run("qemu-img", &["map", "--output=json", "--image-opts", &opts]);
    let dirty: Vec<(u64, u64)> = out
        .lines()
        .filter(|l| l.contains("\"data\": false"))
        .map(|l| {
            let field = |key: &str| {
                let at = l.find(&format!("\"{key}\": ")).unwrap() + key.len() + 4;
                l[at..]
                    .split([',', '}'])
                    .next()
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            };
            (field("start"), field("length"))
        })
        .collect();
    assert_eq!(dirty, [(K64, K64), (1 << 20, 3 * K64)], "{out}");
}
