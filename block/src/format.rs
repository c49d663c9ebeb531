//! Telling an image's format from its first bytes, as QEMU's format probe does, so that an
//! image of another format is never served as a raw disk by mistake.
//!
//! This module owns the magic numbers, the rule and the checks of a qcow2 header that come
//! before opening it; it opens nothing (the caller reads the header).
//!
//! Served as raw, a qcow2 (or QED, VMDK, ...) file shows the guest its metadata, and the first
//! write the guest makes there destroys the image for every other tool. QEMU probes an image
//! given without a format and refuses to let a probed raw image be written into a known
//! format's header. Here:
//!
//! * `format=auto` (the default) serves a qcow2 header as qcow2, refuses any other known
//!   format's header (naming it), and serves anything else as raw; a guest write that would
//!   put a known format's magic into sector 0 of such a probed raw image fails, as QEMU's
//!   raw driver refuses it for a probed image.
//! * `format=raw` serves the file as it is, whatever its first bytes.
//! * `format=qcow2` serves a qcow2 image and refuses anything else.
//! * A qcow2 image is refused before it is opened when it is encrypted (served as it is, the
//!   guest would read ciphertext and write plaintext into it) or carries an incompatible
//!   feature bit the device does not serve (named, with what to do about it).

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
    /// QEMU's qcow2 (version 2 or 3), with its backing chain; anything else is refused.
    Qcow2,
}

impl ImageFormat {
    /// The name on the `--disk` line.
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Auto => "auto",
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }
}

/// A `format=` value that is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("format={0}: expected auto, raw or qcow2")]
pub struct UnknownFormat(pub String);

impl FromStr for ImageFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, UnknownFormat> {
        match s {
            "auto" => Ok(ImageFormat::Auto),
            "raw" => Ok(ImageFormat::Raw),
            "qcow2" => Ok(ImageFormat::Qcow2),
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

/// Why a qcow2 header is refused before the image is opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Qcow2Refusal {
    /// The header is shorter than its version's fixed part.
    #[error("the qcow2 header is truncated ({0} bytes)")]
    Truncated(usize),
    /// A version other than 2 or 3.
    #[error("qcow2 version {0} (2 and 3 are served)")]
    Version(u32),
    /// The image is encrypted (`crypt_method` 1, AES, or 2, LUKS): refused, since the data
    /// would be served as ciphertext and written as plaintext.
    #[error("the qcow2 image is encrypted ({}); encrypted images are not served", crypt_name(*.0))]
    Encrypted(u32),
    /// The dirty bit alone: a crash left the refcounts of a `lazy_refcounts=on` image stale
    /// (its mappings are sound). Such an image may be read, not written, until it is repaired
    /// (`qemu-img check -r all`).
    #[error(
        "the qcow2 image is dirty: its refcounts are stale after a crash with \
         lazy_refcounts=on; repair it with `qemu-img check -r all`"
    )]
    Dirty,
    /// Incompatible feature bits the device does not serve (named in the message).
    #[error("the qcow2 image has incompatible feature bits it cannot be served with: {}",
        incompatible_names(*.0))]
    Incompatible(u64),
}

/// Byte offsets in a qcow2 header (big-endian fields).
mod qcow2_header {
    pub const VERSION: usize = 4;
    pub const CRYPT_METHOD: usize = 32;
    /// The end of version 2's fixed header.
    pub const V2_END: usize = 72;
    pub const INCOMPATIBLE: usize = 72;
    /// The end of version 3's fixed header (the fields read here).
    pub const V3_END: usize = 104;
    /// Dirty (lazy refcounts after a crash): served read-only.
    pub const DIRTY: u64 = 1 << 0;
    /// External data file: served (imago reads it).
    pub const EXTERNAL_DATA_FILE: u64 = 1 << 2;
}

/// A qcow2 `crypt_method`'s name.
fn crypt_name(method: u32) -> &'static str {
    match method {
        1 => "AES",
        2 => "LUKS",
        _ => "an unknown method",
    }
}

