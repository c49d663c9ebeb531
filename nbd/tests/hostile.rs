//! Clients that break the protocol, or push the server's limits: each is answered with the
//! protocol's error (or disconnected, where it must be), and the server keeps serving
//! everyone else.

mod common;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aio_block::{Image, ImageOptions};
use aio_nbd::proto::{cmd, cmd_flag, err, opt, rep};
use aio_nbd::{ExportSet, Limits, NbdExport};
use common::{Raw, TestServer};

const SIZE: u64 = 16 << 20;

/// A server with a writable null export `w` and a read-only one `ro`.
fn server(limits: Limits, max_connections: Option<u32>) -> TestServer {
    let exports = ExportSet::new();
    let null = |ro| Arc::new(Image::null(SIZE, ImageOptions::default().read_only(ro)).unwrap());
    let w = NbdExport::new("w", null(false)).unwrap();
    exports.insert(w.writable(true).unwrap()).unwrap();
    exports
        .insert(NbdExport::new("ro", null(true)).unwrap())
        .unwrap();
    TestServer::start(exports, limits, max_connections)
}

/// The server still serves a well-behaved client: a read on export `w` succeeds.
fn still_serves(s: &TestServer) {
    let mut c = Raw::fixed(&s.socket);
    c.go("w");
    c.request(0, cmd::READ, 7, 0, 4096);
    assert_eq!(c.simple_reply(), (0, 7));
    assert_eq!(c.read_exact(4096), vec![0; 4096]);
}

/// Waits until the server has no client left (what it says when each has gone).
fn no_clients_left(s: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.clients.count() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} clients left",
            s.clients.count()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_broken_handshake_closes_that_connection_only() {
    let s = server(Limits::default(), None);
    // Truncated: two bytes of flags, then gone.
    let mut c = Raw::connect(&s.socket);
    c.send(&[0, 0]);
    drop(c);
    // Unknown client flags.
    let mut c = Raw::connect(&s.socket);
    c.send(&0x8000_0003u32.to_be_bytes());
    assert!(c.closed());
    // An option without IHAVEOPT.
    let mut c = Raw::fixed(&s.socket);
    c.send(&[0x55; 16]);
    assert!(c.closed());
    // NBD_OPT_EXPORT_NAME of an export that is not there cannot be answered.
    let mut c = Raw::fixed(&s.socket);
    c.option(opt::EXPORT_NAME, b"nope");
    assert!(c.closed());
    // A client without fixed newstyle may only send NBD_OPT_EXPORT_NAME.
    let mut c = Raw::connect(&s.socket);
    c.send(&0u32.to_be_bytes());
    c.option(opt::LIST, &[]);
    assert!(c.closed());
    still_serves(&s);
}

#[test]
fn bad_options_are_answered_and_the_handshake_goes_on() {
    let s = server(Limits::default(), None);
    let mut c = Raw::fixed(&s.socket);
    // The answer's last reply (an export's information may come before it, as QEMU sends).
    let expect = |c: &mut Raw, option: u32, payload: &[u8], want: u32| {
        c.option(option, payload);
        let (o, kind) = loop {
            let (o, kind, _) = c.option_reply();
            if kind != rep::INFO {
                break (o, kind);
            }
        };
        assert_eq!((o, kind), (option, want), "option {option} {payload:?}");
    };
    expect(&mut c, 99, b"whatever", rep::ERR_UNSUP);
    // A name length past the option's end, and bytes after the fields.
    expect(&mut c, opt::INFO, &[0, 0, 0, 200, b'w'], rep::ERR_INVALID);
    expect(
        &mut c,
        opt::GO,
        &[0, 0, 0, 1, b'w', 0, 0, 9],
        rep::ERR_INVALID,
    );
    expect(&mut c, opt::LIST, b"x", rep::ERR_INVALID);
    expect(&mut c, opt::STRUCTURED_REPLY, b"x", rep::ERR_INVALID);
    // TLS is not offered.
    expect(&mut c, opt::STARTTLS, &[], rep::ERR_POLICY);
    // A metadata context before structured replies.
    let mut meta = 1u32.to_be_bytes().to_vec();
    meta.extend_from_slice(b"w");
    meta.extend_from_slice(&0u32.to_be_bytes());
    expect(&mut c, opt::SET_META_CONTEXT, &meta, rep::ERR_INVALID);
    // An unknown export.
    expect(
        &mut c,
        opt::GO,
        &[0, 0, 0, 2, b'n', b'o', 0, 0],
        rep::ERR_UNKNOWN,
    );
    // INFO without asking for the block sizes of an export that needs them.
    expect(
        &mut c,
        opt::INFO,
        &[0, 0, 0, 1, b'w', 0, 0],
        rep::ERR_BLOCK_SIZE_REQD,
    );
    // An option too long to hold is read past and refused.
    expect(&mut c, opt::GO, &vec![0; 1 << 20], rep::ERR_TOO_BIG);
    expect(&mut c, opt::STRUCTURED_REPLY, &[], rep::ACK);
    expect(&mut c, opt::STRUCTURED_REPLY, &[], rep::ERR_INVALID);
    // After all that, the session still works.
    c.go("w");
    c.request(0, cmd::FLUSH, 1, 0, 0);
    assert_eq!(c.simple_reply(), (0, 1));
    // NBD_OPT_ABORT is acknowledged, then the connection ends.
    let mut c = Raw::fixed(&s.socket);
    expect(&mut c, opt::ABORT, &[], rep::ACK);
    assert!(c.closed());
}

