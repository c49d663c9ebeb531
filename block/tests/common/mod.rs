//! What the block layer's integration tests share: the engines this machine builds, and
//! QEMU's tools run in a directory. Each test file uses part of it.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use aio::{EngineKind, EngineOptions, IoEngine};

/// Every engine this build and kernel can build, with the fallback pool behind it as the
/// daemon builds them; one this machine lacks says `skipped:` (and fails where
/// `AIO_REQUIRE_ALL_BACKENDS` is set, as in CI).
pub fn engines() -> Vec<(EngineKind, Box<dyn IoEngine>)> {
    let options = EngineOptions::default().with_fallback_pool(true);
    EngineKind::available()
        .into_iter()
        .filter_map(|kind| match kind.build(&options) {
            Ok(engine) => Some((kind, engine)),
            Err(why) => {
                aio_conformance::skip(&format!("engine {kind}: {why}"));
                None
            }
        })
        .collect()
}

/// Runs `program` (`qemu-img`, `qemu-io`) with `args` in `dir`; its standard output. A
/// failure is the test's, with the tool's words.
pub fn run_in(dir: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (install qemu-utils)"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
