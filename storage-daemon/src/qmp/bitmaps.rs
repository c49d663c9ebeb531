//! The dirty bitmap commands: `block-dirty-bitmap-add`, `-remove`, `-clear`, `-enable`,
//! `-disable`, `-merge` and `x-debug-block-dirty-bitmap-sha256`, with the arguments and the
//! error texts of QEMU's `block/monitor/bitmap-qmp-cmds.c`; the same six as actions of a
//! `transaction` (QEMU's `block_dirty_bitmap_*_action`).
//!
//! This module owns each action's arguments, lookups and checks (its prepare); staging and
//! committing the effects is `transaction`'s, a bitmap's rules and texts are
//! `aio_block::bitmap`'s, where a node's image comes from is `nodes`'.
//!
//! * **One path for a command and an action.** A command is a transaction of its one action:
//!   prepared (every check made, the effect staged), then committed. So a command and an
//!   action check the same things with the same texts, and a failed command changes nothing.
//! * **An action sees the actions before it.** A bitmap added earlier in the transaction is
//!   found by the later ones; one to be removed is held busy, so a later action that uses it
//!   is refused as QEMU refuses it.
//! * A bitmap lives on its node: the first one added opens the node's image if nothing had
//!   it open, and the node holds it from then on, so the bitmap outlives the node's exports.
//! * `block-dirty-bitmap-merge` checks every source before it changes the target: all or
//!   nothing, as QEMU restores the target when one source fails.

use std::sync::Arc;

use serde_json::{json, Value};

use aio_block::bitmap::{BitmapError, BitmapOptions, DirtyBitmap};

use super::commands::{Command, State};
use super::staged::{Effect, Staged};
use super::wire::{Args, QmpError};

/// The dirty bitmap commands.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "block-dirty-bitmap-add",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-add", args),
    },
    Command {
        name: "block-dirty-bitmap-remove",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-remove", args),
    },
    Command {
        name: "block-dirty-bitmap-clear",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-clear", args),
    },
    Command {
        name: "block-dirty-bitmap-enable",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-enable", args),
    },
    Command {
        name: "block-dirty-bitmap-disable",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-disable", args),
    },
    Command {
        name: "block-dirty-bitmap-merge",
        run: |state, _, args| state.bitmap_command("block-dirty-bitmap-merge", args),
    },
    Command {
        name: "x-debug-block-dirty-bitmap-sha256",
        run: |state, _, mut args| {
            let node = args.str("node")?;
            let name = args.str("name")?;
            args.finish()?;
            let bitmap = state.find_bitmap(&node, &name)?;
            Ok(json!({ "sha256": bitmap.sha256_hex() }))
        },
    },
];

/// A bitmap's refusal as QEMU words it (`GenericError`).
pub(super) fn refused(e: BitmapError) -> QmpError {
    QmpError::generic(e.to_string())
}

/// A merge's source: a bitmap of the target's node by name, or any node's.
#[derive(Debug)]
pub(super) enum Source {
    Local(String),
    External { node: String, name: String },
}

/// One bitmap action (a command's arguments, or a transaction action's `data`), parsed.
#[derive(Debug)]
pub(super) enum BitmapAction {
    /// `block-dirty-bitmap-add node name [granularity] [persistent] [disabled]`.
    Add {
        node: String,
        name: String,
        options: BitmapOptions,
    },
    /// `block-dirty-bitmap-remove node name`.
    Remove { node: String, name: String },
    /// `block-dirty-bitmap-clear node name`.
    Clear { node: String, name: String },
    /// `block-dirty-bitmap-enable` (true) or `-disable` (false) `node name`.
    Record {
        node: String,
        name: String,
        on: bool,
    },
    /// `block-dirty-bitmap-merge node target bitmaps`.
    Merge {
        node: String,
        target: String,
        sources: Vec<Source>,
    },
}

