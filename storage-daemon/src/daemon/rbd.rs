//! Images named by QEMU's `rbd:` filename where a path is expected (`--disk image=`,
//! `--nbd-export image=`, qemu-storage-daemon's `driver=rbd` node), and where the daemon keeps
//! its RBD lock records.
//!
//! This module owns telling an RBD image from a file and opening either; the RBD image itself
//! is `aio_block`'s (`Image::open_rbd`) and `aio_rbd`'s.
//!
//! * **`rbd:` is a protocol prefix,** as in QEMU's `-drive file=rbd:...`: a file whose name
//!   starts so is given as `./rbd:...`.
//! * **Lock records** live in `$AIO_STORAGE_DAEMON_RUN_DIR/rbd-locks`, else
//!   `/run/aio-storage-daemon/rbd-locks` (root) or `$XDG_RUNTIME_DIR/aio-storage-daemon/rbd-locks`:
//!   a daemon restarted after a SIGKILL finds there that the image's lock holder was its own
//!   dead predecessor, breaks that lock and serves again at once. Without a usable directory
//!   no lock is ever broken (a restart then waits for an operator's `rbd lock rm`).

use std::path::Path;

use aio_block::image::OpenError;
use aio_block::{Image, ImageOptions};

/// Whether `path` names an RBD image (`rbd:...`).
pub(crate) fn is_rbd(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.starts_with("rbd:"))
}

/// The key that tells two RBD images apart: `pool[/namespace]/image[@snapshot]` (None for a
/// file, or a name that does not parse: opening it fails later, with the reason).
pub(crate) fn image_key(path: &Path) -> Option<String> {
    #[cfg(feature = "rbd")]
    {
        let target: aio_rbd::RbdTarget = path.to_str()?.parse().ok()?;
        Some(target.spec.to_string())
    }
    #[cfg(not(feature = "rbd"))]
    {
        is_rbd(path).then(|| path.display().to_string())
    }
}

/// Where lock records go (see the module's notes), if anywhere.
#[cfg(feature = "rbd")]
fn records_dir() -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    if let Some(dir) = std::env::var_os("AIO_STORAGE_DAEMON_RUN_DIR") {
        return Some(PathBuf::from(dir).join("rbd-locks"));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Some(PathBuf::from("/run/aio-storage-daemon/rbd-locks"));
    }
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")?;
    Some(PathBuf::from(runtime).join("aio-storage-daemon/rbd-locks"))
}

/// Opens the image `path` names: an RBD image for `rbd:...`, a file or block device else;
/// `inactive`: without its locks, until activated ([`Image::open_inactive`]).
pub(crate) fn open_image(
    path: &Path,
    options: ImageOptions,
    inactive: bool,
) -> Result<Image, OpenError> {
    let image = if is_rbd(path) {
        open_rbd(path, options, inactive)?
    } else if inactive {
        Image::open_inactive(path, options)?
    } else {
        Image::open(path, options)?
    };
    warn_of_bitmaps(path, &image);
    Ok(image)
}

/// Says on stderr which persistent dirty bitmaps (backup checkpoints) of `image` were found
/// inconsistent at open (left `in_use` by a user that did not close the image), if any: an
/// incremental backup from them is refused, as QEMU refuses it.
pub(crate) fn warn_of_bitmaps(path: &Path, image: &Image) {
    let stale: Vec<String> = image
        .dirty_bitmaps()
        .list()
        .into_iter()
        .filter(|b| b.is_persistent() && b.is_inconsistent())
        .map(|b| b.name().to_owned())
        .collect();
    if !stale.is_empty() {
        eprintln!(
            "aio-storage-daemon: warning: {}: the persistent bitmap(s) {} were left in use by a \
             program that did not close the image: they are inconsistent, an incremental backup \
             from them is refused and the next backup is a full one",
            path.display(),
            stale.join(", ")
        );
    }
}

#[cfg(feature = "rbd")]
fn open_rbd(path: &Path, options: ImageOptions, inactive: bool) -> Result<Image, OpenError> {
    let text = path.to_str().unwrap_or_default();
    let target: aio_rbd::RbdTarget = text.parse()?;
    let records = records_dir().and_then(|dir| match aio_rbd::LockRecords::new(&dir) {
        Ok(records) => Some(records),
        Err(e) => {
            eprintln!(
                "aio-storage-daemon: warning: RBD lock records in {}: {e}: a lock left by a \
                 killed daemon will not be broken",
                dir.display()
            );
            None
        }
    });
    // Inactive (a migration's destination): the exclusive lock is taken on activation.
    let image = match inactive {
        true => Image::open_rbd_inactive(&target, options, records.as_ref())?,
        false => Image::open_rbd(&target, options, records.as_ref())?,
    };
    match image.rbd_lock() {
        Some(aio_rbd::LockTaken::BrokeStale { holder }) => eprintln!(
            "aio-storage-daemon: {}: took over the exclusive lock this daemon's killed \
             predecessor held ({holder}, now blocklisted)",
            target.spec
        ),
        Some(aio_rbd::LockTaken::Unsupported) => eprintln!(
            "aio-storage-daemon: warning: {}: the image has no exclusive-lock feature, so \
             nothing stops a second writer (rbd feature enable {} exclusive-lock)",
            target.spec, target.spec
        ),
        _ => {}
    }
    Ok(image)
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(path: &Path, _options: ImageOptions, _inactive: bool) -> Result<Image, OpenError> {
    Err(OpenError::FormatNotServed {
        path: path.to_path_buf(),
        reason: "this build serves no RBD image (feature `rbd` of aio-storage-daemon)",
    })
}
