//! A generation-numbered slot store: the one table behind fd handlers, timers, bottom halves
//! and the engines' in-flight requests.
//!
//! This module owns slot reuse and stale-id detection only. It never calls a callback, a
//! monitor or the kernel; its users keep their own meaning of a slot.
//!
//! * [`Slots::insert`] puts a value in a free slot (the most recently freed first) and returns
//!   a [`SlotId`]: the slot's index and a generation that no earlier value of that slot had.
//! * An id outlives its value: after [`Slots::remove`], `get(id)` is `None` even once the slot
//!   holds a new value, because the generation differs (generations are 32-bit and never 0;
//!   a slot would have to be reused 2^32 - 1 times for an id to come back).
//! * Users that hand out only the index (an engine's kernel user data, where the request's
//!   lifetime is the slot's) use the `*_index` accessors.

/// Identifies a value in a [`Slots`]: its slot and the generation of that slot's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    index: u32,
    generation: u32,
}

impl SlotId {
    /// The slot's index.
    pub fn index(self) -> u32 {
        self.index
    }

    /// The generation (never 0).
    #[cfg(test)]
    pub fn generation(self) -> u32 {
        self.generation
    }

    /// Both halves in one `u64`: the generation high, the index low.
    pub fn to_u64(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }

    /// The inverse of [`SlotId::to_u64`].
    pub fn from_u64(raw: u64) -> SlotId {
        SlotId {
            index: raw as u32,
            generation: (raw >> 32) as u32,
        }
    }
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Values in reusable, generation-numbered slots (see [`kit`](crate::kit)).
#[derive(Debug)]
pub struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }
}

impl<T> Slots<T> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id the next [`Slots::insert`] will return.
    pub fn next_id(&self) -> SlotId {
        match self.free.last() {
            Some(&index) => SlotId {
                index,
                generation: next_generation(self.slots[index as usize].generation),
            },
            None => SlotId {
                index: self.slots.len() as u32,
                generation: 1,
            },
        }
    }

    /// Stores `value` in a free slot.
    pub fn insert(&mut self, value: T) -> SlotId {
        let id = self.next_id();
        match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                slot.generation = id.generation;
                slot.value = Some(value);
            }
            None => self.slots.push(Slot {
                generation: id.generation,
                value: Some(value),
            }),
        }
        self.live += 1;
        id
    }

    /// The value of `id`, if it is still the slot's current one.
    pub fn get(&self, id: SlotId) -> Option<&T> {
        match self.slots.get(id.index as usize) {
            Some(s) if s.generation == id.generation => s.value.as_ref(),
            _ => None,
        }
    }

    /// The value of `id`, mutably, if it is still the slot's current one.
    pub fn get_mut(&mut self, id: SlotId) -> Option<&mut T> {
        match self.slots.get_mut(id.index as usize) {
            Some(s) if s.generation == id.generation => s.value.as_mut(),
            _ => None,
        }
    }

    /// Takes the value of `id` out and frees its slot; `None` for a stale or unknown id.
    pub fn remove(&mut self, id: SlotId) -> Option<T> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let value = slot.value.take()?;
        self.free.push(id.index);
        self.live -= 1;
        Some(value)
    }

    /// The value in slot `index`, whatever its generation.
    pub fn get_index(&self, index: u32) -> Option<&T> {
        self.slots.get(index as usize)?.value.as_ref()
    }

    /// The value in slot `index`, mutably, whatever its generation.
    pub fn get_index_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize)?.value.as_mut()
    }

    /// The current id of slot `index`, if it holds a value.
    pub fn id_of_index(&self, index: u32) -> Option<SlotId> {
        let slot = self.slots.get(index as usize)?;
        slot.value.as_ref().map(|_| SlotId {
            index,
            generation: slot.generation,
        })
    }

    /// Takes the value out of slot `index` and frees the slot.
    pub fn remove_index(&mut self, index: u32) -> Option<T> {
        let id = self.id_of_index(index)?;
        self.remove(id)
    }

    /// How many values are stored.
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Every stored value with its id, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (SlotId, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            s.value.as_ref().map(|v| {
                (
                    SlotId {
                        index: i as u32,
                        generation: s.generation,
                    },
                    v,
                )
            })
        })
    }

    /// Every stored value, mutably, in slot order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }
}

/// The generation after `g`: never 0, wrapping after `u32::MAX`.
fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut s = Slots::new();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_ne!(a, b);
        assert_eq!((s.get(a), s.get(b)), (Some(&"a"), Some(&"b")));
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None, "removed once only");
        assert_eq!(s.len(), 1);
        *s.get_mut(b).unwrap() = "B";
        assert_eq!(s.get(b), Some(&"B"));
    }

    #[test]
    fn a_reused_slot_does_not_answer_to_the_old_id() {
        let mut s = Slots::new();
        let old = s.insert(1);
        s.remove(old);
        let predicted = s.next_id();
        let new = s.insert(2);
        assert_eq!(new, predicted);
        assert_eq!(new.index(), old.index(), "the freed slot is reused");
        assert_ne!(new.generation(), old.generation());
        assert_eq!(s.get(old), None, "stale id");
        assert_eq!(s.remove(old), None, "a stale id removes nothing");
        assert_eq!(s.get(new), Some(&2));
        assert_eq!(
            s.get_index(old.index()),
            Some(&2),
            "by index: the current value"
        );
    }

    #[test]
    fn ids_round_trip_through_u64_and_generations_skip_zero() {
        let mut s = Slots::new();
        let id = s.insert(());
        assert_eq!(SlotId::from_u64(id.to_u64()), id);
        assert!(id.generation() >= 1);
        assert_eq!(next_generation(u32::MAX), 1);
        assert_eq!(SlotId::from_u64(u64::MAX).index(), u32::MAX);
        assert_eq!(
            s.get(SlotId::from_u64(0)),
            None,
            "generation 0 is never given"
        );
    }

    #[test]
    fn index_access_and_iteration() {
        let mut s = Slots::new();
        let ids: Vec<_> = (0..5).map(|i| s.insert(i)).collect();
        s.remove(ids[1]);
        s.remove(ids[3]);
        let seen: Vec<_> = s.iter().map(|(id, v)| (id.index(), *v)).collect();
        assert_eq!(seen, [(0, 0), (2, 2), (4, 4)]);
        for v in s.values_mut() {
            *v *= 10;
        }
        assert_eq!(s.get_index(4), Some(&40));
        assert_eq!(s.get_index(1), None);
        assert_eq!(s.id_of_index(2), Some(ids[2]));
        assert_eq!(s.remove_index(2), Some(20));
        assert_eq!(s.remove_index(2), None);
        assert_eq!(s.len(), 2);
        assert!(!s.is_empty());
    }
}
