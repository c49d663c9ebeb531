//! The daemon's command line: one `--disk` per served image, and the loop's settings.
//!
//! This module owns parsing and checking the arguments; it opens nothing.

use std::path::PathBuf;
use std::str::FromStr;

use clap::Parser;

use super::backends::{engine_names, monitor_names};
use crate::format::ImageFormat;

/// `aio-vhost-user-blk`: serves disk images as vhost-user-blk devices on aio-rs iothreads.
#[derive(Debug, Parser)]
#[command(name = "aio-vhost-user-blk", version)]
pub struct Args {
    /// A disk: `socket=PATH,image=PATH[,readonly=on][,serial=ID][,queues=Q][,format=auto|raw]`
    /// (repeatable; each its own socket, and an image given twice only read-only).
    #[arg(long = "disk", required = true, value_name = "SPEC")]
    pub disks: Vec<DiskSpec>,
    /// The I/O engine: pool, linux-aio, uring or auto.
    #[arg(long, default_value = "auto", value_parser = clap::builder::PossibleValuesParser::new(engine_names()))]
    pub engine: String,
    /// The fd monitor: poll, epoll, hybrid, uring or auto.
    #[arg(long, default_value = "auto", value_parser = clap::builder::PossibleValuesParser::new(monitor_names()))]
    pub fdmon: String,
    /// How many iothreads; queue i of each disk runs on iothread i mod K.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub iothreads: u16,
    /// The iothreads' longest busy-poll window in ns (0: off; default QEMU's IOThread 32768),
    /// or `auto`: the window chosen from the waits each iothread sees.
    #[arg(long, default_value = "32768", value_parser = parse_poll_max_ns)]
    pub poll_max_ns: aio_core::PollMaxNs,
    /// CPUs to run on, e.g. `0` or `0-1,3`: iothread k on the k-th (mod the count).
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<CpuList>,
}

/// A CPU list (`0`, `0-3`, `0,2`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

fn parse_cpus(s: &str) -> Result<CpuList, String> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let bad = || format!("'{part}' is not a CPU number or range");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    Ok(CpuList(cpus))
}

/// One `--disk`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskSpec {
    /// Where the vhost-user socket goes.
    pub socket: PathBuf,
    /// The image (a file or a block device).
    pub image: PathBuf,
    /// `readonly=on`.
    pub read_only: bool,
    /// `serial=ID` (at most 20 bytes).
    pub serial: String,
    /// `queues=Q` (default 1).
    pub queues: u16,
    /// `format=auto|raw` (default auto: an image with a known format's header is refused).
    pub format: ImageFormat,
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
        Ok(())
    }
}

impl FromStr for DiskSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (mut socket, mut image) = (None, None);
        let mut spec = DiskSpec {
            socket: PathBuf::new(),
            image: PathBuf::new(),
            read_only: false,
            serial: String::new(),
            queues: 1,
            format: ImageFormat::Auto,
        };
        for item in s.split(',') {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not KEY=VALUE"))?;
            match key {
                "socket" => socket = Some(PathBuf::from(value)),
                "image" => image = Some(PathBuf::from(value)),
                "readonly" => {
                    spec.read_only = match value {
                        "on" | "true" | "yes" => true,
                        "off" | "false" | "no" => false,
                        _ => return Err(format!("readonly={value}: expected on or off")),
                    }
                }
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
                other => {
                    return Err(format!(
                        "unknown key '{other}' (socket, image, readonly, serial, queues, format)"
                    ))
                }
            }
        }
        spec.socket = socket.ok_or("socket=PATH is missing")?;
        spec.image = image.ok_or("image=PATH is missing")?;
        Ok(spec)
    }
}

/// `--poll-max-ns`: ns or `auto`.
fn parse_poll_max_ns(s: &str) -> Result<aio_core::PollMaxNs, String> {
    s.parse().map_err(|e: aio_core::BadPollMaxNs| e.to_string())
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
            .contains("socket"));
        assert!("socket=/s,image=/i,queues=0"
            .parse::<DiskSpec>()
            .unwrap_err()
            .contains("queues"));
        assert!("socket=/s,image=/i,colour=red"
            .parse::<DiskSpec>()
            .unwrap_err()
            .contains("colour"));
        let long = "socket=/s,image=/i,serial=123456789012345678901";
        assert!(long.parse::<DiskSpec>().unwrap_err().contains("20 bytes"));
        let raw: DiskSpec = "socket=/s,image=/i,format=raw".parse().unwrap();
        assert_eq!(raw.format, ImageFormat::Raw);
        assert_eq!(raw.to_string(), "socket=/s,image=/i,format=raw");
        assert_eq!(
            d.to_string(),
            "socket=/tmp/s,image=/tmp/i,readonly=on,serial=abc,queues=4"
        );
        let e = "socket=/s,image=/i,format=qcow2"
            .parse::<DiskSpec>()
            .unwrap_err();
        assert!(e.contains("format=qcow2"), "{e}");
        assert_eq!(parse_cpus("0-2,5").unwrap(), CpuList(vec![0, 1, 2, 5]));
        assert!(parse_cpus("2-1").is_err());
    }

    #[test]
    fn bad_arguments_are_refused_with_their_name() {
        let e = Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--engine", "spdk"])
            .unwrap_err();
        assert!(e.to_string().contains("spdk"), "{e}");
        assert!(Args::try_parse_from(["x"]).is_err());
        let a = Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--iothreads", "2"])
            .unwrap();
        assert_eq!(
            (a.iothreads, a.poll_max_ns, a.engine.as_str()),
            (2, aio_core::PollMaxNs::Fixed(32768), "auto")
        );
        let a =
            Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--poll-max-ns", "auto"])
                .unwrap();
        assert_eq!(a.poll_max_ns, aio_core::PollMaxNs::Auto);
        let e =
            Args::try_parse_from(["x", "--disk", "socket=/s,image=/i", "--poll-max-ns", "soon"])
                .unwrap_err();
        assert!(e.to_string().contains("auto"), "{e}");
    }
}
