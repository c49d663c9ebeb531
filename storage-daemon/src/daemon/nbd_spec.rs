//! The NBD side of the daemon's configuration: the server (where it listens, how many
//! clients) and its exports (an image each, or one a `--disk` serves too), in this daemon's
//! own syntax (`--nbd ADDR[,max-connections=N]`, `--nbd-export name=,image=,...`).
//!
//! This module owns the types and that syntax; qemu-storage-daemon's `--nbd-server` and
//! `--export type=nbd` are read into the same types by `qsd`. It opens nothing.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use aio_block::lock::LockMode;
use aio_nbd::ListenAddr;
use aio_virtio_blk::format::ImageFormat;

use super::values::{on_off, parse_size};

/// The NBD server: [`NbdServerSpec::new`] with QEMU's defaults, or parsed from `--nbd`'s
/// value; the fields may be set after (more may come: `#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NbdServerSpec {
    /// Where it listens.
    pub addr: ListenAddr,
    /// At most this many clients at once (QEMU's `max-connections`; none: no bound).
    pub max_connections: Option<u32>,
    /// How long a client may take to choose an export (QEMU's `handshake-max-seconds`).
    pub handshake: Duration,
    /// TLS, required of every client when given (QEMU's `tls-creds`).
    pub tls: Option<NbdTlsSpec>,
}

/// TLS credentials in QEMU's x509 layout (`tls-creds-x509,endpoint=server,dir=`):
/// [`NbdTlsSpec::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NbdTlsSpec {
    /// The directory holding `ca-cert.pem`, `server-cert.pem` and `server-key.pem`.
    pub dir: PathBuf,
    /// Clients must present a certificate the CA signed (QEMU's `verify-peer`, default on).
    pub verify_peer: bool,
}

/// One NBD export: [`NbdExportSpec::new`] (read-only, QEMU's defaults), or parsed from
/// `--nbd-export`'s value; the fields may be set after.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NbdExportSpec {
    /// The name clients ask for.
    pub name: String,
    /// Its description (`NBD_INFO_DESCRIPTION`).
    pub description: Option<String>,
    /// The image, or `null` (with `size`). An image a `--disk` serves is shared with it.
    pub image: PathBuf,
    /// `format=auto|raw|qcow2`.
    pub format: ImageFormat,
    /// The null device's size.
    pub size: Option<u64>,
    /// Whether clients may write (default off, as QEMU's `writable=`).
    pub writable: bool,
    /// `locking=auto|on|off`.
    pub locking: LockMode,
    /// The iothread its clients are served on (none: the iothreads in turn).
    pub iothread: Option<u16>,
    /// Whether the `qemu:allocation-depth` metadata context is offered (QEMU's
    /// `allocation-depth=on`).
    pub allocation_depth: bool,
    /// `id=NAME`: the export's id as QEMU names exports; its end is announced with
    /// `BLOCK_EXPORT_DELETED` (none: not announced).
    pub id: Option<String>,
    /// The image opened inactive, as [`DiskSpec::inactive`](crate::daemon::DiskSpec::inactive).
    pub inactive: bool,
    /// The dirty bitmaps served as `qemu:dirty-bitmap:NAME` contexts, in order (QEMU's
    /// `bitmaps=`).
    pub bitmaps: Vec<NbdBitmapSpec>,
    /// The export's block node is writable (QEMU's `bdrv_is_writable`), though a read-only
    /// export opens its own image read-only: an enabled bitmap is then refused on a read-only
    /// export, as QEMU refuses it. `--nbd-export` has no node: its image's writability counts.
    pub writable_node: bool,
}

/// A dirty bitmap an NBD export serves (QEMU's `BlockDirtyBitmapOrStr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NbdBitmapSpec {
    /// A bitmap of the export's image, by name (`bitmaps.0=NAME`).
    Local(String),
    /// Bitmap `name` of block node `node` (`{"node": N, "name": B}`).
    External {
        /// The node.
        node: String,
        /// The bitmap's name.
        name: String,
    },
}

impl NbdServerSpec {
    /// A server listening on `addr`: no bound on clients, QEMU's handshake deadline, no TLS.
    pub fn new(addr: ListenAddr) -> Self {
        NbdServerSpec {
            addr,
            max_connections: None,
            handshake: aio_nbd::Limits::default().handshake_timeout,
            tls: None,
        }
    }
}

impl NbdTlsSpec {
    /// The credentials in `dir`, client certificates verified (QEMU's default).
    pub fn new(dir: PathBuf) -> Self {
        NbdTlsSpec {
            dir,
            verify_peer: true,
        }
    }
}

impl NbdExportSpec {
    /// Export `name` of `image` (a path, an `rbd:` name, or `null` with [`size`](Self::size)),
    /// read-only, its format probed, locked as QEMU locks it.
    pub fn new(name: impl Into<String>, image: impl Into<PathBuf>) -> Self {
        NbdExportSpec {
            name: name.into(),
            description: None,
            image: image.into(),
            format: ImageFormat::Auto,
            size: None,
            writable: false,
            locking: LockMode::Auto,
            iothread: None,
            allocation_depth: false,
            id: None,
            inactive: false,
            bitmaps: Vec::new(),
            writable_node: false,
        }
    }

    /// Whether the export is the null device.
    pub fn is_null(&self) -> bool {
        self.image.as_os_str() == "null"
    }
}

impl FromStr for NbdServerSpec {
    type Err = String;

