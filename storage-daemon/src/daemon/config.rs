//! The daemon's configuration as a library takes it: the disks (one [`DiskSpec`] each, in
//! the `--disk` syntax), the backends, the iothreads.
//!
//! This module owns the configuration's types and the `--disk` syntax; it opens nothing and
//! parses no command line (the binary's `cli` module does).

use std::path::PathBuf;
use std::str::FromStr;

use aio::process::CpuList;
use aio::{Choice, EngineKind, MonitorKind};
use aio_block::lock::LockMode;
use aio_loop::{PollMaxNs, PollParams};
use aio_virtio_blk::format::ImageFormat;

use super::values::{on_off, parse_size};

/// What [`run`](crate::daemon::run) serves, and on what: [`Config::new`] with the defaults,
/// then the fields set (more may come: `#[non_exhaustive]`, so a new option is not a
/// breaking change).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// The disks, each on its own socket.
    pub disks: Vec<DiskSpec>,
    /// The I/O engine of every iothread (`auto`: the first of uring, linux-aio, pool).
    pub engine: Choice<EngineKind>,
    /// The fd monitor of every loop (`auto`: the first of uring, hybrid, poll).
    pub fdmon: Choice<MonitorKind>,
    /// How many iothreads (at least 1); the queues are spread over them by
    /// [`iothread_of`](aio_virtio_blk::dataplane::iothread_of).
    pub iothreads: u16,
    /// The iothreads' busy-poll window (QEMU's IOThread default 32768 ns).
    pub poll_max_ns: PollMaxNs,
    /// Each iothread's own polling parameters, in order (QEMU's `--object
    /// iothread,poll-max-ns=,poll-grow=,poll-shrink=`): iothread `k` takes
    /// `iothread_poll[k]` when there is one, else `poll_max_ns`'s.
    pub iothread_poll: Vec<PollParams>,
    /// Iothread `k` pinned to the list's CPU `k mod len` (none: not pinned).
    pub cpus: Option<CpuList>,
    /// The NBD server, if any (its clients are served on the iothreads).
    pub nbd: Option<super::nbd_spec::NbdServerSpec>,
    /// The NBD exports (they need [`nbd`](Config::nbd)).
    pub nbd_exports: Vec<super::nbd_spec::NbdExportSpec>,
}

impl Config {
    /// The disks with the defaults: `auto` backends, one iothread, QEMU's polling window.
    pub fn new(disks: Vec<DiskSpec>) -> Self {
        Config {
            disks,
            engine: Choice::Auto,
            fdmon: Choice::Auto,
            iothreads: 1,
            poll_max_ns: PollMaxNs::Fixed(aio_loop::DEFAULT_POLL_MAX_NS),
            iothread_poll: Vec::new(),
            cpus: None,
            nbd: None,
            nbd_exports: Vec::new(),
        }
    }
}

/// One `--disk`: [`DiskSpec::new`] with the defaults, or parsed from `--disk`'s value; the
/// fields may be set after (`#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskSpec {
    /// Where the vhost-user socket goes.
    pub socket: PathBuf,
    /// The image (a file or a block device), or `null`: the null device (see `size`).
    pub image: PathBuf,
    /// `readonly=on`.
    pub read_only: bool,
    /// `serial=ID` (at most 20 bytes).
    pub serial: String,
    /// `queues=Q` (default 1).
    pub queues: u16,
    /// `format=auto|raw|qcow2` (default auto: a qcow2 header is served as qcow2, another
    /// known format's header is refused, anything else is raw).
    pub format: ImageFormat,
    /// `size=BYTES` (suffixes K, M, G, T): the size of the null device (`image=null`), which
    /// has no file to take it from.
    pub size: Option<u64>,
    /// `iothread=K`: every queue of the disk on iothread `K` (counted from 0), as QEMU's
    /// export `iothread=` does; none: the queues of all disks take the iothreads in turn.
    pub iothread: Option<u16>,
    /// `locking=auto|on|off` (QEMU's `file.locking`, default auto): the image locked with
    /// QEMU's lock bytes, so that QEMU's tools and other daemons are refused a conflicting
    /// use of it while it is served, and this disk is refused an image they use.
    pub locking: LockMode,
    /// `share-rw=on`: other users may write the image beside this disk (QEMU's device
    /// option of that name; never for a qcow2 image, whose metadata has one writer).
    pub share_rw: bool,
    /// `id=NAME`: the export's id as QEMU names exports (`--export id=`, `block-export-add
    /// id=`); its end is announced with `BLOCK_EXPORT_DELETED` (none: not announced).
    pub id: Option<String>,
    /// The image opened inactive (QEMU's `active=off` node under an `allow-inactive=on`
    /// export): no lock held, reads served, everything else refused until activated
    /// (`blockdev-set-active`), for a migration's handover.
    pub inactive: bool,
}

