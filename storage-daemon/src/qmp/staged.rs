//! The effects of a transaction's prepared actions, staged until its commit, and the commit
//! itself in the three steps `transaction.rs`' contract gives (bitmaps added and enabled;
//! clears and merges; bitmaps disabled and removed).
//!
//! This module owns the staged effects and how they are applied, never an action's
//! arguments or checks (`bitmaps.rs`) or the command (`transaction.rs`).

use std::sync::Arc;

use aio_block::bitmap::{BitmapError, BusyGuard, DirtyBitmap};
use aio_block::Image;

/// A prepared action's effect, applied at the commit.
pub(super) enum Effect {
    /// A bitmap made for node `node`'s image, added to it.
    Add {
        node: String,
        image: Arc<Image>,
        bitmap: Arc<DirtyBitmap>,
    },
    /// Recording started (`on`) or stopped.
    Record { bitmap: Arc<DirtyBitmap>, on: bool },
    /// Every bit cleared.
    Clear(Arc<DirtyBitmap>),
    /// The sources' bits set in the target.
    Merge {
        target: Arc<DirtyBitmap>,
        sources: Vec<Arc<DirtyBitmap>>,
    },
    /// The held bitmap removed from `image`.
    Remove { image: Arc<Image>, hold: BusyGuard },
}

/// The effects of the actions prepared so far, in order. Dropped uncommitted, it is the
/// transaction's abort: nothing was applied, and the holds of bitmaps to remove let go.
#[derive(Default)]
pub(super) struct Staged {
    effects: Vec<Effect>,
}

impl Staged {
    /// Stages a prepared action's effect.
    pub(super) fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    /// The bitmap `name` an earlier action adds to node `node`.
    pub(super) fn added(&self, node: &str, name: &str) -> Option<Arc<DirtyBitmap>> {
        self.effects.iter().find_map(|e| match e {
            Effect::Add {
                node: n, bitmap, ..
            } if n == node && bitmap.name() == name => Some(bitmap.clone()),
            _ => None,
        })
    }

    /// Applies every effect, in the three steps of the module's contract. An error here
    /// means a bitmap changed between the prepare and the commit, which nothing on the
    /// monitor thread does; it is returned rather than ignored.
    pub(super) fn commit(self) -> Result<(), BitmapError> {
        let effects = self.effects;
        let removed = |b: &Arc<DirtyBitmap>| {
            effects
                .iter()
                .any(|e| matches!(e, Effect::Remove { hold, .. } if Arc::ptr_eq(hold.bitmap(), b)))
        };
        // A bitmap's recording ends as its last enable or disable says (none of a bitmap
        // removed: it goes, and it is held busy).
        let final_record = |at: usize, b: &Arc<DirtyBitmap>| {
            !removed(b)
                && !effects[at + 1..]
                    .iter()
                    .any(|e| matches!(e, Effect::Record { bitmap, .. } if Arc::ptr_eq(bitmap, b)))
        };
        for (at, effect) in effects.iter().enumerate() {
            match effect {
                Effect::Add { image, bitmap, .. } => image.insert_dirty_bitmap(bitmap.clone())?,
                Effect::Record { bitmap, on: true } if final_record(at, bitmap) => {
                    bitmap.set_recording(true)?
                }
                _ => {}
            }
        }
        for effect in &effects {
            match effect {
                Effect::Clear(bitmap) => bitmap.clear(),
                Effect::Merge { target, sources } => {
                    for source in sources {
                        target.merge_from(source)?;
                    }
                }
                _ => {}
            }
        }
        let disabled: Vec<bool> = effects
            .iter()
            .enumerate()
            .map(|(at, e)| matches!(e, Effect::Record { bitmap, on: false } if final_record(at, bitmap)))
            .collect();
        for (effect, disable) in effects.into_iter().zip(disabled) {
            match effect {
                Effect::Record { bitmap, .. } if disable => bitmap.set_recording(false)?,
                Effect::Remove { image, hold } => {
                    let name = hold.bitmap().name().to_string();
                    drop(hold);
                    image.dirty_bitmaps().remove(&name)?;
                }
                _ => {}
            }
        }
        Ok(())
    }
}
