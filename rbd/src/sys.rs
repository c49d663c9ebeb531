//! librados and librbd, opened at run time: the C functions this crate calls, and nothing else.
//!
//! This module owns loading the libraries (`librbd.so.1`, `librados.so.2`, once per process)
//! and the signatures of the functions used, copied from Ceph's headers (`rbd/librbd.h`,
//! `rados/librados.h`, stable since Ceph 14). It never calls them: the other modules do, each
//! call with the invariant that makes it sound.
//!
//! * **Why at run time.** Linking would make every build of the workspace, and every program
//!   that uses it, need Ceph's libraries, RBD disks or not; a user without them would see a
//!   link error in a crate they never asked for. Loaded on first use, a missing library is
//!   [`RbdError::LibraryMissing`](crate::RbdError::LibraryMissing), naming the Debian package.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use crate::error::RbdError;

/// `rados_t`.
pub(crate) type Rados = *mut c_void;
/// `rados_ioctx_t`.
pub(crate) type IoCtx = *mut c_void;
/// `rbd_image_t`.
pub(crate) type Image = *mut c_void;
/// `rbd_completion_t`.
pub(crate) type RbdCompletion = *mut c_void;
/// `rbd_callback_t`.
pub(crate) type Callback = unsafe extern "C" fn(RbdCompletion, *mut c_void);
/// The callback of `rbd_diff_iterate2`: `(offset, length, exists, arg)`.
pub(crate) type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// `RBD_LOCK_MODE_EXCLUSIVE`.
pub(crate) const LOCK_MODE_EXCLUSIVE: c_int = 0;
/// `RBD_WRITE_ZEROES_FLAG_THICK_PROVISION`: zeroed and allocated, not unmapped.
pub(crate) const WRITE_ZEROES_THICK: c_int = 1;
/// `RBD_FEATURE_EXCLUSIVE_LOCK`.
pub(crate) const FEATURE_EXCLUSIVE_LOCK: u64 = 1 << 2;

/// `rbd_image_info_t`.
#[repr(C)]
pub(crate) struct ImageInfo {
    pub(crate) size: u64,
    pub(crate) obj_size: u64,
    pub(crate) num_objs: u64,
    pub(crate) order: c_int,
    pub(crate) block_name_prefix: [c_char; 24],
    pub(crate) parent_pool: i64,
    pub(crate) parent_name: [c_char; 96],
}

/// The Debian package that holds the libraries.
pub(crate) const PACKAGE: &str = "librbd1";

macro_rules! functions {
    ($($name:ident: fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The functions, resolved from the loaded libraries.
        #[allow(non_snake_case)]
        pub(crate) struct Lib {
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
            _rbd: libloading::Library,
            _rados: libloading::Library,
        }

        impl Lib {
            fn load() -> Result<Self, RbdError> {
                let open = |name: &str| {
                    // SAFETY: loading runs the libraries' initialisers, which Ceph's are
                    // written to tolerate (QEMU loads them as a module the same way).
                    unsafe { libloading::Library::new(name) }.map_err(|e| {
                        RbdError::LibraryMissing {
                            library: name.to_string(),
                            reason: e.to_string(),
                            package: PACKAGE,
                        }
                    })
                };
                let rados = open("librados.so.2")?;
                let rbd = open("librbd.so.1")?;
                Ok(Lib {
                    $($name: {
                        let symbol = concat!(stringify!($name), "\0").as_bytes();
                        let lib = if stringify!($name).starts_with("rados_") { &rados } else { &rbd };
                        // SAFETY: the type is the function's C signature in Ceph's headers;
                        // the pointer is valid while the library is loaded, which `Lib`
                        // (kept for the process's life in a static) ensures.
                        let f = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(symbol)
                        }
                        .map_err(|e| RbdError::LibraryMissing {
                            library: stringify!($name).to_string(),
                            reason: e.to_string(),
                            package: PACKAGE,
                        })?;
                        *f
                    },)*
                    _rbd: rbd,
                    _rados: rados,
                })
            }
        }
    };
}

