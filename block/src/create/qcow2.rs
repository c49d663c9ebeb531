//! A qcow2 image written on a file, as QEMU's `qcow2_co_create` does: its options checked
//! in QEMU's order with QEMU's texts, the layout imago's (QEMU's: the header, a refcount
//! table and a refcount block in the first three clusters, the L1 table after), then the
//! header finished for what imago does not write (lazy refcounts, version 2, a backing file
//! without a format).
//!
//! This module owns the qcow2 half of [`super`]; the file under the image is the caller's
//! (it exists: `blockdev-create` of a `file` made it).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use imago::qcow2::Qcow2CreateBuilder;
use imago::{FormatCreateBuilder, Storage, StorageOpenOptions};

use super::file::open_for_format;
use super::options::{CreateError, Preallocation, Qcow2Create, Qcow2Version};
use crate::qcow2::current::block_on;

/// The header extension naming the backing file's format.
const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
/// The header extension naming the feature bits (version 3 only).
const EXT_FEATURE_TABLE: u32 = 0x6803_f857;
/// The length of a version 2 header (every field up to the snapshots' offset).
const V2_HEADER_LEN: usize = 72;
/// The compatible feature bit of lazy refcounts.
const COMPAT_LAZY_REFCOUNTS: u64 = 1;

/// The checked options: cluster size and refcount width.
struct Checked {
    cluster_size: usize,
    refcount_bits: usize,
}

/// QEMU's checks, in its order.
fn check(opts: &Qcow2Create) -> Result<Checked, CreateError> {
    let invalid = |text: &str| Err(CreateError::Invalid(text.to_string()));
    if opts.size % 512 != 0 {
        return invalid("Image size must be a multiple of 512 bytes");
    }
    let v2 = opts.version == Qcow2Version::V2;
    let cluster_size = opts.cluster_size.unwrap_or(64 << 10);
    if !cluster_size.is_power_of_two() || !(512..=2 << 20).contains(&cluster_size) {
        return invalid("Cluster size must be a power of two between 512 and 2048k");
    }
    if opts.backing_file.is_some() && opts.preallocation != Preallocation::Off {
        return invalid(
            "Backing file and preallocation can only be used at the same time if \
             extended_l2 is on",
        );
    }
    if opts.backing_fmt.is_some() && opts.backing_file.is_none() {
        return invalid("Backing format cannot be used without backing file");
    }
    if v2 && opts.lazy_refcounts {
        return invalid(
            "Lazy refcounts only supported with compatibility level 1.1 and above (use \
             version=v3 or greater)",
        );
    }
    let refcount_bits = opts.refcount_bits.unwrap_or(16);
    if !(1..=64).contains(&refcount_bits) || !(refcount_bits as u64).is_power_of_two() {
        return invalid("Refcount width must be a power of two and may not exceed 64 bits");
    }
    if v2 && refcount_bits != 16 {
        return invalid(
            "Different refcount widths than 16 bits require compatibility level 1.1 or above \
             (use version=v3 or greater)",
        );
    }
    if opts.preallocation != Preallocation::Off {
        return Err(CreateError::Invalid(format!(
            "preallocation={} is not served for qcow2 images (only off)",
            opts.preallocation.name()
        )));
    }
    Ok(Checked {
        cluster_size: cluster_size as usize,
        refcount_bits: refcount_bits as usize,
    })
}

