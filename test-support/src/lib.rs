//! # aio-test-support
//!
//! What the integration tests of aio-rs's crates share, written once (a dev-dependency,
//! `publish = false`; `aio-bench`, not published either, takes it for its daemons):
//!
//! - [`tool`]: run a program (`qemu-img`, `qemu-io`, `nbdinfo`, `fio`...) and fail the test
//!   with its words and the package that has it; whether a program is installed;
//! - [`images`]: directories where `O_DIRECT` works or in memory, raw and qcow2 images made
//!   in them;
//! - [`child`]: a child process that must end by itself within a limit;
//! - [`launch`]: a daemon (or QEMU) started as a child process (pinned if asked, its sockets
//!   waited for, its log quoted when it ends early, its console on a pipe if asked, stopped
//!   with a signal, killed when dropped and with the thread that started it);
//! - [`data`]: a stamp naming the offset and the write that put bytes there;
//! - [`procfs`]: what `/proc` says of a process: open fds, resident memory, status fields;
//! - `engines` (feature `backends`, on by default): every engine this build and kernel can
//!   build, each missing one said `skipped:` (a failure under `AIO_REQUIRE_ALL_BACKENDS=1`,
//!   as in CI);
//! - `loop_thread` (feature `backends`): a loop on a thread of its own until dropped, and the
//!   stop that ends a loop from another thread.
//!
//! Protocol clients (NBD's raw client, the QMP client, libblkio's, the Ceph test cluster)
//! stay with the crates whose protocol they speak.
//!
//! ```no_run
//! use aio_test_support::{images, tool};
//!
//! let dir = images::image_dir("my-test");
//! let image = images::qcow2_image(dir.path(), "disk.qcow2", "64M");
//! let info = tool::run("qemu-img", &["info", image.to_str().unwrap()]);
//! assert!(info.contains("virtual size: 64 MiB"));
//! ```

pub mod child;
pub mod data;
#[cfg(feature = "backends")]
pub mod engines;
pub mod images;
pub mod launch;
#[cfg(feature = "backends")]
pub mod loop_thread;
pub mod procfs;
pub mod tool;