functions! {
    rados_create: fn(*mut Rados, *const c_char) -> c_int;
    rados_conf_read_file: fn(Rados, *const c_char) -> c_int;
    rados_conf_set: fn(Rados, *const c_char, *const c_char) -> c_int;
    rados_conf_get: fn(Rados, *const c_char, *mut c_char, usize) -> c_int;
    rados_connect: fn(Rados) -> c_int;
    rados_shutdown: fn(Rados);
    rados_get_instance_id: fn(Rados) -> u64;
    rados_cluster_fsid: fn(Rados, *mut c_char, usize) -> c_int;
    rados_ioctx_create: fn(Rados, *const c_char, *mut IoCtx) -> c_int;
    rados_ioctx_destroy: fn(IoCtx);
    rados_ioctx_set_namespace: fn(IoCtx, *const c_char);
    rbd_version: fn(*mut c_int, *mut c_int, *mut c_int);
    rbd_create: fn(IoCtx, *const c_char, u64, *mut c_int) -> c_int;
    rbd_remove: fn(IoCtx, *const c_char) -> c_int;
    rbd_open: fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int;
    rbd_open_read_only: fn(IoCtx, *const c_char, *mut Image, *const c_char) -> c_int;
    rbd_close: fn(Image) -> c_int;
    rbd_get_size: fn(Image, *mut u64) -> c_int;
    rbd_stat: fn(Image, *mut ImageInfo, usize) -> c_int;
    rbd_get_features: fn(Image, *mut u64) -> c_int;
    rbd_resize: fn(Image, u64) -> c_int;
    rbd_flush: fn(Image) -> c_int;
    rbd_invalidate_cache: fn(Image) -> c_int;
    rbd_read: fn(Image, u64, usize, *mut c_char) -> isize;
    rbd_aio_create_completion: fn(*mut c_void, Callback, *mut RbdCompletion) -> c_int;
    rbd_aio_get_return_value: fn(RbdCompletion) -> isize;
    rbd_aio_release: fn(RbdCompletion);
    rbd_aio_readv: fn(Image, *const libc::iovec, c_int, u64, RbdCompletion) -> c_int;
    rbd_aio_writev: fn(Image, *const libc::iovec, c_int, u64, RbdCompletion) -> c_int;
    rbd_aio_flush: fn(Image, RbdCompletion) -> c_int;
    rbd_aio_discard: fn(Image, u64, u64, RbdCompletion) -> c_int;
    rbd_aio_write_zeroes: fn(Image, u64, usize, RbdCompletion, c_int, c_int) -> c_int;
    rbd_diff_iterate2: fn(Image, *const c_char, u64, u64, u8, u8, DiffCallback, *mut c_void) -> c_int;
    rbd_lock_acquire: fn(Image, c_int) -> c_int;
    rbd_lock_release: fn(Image) -> c_int;
    rbd_lock_get_owners: fn(Image, *mut c_int, *mut *mut c_char, *mut usize) -> c_int;
    rbd_lock_get_owners_cleanup: fn(*mut *mut c_char, usize);
    rbd_lock_break: fn(Image, c_int, *const c_char) -> c_int;
    rbd_is_exclusive_lock_owner: fn(Image, *mut c_int) -> c_int;
}

/// The libraries, loaded on first use and kept for the process's life (librbd's threads may
/// run its code until the process ends).
pub(crate) fn lib() -> Result<&'static Lib, RbdError> {
    static LIB: OnceLock<Result<Lib, RbdError>> = OnceLock::new();
    LIB.get_or_init(Lib::load).as_ref().map_err(Clone::clone)
}

/// librbd's version, `(major, minor, extra)`: 1.16.0 is Ceph 16 (Pacific).
pub fn librbd_version() -> Result<(i32, i32, i32), RbdError> {
    let lib = lib()?;
    let (mut major, mut minor, mut extra) = (0, 0, 0);
    // SAFETY: the three pointers are to live locals the function writes.
    unsafe { (lib.rbd_version)(&mut major, &mut minor, &mut extra) };
    Ok((major, minor, extra))
}
