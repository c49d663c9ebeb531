//! The metadata contexts an export offers, as QEMU's `nbd/server.c` names and numbers them:
//! `base:allocation` (id 0), `qemu:allocation-depth` (id 1) and `qemu:dirty-bitmap:NAME`
//! (id 2 + the bitmap's place among the export's), and how a client's queries choose them.
//!
//! This module owns the contexts' names and ids and the meaning of a query
//! (`NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`); parsing the option and
//! answering it is `negotiate`'s, answering `NBD_CMD_BLOCK_STATUS` the connection's.
//!
//! A query is matched as QEMU matches it (`nbd_meta_base_query`, `nbd_meta_qemu_query`):
//!
//! * `base:allocation` and `qemu:allocation-depth` choose their context (the latter only
//!   where the export offers it); `qemu:dirty-bitmap:NAME` the bitmap the export serves
//!   under that name.
//! * For a list only: no query at all, or a namespace alone, chooses every context it
//!   holds: `base:` the allocation, `qemu:` the allocation depth and every bitmap,
//!   `qemu:dirty-bitmap:` every bitmap. An empty leaf chooses nothing when setting.
//! * Anything else (another namespace, an unknown name) chooses nothing, without an error.

use crate::export::NbdExport;

/// The context id of `base:allocation` (QEMU's too).
pub const BASE_ALLOCATION_ID: u32 = 0;
/// The name of the allocation context.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The context id of `qemu:allocation-depth` (QEMU's too).
pub const ALLOCATION_DEPTH_ID: u32 = 1;
/// The name of the allocation-depth context (an export offers it when asked to).
pub const ALLOCATION_DEPTH: &str = "qemu:allocation-depth";
/// The context id of an export's first dirty bitmap; the n-th (from 0) is this plus n, as
/// QEMU numbers them.
pub const DIRTY_BITMAP_ID: u32 = 2;
/// What a dirty bitmap's context name starts with; its bitmap's name follows.
pub const DIRTY_BITMAP: &str = "qemu:dirty-bitmap:";

/// The metadata contexts a client chose, for one export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaContexts {
    /// The export they were chosen for (they apply only to it).
    pub export: String,
    /// `base:allocation`.
    pub base_allocation: bool,
    /// `qemu:allocation-depth`.
    pub allocation_depth: bool,
    /// `qemu:dirty-bitmap:NAME` of the export's bitmaps, by their place among its
    /// [`dirty_bitmaps`](NbdExport::dirty_bitmaps) (missing ones are not chosen).
    pub bitmaps: Vec<bool>,
}

impl MetaContexts {
    /// None chosen yet, for `export`.
    pub fn for_export(export: &NbdExport) -> Self {
        MetaContexts {
            export: export.name().to_owned(),
            bitmaps: vec![false; export.dirty_bitmaps().len()],
            ..MetaContexts::default()
        }
    }

    /// Every context `export` offers (a list without queries).
    pub fn all(export: &NbdExport) -> Self {
        let mut m = MetaContexts::for_export(export);
        m.base_allocation = true;
        m.allocation_depth = export.offers_allocation_depth();
        m.bitmaps.fill(true);
        m
    }

    /// Whether bitmap `i` of the export is chosen.
    pub fn bitmap(&self, i: usize) -> bool {
        self.bitmaps.get(i).copied().unwrap_or(false)
    }

    /// How many contexts are chosen.
    pub fn count(&self) -> usize {
        usize::from(self.base_allocation)
            + usize::from(self.allocation_depth)
            + self.bitmaps.iter().filter(|&&b| b).count()
    }

    /// Applies one `query` of a list (`list`) or a set to `export`'s contexts.
    pub fn query(&mut self, query: &str, list: bool, export: &NbdExport) {
        if let Some(leaf) = query.strip_prefix("base:") {
            self.base_allocation |= leaf == "allocation" || (list && leaf.is_empty());
            return;
        }
        let Some(leaf) = query.strip_prefix("qemu:") else {
            return;
        };
        if leaf.is_empty() {
            if list {
                self.allocation_depth |= export.offers_allocation_depth();
                self.bitmaps.fill(true);
            }
        } else if leaf == "allocation-depth" {
            self.allocation_depth |= export.offers_allocation_depth();
        } else if let Some(name) = leaf.strip_prefix("dirty-bitmap:") {
            if name.is_empty() {
                if list {
                    self.bitmaps.fill(true);
                }
            } else if let Some(i) = export.dirty_bitmaps().iter().position(|b| b.name() == name) {
                if let Some(b) = self.bitmaps.get_mut(i) {
                    *b = true;
                }
            }
        }
    }

    /// The chosen contexts of `export`, `(id, name)` in QEMU's order: the allocation, the
    /// allocation depth, then the bitmaps in the export's order.
    pub fn chosen(&self, export: &NbdExport) -> Vec<(u32, String)> {
        let mut out = Vec::with_capacity(self.count());
        if self.base_allocation {
            out.push((BASE_ALLOCATION_ID, BASE_ALLOCATION.to_owned()));
        }
        if self.allocation_depth {
            out.push((ALLOCATION_DEPTH_ID, ALLOCATION_DEPTH.to_owned()));
        }
        for (i, b) in export.dirty_bitmaps().iter().enumerate() {
            if self.bitmap(i) {
                out.push((bitmap_id(i), format!("{DIRTY_BITMAP}{}", b.name())));
            }
        }
        out
    }
}

