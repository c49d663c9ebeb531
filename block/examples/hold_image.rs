//! Takes an image as a served disk does (QEMU's lock bytes) and holds it until Enter is
//! pressed: meanwhile `qemu-io -c 'write 0 4k' IMAGE`, `qemu-img resize IMAGE +1M` or a second
//! `hold_image` are refused, and `/proc/locks` shows the bytes.
//!
//! `cargo run -p aio-block --example hold_image -- IMAGE [rw|ro]`

use std::io::BufRead;

use aio_block::format::{self, KnownFormat};
use aio_block::lock::{Access, ImageLock, LockMode};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(image) = args.next() else {
        eprintln!("usage: hold_image IMAGE [rw|ro]");
        std::process::exit(2);
    };
    let writable = match args.next().as_deref() {
        None | Some("rw") => true,
        Some("ro") => false,
        Some(other) => {
            eprintln!("hold_image: '{other}': expected rw or ro");
            std::process::exit(2);
        }
    };
    let path = std::path::Path::new(&image);
    let file = std::fs::File::options()
        .read(true)
        .write(writable)
        .open(path)?;
    // A qcow2 image's file is held as QEMU's format layer holds it; anything else as a disk.
    let mut head = vec![0u8; format::PROBE_BYTES];
    let n = std::os::unix::fs::FileExt::read_at(&file, &mut head, 0)?;
    let access = match format::probe(&head[..n]) {
        Some(KnownFormat::Qcow2) => Access::qcow2_file(writable),
        _ => Access::disk(writable, false),
    };
    match ImageLock::acquire(&file, path, access, LockMode::On) {
        Ok(lock) => {
            println!(
                "holding {} ({}; not shared: {}): press Enter to release",
                path.display(),
                lock.access().held,
                lock.access().shared.complement()
            );
            std::io::stdin().lock().lines().next();
            Ok(())
        }
        Err(e) => {
            eprintln!("hold_image: {e}");
            std::process::exit(2);
        }
    }
}