#[test]
fn bad_requests_get_the_protocols_errors_and_the_connection_goes_on() {
    let s = server(Limits::default(), None);
    let mut c = Raw::fixed(&s.socket);
    let (size, _) = c.go("w");
    assert_eq!(size, SIZE);
    let mut cookie = 0;
    let mut expect =
        |c: &mut Raw, flags: u16, kind: u16, offset: u64, len: u32, payload: bool, want: u32| {
            cookie += 1;
            c.request(flags, kind, cookie, offset, len);
            if payload {
                c.send(&vec![0xee; len as usize]);
            }
            assert_eq!(
                c.simple_reply(),
                (want, cookie),
                "{kind} {flags:#x} {offset} {len}"
            );
        };
    expect(&mut c, 0, cmd::READ, SIZE, 512, false, err::EINVAL);
    expect(&mut c, 0, cmd::READ, SIZE - 512, 1024, false, err::EINVAL);
    expect(&mut c, 0, cmd::WRITE, SIZE, 512, true, err::ENOSPC);
    expect(
        &mut c,
        0,
        cmd::WRITE_ZEROES,
        SIZE - 512,
        4096,
        false,
        err::ENOSPC,
    );
    expect(&mut c, 0, cmd::READ, 100, 512, false, err::EINVAL);
    expect(&mut c, 0, cmd::WRITE, 0, 100, true, err::EINVAL);
    expect(&mut c, 0, cmd::READ, 0, 64 << 20, false, err::EINVAL);
    expect(&mut c, 0x4000, cmd::READ, 0, 512, false, err::EINVAL);
    expect(&mut c, cmd_flag::DF, cmd::READ, 0, 512, false, err::EINVAL);
    expect(&mut c, 0, 42, 0, 512, false, err::EINVAL);
    expect(&mut c, 0, cmd::BLOCK_STATUS, 0, 512, false, err::EINVAL);
    expect(&mut c, 0, cmd::WRITE, 4096, 4096, true, 0);
    expect(&mut c, cmd_flag::FUA, cmd::TRIM, 0, 4096, false, 0);
    // A write too large to skip is answered, then the connection closes.
    cookie += 1;
    c.request(0, cmd::WRITE, cookie, 0, 64 << 20);
    assert_eq!(c.simple_reply(), (err::EINVAL, cookie));
    assert!(c.closed());

    // Read-only: every change is EPERM (a write's payload is skipped).
    let mut c = Raw::fixed(&s.socket);
    let (_, flags) = c.go("ro");
    assert_ne!(flags & aio_nbd::proto::tflag::READ_ONLY, 0);
    c.request(0, cmd::WRITE, 1, 0, 512);
    c.send(&[1; 512]);
    assert_eq!(c.simple_reply(), (err::EPERM, 1));
    c.request(0, cmd::TRIM, 2, 0, 512);
    assert_eq!(c.simple_reply(), (err::EPERM, 2));
    c.request(0, cmd::READ, 3, 0, 512);
    assert_eq!(c.simple_reply(), (0, 3));
    c.read_exact(512);
    // A bad request magic: the client is out of step, and is disconnected.
    c.send(&[0x11; 28]);
    assert!(c.closed());
    still_serves(&s);
}

