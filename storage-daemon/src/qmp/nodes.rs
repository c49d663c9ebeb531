//! The block nodes' images as the commands find them: the image a node serves now, a node's
//! image opened when a command needs one (`blockdev-add` of a qcow2 node, the first dirty
//! bitmap on a node), and what `query-named-block-nodes` says of its bitmaps.
//!
//! This module owns finding and opening a node's image for a command, with QEMU's texts for
//! a failed open; which node holds what is the daemon's [`NodeImages`], the node's options
//! the graph's.
//!
//! [`NodeImages`]: crate::daemon::NodeImages

use std::io;
use std::sync::Arc;

use serde_json::{json, Value};

use aio_block::image::OpenError;
use aio_block::{Image, ImageOptions};
use aio_virtio_blk::format::ImageFormat;

use super::commands::State;
use super::wire::QmpError;
use crate::blockdev::node::{FormatBacking, Node};

/// Whether `blockdev-add` opens `node` at once and the node holds its image from then on:
/// a qcow2 node (QEMU's qcow2 driver opens and locks its file when it is added) and a null
/// node. A raw or file node is opened by its first user, as QEMU's `file` driver takes its
/// locks only then.
fn opens_when_added(node: &Node) -> bool {
    matches!(
        node,
        Node::Format {
            format: ImageFormat::Qcow2,
            ..
        } | Node::Null { .. }
    )
}

/// QEMU's text for a failed open: a lock's as QEMU's QMP gives it, `Could not open 'PATH':
/// REASON` for a file that cannot be opened, ours otherwise.
pub(super) fn open_failed(e: &OpenError) -> QmpError {
    QmpError::generic(match e {
        OpenError::Lock(lock) => lock.qemu_desc(),
        OpenError::Open { path, source } => {
            format!("Could not open '{}': {}", path.display(), strerror(source))
        }
        other => other.to_string(),
    })
}

/// An I/O error's text as C's `strerror` gives it (Rust's, without " (os error N)").
fn strerror(e: &io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error ") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

impl State {
    /// The image node `name` serves now: the one it holds, else the one an export of it has
    /// open (None: the node is not open).
    pub(super) fn served_image(&self, name: &str) -> Option<Arc<Image>> {
        if let Some(image) = self.nodes.get(name) {
            return Some(image);
        }
        self.graph
            .exports
            .iter()
            .filter(|e| e.node == name)
            .find_map(|e| self.export_image(e))
    }

    /// Opens node `name` of the graph as it says (read-only or not, its locking, inactive
    /// while the graph has it so), for the node to hold.
    /// A node `blockdev-add` just added: a qcow2 or null node is opened now and holds its
    /// image (and its locks) until `blockdev-del`; any other waits for its export.
    pub(super) fn hold_added_node(&mut self, name: &str, node: &Node) -> Result<(), QmpError> {
        if opens_when_added(node) {
            let image = self.open_node(name, node)?;
            self.nodes.hold(name, image);
        }
        Ok(())
    }

    /// A qcow2 node over a backing node (`backing=NODE`) reads that node's image for its
    /// unallocated clusters (`aio_block::Image::set_backing_node`); with `backing=null`,
    /// nothing.
    pub(super) fn open_node(&self, name: &str, node: &Node) -> Result<Arc<Image>, QmpError> {
        let (path, format, size, read_only, _) = node.image();
        let backing = match node {
            Node::Format { backing, .. } => backing.clone(),
            _ => FormatBacking::File,
        };
        let options = ImageOptions::new(format)
            .read_only(read_only)
            .locking(node.locking())
            .open_backing(backing == FormatBacking::File);
        let inactive = !self.graph.is_active(name);
        let image = crate::daemon::open_node_image(&path, options, size, inactive)
            .map(Arc::new)
            .map_err(|e| open_failed(&e))?;
        if let FormatBacking::Node(below) = backing {
            let below = self.held_image(&below)?;
            image
                .set_backing_node(Some(below))
                .map_err(|e| QmpError::generic(e.to_string()))?;
        }
        Ok(image)
    }

    /// Node `name`'s image, held by the node from now on (what a dirty bitmap needs: it lives
    /// on the node, whatever exports come and go): the one it serves, else opened now.
    pub(super) fn held_image(&self, name: &str) -> Result<Arc<Image>, QmpError> {
        if let Some(image) = self.nodes.get(name) {
            return Ok(image);
        }
        // A file child's writes come through its format node's image, which has its own.
        let parent = self.graph.nodes.iter().find_map(|(parent, n)| match n {
            Node::Format {
                file_name: Some(file),
                ..
            } if file == name => Some(parent),
            _ => None,
        });
        if let Some(parent) = parent {
            return Err(QmpError::generic(format!(
                "node '{name}' is the image file of node '{parent}': its writes are the \
                 format's, so a dirty bitmap goes on '{parent}'"
            )));
        }
        let image = match self.served_image(name) {
            Some(image) => image,
            None => {
                let node = self.graph.nodes.get(name).ok_or_else(|| {
                    QmpError::generic(format!(
                        "Cannot find device='{name}' nor node-name='{name}'"
                    ))
                })?;
                self.open_node(name, node)?
            }
        };
        self.nodes.hold(name, image.clone());
        Ok(image)
    }

    /// Makes every node that [opens when added](opens_when_added) hold its image: the one an
    /// export of it serves, else opened now (the command line's nodes, once its exports are
    /// served). Fails with the first node that cannot be opened.
    pub(super) fn hold_opened_nodes(&self) -> Result<(), (String, QmpError)> {
        let mut names: Vec<&String> = self
            .graph
            .nodes
            .iter()
            .filter(|(_, node)| opens_when_added(node))
            .map(|(name, _)| name)
            .collect();
        names.sort();
        for name in names {
            if self.nodes.get(name).is_some() {
                continue;
            }
            let image = match self.served_image(name) {
                Some(image) => image,
                None => self
                    .open_node(name, &self.graph.nodes[name])
                    .map_err(|e| (name.clone(), e))?,
            };
            self.nodes.hold(name, image);
        }
        Ok(())
    }

    /// `query-named-block-nodes`' `dirty-bitmaps` of node `name` (QEMU's `BlockDirtyInfo`
    /// list, the newest first as QEMU lists them; None when it has none, as QEMU leaves the
    /// member out).
    pub(super) fn dirty_bitmaps_info(&self, name: &str) -> Option<Value> {
        let image = self.served_image(name)?;
        let bitmaps = image.dirty_bitmaps().list();
        if bitmaps.is_empty() {
            return None;
        }
        Some(Value::Array(
            bitmaps
                .iter()
                .rev()
                .map(|b| {
                    let mut info = json!({
                        "name": b.name(),
                        "count": b.count(),
                        "granularity": b.granularity(),
                        "recording": b.is_recording(),
                        "busy": b.is_busy(),
                        "persistent": b.is_persistent(),
                    });
                    if b.is_inconsistent() {
                        info["inconsistent"] = json!(true);
                    }
                    info
                })
                .collect(),
        ))
    }
}
