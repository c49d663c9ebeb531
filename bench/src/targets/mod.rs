//! What a run reads and writes: disk images, the fast device (a loop device), the cleanup
//! that removes what a killed run left, and the checks that refuse a mounted file system.
//!
//! This module owns the targets' life (create, attach, detach, remove), never the load on
//! them (`load`, `fio::job`, `matrix`, `vhost`).

pub mod cleanup;
pub mod image;
pub mod loopdev;
pub mod mounted;