#[test]
fn disc_answers_the_requests_in_flight_first() {
    let s = server(Limits::default(), None);
    let mut c = Raw::fixed(&s.socket);
    c.go("w");
    for cookie in 0..32 {
        c.request(0, cmd::READ, cookie, cookie * 4096, 4096);
    }
    c.request(0, cmd::DISC, 99, 0, 0);
    let mut seen: Vec<u64> = (0..32)
        .map(|_| {
            let (error, cookie) = c.simple_reply();
            assert_eq!(error, 0);
            c.read_exact(4096);
            cookie
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..32).collect::<Vec<_>>());
    assert!(c.closed());
}

#[test]
fn a_flood_of_connections_that_open_and_drop_leaves_nothing_behind() {
    let s = server(Limits::default(), Some(300));
    for i in 0..200 {
        let mut c = UnixStream::connect(&s.socket).unwrap();
        if i % 2 == 0 {
            let _ = c.write_all(&3u32.to_be_bytes());
        }
    }
    still_serves(&s);
    no_clients_left(&s);
}

#[test]
fn max_connections_refuses_the_one_too_many() {
    let s = server(Limits::default(), Some(1));
    let mut first = Raw::fixed(&s.socket);
    first.go("w");
    let mut second = UnixStream::connect(&s.socket).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 18];
    assert_eq!(std::io::Read::read(&mut second, &mut buf).unwrap_or(0), 0);
    drop(first);
    no_clients_left(&s);
    still_serves(&s);
}

#[test]
fn a_handshake_that_never_ends_is_cut_at_the_deadline() {
    let limits = Limits {
        handshake_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let s = server(limits, None);
    // A client that chose its export is not cut when its deadline passes...
    let mut done = Raw::fixed(&s.socket);
    done.go("w");
    // ...one that never does is, once its own has passed (after the first's).
    let mut stuck = Raw::fixed(&s.socket);
    assert!(stuck.closed());
    done.request(0, cmd::FLUSH, 5, 0, 0);
    assert_eq!(done.simple_reply(), (0, 5));
}

#[test]
fn a_client_that_never_reads_its_replies_stops_being_read() {
    let limits = Limits {
        max_held_bytes: 1 << 20,
        ..Limits::default()
    };
    let s = server(limits, None);
    let mut c = Raw::fixed(&s.socket);
    c.go("w");
    c.stream.set_nonblocking(true).unwrap();
    // Reads of 64 KiB whose replies are never read. Were the server to go on reading, these
    // would ask for 64 GiB; it stops once its megabyte of replies waits, and the socket's
    // buffers then fill with requests it does not take.
    let cap = 1 << 20;
    let mut header = Vec::new();
    let mut sent = 0;
    let mut blocked_since: Option<Instant> = None;
    while sent < cap {
        header.clear();
        header.extend_from_slice(&aio_nbd::proto::REQUEST_MAGIC.to_be_bytes());
        header.extend_from_slice(&0u16.to_be_bytes());
        header.extend_from_slice(&cmd::READ.to_be_bytes());
        header.extend_from_slice(&(sent as u64).to_be_bytes());
        header.extend_from_slice(&0u64.to_be_bytes());
        header.extend_from_slice(&(64u32 << 10).to_be_bytes());
        match c.stream.write(&header) {
            Ok(28) => {
                sent += 1;
                blocked_since = None;
            }
            Ok(_) => panic!("a partial header write"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let since = *blocked_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(2) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        sent < cap,
        "the server read {sent} requests without their replies being read"
    );
    println!("{sent} requests sent before the server stopped reading");
    // Everyone else is served meanwhile.
    still_serves(&s);
    drop(c);
    no_clients_left(&s);
}
