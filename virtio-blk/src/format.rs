//! Telling an image's format from its first bytes, as QEMU's format probe does, so that an
//! image of another format is never served as a raw disk by mistake.
//!
//! This module owns the magic numbers and the rule; it opens nothing (the device reads the
//! header) and serves no format but raw.
//!
//! Served as raw, a qcow2 (or QED, VMDK, ...) file shows the guest its metadata, and the first
//! write the guest makes there destroys the image for every other tool. QEMU probes an image
//! given without a format and refuses to let a probed raw image be written into a known
//! format's header; here an image whose first bytes are a known format's magic is refused
//! unless the disk says `format=raw`.

use std::fmt;
use std::str::FromStr;

/// How many bytes of the image [`probe`] looks at (the VDI signature ends at byte 68).
pub const PROBE_BYTES: usize = 512;

/// The format a disk says its image has (`format=` on the `--disk` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ImageFormat {
    /// Read the header: raw unless it is a known format's (which is refused: see
    /// [`KnownFormat`]).
    #[default]
    Auto,
    /// Raw, whatever the first bytes are: the operator says the image is a disk whose first
    /// sector merely looks like a header.
    Raw,
}

impl ImageFormat {
    /// The name on the `--disk` line.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Auto => "auto",
            ImageFormat::Raw => "raw",
        }
    }
}

/// A `format=` value that is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("format={0}: expected auto or raw (image formats other than raw are not served yet)")]
pub struct UnknownFormat(pub String);

impl FromStr for ImageFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, UnknownFormat> {
        match s {
            "auto" => Ok(ImageFormat::Auto),
            "raw" => Ok(ImageFormat::Raw),
            other => Err(UnknownFormat(other.to_string())),
        }
    }
}

/// An image format other than raw, found by its magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KnownFormat {
    /// QEMU's qcow2 (`QFI\xfb`, version 2 or 3).
    Qcow2,
    /// QEMU's first qcow (`QFI\xfb`, version 1).
    Qcow,
    /// QEMU Enhanced Disk (`QED\0`).
    Qed,
    /// VMware's VMDK: a sparse extent (`KDMV`), an ESX COW disk (`COWD`) or a descriptor file.
    Vmdk,
    /// VirtualBox's VDI (signature `0xbeda107f` at byte 64).
    Vdi,
    /// Hyper-V's VHDX (`vhdxfile`).
    Vhdx,
    /// Virtual PC's VHD (`conectix`).
    Vpc,
    /// Parallels (`WithoutFreeSpace`, `WithouFreSpacExt`).
    Parallels,
    /// A LUKS-encrypted volume (`LUKS\xba\xbe`, LUKS1 and LUKS2).
    Luks,
}

impl KnownFormat {
    /// QEMU's driver name for the format.
    pub fn name(self) -> &'static str {
        match self {
            KnownFormat::Qcow2 => "qcow2",
            KnownFormat::Qcow => "qcow",
            KnownFormat::Qed => "qed",
            KnownFormat::Vmdk => "vmdk",
            KnownFormat::Vdi => "vdi",
            KnownFormat::Vhdx => "vhdx",
            KnownFormat::Vpc => "vpc",
            KnownFormat::Parallels => "parallels",
            KnownFormat::Luks => "luks",
        }
    }
}

impl fmt::Display for KnownFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The known format whose magic `header` (the image's first bytes, [`PROBE_BYTES`] of them or
/// the whole image if smaller) starts with, or None: raw.
pub fn probe(header: &[u8]) -> Option<KnownFormat> {
    let starts = |magic: &[u8]| header.starts_with(magic);
    if starts(b"QFI\xfb") {
        let version = header
            .get(4..8)
            .map(|v| u32::from_be_bytes(v.try_into().expect("4 bytes")));
        return Some(match version {
            Some(1) => KnownFormat::Qcow,
            _ => KnownFormat::Qcow2,
        });
    }
    let by_prefix: [(&[u8], KnownFormat); 9] = [
        (b"QED\0", KnownFormat::Qed),
        (b"KDMV", KnownFormat::Vmdk),
        (b"COWD", KnownFormat::Vmdk),
        (b"# Disk DescriptorFile", KnownFormat::Vmdk),
        (b"vhdxfile", KnownFormat::Vhdx),
        (b"conectix", KnownFormat::Vpc),
        (b"WithoutFreeSpace", KnownFormat::Parallels),
        (b"WithouFreSpacExt", KnownFormat::Parallels),
        (b"LUKS\xba\xbe", KnownFormat::Luks),
    ];
    if let Some(&(_, format)) = by_prefix.iter().find(|(magic, _)| starts(magic)) {
        return Some(format);
    }
    const VDI_SIGNATURE: u32 = 0xbeda_107f;
    let vdi = header
        .get(64..68)
        .is_some_and(|s| u32::from_le_bytes(s.try_into().expect("4 bytes")) == VDI_SIGNATURE);
    vdi.then_some(KnownFormat::Vdi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(prefix: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; PROBE_BYTES];
        h[..prefix.len()].copy_from_slice(prefix);
        h
    }

    #[test]
    fn every_known_magic_is_found_and_anything_else_is_raw() {
        let cases: [(&[u8], KnownFormat); 11] = [
            (b"QFI\xfb\0\0\0\x03", KnownFormat::Qcow2),
            (b"QFI\xfb\0\0\0\x02", KnownFormat::Qcow2),
            (b"QFI\xfb\0\0\0\x01", KnownFormat::Qcow),
            (b"QED\0", KnownFormat::Qed),
            (b"KDMV\x01\0\0\0", KnownFormat::Vmdk),
            (b"# Disk DescriptorFile\n", KnownFormat::Vmdk),
            (b"vhdxfile", KnownFormat::Vhdx),
            (b"conectix", KnownFormat::Vpc),
            (b"WithoutFreeSpace", KnownFormat::Parallels),
            (b"LUKS\xba\xbe\0\x02", KnownFormat::Luks),
            (b"LUKS\xba\xbe\0\x01", KnownFormat::Luks),
        ];
        for (magic, format) in cases {
            assert_eq!(probe(&header(magic)), Some(format), "{magic:?}");
        }
        let mut vdi = header(b"<<< Oracle VM VirtualBox Disk Image >>>\n");
        vdi[64..68].copy_from_slice(&0xbeda_107fu32.to_le_bytes());
        assert_eq!(probe(&vdi), Some(KnownFormat::Vdi));
        for raw in [
            &header(b"")[..],
            b"",
            b"QFI",
            b"LUKS\xba",
            &[0x55; 64],
            b"\xeb\x63\x90",
        ] {
            assert_eq!(probe(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn format_names_parse_and_others_are_refused_by_name() {
        assert_eq!("auto".parse(), Ok(ImageFormat::Auto));
        assert_eq!("raw".parse(), Ok(ImageFormat::Raw));
        assert_eq!(ImageFormat::default(), ImageFormat::Auto);
        let e = "qcow2".parse::<ImageFormat>().unwrap_err();
        assert!(e.to_string().contains("format=qcow2"), "{e}");
    }
}
