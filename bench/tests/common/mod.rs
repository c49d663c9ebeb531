//! What the bench's command-line tests share: the binary, its output, a temporary folder.

#![allow(dead_code)] // Each test binary uses its own part.

use std::path::PathBuf;
use std::process::Command;

/// The `aio-bench` binary of this build.
pub fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_aio-bench"))
}

/// Both streams of a finished run, as one text.
pub use aio_test_support::tool::text;

/// A fresh directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("aio-bench-cli-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn entries(&self) -> usize {
        std::fs::read_dir(&self.0).unwrap().count()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Each command exits with code 2 and a message naming what is wrong.
pub fn expect_bad_input(cases: &[(Vec<&str>, &str)]) {
    for (args, needle) in cases {
        let o = bench().args(args).output().unwrap();
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {t}");
        assert!(
            t.contains(needle),
            "{args:?}: '{t}' does not name '{needle}'"
        );
    }
}

/// The fio engine names among `wanted` that this build and kernel run; each one refused says
/// `skipped:` why (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`).
pub fn usable(wanted: &[&'static str]) -> Vec<&'static str> {
    use aio::EngineKind;
    let mut out = Vec::new();
    for &w in wanted {
        let kind = EngineKind::ALL
            .into_iter()
            .find(|k| aio_bench::fio::ioengine(*k) == w)
            .expect("a fio ioengine name");
        match kind.build(&aio::EngineOptions::default()) {
            Ok(_) => out.push(w),
            Err(e) => aio_conformance::skip(&format!("ioengine={w}: {e}")),
        }
    }
    out
}

/// Why `--device loop` cannot run here (not root, no losetup, no loop driver), or `None`.
pub fn loop_device_unusable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("--device loop needs root".into());
    }
    if Command::new("losetup").arg("--version").output().is_err() {
        return Some("losetup is not installed".into());
    }
    if !std::path::Path::new("/dev/loop-control").exists() {
        return Some("no /dev/loop-control (loop driver missing)".into());
    }
    None
}

/// The loop devices whose backing file is `file` (`losetup -a`, deleted files included).
pub fn attached_to(file: &std::path::Path) -> Vec<String> {
    let out = Command::new("losetup").arg("-a").output().unwrap();
    let name = file.to_string_lossy().into_owned();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&name))
        .map(str::to_string)
        .collect()
}

/// Asserts that no loop device is left over `file` (the kernel may finish a detach of a device
/// that was busy when its last fd closes: allowed a few seconds) and that `file` is gone.
pub fn assert_cleaned_up(file: &std::path::Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !attached_to(file).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        attached_to(file),
        Vec::<String>::new(),
        "device left attached"
    );
    assert!(!file.exists(), "{} left behind", file.display());
}
