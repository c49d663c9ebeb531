//! A one-node Ceph cluster for tests (feature `testing`): the one `AIO_CEPH_CONF` names, or
//! one started by `scripts/ceph-cluster.sh` for the test and stopped when it ends.
//!
//! This module owns finding or starting the cluster and stopping one it started, and makes
//! the images tests ask for ([`TestCluster::new_image`]: each test its own, under a name no
//! other uses); what a test does with them is the test's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, Weak};

use crate::cluster::Cluster;
use crate::spec::ClusterOptions;

/// The environment variable that names a running cluster's configuration (`.ci/run` starts
/// one for every test binary).
pub const CONF_ENV: &str = "AIO_CEPH_CONF";

/// A cluster for a test: stopped on drop if the test started it.
#[derive(Debug)]
pub struct TestCluster {
    conf: PathBuf,
    /// The directory of a cluster this value started (stopped on drop).
    started: Option<tempfile::TempDir>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/ceph-cluster.sh")
}

/// Whether `AIO_REQUIRE_ALL_BACKENDS=1` (CI): a missing cluster fails, it does not skip.
fn required() -> bool {
    std::env::var("AIO_REQUIRE_ALL_BACKENDS").is_ok_and(|v| v == "1")
}

impl TestCluster {
    /// The cluster `AIO_CEPH_CONF` names, or one started under a temporary directory (about
    /// 10 s) and shared by the tests of this process that run meanwhile: the last one to drop
    /// it stops it. None, said on stderr, where neither can be had (no Ceph and no root to
    /// install it), unless `AIO_REQUIRE_ALL_BACKENDS=1`, which panics instead.
    pub fn get() -> Option<Arc<Self>> {
        static SHARED: Mutex<Weak<TestCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(running) = shared.upgrade() {
            return Some(running);
        }
        let started = Arc::new(Self::start()?);
        *shared = Arc::downgrade(&started);
        Some(started)
    }

    fn start() -> Option<Self> {
        if let Some(conf) = std::env::var_os(CONF_ENV) {
            return Some(TestCluster {
                conf: conf.into(),
                started: None,
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("aio-ceph-")
            .tempdir_in("/var/tmp")
            .expect("a directory for the cluster");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("bash runs");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(dir.path())
                .status();
            assert!(!required(), "no Ceph cluster could be started: {why}");
            eprintln!("skipped: no Ceph cluster could be started ({CONF_ENV} unset): {why}");
            return None;
        }
        Some(TestCluster {
            conf: dir.path().join("ceph.conf"),
            started: Some(dir),
        })
    }

    /// The cluster whose configuration is `conf` (started elsewhere: never stopped by this
    /// value).
    pub fn at(conf: &Path) -> Self {
        TestCluster {
            conf: conf.to_path_buf(),
            started: None,
        }
    }

    /// Its configuration file.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Options that reach it as `client.admin`.
    pub fn options(&self) -> ClusterOptions {
        ClusterOptions::from_conf(&self.conf, "admin")
    }

    /// A new connection to it.
    pub fn connect(&self) -> Arc<Cluster> {
        Cluster::connect(&self.options()).expect("the test cluster answers")
    }

    /// SIGKILLs one of the cluster's daemons (`osd.0`, `mon.a`): a fault test's crash.
    pub fn kill(&self, daemon: &str) {
        self.script("kill", daemon);
    }

    /// Starts a killed daemon again on its data.
    pub fn revive(&self, daemon: &str) {
        self.script("revive", daemon);
    }

    fn script(&self, action: &str, daemon: &str) {
        let dir = self
            .conf
            .parent()
            .expect("the configuration is in the cluster's directory");
        let status = Command::new("bash")
            .arg(script())
            .args([action.as_ref(), dir.as_os_str(), daemon.as_ref()])
            .status()
            .expect("bash runs");
        assert!(status.success(), "ceph-cluster.sh {action} {daemon}");
    }

    /// QEMU's name of `spec` on this cluster as `client.admin`
    /// (`rbd:POOL/IMAGE:conf=PATH:id=admin`): what `qemu-img` and the daemon's `image=` take.
    pub fn qemu_name(&self, spec: &crate::ImageSpec) -> String {
        format!("rbd:{spec}:conf={}:id=admin", self.conf.display())
    }

    /// Runs Ceph's `rbd` tool on this cluster with `args`: its standard output (a failure
    /// fails the test, with what the tool said).
    pub fn rbd(&self, args: &[&str]) -> String {
        let out = Command::new("rbd")
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .expect("rbd (Debian package ceph-common)");
        assert!(out.status.success(), "rbd {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A new, empty qcow2 image of `size` (`qemu-img create`'s form: `64M`) imported into RBD
    /// as `spec` (`rbd import`: the file's bytes, the qcow2 header first).
    pub fn import_new_qcow2(&self, spec: &crate::ImageSpec, size: &str) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let local = dir.path().join("new.qcow2");
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&local)
            .arg(size)
            .output()
            .expect("qemu-img (Debian package qemu-utils)");
        assert!(out.status.success(), "qemu-img create: {out:?}");
        self.rbd(&["import", local.to_str().expect("UTF-8"), &spec.to_string()]);
    }

    /// A new image of `size` bytes in the pool `rbd`, made through `cluster` (a connection to
    /// this cluster), its name [`unique`](TestCluster::unique_name) from `prefix`: its spec.
    pub fn new_image(cluster: &Arc<Cluster>, prefix: &str, size: u64) -> crate::ImageSpec {
        let spec = crate::ImageSpec::new("rbd", &Self::unique_name(prefix));
        crate::RbdImage::create(cluster, &spec, size)
            .unwrap_or_else(|e| panic!("creating the image {spec} of {size} bytes: {e}"));
        spec
    }

    /// A name no other test uses: `prefix` and this process's id and a counter.
    pub fn unique_name(prefix: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{}-{n}", std::process::id())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(dir) = &self.started {
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(dir.path())
                .status();
        }
    }
}