/// The context id of the export's bitmap `i` (saturated: an export cannot serve 4 billion).
pub fn bitmap_id(i: usize) -> u32 {
    u32::try_from(i)
        .unwrap_or(u32::MAX)
        .saturating_add(DIRTY_BITMAP_ID)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aio_block::bitmap::DirtyBitmap;
    use aio_block::{Image, ImageOptions};

    use super::*;
    use crate::export::ExportSet;
    use crate::negotiate::{Negotiation, Step};
    use crate::proto::{opt, rep, Wire, FLAG_C_FIXED_NEWSTYLE};

    /// Export "a" of a 1 MiB null image serving bitmaps `names`, with the allocation depth.
    fn exports(names: &[&str]) -> ExportSet {
        let image = Arc::new(Image::null(1 << 20, ImageOptions::default()).unwrap());
        let mut export = NbdExport::new("a", image).unwrap().allocation_depth(true);
        for name in names {
            let bitmap = Arc::new(DirtyBitmap::new(name, 1 << 20, 65536).unwrap());
            export = export.dirty_bitmap(bitmap);
        }
        let set = ExportSet::new();
        set.insert(export).unwrap();
        set
    }

    /// A LIST or SET payload for export `name` with `queries`.
    fn payload(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut p = (name.len() as u32).to_be_bytes().to_vec();
        p.extend_from_slice(name.as_bytes());
        p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            p.extend_from_slice(&(q.len() as u32).to_be_bytes());
            p.extend_from_slice(q.as_bytes());
        }
        p
    }

    /// The answer to `option` with `queries` on a session with structured replies: each
    /// reply's (type, id, name).
    fn ask(
        set: &ExportSet,
        n: &mut Negotiation,
        option: u32,
        queries: &[&str],
    ) -> Vec<(u32, u32, String)> {
        let mut out = Vec::new();
        assert!(matches!(
            n.option(option, &payload("a", queries), set, &mut out),
            Step::Next
        ));
        let mut w = Wire::new(&out);
        let mut replies = Vec::new();
        while w.remaining() > 0 {
            w.u64("magic").unwrap();
            assert_eq!(w.u32("option").unwrap(), option);
            let kind = w.u32("type").unwrap();
            let len = w.u32("length").unwrap() as usize;
            let body = w.bytes(len, "payload").unwrap();
            let (id, name) = if kind == rep::META_CONTEXT {
                let id = u32::from_be_bytes(body[..4].try_into().unwrap());
                (id, String::from_utf8(body[4..].to_vec()).unwrap())
            } else {
                (0, String::new())
            };
            replies.push((kind, id, name));
        }
        replies
    }

    fn session() -> Negotiation {
        let mut n = Negotiation::new(false);
        n.client_flags(FLAG_C_FIXED_NEWSTYLE).unwrap();
        let mut out = Vec::new();
        n.option(opt::STRUCTURED_REPLY, &[], &ExportSet::new(), &mut out);
        n
    }

    fn meta(id: u32, name: &str) -> (u32, u32, String) {
        (rep::META_CONTEXT, id, name.to_owned())
    }

    fn ack() -> (u32, u32, String) {
        (rep::ACK, 0, String::new())
    }

    #[test]
    fn a_list_of_the_bitmap_namespace_names_each_served_bitmap_once() {
        let set = exports(&["b0"]);
        let mut n = session();
        let list = opt::LIST_META_CONTEXT;
        // oVirt's client asks for `qemu:dirty-bitmap:` and expects exactly one answer.
        assert_eq!(
            ask(&set, &mut n, list, &["qemu:dirty-bitmap:"]),
            [meta(0, "qemu:dirty-bitmap:b0"), ack()]
        );
        assert_eq!(
            ask(&set, &mut n, list, &["qemu:"]),
            [
                meta(0, ALLOCATION_DEPTH),
                meta(0, "qemu:dirty-bitmap:b0"),
                ack()
            ]
        );
        assert_eq!(
            ask(&set, &mut n, list, &[]),
            [
                meta(0, BASE_ALLOCATION),
                meta(0, ALLOCATION_DEPTH),
                meta(0, "qemu:dirty-bitmap:b0"),
                ack()
            ]
        );
        assert_eq!(
            ask(&set, &mut n, list, &["qemu:dirty-bitmap:nope", "other:x"]),
            [ack()]
        );
        // A list chooses nothing for transmission.
        assert_eq!(n.meta().count(), 0);
    }

    #[test]
    fn a_set_chooses_bitmaps_by_name_with_ids_after_the_allocation_depth() {
        let set = exports(&["b0", "b1"]);
        let mut n = session();
        let chosen = ask(
            &set,
            &mut n,
            opt::SET_META_CONTEXT,
            &[
                "qemu:dirty-bitmap:b1",
                "base:allocation",
                "qemu:dirty-bitmap:",
            ],
        );
        assert_eq!(
            chosen,
            [
                meta(BASE_ALLOCATION_ID, BASE_ALLOCATION),
                meta(DIRTY_BITMAP_ID + 1, "qemu:dirty-bitmap:b1"),
                ack()
            ]
        );
        assert_eq!(n.meta().bitmaps, [false, true]);
        assert_eq!(n.meta().count(), 2);
        // A set of the namespaces alone chooses nothing, and replaces what was chosen.
        assert_eq!(
            ask(
                &set,
                &mut n,
                opt::SET_META_CONTEXT,
                &["qemu:", "qemu:dirty-bitmap:"]
            ),
            [ack()]
        );
        assert_eq!(n.meta().count(), 0);
    }

    #[test]
    fn an_export_without_bitmaps_lists_none() {
        let set = exports(&[]);
        let mut n = session();
        assert_eq!(
            ask(
                &set,
                &mut n,
                opt::LIST_META_CONTEXT,
                &["qemu:dirty-bitmap:"]
            ),
            [ack()]
        );
    }
}