    /// `ADDR[,max-connections=N][,handshake-max-seconds=S][,tls-creds=DIR[,verify-peer=off]]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let addr: ListenAddr = parts.next().unwrap_or_default().parse()?;
        let mut spec = NbdServerSpec {
            addr,
            max_connections: None,
            handshake: aio_nbd::Limits::default().handshake_timeout,
            tls: None,
        };
        let mut verify_peer = true;
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            let number = || {
                value
                    .parse::<u32>()
                    .map_err(|_| format!("{key}={value}: expected a number"))
            };
            match key {
                "max-connections" => spec.max_connections = Some(number()?).filter(|&n| n > 0),
                "handshake-max-seconds" => {
                    spec.handshake = Duration::from_secs(u64::from(number()?))
                }
                "tls-creds" => spec.tls = Some(NbdTlsSpec::new(PathBuf::from(value))),
                "verify-peer" => verify_peer = on_off(key, value)?,
                other => {
                    return Err(format!(
                        "unknown key '{other}' (max-connections, handshake-max-seconds, \
                         tls-creds, verify-peer)"
                    ))
                }
            }
        }
        match spec.tls.as_mut() {
            Some(tls) => tls.verify_peer = verify_peer,
            None if !verify_peer => return Err("verify-peer= needs tls-creds=DIR".into()),
            None => {}
        }
        Ok(spec)
    }
}

impl FromStr for NbdExportSpec {
    type Err = String;

    /// `name=NAME,image=PATH[,format=][,writable=on][,description=TEXT][,size=][,locking=]
    /// [,iothread=K][,allocation-depth=on][,id=ID][,bitmap=NAME...]` (`bitmap=` once per
    /// bitmap of the image served, in order).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut spec = NbdExportSpec::new(String::new(), PathBuf::new());
        let (mut name, mut image) = (None, None);
        for part in s.split(',') {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("'{part}' is not key=value"))?;
            match key {
                "name" => name = Some(value.to_owned()),
                "image" => image = Some(PathBuf::from(value)),
                "description" => spec.description = Some(value.to_owned()),
                "id" => spec.id = Some(value.to_owned()),
                "bitmap" => spec.bitmaps.push(NbdBitmapSpec::Local(value.to_owned())),
                "writable" => spec.writable = on_off(key, value)?,
                "allocation-depth" => spec.allocation_depth = on_off(key, value)?,
                "format" => {
                    spec.format = value.parse().map_err(|e| format!("format={value}: {e}"))?
                }
                "size" => {
                    spec.size = Some(
                        parse_size(value)
                            .ok_or_else(|| format!("size={value}: expected a number of bytes"))?,
                    )
                }
                "locking" => spec.locking = value.parse().map_err(|e| format!("{e}"))?,
                "iothread" => {
                    spec.iothread = Some(
                        value
                            .parse()
                            .map_err(|_| format!("iothread={value}: expected a number"))?,
                    )
                }
                other => {
                    return Err(format!(
                        "unknown key '{other}' (name, image, description, writable, format, \
                         size, locking, iothread, allocation-depth, id, bitmap)"
                    ))
                }
            }
        }
        spec.name = name.ok_or("name=NAME is missing")?;
        spec.image = image.ok_or("image=PATH is missing")?;
        match (spec.is_null(), spec.size) {
            (true, None) => return Err("image=null needs size=BYTES".into()),
            (false, Some(_)) => return Err("size= is the null device's (image=null)".into()),
            _ => {}
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbd_servers_and_exports_parse_and_bad_ones_name_the_key() {
        let s: NbdServerSpec = "unix:/tmp/n.sock,max-connections=4".parse().unwrap();
        assert_eq!(s.addr, ListenAddr::Unix("/tmp/n.sock".into()));
        assert_eq!(s.max_connections, Some(4));
        let s: NbdServerSpec = "[::1]:10809".parse().unwrap();
        let inet = ListenAddr::Inet {
            host: "::1".into(),
            port: 10809,
        };
        assert_eq!(s.addr, inet);
        assert!("10809"
            .parse::<NbdServerSpec>()
            .unwrap_err()
            .contains("HOST:PORT"));
        assert!("h:x".parse::<NbdServerSpec>().unwrap_err().contains("port"));
        let t: NbdServerSpec = "unix:/s,tls-creds=/pki,verify-peer=off".parse().unwrap();
        let tls = NbdTlsSpec {
            dir: "/pki".into(),
            verify_peer: false,
        };
        assert_eq!(t.tls, Some(tls));
        let e = "unix:/s,colour=red".parse::<NbdServerSpec>().unwrap_err();
        assert!(e.contains("colour"), "{e}");

        let e: NbdExportSpec = "name=vm0,image=/i.qcow2,writable=on,description=a disk"
            .parse()
            .unwrap();
        assert_eq!(e.name, "vm0");
        assert!(e.writable);
        assert_eq!(e.description.as_deref(), Some("a disk"));
        let b: NbdExportSpec = "name=b,image=/i.qcow2,bitmap=b0,bitmap=b1".parse().unwrap();
        let local = |n: &str| NbdBitmapSpec::Local(n.into());
        assert_eq!(b.bitmaps, [local("b0"), local("b1")]);
        let n: NbdExportSpec = "name=z,image=null,size=1G".parse().unwrap();
        assert!(n.is_null());
        let bad = |s: &str| s.parse::<NbdExportSpec>().unwrap_err();
        assert!(bad("image=/i").contains("name="));
        assert!(bad("name=a").contains("image="));
        assert!(bad("name=a,image=null").contains("size="));
        assert!(bad("name=a,image=/i,writable=2").contains("writable=2"));
        assert!(bad("name=a,image=/i,colour=red").contains("colour"));
    }
}
