//! Which image, and how to reach its cluster, as users write them: `pool[/namespace]/image[@snap]`
//! and QEMU's `rbd:` filename.
//!
//! This module owns parsing and printing those forms ([`ImageSpec`], [`RbdTarget`],
//! [`ClusterOptions`]); it never connects to anything.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::RbdError;

/// An image in a cluster: its pool, namespace, name and snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageSpec {
    /// The pool (`rbd`).
    pub pool: String,
    /// The namespace in the pool (None: the default one).
    pub namespace: Option<String>,
    /// The image's name.
    pub image: String,
    /// A snapshot of the image: served read-only.
    pub snapshot: Option<String>,
}

impl ImageSpec {
    /// The image `image` in `pool`'s default namespace, its head (not a snapshot).
    pub fn new(pool: &str, image: &str) -> Self {
        ImageSpec {
            pool: pool.to_string(),
            namespace: None,
            image: image.to_string(),
            snapshot: None,
        }
    }

    /// The same image in `namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// The same image's snapshot `snapshot`.
    pub fn snapshot(mut self, snapshot: &str) -> Self {
        self.snapshot = Some(snapshot.to_string());
        self
    }
}

impl fmt::Display for ImageSpec {
    /// `pool[/namespace]/image[@snapshot]`, as `rbd` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.pool)?;
        if let Some(ns) = &self.namespace {
            write!(f, "{ns}/")?;
        }
        write!(f, "{}", self.image)?;
        if let Some(snap) = &self.snapshot {
            write!(f, "@{snap}")?;
        }
        Ok(())
    }
}

impl FromStr for ImageSpec {
    type Err = RbdError;

    /// `pool/image`, `pool/namespace/image`, either with `@snapshot`.
    fn from_str(s: &str) -> Result<Self, RbdError> {
        let bad = |reason: &str| RbdError::BadSpec {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let (path, snapshot) = match s.split_once('@') {
            Some((path, snap)) if !snap.is_empty() => (path, Some(snap.to_string())),
            Some(_) => return Err(bad("an empty snapshot name after '@'")),
            None => (s, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(bad("an empty pool, namespace or image name"));
        }
        let (pool, namespace, image) = match parts.as_slice() {
            [pool, image] => (pool, None, image),
            [pool, ns, image] => (pool, Some(ns.to_string()), image),
            _ => return Err(bad("expected pool/image or pool/namespace/image")),
        };
        Ok(ImageSpec {
            pool: pool.to_string(),
            namespace,
            image: image.to_string(),
            snapshot,
        })
    }
}

/// An image and how to reach its cluster: what QEMU's `rbd:` filename says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdTarget {
    /// The image.
    pub spec: ImageSpec,
    /// The cluster.
    pub cluster: ClusterOptions,
}

impl FromStr for RbdTarget {
    type Err = RbdError;

    /// QEMU's `rbd:pool[/namespace]/image[@snap][:conf=PATH][:id=USER][:key=VALUE]...`: after
    /// the image, `:`-separated options (`\:` is a colon inside a value); `conf` and `id` are
    /// the configuration file and the user (without `client.`), any other is a Ceph option
    /// (`mon_host`, `key`, `keyring`, `client_mount_timeout`, ...).
    fn from_str(s: &str) -> Result<Self, RbdError> {
        let bad = |reason: &str| RbdError::BadSpec {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let rest = s
            .strip_prefix("rbd:")
            .ok_or_else(|| bad("does not start with rbd:"))?;
        let fields = split_escaped(rest);
        let (image, options) = fields.split_first().ok_or_else(|| bad("no image"))?;
        let spec: ImageSpec = image.parse().map_err(|_| bad("expected pool/image"))?;
        let mut cluster = ClusterOptions::default();
        for option in options {
            let (key, value) = option
                .split_once('=')
                .ok_or_else(|| bad(&format!("option {option:?} is not key=value")))?;
            match key {
                "conf" => cluster.conf = Some(PathBuf::from(value)),
                "id" => cluster.user = value.to_string(),
                _ => cluster.options.push((key.to_string(), value.to_string())),
            }
        }
        Ok(RbdTarget { spec, cluster })
    }
}

/// Splits at `:` not escaped by `\`, unescaping `\:` and `\\`.
fn split_escaped(s: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    out.last_mut().expect("never empty").push(next);
                }
            }
            ':' => out.push(String::new()),
            c => out.last_mut().expect("never empty").push(c),
        }
    }
    out
}

/// How to reach a cluster, as QEMU's `driver=rbd` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// The configuration file (`/etc/ceph/ceph.conf`); None reads Ceph's default places, if
    /// any exist.
    pub conf: Option<PathBuf>,
    /// The user, without `client.` (`admin`).
    pub user: String,
    /// How long connecting waits for the monitors (`client_mount_timeout`); None keeps the
    /// configuration's (Ceph's default is 300 s).
    pub mount_timeout: Option<Duration>,
    /// Other Ceph options, set after the file is read (`mon_host`, `key`, `keyring`, ...).
    pub options: Vec<(String, String)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            conf: None,
            user: "admin".to_string(),
            mount_timeout: None,
            options: Vec::new(),
        }
    }
}

impl ClusterOptions {
    /// The cluster a configuration file describes, reached as `user`.
    pub fn from_conf(conf: impl Into<PathBuf>, user: &str) -> Self {
        ClusterOptions {
            conf: Some(conf.into()),
            user: user.to_string(),
            ..Self::default()
        }
    }

    /// The same options with the Ceph option `key` set to `value` (`mon_host`, `key`).
    pub fn option(mut self, key: &str, value: &str) -> Self {
        self.options.push((key.to_string(), value.to_string()));
        self
    }

    /// The same options, connecting for at most `timeout`.
    pub fn mount_timeout(mut self, timeout: Duration) -> Self {
        self.mount_timeout = Some(timeout);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_as_rbd_writes_them() {
        for s in ["rbd/disk0", "rbd/ns1/disk0", "rbd/disk0@snap1", "p/n/i@s"] {
            assert_eq!(s.parse::<ImageSpec>().unwrap().to_string(), s);
        }
        for s in ["disk0", "rbd/", "/disk0", "a/b/c/d", "rbd/disk0@", "rbd//x"] {
            assert!(
                matches!(s.parse::<ImageSpec>(), Err(RbdError::BadSpec { .. })),
                "{s}"
            );
        }
    }

    #[test]
    fn qemus_filename_gives_the_image_the_conf_the_user_and_ceph_options() {
        let t: RbdTarget =
            r"rbd:rbd/ns/disk@s:conf=/etc/ceph/x.conf:id=qemu:mon_host=1.2.3.4\:6789"
                .parse()
                .unwrap();
        assert_eq!(
            t.spec,
            ImageSpec::new("rbd", "disk").namespace("ns").snapshot("s")
        );
        assert_eq!(t.cluster.conf, Some(PathBuf::from("/etc/ceph/x.conf")));
        assert_eq!(t.cluster.user, "qemu");
        assert_eq!(
            t.cluster.options,
            vec![("mon_host".to_string(), "1.2.3.4:6789".to_string())]
        );
        assert!("file:x".parse::<RbdTarget>().is_err());
        assert!("rbd:rbd/x:conf".parse::<RbdTarget>().is_err());
    }
}
