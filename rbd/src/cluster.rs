//! A connection to a Ceph cluster (`rados_t`) and to one of its pools (`rados_ioctx_t`).
//!
//! This module owns connecting (the configuration file, the user and key, the options, the
//! mount timeout), telling why a connection failed, and shutting it down once its last image
//! has closed. It never opens an image (`image.rs` does).
//!
//! * **Blocking.** Connecting waits for the monitors, up to `client_mount_timeout`: do it
//!   where a wait is acceptable (a daemon's start, a QMP command), never on a serving loop.

use std::ffi::{c_char, CString};
use std::sync::Arc;

use crate::error::{c_string, check, RbdError};
use crate::spec::{ClusterOptions, ImageSpec};
use crate::sys::{self, Lib};

/// A connection to a cluster. `Send + Sync`; images keep it alive (`Arc`), and the last one
/// to go shuts it down.
pub struct Cluster {
    handle: sys::Rados,
    lib: &'static Lib,
    user: String,
    monitors: String,
}

// SAFETY: librados's cluster handle is thread-safe once connected (its calls lock inside);
// the handle is only shut down by `Drop`, when no other reference exists.
unsafe impl Send for Cluster {}
// SAFETY: as above.
unsafe impl Sync for Cluster {}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("user", &self.user)
            .field("monitors", &self.monitors)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Connects to the cluster `options` describe (blocking, up to the mount timeout).
    pub fn connect(options: &ClusterOptions) -> Result<Arc<Self>, RbdError> {
        let lib = sys::lib()?;
        let user = c_string(&options.user, "user")?;
        let mut handle: sys::Rados = std::ptr::null_mut();
        // SAFETY: `handle` is a live out-pointer; `user` a NUL-terminated string.
        let ret = unsafe { (lib.rados_create)(&mut handle, user.as_ptr()) };
        check(ret.into()).map_err(|errno| RbdError::Call {
            call: "rados_create",
            target: options.user.clone(),
            errno,
        })?;
        // From here `cluster`'s drop shuts the handle down, on every error path.
        let mut cluster = Cluster {
            handle,
            lib,
            user: format!("client.{}", options.user),
            monitors: String::new(),
        };
        cluster.configure(options)?;
        cluster.monitors = cluster.conf_get("mon_host").unwrap_or_default();
        // SAFETY: a configured handle, not yet connected.
        let ret = unsafe { (lib.rados_connect)(handle) };
        if let Err(errno) = check(ret.into()) {
            return Err(cluster.connect_error(errno));
        }
        Ok(Arc::new(cluster))
    }

    fn configure(&self, options: &ClusterOptions) -> Result<(), RbdError> {
        let conf = match &options.conf {
            Some(path) => Some(c_string(&path.to_string_lossy(), "configuration path")?),
            None => None,
        };
        let conf_ptr = conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: a live handle not yet connected; the path is NUL-terminated or null (Ceph's
        // default search path).
        let ret = unsafe { (self.lib.rados_conf_read_file)(self.handle, conf_ptr) };
        // No file in Ceph's default places is no error: the options may say all that is
        // needed.
        if let (Err(errno), Some(path)) = (check(ret.into()), &options.conf) {
            return Err(RbdError::Config {
                what: path.display().to_string(),
                errno,
            });
        }
        let timeout = options.mount_timeout.map(|t| {
            (
                "client_mount_timeout".to_string(),
                t.as_secs().max(1).to_string(),
            )
        });
        for (key, value) in options.options.iter().cloned().chain(timeout) {
            self.conf_set(&key, &value)?;
        }
        Ok(())
    }

    fn conf_set(&self, key: &str, value: &str) -> Result<(), RbdError> {
        let (k, v) = (c_string(key, "option")?, c_string(value, "option value")?);
        // SAFETY: a live handle; both strings NUL-terminated.
        let ret = unsafe { (self.lib.rados_conf_set)(self.handle, k.as_ptr(), v.as_ptr()) };
        check(ret.into())
            .map(drop)
            .map_err(|errno| RbdError::Config {
                what: format!("{key}={value}"),
                errno,
            })
    }

    /// The value of the Ceph option `key`, if it has one.
    pub fn conf_get(&self, key: &str) -> Option<String> {
        let k = CString::new(key).ok()?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: a live handle; `buf` is writable for its length, which is passed.
        let ret = unsafe {
            (self.lib.rados_conf_get)(
                self.handle,
                k.as_ptr(),
                buf.as_mut_ptr().cast::<c_char>(),
                buf.len(),
            )
        };
        check(ret.into()).ok()?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Some(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    fn connect_error(&self, errno: i32) -> RbdError {
        match errno {
            libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ECONNREFUSED => RbdError::Unreachable {
                monitors: self.monitors.clone(),
                timeout_secs: self
                    .conf_get("client_mount_timeout")
                    .and_then(|t| t.parse::<f64>().ok())
                    .map_or(0, |t| t as u64),
                errno,
            },
            libc::EACCES | libc::EPERM | libc::EKEYREJECTED | libc::EINVAL => RbdError::Auth {
                user: self.user.clone(),
                monitors: self.monitors.clone(),
                errno,
            },
            errno => RbdError::Call {
                call: "rados_connect",
                target: self.monitors.clone(),
                errno,
            },
        }
    }

    /// The client's name in the cluster (`client.4242`): how lock owners and blocklists
    /// name this connection.
    pub fn client_name(&self) -> String {
        // SAFETY: a connected handle.
        let id = unsafe { (self.lib.rados_get_instance_id)(self.handle) };
        format!("client.{id}")
    }

    /// The cluster's fsid.
    pub fn fsid(&self) -> Result<String, RbdError> {
        let mut buf = [0u8; 64];
        // SAFETY: a connected handle; `buf` is writable for its length, which is passed.
        let ret = unsafe {
            (self.lib.rados_cluster_fsid)(self.handle, buf.as_mut_ptr().cast(), buf.len())
        };
        let n = check(ret.into()).map_err(|errno| RbdError::Call {
            call: "rados_cluster_fsid",
            target: self.monitors.clone(),
            errno,
        })?;
        let n = (n as usize).min(buf.len());
        let end = buf[..n].iter().position(|&b| b == 0).unwrap_or(n);
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    /// The user this connection authenticated as (`client.admin`).
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The monitors (`mon_host`), as configured.
    pub fn monitors(&self) -> &str {
        &self.monitors
    }

    pub(crate) fn lib(&self) -> &'static Lib {
        self.lib
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the last reference: every pool context and image of this connection is
        // gone (each holds an `Arc<Cluster>`).
        unsafe { (self.lib.rados_shutdown)(self.handle) };
    }
}

/// A pool (and namespace) of a cluster: `rados_ioctx_t`.
pub(crate) struct Pool {
    pub(crate) ctx: sys::IoCtx,
    pub(crate) cluster: Arc<Cluster>,
}

// SAFETY: an I/O context is thread-safe for the calls made on it (opening images); it is
// destroyed only by `Drop`, when no image of it remains.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

impl Pool {
    /// The pool and namespace of `spec`.
    pub(crate) fn open(cluster: &Arc<Cluster>, spec: &ImageSpec) -> Result<Self, RbdError> {
        let lib = cluster.lib;
        let name = c_string(&spec.pool, "pool name")?;
        let mut ctx: sys::IoCtx = std::ptr::null_mut();
        // SAFETY: a connected handle; a live out-pointer; a NUL-terminated name.
        let ret = unsafe { (lib.rados_ioctx_create)(cluster.handle, name.as_ptr(), &mut ctx) };
        check(ret.into()).map_err(|errno| match errno {
            libc::ENOENT => RbdError::NoSuchPool {
                pool: spec.pool.clone(),
            },
            libc::EACCES | libc::EPERM => RbdError::PermissionDenied {
                what: format!("pool {}", spec.pool),
            },
            errno => RbdError::Call {
                call: "rados_ioctx_create",
                target: spec.pool.clone(),
                errno,
            },
        })?;
        let pool = Pool {
            ctx,
            cluster: cluster.clone(),
        };
        if let Some(ns) = &spec.namespace {
            let ns = c_string(ns, "namespace")?;
            // SAFETY: a live context; a NUL-terminated name, copied by librados.
            unsafe { (lib.rados_ioctx_set_namespace)(pool.ctx, ns.as_ptr()) };
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: no image of this context remains (each holds the `Pool`).
        unsafe { (self.cluster.lib.rados_ioctx_destroy)(self.ctx) };
    }
}