impl DiskSpec {
    /// The disk as its user named it, for messages: `export 'ID' (SOCKET)` when it has an
    /// export id, `--disk SOCKET` otherwise.
    pub(crate) fn label(&self) -> String {
        match &self.id {
            Some(id) => format!("export '{id}' ({})", self.socket.display()),
            None => format!("--disk {}", self.socket.display()),
        }
    }

    /// A disk serving `image` (a path, an `rbd:` name, or `null` with [`size`](Self::size)) on
    /// the vhost-user socket `socket`: writable, one queue, no serial, its format probed,
    /// locked as QEMU locks it, its queues on the iothreads in turn.
    pub fn new(socket: impl Into<PathBuf>, image: impl Into<PathBuf>) -> Self {
        DiskSpec {
            socket: socket.into(),
            image: image.into(),
            read_only: false,
            serial: String::new(),
            queues: 1,
            format: ImageFormat::Auto,
            size: None,
            iothread: None,
            locking: LockMode::Auto,
            share_rw: false,
            id: None,
            inactive: false,
        }
    }

    /// Whether the disk is the null device (`image=null`; a file named `null` is
    /// `image=./null`).
    pub fn is_null(&self) -> bool {
        self.image.as_os_str() == "null"
    }
}

impl std::fmt::Display for DiskSpec {
    /// The spec as a `--disk` value (every key given, in the documented order).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "socket={},image={}",
            self.socket.display(),
            self.image.display()
        )?;
        if self.read_only {
            f.write_str(",readonly=on")?;
        }
        if !self.serial.is_empty() {
            write!(f, ",serial={}", self.serial)?;
        }
        if self.queues != 1 {
            write!(f, ",queues={}", self.queues)?;
        }
        if self.format != ImageFormat::Auto {
            write!(f, ",format={}", self.format.name())?;
        }
        if let Some(size) = self.size {
            write!(f, ",size={size}")?;
        }
        if let Some(k) = self.iothread {
            write!(f, ",iothread={k}")?;
        }
        if self.locking != LockMode::Auto {
            write!(f, ",locking={}", self.locking)?;
        }
        if self.share_rw {
            f.write_str(",share-rw=on")?;
        }
        if let Some(id) = &self.id {
            write!(f, ",id={id}")?;
        }
        Ok(())
    }
}

/// A `--disk` value that does not parse: what is wrong, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadDiskSpec(pub String);

impl FromStr for DiskSpec {
    type Err = BadDiskSpec;

    fn from_str(s: &str) -> Result<Self, BadDiskSpec> {
        parse_disk(s).map_err(BadDiskSpec)
    }
}