/// The incompatible feature bits, by name, with what an operator can do about each.
fn incompatible_names(bits: u64) -> String {
    let name = |bit: u32| match bit {
        0 => "0 (dirty: refcounts are stale after a crash with lazy_refcounts=on; repair with \
              `qemu-img check -r all`)"
            .to_string(),
        1 => "1 (corrupt: `qemu-img check -r all` may repair it)".to_string(),
        3 => "3 (compression type other than zlib)".to_string(),
        4 => "4 (extended L2 entries, subclusters)".to_string(),
        other => format!("{other} (unknown)"),
    };
    (0..64)
        .filter(|b| bits & (1u64 << b) != 0)
        .map(name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks a qcow2 header (the image's first bytes, at least the fixed header) for what is
/// refused before opening: a version other than 2 or 3, encryption, incompatible feature bits
/// other than the external data file's.
pub fn check_qcow2(header: &[u8]) -> Result<(), Qcow2Refusal> {
    use qcow2_header::*;
    let be32 = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
    if header.len() < V2_END {
        return Err(Qcow2Refusal::Truncated(header.len()));
    }
    let version = be32(VERSION);
    if version != 2 && version != 3 {
        return Err(Qcow2Refusal::Version(version));
    }
    let crypt = be32(CRYPT_METHOD);
    if crypt != 0 {
        return Err(Qcow2Refusal::Encrypted(crypt));
    }
    if version == 3 {
        if header.len() < V3_END {
            return Err(Qcow2Refusal::Truncated(header.len()));
        }
        let bits = u64::from_be_bytes(
            header[INCOMPATIBLE..INCOMPATIBLE + 8]
                .try_into()
                .expect("8"),
        );
        let refused = bits & !EXTERNAL_DATA_FILE;
        if refused == qcow2_header::DIRTY {
            return Err(Qcow2Refusal::Dirty);
        }
        if refused != 0 {
            return Err(Qcow2Refusal::Incompatible(refused));
        }
    }
    Ok(())
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
        assert_eq!("qcow2".parse(), Ok(ImageFormat::Qcow2));
        let e = "vmdk".parse::<ImageFormat>().unwrap_err();
        assert!(e.to_string().contains("format=vmdk"), "{e}");
    }

    fn qcow2_header(version: u32, crypt: u32, incompatible: u64) -> Vec<u8> {
        let mut h = vec![0u8; 112];
        h[..4].copy_from_slice(b"QFI\xfb");
        h[4..8].copy_from_slice(&version.to_be_bytes());
        h[32..36].copy_from_slice(&crypt.to_be_bytes());
        h[72..80].copy_from_slice(&incompatible.to_be_bytes());
        h
    }

    #[test]
    fn encrypted_and_unknown_feature_qcow2_headers_are_refused_by_name() {
        assert_eq!(check_qcow2(&qcow2_header(3, 0, 0)), Ok(()));
        assert_eq!(check_qcow2(&qcow2_header(2, 0, 0)), Ok(()));
        // The external data file bit is served.
        assert_eq!(check_qcow2(&qcow2_header(3, 0, 1 << 2)), Ok(()));
        let luks = check_qcow2(&qcow2_header(3, 2, 0)).unwrap_err();
        assert_eq!(luks, Qcow2Refusal::Encrypted(2));
        assert!(luks.to_string().contains("LUKS"), "{luks}");
        let aes = check_qcow2(&qcow2_header(2, 1, 0)).unwrap_err();
        assert!(aes.to_string().contains("AES"), "{aes}");
        let dirty = check_qcow2(&qcow2_header(3, 0, 1)).unwrap_err();
        assert_eq!(dirty, Qcow2Refusal::Dirty);
        assert!(dirty.to_string().contains("dirty") && dirty.to_string().contains("check -r all"));
        let unknown = check_qcow2(&qcow2_header(3, 0, (1 << 4) | (1 << 9))).unwrap_err();
        assert_eq!(unknown, Qcow2Refusal::Incompatible((1 << 4) | (1 << 9)));
        let text = unknown.to_string();
        assert!(
            text.contains("extended L2") && text.contains("9 (unknown)"),
            "{text}"
        );
        assert_eq!(
            check_qcow2(&qcow2_header(4, 0, 0)),
            Err(Qcow2Refusal::Version(4))
        );
        assert_eq!(
            check_qcow2(&qcow2_header(3, 0, 0)[..80]),
            Err(Qcow2Refusal::Truncated(80))
        );
        assert_eq!(check_qcow2(b"QFI\xfb"), Err(Qcow2Refusal::Truncated(4)));
    }
}
