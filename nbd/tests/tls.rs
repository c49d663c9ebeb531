//! TLS with QEMU's x509 credentials layout: QEMU's client reads and writes over it, a client
//! that skips it is refused everything but `NBD_OPT_STARTTLS` and `NBD_OPT_ABORT`, and a
//! client certificate the CA did not sign (or none, where one is required) ends only that
//! client's connection.
//!
//! The certificates are made with `openssl` for each test (`aio_nbd::testing::TestPki`).

mod common;

use std::path::Path;
use std::sync::Arc;

use aio_block::{Image, ImageOptions};
use aio_nbd::proto::{opt, rep};
use aio_nbd::testing::TestPki;
use aio_nbd::{ExportSet, Limits, ListenAddr, NbdExport, NbdServer, TlsCreds};
use common::{image_dir, raw_image, tool, Raw};

/// A server requiring TLS with `creds`, on a thread of its own.
fn serve(creds: TlsCreds, image: Image) -> common::TestServer {
    let exports = ExportSet::new();
    let export = NbdExport::new("disk", Arc::new(image)).unwrap();
    exports.insert(export.writable(true).unwrap()).unwrap();
    common::TestServer::start_tls(exports, Limits::default(), creds)
}

/// qemu-io over TLS with the client credentials in `client_dir`: (success, output).
fn qemu_io_tls(socket: &Path, client_dir: &Path, commands: &[&str]) -> (bool, String) {
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        client_dir.display()
    );
    let image = format!(
        "driver=nbd,server.type=unix,server.path={},export=disk,tls-creds=tls0,tls-hostname=localhost",
        socket.display()
    );
    let mut args = vec!["--object", &object, "--image-opts"];
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(&image);
    let out = tool("qemu-io", &args);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !text.contains("failed"), text)
}

#[test]
fn qemu_reads_and_writes_over_tls_with_a_client_certificate_the_ca_signed() {
    let pki = TestPki::new();
    let dir = image_dir();
    let img = raw_image(dir.path(), "disk.raw", 8 << 20, 0, 0);
    let creds = TlsCreds::from_qemu_dir(&pki.server, true).unwrap();
    let image = Image::open(&img, ImageOptions::new(aio_block::format::ImageFormat::Raw)).unwrap();
    let server = serve(creds, image);
    let (ok, text) = qemu_io_tls(
        &server.socket,
        &pki.client,
        &[
            "write -P 0x7e 0 1M",
            "flush",
            "read -P 0x7e 0 1M",
            "write -z 1M 1M",
            "read -P 0 1M 1M",
        ],
    );
    assert!(ok, "{text}");
    // Another CA's certificate is refused; the server goes on serving.
    let (ok, text) = qemu_io_tls(&server.socket, &pki.rogue, &["read 0 4k"]);
    assert!(!ok, "a certificate of another CA was accepted: {text}");
    let (ok, text) = qemu_io_tls(&server.socket, &pki.client, &["read -P 0x7e 0 4k"]);
    assert!(ok, "{text}");
}

#[test]
fn without_tls_only_starttls_and_abort_are_answered() {
    let pki = TestPki::new();
    let creds = TlsCreds::from_qemu_dir(&pki.server, false).unwrap();
    let image = Image::null(1 << 20, ImageOptions::default()).unwrap();
    let server = serve(creds, image);
    let mut c = Raw::fixed(&server.socket);
    for option in [opt::LIST, opt::STRUCTURED_REPLY, 99] {
        c.option(option, &[]);
        let (o, kind, _) = c.option_reply();
        assert_eq!((o, kind), (option, rep::ERR_TLS_REQD));
    }
    let mut go = 4u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"disk\0\0");
    c.option(opt::GO, &go);
    assert_eq!(c.option_reply().1, rep::ERR_TLS_REQD);
    // NBD_OPT_EXPORT_NAME cannot be refused with an error: the connection ends.
    c.option(opt::EXPORT_NAME, b"disk");
    assert!(c.closed());
    // NBD_OPT_ABORT is answered, then the connection ends.
    let mut c = Raw::fixed(&server.socket);
    c.option(opt::ABORT, &[]);
    assert_eq!(c.option_reply().1, rep::ERR_TLS_REQD);
    assert!(c.closed());
    // STARTTLS is acknowledged; garbage instead of a TLS handshake ends that client only.
    let mut c = Raw::fixed(&server.socket);
    c.option(opt::STARTTLS, &[]);
    assert_eq!(c.option_reply().1, rep::ACK);
    c.send(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8]);
    assert!(c.closed());
    // A client that verifies nothing but speaks TLS is served (verify-peer=off).
    let out = tool(
        "nbdinfo",
        &[&format!(
            "nbds+unix:///disk?socket={}&tls-verify-peer=false",
            server.socket.display()
        )],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("with TLS"));
}

#[test]
fn credentials_that_cannot_be_used_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let e = TlsCreds::from_qemu_dir(dir.path(), false).unwrap_err();
    assert!(e.to_string().contains("server-cert.pem"), "{e}");
    let pki = TestPki::new();
    std::fs::remove_file(pki.server.join("ca-cert.pem")).unwrap();
    let e = TlsCreds::from_qemu_dir(&pki.server, true).unwrap_err();
    assert!(e.to_string().contains("ca-cert.pem"), "{e}");
    // Without client verification the CA is not needed.
    TlsCreds::from_qemu_dir(&pki.server, false).unwrap();
    let _ = (ListenAddr::Unix("x".into()), NbdServer::bind_tls);
}
