//! Creating a `file` as QEMU's `raw_co_create` does, and opening an existing one for a
//! format to be written on it, locked as QEMU's creators lock it.
//!
//! This module owns the file's creation and its lock, never a format's layout (`qcow2.rs`).

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use super::options::{CreateError, FileCreate, Preallocation};
use crate::lock::{Access, ImageLock, LockMode, Permissions};

/// What QEMU's creators hold on the file they write: write and resize, sharing everything
/// but resize (the file has the asked size when they return).
fn creator_access(share_resize: bool) -> Access {
    let held = Permissions::WRITE | Permissions::RESIZE;
    let shared = if share_resize {
        Permissions::ALL
    } else {
        Permissions::CONSISTENT_READ | Permissions::WRITE | Permissions::WRITE_UNCHANGED
    };
    Access { held, shared }
}

/// Creates the file `opts` describes, as QEMU's `raw_co_create` does: created (or opened)
/// mode 0644, locked, emptied, then sized with its preallocation.
pub fn create_file(opts: &FileCreate) -> Result<(), CreateError> {
    let path = &opts.filename;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)
        .map_err(|source| CreateError::Create {
            path: path.clone(),
            source,
        })?;
    let _lock = ImageLock::acquire(&file, path, creator_access(false), LockMode::Auto)?;
    file.set_len(0)
        .map_err(CreateError::io("Could not resize file"))?;
    let size = opts.size;
    match opts.preallocation {
        Preallocation::Off => file
            .set_len(size)
            .map_err(CreateError::io("Could not resize file"))?,
        Preallocation::Falloc => {
            if size > 0 {
                let len = libc::off_t::try_from(size)
                    .map_err(|_| CreateError::Invalid("Could not preallocate new data".into()))?;
                // SAFETY: posix_fallocate on a descriptor the `File` keeps open; no memory
                // is passed.
                let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
                if err != 0 {
                    return Err(CreateError::Io {
                        what: "Could not preallocate new data",
                        source: io::Error::from_raw_os_error(err),
                    });
                }
            }
        }
        Preallocation::Full => {
            file.set_len(size)
                .map_err(CreateError::io("Could not resize file"))?;
            write_zeros(&mut file, size)
                .map_err(CreateError::io("Could not write zeros for preallocation"))?;
        }
        Preallocation::Metadata => {
            return Err(CreateError::Invalid(
                "Unsupported preallocation mode: metadata".into(),
            ))
        }
    }
    Ok(())
}

/// Writes `len` zero bytes from the start of `file`, 64 KiB at a time (QEMU's chunk).
fn write_zeros(file: &mut File, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; 64 << 10];
    file.seek(SeekFrom::Start(0))?;
    let mut left = len;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..n])?;
        left -= n as u64;
    }
    file.sync_data()
}

/// Opens the existing file `path` for a format to be written on it, locked as QEMU's format
/// creators hold it.
#[cfg(feature = "qcow2")]
pub(super) fn open_for_format(path: &std::path::Path) -> Result<(File, ImageLock), CreateError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|source| CreateError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let lock = ImageLock::acquire(&file, path, creator_access(true), LockMode::Auto)?;
    Ok((file, lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_created_sized_and_refused_in_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.raw");
        std::fs::write(&path, b"old data").unwrap();
        for (mode, size) in [
            (Preallocation::Off, 1 << 20),
            (Preallocation::Falloc, 64 << 10),
            (Preallocation::Full, 128 << 10),
        ] {
            let opts = FileCreate {
                filename: path.clone(),
                size,
                preallocation: mode,
            };
            create_file(&opts).unwrap();
            let data = std::fs::read(&path).unwrap();
            assert_eq!(data.len() as u64, size, "{mode:?}");
            assert!(
                data.iter().all(|&b| b == 0),
                "{mode:?}: the old data is gone"
            );
        }
        let missing = FileCreate {
            filename: dir.path().join("no/such.raw"),
            size: 0,
            preallocation: Preallocation::Off,
        };
        assert_eq!(
            create_file(&missing).unwrap_err().to_string(),
            format!(
                "Could not create '{}': No such file or directory",
                missing.filename.display()
            )
        );
        let metadata = FileCreate {
            preallocation: Preallocation::Metadata,
            ..missing
        };
        let metadata = FileCreate {
            filename: path,
            ..metadata
        };
        assert_eq!(
            create_file(&metadata).unwrap_err().to_string(),
            "Unsupported preallocation mode: metadata"
        );
    }
}
