//! The I/O engines by name: [`EngineKind`] and `auto`'s order.
//!
//! This module owns the names of the engines and which ones this build has (features `pool`,
//! `linux-aio`, `uring`). It never constructs an engine: that, the engines' options and the
//! pairing with a thread pool are `engine_build.rs`'s.

use std::fmt;
use std::str::FromStr;

use crate::UnknownBackend;

/// An I/O engine aio-rs offers, whether or not this build has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// The thread pool (`aio-pool`, QEMU's `aio=threads`); feature `pool`.
    Pool,
    /// Linux native AIO (`aio-backend-linux-aio`, QEMU's `aio=native`); feature `linux-aio`.
    LinuxAio,
    /// io_uring (`aio-backend-uring`, QEMU's `aio=io_uring`); feature `uring`.
    Uring,
}

impl EngineKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [EngineKind; 3] = [EngineKind::Pool, EngineKind::LinuxAio, EngineKind::Uring];

    /// The order `auto` tries engines in: io_uring, Linux AIO, the thread pool.
    pub const AUTO_ORDER: [EngineKind; 3] =
        [EngineKind::Uring, EngineKind::LinuxAio, EngineKind::Pool];

    /// The name on command lines and in reports: `pool`, `linux-aio`, `uring`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Pool => "pool",
            EngineKind::LinuxAio => "linux-aio",
            EngineKind::Uring => "uring",
        }
    }

    /// The Cargo feature of the `aio` crate that builds this kind.
    pub fn feature(self) -> &'static str {
        self.name()
    }

    /// Whether this build has the kind (its feature is on); the kernel may still refuse it.
    pub fn in_build(self) -> bool {
        match self {
            EngineKind::Pool => cfg!(feature = "pool"),
            EngineKind::LinuxAio => cfg!(feature = "linux-aio"),
            EngineKind::Uring => cfg!(feature = "uring"),
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EngineKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownBackend {
                what: "engine",
                name: s.to_string(),
                expected: "pool, linux-aio, uring",
            })
    }
}