impl BitmapAction {
    /// The commands (and transaction action types) that are bitmap actions.
    pub(super) const KINDS: &'static [&'static str] = &[
        "block-dirty-bitmap-add",
        "block-dirty-bitmap-remove",
        "block-dirty-bitmap-clear",
        "block-dirty-bitmap-enable",
        "block-dirty-bitmap-disable",
        "block-dirty-bitmap-merge",
    ];

    /// Parses `args` as the arguments of `kind` (one of [`KINDS`](Self::KINDS)), with
    /// QEMU's texts for what is missing, mistyped or unexpected.
    pub(super) fn parse(kind: &str, mut args: Args) -> Result<BitmapAction, QmpError> {
        let node = args.str("node")?;
        let action = match kind {
            "block-dirty-bitmap-add" => {
                let name = args.str("name")?;
                let mut options = BitmapOptions::new();
                if let Some(g) = args.opt_u64("granularity")? {
                    let g = u32::try_from(g).map_err(|_| {
                        QmpError::generic(format!(
                            "Parameter '{}' expects uint32_t",
                            args.path("granularity")
                        ))
                    })?;
                    options = options.granularity(g);
                }
                options = options
                    .persistent(args.opt_bool("persistent")?.unwrap_or(false))
                    .disabled(args.opt_bool("disabled")?.unwrap_or(false));
                BitmapAction::Add {
                    node,
                    name,
                    options,
                }
            }
            "block-dirty-bitmap-merge" => {
                let target = args.str("target")?;
                let items = args.array("bitmaps")?;
                let mut sources = Vec::with_capacity(items.len());
                for (i, item) in items.into_iter().enumerate() {
                    let at = args.path(&format!("bitmaps[{i}]"));
                    sources.push(match item {
                        Value::String(name) => Source::Local(name),
                        Value::Object(members) => {
                            let mut external = Args::nested(members, at);
                            let node = external.str("node")?;
                            let name = external.str("name")?;
                            external.finish()?;
                            Source::External { node, name }
                        }
                        _ => {
                            return Err(QmpError::generic(format!(
                                "Invalid parameter type for '{at}', expected: string or object"
                            )))
                        }
                    });
                }
                BitmapAction::Merge {
                    node,
                    target,
                    sources,
                }
            }
            _ => {
                let name = args.str("name")?;
                match kind {
                    "block-dirty-bitmap-remove" => BitmapAction::Remove { node, name },
                    "block-dirty-bitmap-clear" => BitmapAction::Clear { node, name },
                    "block-dirty-bitmap-enable" | "block-dirty-bitmap-disable" => {
                        BitmapAction::Record {
                            node,
                            name,
                            on: kind == "block-dirty-bitmap-enable",
                        }
                    }
                    other => {
                        return Err(QmpError::generic(format!(
                            "'{other}' is not a dirty bitmap action"
                        )))
                    }
                }
            }
        };
        args.finish()?;
        Ok(action)
    }
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

    /// [`find_bitmap`](Self::find_bitmap), seeing the bitmaps `staged` adds.
    fn staged_bitmap(
        &self,
        staged: &Staged,
        node: &str,
        name: &str,
    ) -> Result<Arc<DirtyBitmap>, QmpError> {
        match staged.added(node, name) {
            Some(bitmap) => Ok(bitmap),
            None => self.find_bitmap(node, name),
        }
    }

    /// Runs the bitmap command `kind` with `args`: a transaction of one action.
    fn bitmap_command(&mut self, kind: &str, args: Args) -> Result<Value, QmpError> {
        let action = BitmapAction::parse(kind, args)?;
        let mut staged = Staged::default();
        self.prepare_bitmap(&mut staged, action)?;
        staged.commit().map_err(refused)?;
        Ok(json!({}))
    }

    /// Prepares `action` after the actions `staged` holds: every check QEMU makes, with its
    /// texts; on success its effect is staged, and nothing has changed but a bitmap to remove
    /// being held busy (released when `staged` is dropped uncommitted).
    pub(super) fn prepare_bitmap(
        &mut self,
        staged: &mut Staged,
        action: BitmapAction,
    ) -> Result<(), QmpError> {
        let effect = match action {
            BitmapAction::Add {
                node,
                name,
                options,
            } => self.prepare_add(staged, node, name, options)?,
            BitmapAction::Remove { node, name } => {
                let bitmap = self.staged_bitmap(staged, &node, &name)?;
                let image = self.held_image(&node)?;
                Effect::Remove {
                    image,
                    hold: bitmap.hold_for_removal().map_err(refused)?,
                }
            }
            BitmapAction::Clear { node, name } => {
                let bitmap = self.staged_bitmap(staged, &node, &name)?;
                bitmap.check_writable().map_err(refused)?;
                Effect::Clear(bitmap)
            }
            BitmapAction::Record { node, name, on } => {
                let bitmap = self.staged_bitmap(staged, &node, &name)?;
                // QEMU's `BDRV_BITMAP_ALLOW_RO`: a read-only bitmap may be enabled.
                bitmap.check_usable().map_err(refused)?;
                Effect::Record { bitmap, on }
            }
            BitmapAction::Merge {
                node,
                target,
                sources,
            } => self.prepare_merge(staged, &node, &target, &sources)?,
        };
        staged.push(effect);
        Ok(())
    }

    /// `block-dirty-bitmap-add`'s checks, in QEMU's order: the name, the node, the bitmap's
    /// options on the node's image, the name not taken (on the node or by an earlier action).
    fn prepare_add(
        &mut self,
        staged: &Staged,
        node: String,
        name: String,
        options: BitmapOptions,
    ) -> Result<Effect, QmpError> {
        if name.is_empty() {
            return Err(refused(BitmapError::EmptyName));
        }
        if !self.graph.nodes.contains_key(&node) {
            return Err(QmpError::generic(format!(
                "Cannot find device='{node}' nor node-name='{node}'"
            )));
        }
        let image = self.held_image(&node)?;
        let bitmap = image
            .new_dirty_bitmap(&name, options)
            .map_err(|e| match e {
                // QEMU names the node, where the block layer names the image's file.
                BitmapError::NotStorable { .. } => {
                    refused(BitmapError::NotStorable { node: node.clone() })
                }
                other => refused(other),
            })?;
        if image.dirty_bitmaps().get(&name).is_some() || staged.added(&node, &name).is_some() {
            return Err(refused(BitmapError::Exists(name)));
        }
        Ok(Effect::Add {
            node,
            image,
            bitmap,
        })
    }

    /// `block-dirty-bitmap-merge`'s checks (QEMU's `bdrv_merge_dirty_bitmap`), each source's
    /// made before any bit moves.
    fn prepare_merge(
        &mut self,
        staged: &Staged,
        node: &str,
        target: &str,
        sources: &[Source],
    ) -> Result<Effect, QmpError> {
        let target = self.staged_bitmap(staged, node, target)?;
        let mut found = Vec::with_capacity(sources.len());
        for source in sources {
            let bitmap = match source {
                Source::Local(name) => self.staged_bitmap(staged, node, name)?,
                Source::External { node, name } => self.staged_bitmap(staged, node, name)?,
            };
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
        Ok(Effect::Merge {
            target,
            sources: found,
        })
    }
}
