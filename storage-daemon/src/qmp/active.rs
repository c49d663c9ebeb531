//! `blockdev-set-active`: QEMU 10.0's handover of a migrating VM's images between two storage
//! daemons. The source daemon inactivates its nodes (caches written back and dropped, locks
//! released, reads still served), then the destination activates its own (locks taken,
//! metadata read afresh).
//!
//! This module owns the command's rules, with QEMU's texts: a node an export uses without
//! `allow-inactive=on` is not inactivated; activating a node activates its `file` child
//! first, inactivating it inactivates a child no other active node stands on. Which nodes
//! are active is the graph's; what an image does when it changes is `aio_block`'s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use aio_block::image::ActivationError;
use aio_block::Image;

use super::commands::{Command, Ctx, State};
use super::wire::{Args, QmpError};
use crate::blockdev::export::Transport;

/// How long a transition waits for the requests in flight on its image (QEMU drains the node
/// first, as long as that takes; a client that never stops writing is refused instead).
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// `transition`, tried again every millisecond while requests are still in flight on the
/// image ([`ActivationError::InFlight`]: nothing changed), for at most [`DRAIN_WAIT`].
pub(super) fn drained(
    transition: impl Fn() -> Result<(), ActivationError>,
) -> Result<(), ActivationError> {
    let deadline = Instant::now() + DRAIN_WAIT;
    loop {
        match transition() {
            Err(ActivationError::InFlight { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            done => return done,
        }
    }
}

/// The command this module serves.
pub(crate) const COMMANDS: &[Command] = &[Command {
    name: "blockdev-set-active",
    run: |state, ctx, args| state.set_active(ctx, args),
}];

/// Activates `image` for an export created without `allow-inactive=on` over an image another
/// export serves inactive, as QEMU's export activates its node.
pub(super) fn activated_for_export(image: Option<&Arc<Image>>) -> Result<(), QmpError> {
    match image {
        Some(image) if !image.is_active() => {
            drained(|| image.activate()).map_err(|e| QmpError::generic(e.qemu_desc()))
        }
        _ => Ok(()),
    }
}

impl State {
    /// `blockdev-set-active [node-name] active`.
    fn set_active(&mut self, _ctx: &Ctx, mut args: Args) -> Result<Value, QmpError> {
        let name = args.opt_str("node-name")?;
        let active = args
            .opt_bool("active")?
            .ok_or_else(|| QmpError::generic("Parameter 'active' is missing"))?;
        args.finish()?;
        let nodes = match &name {
            Some(n) if !self.graph.nodes.contains_key(n) => {
                return Err(QmpError::generic(format!(
                    "Failed to find node with node-name='{n}'"
                )))
            }
            Some(n) => vec![n.clone()],
            None => self.graph.roots(),
        };
        let failed = |e: &dyn std::fmt::Display| {
            QmpError::generic(match (&name, active) {
                (_, true) => e.to_string(),
                (Some(_), false) => format!("Failed to inactivate node: {e}"),
                (None, false) => format!("Failed to inactivate all nodes: {e}"),
            })
        };
        if !active {
            // An export that does not allow an inactive node keeps its node active.
            let pinned = self.graph.exports.iter().any(|e| {
                !e.allow_inactive && self.graph.is_active(&e.node) && nodes.contains(&e.node)
            });
            if pinned {
                return Err(failed(&"Operation not permitted"));
            }
        }
        let mut graph = self.graph.clone();
        let mut changed = Vec::new();
        for n in &nodes {
            changed.extend(graph.set_active(n, active));
        }
        // The images of the nodes that changed (their own, their exports'), each once.
        let mut images: Vec<Arc<Image>> = Vec::new();
        for image in changed.iter().filter_map(|n| self.nodes.get(n)) {
            if !images.iter().any(|i| Arc::ptr_eq(i, &image)) {
                images.push(image);
            }
        }
        for e in graph.exports.iter().filter(|e| changed.contains(&e.node)) {
            let image = match &e.transport {
                Transport::Nbd { name, .. } => {
                    self.nbd.borrow().as_ref().and_then(|n| n.image(name))
                }
                Transport::VhostUserBlk { .. } => e
                    .disk
                    .and_then(|d| self.exports.device(d))
                    .map(|d| d.image().clone()),
            };
            if let Some(image) = image {
                if !images.iter().any(|i| Arc::ptr_eq(i, &image)) {
                    images.push(image);
                }
            }
        }
        for (k, image) in images.iter().enumerate() {
            let done = if active {
                drained(|| image.activate()).map_err(|e| failed(&e.qemu_desc()))
            } else {
                drained(|| image.inactivate()).map_err(|e| failed(&e))
            };
            if let Err(e) = done {
                // All or nothing: the images changed so far go back, the graph stays.
                for back in &images[..k] {
                    let _ = if active {
                        back.inactivate().map_err(|e| e.to_string())
                    } else {
                        back.activate().map_err(|e| e.to_string())
                    };
                }
                return Err(e);
            }
        }
        self.graph = graph;
        Ok(json!({}))
    }
}
