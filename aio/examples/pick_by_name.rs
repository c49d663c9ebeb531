//! A program that takes its fd monitor and engine by name from its configuration, as a
//! downstream crate with `aio = { version = "0.1", features = ["epoll", "linux-aio"] }` does:
//! it reads a file through the engine picked, and says what `auto` would have picked.
//!
//! ```text
//! cargo run -p aio --example pick_by_name --features epoll,linux-aio -- epoll linux-aio
//! ```

use std::error::Error;
use std::fs::OpenOptions;
use std::io::Write;

use aio::engine::{AlignedBuf, IoFile};
use aio::{AioContext, Backends, Choice, EngineKind, EngineOptions, Pairing};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    // As a configuration file would give them; `auto` is a name too.
    let fdmon: Pairing = args.next().as_deref().unwrap_or("epoll").parse()?;
    let engine: Choice<EngineKind> = args.next().as_deref().unwrap_or("auto").parse()?;

    // Linux AIO cannot discard: a thread pool behind it would take those (feature `pool`).
    let options = EngineOptions::default().with_fallback_pool(true);
    let backends = match Backends::build(fdmon, engine, &options) {
        Ok(b) => b,
        Err(e) => {
            // A backend whose feature is off says which feature would build it.
            eprintln!("cannot build {fdmon} + {engine}: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "fd monitor {} ({}), engine {}",
        backends.monitor.kind,
        backends.monitor.built.describe(),
        backends.engine.kind
    );
    for report in &backends.engine.reports {
        println!("  auto: {report}");
    }

    let ctx = AioContext::new(backends.monitor.built)?;
    let engine = ctx.attach_engine(backends.engine.built, |_, _| {})?;

    let dir = std::env::temp_dir();
    let path = dir.join(format!("aio-pick-by-name-{}", std::process::id()));
    OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)?
        .write_all(&[0xa5; 4096])?;
    let file = IoFile::new(std::fs::File::open(&path)?);
    std::fs::remove_file(&path)?;

    let (result, buf) = ctx.block_on(engine.read(&file, 0, AlignedBuf::new(4096)));
    println!("read {} bytes, first byte {:#x}", result?, buf[0]);
    Ok(())
}
