//! `block_resize`: a node made larger or smaller while the daemon runs.
//!
//! This module owns finding what a node's size is (an export's disk, an image no export
//! serves, a null node's number) and changing it; the disk's own resize is
//! [`BlockDevice::resize`], telling a connected frontend is the daemon's [`Exports::resize`]
//! (vhost-user's config-change message, so a running guest sees the new capacity).
//!
//! * The node is named by `node-name` (qemu-storage-daemon's exports have no named
//!   BlockBackends, so `device` finds nothing there either).
//! * An exported node resizes its disk; the protocol node under an exported raw node resizes
//!   that disk too (the raw node's size is its file's); the file of an exported qcow2 node is
//!   refused (the guest's size is the qcow2 node's).
//! * A node no export serves has its image resized directly: the one it holds open, else
//!   opened for the resize.
//! * A null node is refused with QEMU's words (its `null-co` driver has no resize).
//!
//! [`Exports::resize`]: crate::daemon::Exports::resize

use serde_json::{json, Value};

use aio_virtio_blk::device::DiskOptions;
use aio_virtio_blk::format::ImageFormat;

use super::commands::{Command, State};
use super::wire::{Args, QmpError};
use crate::blockdev::node::Node;

/// `block_resize`.
pub(super) const COMMANDS: &[Command] = &[Command {
    name: "block_resize",
    run: |state, _, args| state.block_resize(args),
}];

/// Where a node's size lives.
enum Target {
    /// The disk (its number) of a live export.
    Export(usize),
    /// An image file no export serves, opened for the resize: its path, format, and whether
    /// the node (or the file under it) is read-only.
    Image(std::path::PathBuf, ImageFormat, bool),
    /// A null node (QEMU's `null-co` and `null-aio` cannot be resized).
    Null,
    /// The image a node no export serves holds open (a qcow2 node, a node with a bitmap).
    Held(std::sync::Arc<aio_block::Image>),
}

impl State {
    /// `block_resize`: `node-name` (or `device`) and `size` in bytes.
    fn block_resize(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let device = args.opt_str("device")?;
        let node_name = args.opt_str("node-name")?;
        let size = args.int("size")?;
        args.finish()?;
        let size = u64::try_from(size)
            .map_err(|_| QmpError::generic("Parameter 'size' expects a >0 size"))?;
        let not_found = || {
            QmpError::generic(format!(
                "Cannot find device='{}' nor node-name='{}'",
                device.as_deref().unwrap_or(""),
                node_name.as_deref().unwrap_or("")
            ))
        };
        let name = node_name.clone().ok_or_else(not_found)?;
        let node = self.graph.nodes.get(&name).ok_or_else(not_found)?.clone();
        match self.resize_target(&name, &node)? {
            Target::Export(number) => match self.exports.resize(number, size) {
                Some(Ok(_told)) => {}
                Some(Err(e)) => return Err(e.into()),
                None => return Err(not_found()),
            },
            Target::Image(path, format, read_only) => {
                if read_only {
                    return Err(QmpError::generic("Image is read-only"));
                }
                let options = DiskOptions {
                    format,
                    ..DiskOptions::default()
                };
                let image = crate::daemon::rbd::open_image(&path, options.image_options(), false)?;
                image.resize(size)?;
            }
            Target::Held(image) => {
                image.resize(size)?;
            }
            Target::Null => {
                return Err(QmpError::generic(
                    "Image format driver does not support resize",
                ))
            }
        }
        Ok(json!({}))
    }

    /// What resizing node `name` changes.
    fn resize_target(&self, name: &str, node: &Node) -> Result<Target, QmpError> {
        // The live exports, each with its disk's number.
        let live = || self.graph.exports.iter().filter_map(|e| Some((e, e.disk?)));
        if let Node::Null { .. } = node {
            return Ok(Target::Null);
        }
        if let Some((_, disk)) = live().find(|(e, _)| e.node == name) {
            return Ok(Target::Export(disk));
        }
        // The file under an exported format node.
        for (e, disk) in live() {
            if let Some(Node::Format { format, file, .. }) = self.graph.nodes.get(&e.node) {
                if **file != *node {
                    continue;
                }
                if *format == ImageFormat::Qcow2 {
                    return Err(QmpError::generic(format!(
                        "node '{name}' is the qcow2 image file of node '{}' (export '{}'): \
                         resize '{}' to change the disk's size",
                        e.node, e.id, e.node
                    )));
                }
                return Ok(Target::Export(disk));
            }
        }
        if let Some(image) = self.nodes.get(name) {
            return Ok(Target::Held(image));
        }
        // Not exported: its image (a format node's file, as the format reads it).
        let (path, format, _, read_only, _) = node.image();
        Ok(Target::Image(path, format, read_only))
    }
}
