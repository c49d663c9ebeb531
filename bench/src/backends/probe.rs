//! `aio-bench probe`: which fd monitors and engines this build and kernel offer, why any is
//! unusable, what `auto` picks and why, and which fio is installed.
//!
//! This module owns the report's text; the probing itself is [`aio_vhost_user_blk::backends::monitors`],
//! [`aio_vhost_user_blk::backends::engines`] and [`crate::fio`].

use std::fmt::Write as _;

use crate::fio;
use aio_vhost_user_blk::backends::engines::EngineKind;
use aio_vhost_user_blk::backends::monitors::MonitorKind;

/// The probe's report, as `aio-bench probe` prints it.
pub fn report() -> String {
    let mut out = String::new();
    let _ = writeln!(out, "fd monitors:");
    for k in MonitorKind::ALL {
        let _ = match k.build() {
            Ok(m) => writeln!(out, "  {:<10} ok ({})", k.name(), m.describe()),
            Err(e) => writeln!(out, "  {:<10} unavailable: {e}", k.name()),
        };
    }
    let _ = writeln!(out, "engines:");
    for k in EngineKind::ALL {
        let _ = match k.build() {
            Ok(_) => writeln!(out, "  {:<10} ok", k.name()),
            Err(e) => writeln!(out, "  {:<10} unavailable: {e}", k.name()),
        };
    }
    let _ = writeln!(
        out,
        "auto (engines uring -> linux-aio -> pool, fd monitors uring -> hybrid -> poll):"
    );
    for (what, picked) in [
        (
            "fd monitor",
            aio_vhost_user_blk::backends::monitors::auto().map(|(k, why)| (k.name(), why)),
        ),
        (
            "engine",
            aio_vhost_user_blk::backends::engines::auto().map(|(k, why)| (k.name(), why)),
        ),
    ] {
        match picked {
            Ok((name, why)) => {
                let _ = writeln!(out, "  {what}: {name}");
                for line in why {
                    let _ = writeln!(out, "    {line}");
                }
            }
            Err(e) => {
                let _ = writeln!(out, "  {what}: none: {e}");
            }
        }
    }
    let _ = match fio::version() {
        Ok(v) => writeln!(out, "fio: {v}"),
        Err(e) => writeln!(out, "fio: {e}"),
    };
    out
}
