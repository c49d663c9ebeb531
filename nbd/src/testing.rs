//! A raw NBD client, for tests of servers (ours, qemu-storage-daemon's): the bytes of the
//! protocol one by one, including those no real client sends. Feature `testing`.
//!
//! Every read has a 20 s timeout, and a broken exchange panics with what was expected: it is
//! for tests only.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proto::{self, opt};

/// A raw NBD client over a Unix socket, for the bytes no real client sends.
pub struct Raw {
    /// The socket.
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

    /// Sends `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// Reads exactly `n` bytes.
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

    /// Sends an extended request (after `NBD_OPT_EXTENDED_HEADERS`): 64-bit length.
    pub fn request_ext(&mut self, flags: u16, kind: u16, cookie: u64, offset: u64, len: u64) {
        let mut m = proto::REQUEST_EXT_MAGIC.to_be_bytes().to_vec();
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&kind.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        self.send(&m);
    }

    /// Reads one extended reply chunk: (flags, type, cookie, offset, payload).
    pub fn chunk_ext(&mut self) -> (u16, u16, u64, u64, Vec<u8>) {
        let h = self.read_exact(32);
        assert_eq!(
            &h[..4],
            &proto::EXTENDED_REPLY_MAGIC.to_be_bytes(),
            "extended chunk magic"
        );
        let flags = u16::from_be_bytes(h[4..6].try_into().unwrap());
        let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let offset = u64::from_be_bytes(h[16..24].try_into().unwrap());
        let len = u64::from_be_bytes(h[24..32].try_into().unwrap());
        (flags, kind, cookie, offset, self.read_exact(len as usize))
    }
}

/// Runs openssl with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`ca-key.pem`, `ca-cert.pem`) in `dir`.
fn ca(dir: &Path, name: &str) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "ca-key.pem",
            "-out",
            "ca-cert.pem",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
}

/// A certificate `{role}-cert.pem` and key `{role}-key.pem` in `dir`, signed by the CA in
/// `ca_dir`, for `role` "server" (localhost) or "client".
fn issue(ca_dir: &Path, dir: &Path, role: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let (key, csr, cert) = (
        format!("{role}-key.pem"),
        format!("{role}.csr"),
        format!("{role}-cert.pem"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={role}"),
        ],
    );
    let ext = dir.join(format!("{role}.ext"));
    let usage = if role == "server" {
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
    } else {
        "extendedKeyUsage=clientAuth\n"
    };
    std::fs::write(
        &ext,
        format!("{usage}keyUsage=digitalSignature\nbasicConstraints=CA:FALSE\n"),
    )
    .unwrap();
    let ca_cert = ca_dir.join("ca-cert.pem");
    let ca_key = ca_dir.join("ca-key.pem");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_cert.to_str().unwrap(),
            "-CAkey",
            ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            ext.to_str().unwrap(),
        ],
    );
}

/// Test credentials made with `openssl`, in QEMU's x509 layout: a CA, the server's directory
/// (`ca-cert.pem`, `server-cert.pem` for `localhost` and 127.0.0.1, `server-key.pem`), a
/// client's (`ca-cert.pem`, `client-cert.pem` the CA signed, `client-key.pem`, as QEMU's and
/// libnbd's clients read them) and a rogue client's (signed by another CA). Removed when
/// dropped.
pub struct TestPki {
    _root: tempfile::TempDir,
    /// The server's directory.
    pub server: PathBuf,
    /// A client's directory, its certificate signed by the server's CA.
    pub client: PathBuf,
    /// A client's directory, its certificate signed by another CA.
    pub rogue: PathBuf,
}

impl TestPki {
    /// Makes them (panics, naming openssl's complaint, if it cannot).
    pub fn new() -> TestPki {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let (ca_dir, rogue_ca) = (r.join("ca"), r.join("rogue-ca"));
        ca(&ca_dir, "test CA");
        ca(&rogue_ca, "another CA");
        let dirs = [r.join("server"), r.join("client"), r.join("rogue")];
        issue(&ca_dir, &dirs[0], "server");
        issue(&ca_dir, &dirs[1], "client");
        issue(&rogue_ca, &dirs[2], "client");
        for d in &dirs {
            std::fs::copy(ca_dir.join("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        }
        let [server, client, rogue] = dirs;
        TestPki {
            _root: root,
            server,
            client,
            rogue,
        }
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}
