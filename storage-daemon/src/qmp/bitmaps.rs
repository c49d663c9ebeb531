//! The dirty bitmap commands: `block-dirty-bitmap-add`, `-remove`, `-clear`, `-enable`,
//! `-disable`, `-merge` and `x-debug-block-dirty-bitmap-sha256`, with the arguments and the
//! error texts of QEMU's `block/monitor/bitmap-qmp-cmds.c`.
//!
//! This module owns each command's lookups and checks; a bitmap's rules and texts are
//! `aio_block::bitmap`'s, where a node's image comes from is `nodes`'.
//!
//! * A bitmap lives on its node: the first one added opens the node's image if nothing had
//!   it open, and the node holds it from then on, so the bitmap outlives the node's exports.
//! * `block-dirty-bitmap-merge` checks every source before it changes the target: all or
//!   nothing, as QEMU restores the target when one source fails.

use std::sync::Arc;

use serde_json::{json, Value};

use aio_block::bitmap::{BitmapError, BitmapOptions, DirtyBitmap};

use super::commands::{Command, State};
use super::wire::{Args, QmpError};

/// The dirty bitmap commands.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "block-dirty-bitmap-add",
        run: |state, _, args| state.bitmap_add(args),
    },
    Command {
        name: "block-dirty-bitmap-remove",
        run: |state, _, args| state.bitmap_remove(args),
    },
    Command {
        name: "block-dirty-bitmap-clear",
        run: |state, _, args| {
            let bitmap = state.bitmap_named(args)?;
            bitmap.check_writable().map_err(refused)?;
            bitmap.clear();
            Ok(json!({}))
        },
    },
    Command {
        name: "block-dirty-bitmap-enable",
        run: |state, _, args| {
            let bitmap = state.bitmap_named(args)?;
            bitmap.set_recording(true).map_err(refused)?;
            Ok(json!({}))
        },
    },
    Command {
        name: "block-dirty-bitmap-disable",
        run: |state, _, args| {
            let bitmap = state.bitmap_named(args)?;
            bitmap.set_recording(false).map_err(refused)?;
            Ok(json!({}))
        },
    },
    Command {
        name: "block-dirty-bitmap-merge",
        run: |state, _, args| state.bitmap_merge(args),
    },
    Command {
        name: "x-debug-block-dirty-bitmap-sha256",
        run: |state, _, args| {
            let bitmap = state.bitmap_named(args)?;
            Ok(json!({ "sha256": bitmap.sha256_hex() }))
        },
    },
];

/// A bitmap's refusal as QEMU words it (`GenericError`).
fn refused(e: BitmapError) -> QmpError {
    QmpError::generic(e.to_string())
}

impl State {
    /// The bitmap `name` of node `node` (QEMU's `block_dirty_bitmap_lookup`).
    pub(super) fn find_bitmap(&self, node: &str, name: &str) -> Result<Arc<DirtyBitmap>, QmpError> {
        if !self.graph.nodes.contains_key(node) {
            return Err(QmpError::generic(format!("Node '{node}' not found")));
        }
        self.served_image(node)
            .and_then(|image| image.dirty_bitmaps().get(name))
            .ok_or_else(|| QmpError::generic(format!("Dirty bitmap '{name}' not found")))
    }

    /// The bitmap the arguments `node` and `name` name (and nothing else given).
    fn bitmap_named(&self, mut args: Args) -> Result<Arc<DirtyBitmap>, QmpError> {
        let node = args.str("node")?;
        let name = args.str("name")?;
        args.finish()?;
        self.find_bitmap(&node, &name)
    }

    /// `block-dirty-bitmap-add node name [granularity] [persistent] [disabled]`.
    fn bitmap_add(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let node = args.str("node")?;
        let name = args.str("name")?;
        let granularity = match args.opt_u64("granularity")? {
            Some(g) => Some(
                u32::try_from(g)
                    .map_err(|_| QmpError::generic("Parameter 'granularity' expects uint32_t"))?,
            ),
            None => None,
        };
        let persistent = args.opt_bool("persistent")?.unwrap_or(false);
        let disabled = args.opt_bool("disabled")?.unwrap_or(false);
        args.finish()?;
        if name.is_empty() {
            return Err(refused(BitmapError::EmptyName));
        }
        if !self.graph.nodes.contains_key(&node) {
            return Err(QmpError::generic(format!(
                "Cannot find device='{node}' nor node-name='{node}'"
            )));
        }
        let mut options = BitmapOptions::new()
            .persistent(persistent)
            .disabled(disabled);
        if let Some(g) = granularity {
            options = options.granularity(g);
        }
        let image = self.held_image(&node)?;
        image
            .add_dirty_bitmap(&name, options)
            .map_err(|e| match e {
                // QEMU names the node, where the block layer names the image's file.
                BitmapError::NotStorable { .. } => refused(BitmapError::NotStorable { node }),
                other => refused(other),
            })?;
        Ok(json!({}))
    }

    /// `block-dirty-bitmap-remove node name`.
    fn bitmap_remove(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let node = args.str("node")?;
        let name = args.str("name")?;
        args.finish()?;
        self.find_bitmap(&node, &name)?;
        let image = self.held_image(&node)?;
        image.dirty_bitmaps().remove(&name).map_err(refused)?;
        Ok(json!({}))
    }

    /// `block-dirty-bitmap-merge node target bitmaps`: each of `bitmaps` a bitmap of `node`
    /// by name, or `{"node": N, "name": B}` of any node.
    fn bitmap_merge(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let node = args.str("node")?;
        let target = args.str("target")?;
        let sources = args.value("bitmaps")?;
        args.finish()?;
        let target = self.find_bitmap(&node, &target)?;
        let Value::Array(sources) = sources else {
            return Err(QmpError::generic(
                "Invalid parameter type for 'bitmaps', expected: array",
            ));
        };
        let mut found = Vec::with_capacity(sources.len());
        for source in &sources {
            let bitmap = match source {
                Value::String(name) => self
                    .served_image(&node)
                    .and_then(|image| image.dirty_bitmaps().get(name))
                    .ok_or_else(|| QmpError::generic(format!("Dirty bitmap '{name}' not found")))?,
                Value::Object(external) => {
                    let field = |key: &str| {
                        external.get(key).and_then(Value::as_str).ok_or_else(|| {
                            QmpError::generic(format!("Parameter '{key}' is missing"))
                        })
                    };
                    self.find_bitmap(field("node")?, field("name")?)?
                }
                _ => {
                    return Err(QmpError::generic(
                        "Invalid parameter type for 'bitmaps[0]', expected: string or object",
                    ))
                }
            };
            // QEMU's checks of each merge (`bdrv_merge_dirty_bitmap`), all made before any.
            target.check_writable().map_err(refused)?;
            bitmap.check_usable().map_err(refused)?;
            if bitmap.size() != target.size() {
                return Err(refused(BitmapError::SizeMismatch {
                    destination: target.size(),
                    source_size: bitmap.size(),
                }));
            }
            found.push(bitmap);
        }
        for source in &found {
            target.merge_from(source).map_err(refused)?;
        }
        Ok(json!({}))
    }
}