fn parse_disk(s: &str) -> Result<DiskSpec, String> {
    let (mut socket, mut image) = (None, None);
    let mut spec = DiskSpec::new(PathBuf::new(), PathBuf::new());
    for item in s.split(',') {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not KEY=VALUE"))?;
        match key {
            "socket" => socket = Some(PathBuf::from(value)),
            "image" => image = Some(PathBuf::from(value)),
            "readonly" => spec.read_only = on_off(key, value)?,
            "share-rw" => spec.share_rw = on_off(key, value)?,
            "id" => spec.id = Some(value.to_string()),
            "locking" => spec.locking = value.parse().map_err(|e| format!("{e}"))?,
            "serial" if value.len() <= 20 => spec.serial = value.to_string(),
            "serial" => return Err(format!("serial '{value}' is longer than 20 bytes")),
            "queues" => {
                spec.queues = value
                    .parse()
                    .ok()
                    .filter(|q| (1..=256).contains(q))
                    .ok_or_else(|| format!("queues={value}: expected 1 to 256"))?
            }
            "format" => spec.format = value.parse().map_err(|e| format!("{e}"))?,
            "size" => {
                spec.size = Some(parse_size(value).ok_or_else(|| {
                    format!("size={value}: expected a number of bytes (suffix K, M, G or T)")
                })?)
            }
            "iothread" => {
                spec.iothread = Some(value.parse().map_err(|_| {
                    format!("iothread={value}: expected an iothread's number, from 0")
                })?)
            }
            other => {
                return Err(format!(
                    "unknown key '{other}' (socket, image, readonly, serial, queues, format, \
                     size, iothread, locking, share-rw, id)"
                ))
            }
        }
    }
    spec.socket = socket.ok_or("socket=PATH is missing")?;
    spec.image = image.ok_or("image=PATH is missing")?;
    match (spec.is_null(), spec.size) {
        (true, None) => return Err("image=null needs size=BYTES".into()),
        (false, Some(_)) => {
            return Err("size= is the null device's (image=null); an image has its own".into())
        }
        _ => {}
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_specs_parse_and_bad_ones_name_the_key() {
        let d: DiskSpec = "socket=/tmp/s,image=/tmp/i,readonly=on,serial=abc,queues=4"
            .parse()
            .unwrap();
        assert_eq!((d.read_only, d.serial.as_str(), d.queues), (true, "abc", 4));
        assert!("image=/x"
            .parse::<DiskSpec>()
            .unwrap_err()
            .to_string()
            .contains("socket"));
        assert!("socket=/s,image=/i,queues=0"
            .parse::<DiskSpec>()
            .unwrap_err()
            .to_string()
            .contains("queues"));
        assert!("socket=/s,image=/i,colour=red"
            .parse::<DiskSpec>()
            .unwrap_err()
            .to_string()
            .contains("colour"));
        let long = "socket=/s,image=/i,serial=123456789012345678901";
        assert!(long
            .parse::<DiskSpec>()
            .unwrap_err()
            .to_string()
            .contains("20 bytes"));
        let raw: DiskSpec = "socket=/s,image=/i,format=raw".parse().unwrap();
        assert_eq!(raw.format, ImageFormat::Raw);
        assert_eq!(raw.to_string(), "socket=/s,image=/i,format=raw");
        assert_eq!(
            d.to_string(),
            "socket=/tmp/s,image=/tmp/i,readonly=on,serial=abc,queues=4"
        );
        let e = "socket=/s,image=/i,format=vmdk"
            .parse::<DiskSpec>()
            .unwrap_err();
        assert!(e.to_string().contains("format=vmdk"), "{e}");
        let q: DiskSpec = "socket=/s,image=/i.qcow2,format=qcow2".parse().unwrap();
        assert_eq!(q.format, ImageFormat::Qcow2);
        let named: DiskSpec = "socket=/s,image=/i,id=disk0".parse().unwrap();
        assert_eq!(named.id.as_deref(), Some("disk0"));
        assert_eq!(named.to_string().parse::<DiskSpec>().unwrap(), named);
        let l: DiskSpec = "socket=/s,image=/i,locking=off,share-rw=on"
            .parse()
            .unwrap();
        assert_eq!((l.locking, l.share_rw), (LockMode::Off, true));
        assert_eq!(l.to_string().parse::<DiskSpec>().unwrap(), l);
        for (bad, key) in [
            ("socket=/s,image=/i,locking=maybe", "locking=maybe"),
            ("socket=/s,image=/i,share-rw=2", "share-rw=2"),
        ] {
            let e = bad.parse::<DiskSpec>().unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    #[test]
    fn the_null_device_takes_a_size_and_only_it_does() {
        let d: DiskSpec = "socket=/s,image=null,size=1G".parse().unwrap();
        assert!(d.is_null());
        assert_eq!(d.size, Some(1 << 30));
        assert_eq!(d.to_string(), "socket=/s,image=null,size=1073741824");
        assert_eq!(d.to_string().parse::<DiskSpec>().unwrap(), d);
        let e = |s: &str| s.parse::<DiskSpec>().unwrap_err().to_string();
        assert!(e("socket=/s,image=null").contains("size="));
        assert!(e("socket=/s,image=/i,size=1G").contains("null"));
        assert!(e("socket=/s,image=null,size=12Q").contains("size=12Q"));
        assert!(e("socket=/s,image=null,size=99999999999T").contains("size="));
        assert!(!"socket=/s,image=./null"
            .parse::<DiskSpec>()
            .unwrap()
            .is_null());
    }
}
