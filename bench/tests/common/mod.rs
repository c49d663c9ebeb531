//! What the bench's command-line tests share: the binary, its output, a temporary folder.

#![allow(dead_code)] // Each test binary uses its own part.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `aio-bench` binary of this build.
pub fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_aio-bench"))
}

/// Both streams of a finished run, as one text.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

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