/// Writes the qcow2 image `opts` describes on the file at `path` (what was in it is gone).
pub fn create_qcow2(path: &Path, opts: &Qcow2Create) -> Result<(), CreateError> {
    let (file, _lock) = open_for_format(path)?;
    let checked = check(opts)?;
    file.set_len(0)
        .map_err(CreateError::io("Could not resize file"))?;
    let write = CreateError::io("Could not write qcow2 header");
    let storage = block_on(imago::file::File::open(
        StorageOpenOptions::new().write(true).filename(path),
    ))
    .map_err(CreateError::io("Could not open the new image"))?;
    let mut builder = Qcow2CreateBuilder::<imago::file::File>::new(storage)
        .size(opts.size)
        .cluster_size(checked.cluster_size)
        .refcount_width(checked.refcount_bits);
    if let Some(backing) = &opts.backing_file {
        // imago writes a format always; one not asked for is taken out below.
        let format = opts.backing_fmt.clone().unwrap_or_else(|| "raw".into());
        builder = builder.backing(backing.clone(), format);
    }
    block_on(builder.create()).map_err(CreateError::io("Could not resize image"))?;
    finish_header(
        &file,
        checked.cluster_size,
        opts.lazy_refcounts,
        opts.version == Qcow2Version::V2,
        opts.backing_file.is_some() && opts.backing_fmt.is_none(),
    )
    .map_err(write)?;
    file.sync_all()
        .map_err(CreateError::io("Could not update qcow2 header"))
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Rewrites the header cluster imago wrote: lazy refcounts set, made a version 2 header
/// (its 72 bytes, no feature table), the backing format's extension taken out. Nothing is
/// written when none is asked.
fn finish_header(
    file: &File,
    cluster_size: usize,
    lazy: bool,
    v2: bool,
    no_backing_fmt: bool,
) -> io::Result<()> {
    if !lazy && !v2 && !no_backing_fmt {
        return Ok(());
    }
    let mut old = vec![0u8; cluster_size];
    file.read_exact_at(&mut old, 0)?;
    let header_len = be32(&old, 100) as usize;
    if be32(&old, 4) != 3 || !(104..=cluster_size).contains(&header_len) {
        return Err(bad("not the version 3 header imago writes"));
    }
    let mut new = Vec::with_capacity(cluster_size);
    if v2 {
        new.extend_from_slice(&old[..V2_HEADER_LEN]);
        new[4..8].copy_from_slice(&2u32.to_be_bytes());
    } else {
        new.extend_from_slice(&old[..header_len]);
        if lazy {
            let compat = be64(&old, 80) | COMPAT_LAZY_REFCOUNTS;
            new[80..88].copy_from_slice(&compat.to_be_bytes());
        }
    }
    // The extensions, each kept or left out, then their end.
    let mut at = header_len;
    loop {
        if at + 8 > cluster_size {
            return Err(bad("header extensions past the first cluster"));
        }
        let (kind, len) = (be32(&old, at), be32(&old, at + 4) as usize);
        if kind == 0 {
            break;
        }
        let end = at + 8 + len.next_multiple_of(8);
        if end > cluster_size {
            return Err(bad("header extension past the first cluster"));
        }
        let drop =
            (no_backing_fmt && kind == EXT_BACKING_FORMAT) || (v2 && kind == EXT_FEATURE_TABLE);
        if !drop {
            new.extend_from_slice(&old[at..end]);
        }
        at = end;
    }
    new.extend_from_slice(&[0u8; 8]);
    // The backing file's name follows, where the header says.
    let (name_at, name_len) = (be64(&old, 8) as usize, be32(&old, 16) as usize);
    if name_at != 0 {
        let name = old
            .get(name_at..name_at + name_len)
            .ok_or_else(|| bad("backing file name past the first cluster"))?
            .to_vec();
        let offset = new.len() as u64;
        new[8..16].copy_from_slice(&offset.to_be_bytes());
        new.extend_from_slice(&name);
    }
    new.resize(cluster_size, 0);
    file.write_all_at(&new, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::create::{create_file, FileCreate};

    fn opts(size: u64) -> Qcow2Create {
        Qcow2Create {
            size,
            version: Qcow2Version::V3,
            cluster_size: None,
            lazy_refcounts: false,
            refcount_bits: None,
            backing_file: None,
            backing_fmt: None,
            preallocation: Preallocation::Off,
        }
    }

    fn file(dir: &Path) -> std::path::PathBuf {
        let path = dir.join("a.qcow2");
        create_file(&FileCreate {
            filename: path.clone(),
            size: 0,
            preallocation: Preallocation::Off,
        })
        .unwrap();
        path
    }

    #[test]
    fn options_are_checked_in_qemus_order_with_its_texts() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path());
        let refused = |o: Qcow2Create| create_qcow2(&path, &o).unwrap_err().to_string();
        assert_eq!(
            refused(Qcow2Create {
                cluster_size: Some(1000),
                ..opts(1000)
            }),
            "Image size must be a multiple of 512 bytes"
        );
        assert_eq!(
            refused(Qcow2Create {
                cluster_size: Some(256),
                ..opts(1 << 20)
            }),
            "Cluster size must be a power of two between 512 and 2048k"
        );
        assert_eq!(
            refused(Qcow2Create {
                backing_fmt: Some("raw".into()),
                ..opts(1 << 20)
            }),
            "Backing format cannot be used without backing file"
        );
        assert_eq!(
            refused(Qcow2Create {
                refcount_bits: Some(3),
                ..opts(1 << 20)
            }),
            "Refcount width must be a power of two and may not exceed 64 bits"
        );
        assert!(refused(Qcow2Create {
            version: Qcow2Version::V2,
            lazy_refcounts: true,
            ..opts(1 << 20)
        })
        .starts_with("Lazy refcounts only supported"));
    }

    #[test]
    fn the_header_says_what_was_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(dir.path());
        let header = |path: &Path| {
            let mut h = vec![0u8; 4096];
            File::open(path).unwrap().read_exact_at(&mut h, 0).unwrap();
            h
        };
        create_qcow2(
            &path,
            &Qcow2Create {
                lazy_refcounts: true,
                backing_file: Some("base.raw".into()),
                ..opts(1 << 30)
            },
        )
        .unwrap();
        let h = header(&path);
        assert_eq!(be32(&h, 4), 3);
        assert_eq!(be64(&h, 24), 1 << 30);
        assert_eq!(be64(&h, 80) & COMPAT_LAZY_REFCOUNTS, 1);
        let (at, len) = (be64(&h, 8) as usize, be32(&h, 16) as usize);
        assert_eq!(&h[at..at + len], b"base.raw");
        assert!(
            !h.windows(4).any(|w| w == EXT_BACKING_FORMAT.to_be_bytes()),
            "no backing format was asked"
        );
        create_qcow2(
            &path,
            &Qcow2Create {
                version: Qcow2Version::V2,
                backing_file: Some("base.qcow2".into()),
                backing_fmt: Some("qcow2".into()),
                ..opts(1 << 20)
            },
        )
        .unwrap();
        let h = header(&path);
        assert_eq!(be32(&h, 4), 2);
        assert_eq!(be32(&h, V2_HEADER_LEN), EXT_BACKING_FORMAT);
        let (at, len) = (be64(&h, 8) as usize, be32(&h, 16) as usize);
        assert_eq!(&h[at..at + len], b"base.qcow2");
    }
}
