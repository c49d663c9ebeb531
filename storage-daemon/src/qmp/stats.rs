//! The I/O statistics over QMP: `query-blockstats` with QEMU's `BlockDeviceStats` fields, and
//! `block-latency-histogram-set`.
//!
//! This module owns rendering a disk's counts as QEMU names them and the histograms' command;
//! the counting is the block layer's (`aio_block::stats`).
//!
//! * A disk is found by its export's id or its node's name (QEMU finds a BlockBackend or a
//!   guest device by name; qemu-storage-daemon's exports have neither, and its schema has no
//!   `block-latency-histogram-set`).
//! * `boundaries` sets the read, write and flush histograms, `boundaries-read`,
//!   `boundaries-write`, `boundaries-flush` one each (over `boundaries`); none at all removes
//!   every histogram. `boundaries-zap` (zone appends) is checked and has nothing to count.
//!   Every list is checked before any histogram changes.

use std::sync::Arc;

use serde_json::{json, Value};

use aio_block::stats::{BlockStats, IoKind, LatencyHistogram, StatsSnapshot};
use aio_block::Image;

use crate::blockdev::export::{Export, Transport};

use super::commands::{Command, State};
use super::wire::{Args, ErrorClass, QmpError};

/// The statistics' commands.
pub(super) const COMMANDS: &[Command] = &[
    Command {
        name: "query-blockstats",
        run: |state, _, args| state.query_blockstats(args),
    },
    Command {
        name: "block-latency-histogram-set",
        run: |state, _, args| state.latency_histogram_set(args),
    },
];

impl State {
    /// The image of the live export whose id or node name is `id` (a disk's, or an NBD
    /// export's).
    fn image_named(&self, id: &str) -> Option<Arc<Image>> {
        let export = self
            .graph
            .exports
            .iter()
            .find(|e| e.id == id || e.node == id)?;
        self.export_image(export)
    }

    /// The image export `e` serves.
    pub(super) fn export_image(&self, e: &Export) -> Option<Arc<Image>> {
        match &e.transport {
            Transport::Nbd { name, .. } => self.nbd.borrow().as_ref()?.image(name),
            Transport::VhostUserBlk { .. } => {
                let number = e.disk?;
                Some(self.exports.device(number)?.image().clone())
            }
        }
    }

    /// Each export's disk (or, with `query-nodes`, each named node: the counts of the export
    /// serving it, zeros for one no export serves), with QEMU's `BlockDeviceStats` fields.
    fn query_blockstats(&self, mut args: Args) -> Result<Value, QmpError> {
        let nodes = args.opt_bool("query-nodes")?.unwrap_or(false);
        args.finish()?;
        let entry = |node: &str, image: Option<Arc<Image>>| json!({"device": "", "node-name": node, "stats": block_device_stats(image.as_deref().map(Image::stats))});
        if !nodes {
            return Ok(self
                .graph
                .exports
                .iter()
                .map(|e| entry(&e.node, self.export_image(e)))
                .collect());
        }
        let mut names: Vec<&String> = self.graph.nodes.keys().collect();
        names.sort();
        Ok(names
            .into_iter()
            .map(|name| entry(name, self.image_named(name)))
            .collect())
    }

    /// `block-latency-histogram-set`.
    fn latency_histogram_set(&mut self, mut args: Args) -> Result<Value, QmpError> {
        let id = args.str("id")?;
        let all = args.opt_u64_list("boundaries")?;
        let read = args.opt_u64_list("boundaries-read")?;
        let write = args.opt_u64_list("boundaries-write")?;
        let zap = args.opt_u64_list("boundaries-zap")?;
        let flush = args.opt_u64_list("boundaries-flush")?;
        args.finish()?;
        let disk = self.image_named(&id).ok_or_else(|| QmpError {
            class: ErrorClass::DeviceNotFound,
            desc: format!("Device '{id}' not found"),
        })?;
        let stats = disk.stats();
        let kinds = [
            (IoKind::Read, "read"),
            (IoKind::Write, "write"),
            (IoKind::Flush, "flush"),
        ];
        if all.is_none() && read.is_none() && write.is_none() && flush.is_none() {
            for (kind, _) in kinds {
                let _ = stats.set_latency_histogram(kind, None);
            }
            return Ok(json!({}));
        }
        let wanted = [read, write, flush].map(|b| b.or_else(|| all.clone()));
        let fail =
            |name: &str| QmpError::generic(format!("Device '{id}' set {name} boundaries fail"));
        for ((_, name), b) in kinds.iter().zip(&wanted) {
            if b.as_deref()
                .is_some_and(|b| LatencyHistogram::new(b.to_vec()).is_err())
            {
                return Err(fail(name));
            }
        }
        if zap
            .or(all)
            .is_some_and(|b| LatencyHistogram::new(b).is_err())
        {
            return Err(fail("append write"));
        }
        for ((kind, name), b) in kinds.into_iter().zip(wanted) {
            if b.is_some() {
                stats
                    .set_latency_histogram(kind, b)
                    .map_err(|_| fail(name))?;
            }
        }
        Ok(json!({}))
    }
}

/// QEMU's `BlockDeviceStats` of an image's `stats` (all zeros for none): every export of
/// the image counts in them. What is not counted here,
/// merges and zoned appends, is 0; invalid requests are counted apart, as QEMU counts them,
/// and leave the idle time; a latency histogram appears once set.
fn block_device_stats(stats: Option<&BlockStats>) -> Value {
    let s: StatsSnapshot = stats.map(|d| d.snapshot()).unwrap_or_default();
    let mut out = json!({
        "rd_bytes": s.read.bytes, "wr_bytes": s.write.bytes, "unmap_bytes": s.unmap.bytes,
        "rd_operations": s.read.operations, "wr_operations": s.write.operations,
        "flush_operations": s.flush.operations, "unmap_operations": s.unmap.operations,
        "rd_total_time_ns": s.read.total_time_ns, "wr_total_time_ns": s.write.total_time_ns,
        "flush_total_time_ns": s.flush.total_time_ns,
        "unmap_total_time_ns": s.unmap.total_time_ns,
        "failed_rd_operations": s.read.failed, "failed_wr_operations": s.write.failed,
        "failed_flush_operations": s.flush.failed, "failed_unmap_operations": s.unmap.failed,
        "invalid_rd_operations": s.read.invalid, "invalid_wr_operations": s.write.invalid,
        "invalid_flush_operations": s.flush.invalid,
        "invalid_unmap_operations": s.unmap.invalid,
        "rd_merged": 0, "wr_merged": 0, "unmap_merged": 0,
        "zone_append_bytes": 0, "zone_append_operations": 0, "zone_append_merged": 0,
        "zone_append_total_time_ns": 0, "failed_zone_append_operations": 0,
        "invalid_zone_append_operations": 0,
        "wr_highest_offset": s.wr_highest_offset,
        "account_invalid": false, "account_failed": true,
        "timed_stats": [],
    });
    if let Some(idle) = s.idle_time_ns {
        out["idle_time_ns"] = json!(idle);
    }
    if let Some(stats) = stats {
        let [read, write, flush, _unmap] = stats.latency_histograms();
        for (field, h) in [
            ("rd_latency_histogram", read),
            ("wr_latency_histogram", write),
            ("flush_latency_histogram", flush),
        ] {
            if let Some(h) = h {
                out[field] = json!({"boundaries": h.boundaries, "bins": h.bins});
            }
        }
    }
    out
}
