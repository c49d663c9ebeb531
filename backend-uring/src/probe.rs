//! Whether io_uring is usable here, and if not, why.
//!
//! This module owns the probe: one `io_uring_setup`, the `kernel.io_uring_disabled` sysctl,
//! the memlock limit, and the opcode list from `IORING_REGISTER_PROBE`. It never panics.

use std::io;

use io_uring::{opcode, IoUring, Probe};

/// Why io_uring cannot be used here.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UringUnavailable {
    /// `kernel.io_uring_disabled` forbids it (1: only the `io_uring_group` may, 2: nobody).
    #[error("io_uring is disabled by the sysctl kernel.io_uring_disabled = {value} (/proc/sys/kernel/io_uring_disabled)")]
    DisabledBySysctl {
        /// The sysctl's value.
        value: String,
    },
    /// `EPERM` without the sysctl set: a seccomp filter or an LSM refuses io_uring_setup.
    #[error(
        "io_uring_setup is refused (EPERM): a seccomp filter or security module forbids io_uring"
    )]
    PermissionDenied,
    /// `ENOSYS`: the kernel is built without io_uring.
    #[error("this kernel has no io_uring (io_uring_setup: ENOSYS)")]
    NotImplemented,
    /// `ENOMEM`: the ring does not fit the locked-memory limit (kernels before 5.12 charge
    /// rings to RLIMIT_MEMLOCK).
    #[error("io_uring_setup failed with ENOMEM: the ring does not fit the locked-memory limit (RLIMIT_MEMLOCK = {memlock})")]
    OutOfLockedMemory {
        /// The current soft limit.
        memlock: String,
    },
    /// A setting of [`UringConfig`](crate::UringConfig) that cannot work, named.
    #[error(transparent)]
    BadConfig(#[from] aio_core::kit::BadConfig),
    /// Another error.
    #[error("io_uring_setup failed: {0}")]
    Other(#[source] io::Error),
}

aio_core::kit::io_error_from!(UringUnavailable, |e| match e {
    UringUnavailable::DisabledBySysctl { .. } | UringUnavailable::PermissionDenied => {
        io::ErrorKind::PermissionDenied
    }
    UringUnavailable::NotImplemented => io::ErrorKind::Unsupported,
    UringUnavailable::OutOfLockedMemory { .. } => io::ErrorKind::OutOfMemory,
    UringUnavailable::BadConfig(_) => io::ErrorKind::InvalidInput,
    UringUnavailable::Other(s) => s.kind(),
});

/// What this kernel's io_uring offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringSupport {
    /// The opcodes this project uses that the kernel supports.
    pub opcodes: Vec<&'static str>,
    /// CQ overflow keeps completions instead of dropping them (`IORING_FEAT_NODROP`, 5.5+).
    pub nodrop: bool,
    /// Waits take a timeout argument (`IORING_FEAT_EXT_ARG`, 5.11+).
    pub ext_arg: bool,
}

impl UringSupport {
    /// Whether `name` (e.g. `"POLL_ADD"`) is supported.
    pub fn has(&self, name: &str) -> bool {
        self.opcodes.contains(&name)
    }
}

fn read_sysctl() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Classifies an `io_uring_setup` failure.
pub(crate) fn classify(e: io::Error) -> UringUnavailable {
    match e.raw_os_error() {
        Some(libc::EPERM) => match read_sysctl() {
            Some(v) if v != "0" => UringUnavailable::DisabledBySysctl { value: v },
            _ => UringUnavailable::PermissionDenied,
        },
        Some(libc::ENOSYS) => UringUnavailable::NotImplemented,
        Some(libc::ENOMEM) => {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: `lim` is a valid rlimit to fill.
            let memlock = if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0 {
                format!("{} bytes", lim.rlim_cur)
            } else {
                "unknown".into()
            };
            UringUnavailable::OutOfLockedMemory { memlock }
        }
        _ => UringUnavailable::Other(e),
    }
}

/// Says whether io_uring is usable here and which of the opcodes this project uses exist.
pub fn probe() -> Result<UringSupport, UringUnavailable> {
    let ring = IoUring::new(2).map_err(classify)?;
    let mut p = Probe::new();
    let known: [(&'static str, u8); 12] = [
        ("READ", opcode::Read::CODE),
        ("WRITE", opcode::Write::CODE),
        ("READV", opcode::Readv::CODE),
        ("WRITEV", opcode::Writev::CODE),
        ("FSYNC", opcode::Fsync::CODE),
        ("FALLOCATE", opcode::Fallocate::CODE),
        ("POLL_ADD", opcode::PollAdd::CODE),
        ("POLL_REMOVE", opcode::PollRemove::CODE),
        ("TIMEOUT", opcode::Timeout::CODE),
        ("READ_FIXED", opcode::ReadFixed::CODE),
        ("WRITE_FIXED", opcode::WriteFixed::CODE),
        ("NOP", opcode::Nop::CODE),
    ];
    let opcodes = match ring.submitter().register_probe(&mut p) {
        Ok(()) => known
            .iter()
            .filter(|(_, code)| p.is_supported(*code))
            .map(|(name, _)| *name)
            .collect(),
        // Kernels before 5.6 have no probe but do have the original opcodes.
        Err(_) => vec!["READV", "WRITEV", "FSYNC", "POLL_ADD", "POLL_REMOVE", "NOP"],
    };
    Ok(UringSupport {
        opcodes,
        nodrop: ring.params().is_feature_nodrop(),
        ext_arg: ring.params().is_feature_ext_arg(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_with_their_reason() {
        assert!(matches!(
            classify(io::Error::from_raw_os_error(libc::ENOSYS)),
            UringUnavailable::NotImplemented
        ));
        let e = classify(io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
        let e = classify(io::Error::from_raw_os_error(libc::EPERM));
        assert!(
            matches!(
                e,
                UringUnavailable::PermissionDenied | UringUnavailable::DisabledBySysctl { .. }
            ),
            "{e}"
        );
        let io: io::Error = UringUnavailable::NotImplemented.into();
        assert_eq!(io.kind(), io::ErrorKind::Unsupported);
    }
}
