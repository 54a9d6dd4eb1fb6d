//! The world's QPs, CQs and SRQs: a slab whose keys (QP numbers, queue identifiers) name their
//! slot, so that finding one is an array index whatever the count. A sorted vector paid a shift
//! of every later entry on each removal and an ordered map a tree walk on every lookup of the
//! hot path (issue 22: the map cost a 64-byte transfer 23 % more CPU than the vector); this
//! costs neither.
//!
//! A key is its slot plus the slot's generation, so a number whose QP was destroyed stops
//! naming anything even when the slot is reused: a QP connected to a destroyed peer gets an
//! error, not someone else's QP. Freed slots are reused oldest first, so a key can name a new
//! entry only after its slot has been reused once per generation value (16 for QP numbers, which
//! are 24 bits on the wire, as a NIC reuses them; 2^32 for queue identifiers). A table that
//! empties gives its memory back and goes on with the next generation.

use std::collections::VecDeque;

/// How a key is made from a slot and a generation, and read back.
pub(crate) trait SlabKey: Copy + Eq + std::fmt::Debug {
    /// The key of `slot` in `generation`, or `None` when the key space has no room for `slot`.
    fn compose(slot: usize, generation: u32) -> Option<Self>;
    /// The slot `self` names (checked against the stored key by the table).
    fn slot(self) -> usize;
}

/// QP numbers: 24 bits on the wire, starting at [`FIRST_QPN`]; 20 bits of slot (about a
/// million live QPs), 4 of generation.
impl SlabKey for u32 {
    fn compose(slot: usize, generation: u32) -> Option<u32> {
        let slot = u32::try_from(slot).ok().filter(|s| *s < QP_SLOTS)?;
        Some(FIRST_QPN + (((generation & 0xF) << 20) | slot))
    }
    fn slot(self) -> usize {
        (self.wrapping_sub(FIRST_QPN) & 0x000F_FFFF) as usize
    }
}

/// Queue identifiers: generation (from 1, so never 0) in the high half, slot in the low half.
impl SlabKey for u64 {
    fn compose(slot: usize, generation: u32) -> Option<u64> {
        let slot = u32::try_from(slot).ok()?;
        Some((u64::from(generation) + 1) << 32 | u64::from(slot))
    }
    fn slot(self) -> usize {
        (self & 0xFFFF_FFFF) as usize
    }
}

/// First QP number handed out; small numbers look like uninitialised fields in logs.
pub(crate) const FIRST_QPN: u32 = 0x100;
/// Slots for QPs: the highest key, slot `QP_SLOTS - 1` in generation 15, is 0xFF_FFFF.
const QP_SLOTS: u32 = 0x000F_FF00;

struct Slot<K, V> {
    /// The key of the entry held, or of the last one held.
    key: Option<K>,
    /// Generation of the next entry put here.
    generation: u32,
    value: Option<V>,
}

/// A slab of entries named by keys of type `K`.
pub(crate) struct Table<K: SlabKey, V> {
    slots: Vec<Slot<K, V>>,
    /// Free slots, freed first at the front.
    free: VecDeque<usize>,
    live: usize,
    /// Generation of slots made from now on (past every generation used before an emptying).
    base_generation: u32,
}

impl<K: SlabKey, V> Table<K, V> {
    pub(crate) const fn new() -> Self {
        Table {
            slots: Vec::new(),
            free: VecDeque::new(),
            live: 0,
            base_generation: 0,
        }
    }

    /// The key the next [`Table::insert`] will give, or `None` when the key space is full.
    pub(crate) fn next_key(&self) -> Option<K> {
        match self.free.front() {
            Some(&slot) => K::compose(slot, self.slots[slot].generation),
            None => K::compose(self.slots.len(), self.base_generation),
        }
    }

    /// Adds `value` under `key`, which must be [`Table::next_key`]'s answer.
    pub(crate) fn insert(&mut self, key: K, value: V) {
        debug_assert_eq!(Some(key), self.next_key());
        let slot = key.slot();
        if self.free.front() == Some(&slot) {
            self.free.pop_front();
        } else {
            self.slots.push(Slot {
                key: None,
                generation: self.base_generation,
                value: None,
            });
        }
        let entry = &mut self.slots[slot];
        entry.key = Some(key);
        entry.generation = entry.generation.wrapping_add(1);
        entry.value = Some(value);
        self.live += 1;
    }

    /// The entry of `key`, while it lives.
    #[inline]
    pub(crate) fn get(&self, key: K) -> Option<&V> {
        let entry = self.slots.get(key.slot())?;
        if entry.key != Some(key) {
            return None;
        }
        entry.value.as_ref()
    }

    /// The entry of `key`, while it lives, to change.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: K) -> Option<&mut V> {
        let entry = self.slots.get_mut(key.slot())?;
        if entry.key != Some(key) {
            return None;
        }
        entry.value.as_mut()
    }

    /// Whether `key` names a live entry.
    #[inline]
    pub(crate) fn contains(&self, key: K) -> bool {
        self.get(key).is_some()
    }

    /// Removes and returns the entry of `key`.
    pub(crate) fn remove(&mut self, key: K) -> Option<V> {
        let slot = key.slot();
        let entry = self.slots.get_mut(slot)?;
        if entry.key != Some(key) {
            return None;
        }
        let value = entry.value.take()?;
        self.live -= 1;
        if self.live == 0 {
            // Emptied: give the slots back; later keys start past every generation used.
            let highest = self.slots.iter().map(|s| s.generation).max().unwrap_or(0);
            self.base_generation = highest;
            self.slots = Vec::new();
            self.free = VecDeque::new();
        } else {
            self.free.push_back(slot);
        }
        Some(value)
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

impl<K: SlabKey, V> std::ops::Index<K> for Table<K, V> {
    type Output = V;
    /// Panics if `key` names nothing, as indexing a vector past its end does: callers look the
    /// key up first.
    #[inline]
    #[allow(clippy::expect_used)] // A missing key is the caller's bug, as `Vec`'s index is.
    fn index(&self, key: K) -> &V {
        self.get(key).expect("a looked-up key is present")
    }
}

impl<K: SlabKey, V> std::ops::IndexMut<K> for Table<K, V> {
    /// Panics if `key` names nothing, as [`Index`](std::ops::Index) does.
    #[inline]
    #[allow(clippy::expect_used)] // A missing key is the caller's bug, as `Vec`'s index is.
    fn index_mut(&mut self, key: K) -> &mut V {
        self.get_mut(key).expect("a looked-up key is present")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_entry_until_removed_and_not_after_reuse() {
        let mut table: Table<u32, &str> = Table::new();
        let a = table.next_key().unwrap();
        table.insert(a, "a");
        let b = table.next_key().unwrap();
        table.insert(b, "b");
        assert_eq!((a, b), (FIRST_QPN, FIRST_QPN + 1));
        assert_eq!(table[a], "a");
        assert_eq!(table.remove(a), Some("a"));
        assert!(!table.contains(a));
        let c = table.next_key().unwrap();
        table.insert(c, "c");
        // Same slot, next generation: the old number names nothing.
        assert_eq!(c.slot(), a.slot());
        assert_ne!(c, a);
        assert_eq!(table.get(a), None);
        assert_eq!(table.remove(a), None);
        assert_eq!((table[b], table[c], table.len()), ("b", "c", 2));
    }

    #[test]
    fn freed_slots_are_reused_oldest_first() {
        let mut table: Table<u64, u32> = Table::new();
        let keys: Vec<u64> = (0..4)
            .map(|i| {
                let key = table.next_key().unwrap();
                table.insert(key, i);
                key
            })
            .collect();
        table.remove(keys[2]);
        table.remove(keys[0]);
        let next = table.next_key().unwrap();
        assert_eq!(next.slot(), keys[2].slot());
        assert!(
            keys.iter().all(|k| *k >> 32 != 0),
            "identifiers are never small"
        );
    }

    #[test]
    fn an_emptied_table_gives_its_slots_back_and_keeps_generations_moving() {
        let mut table: Table<u64, u8> = Table::new();
        let first = table.next_key().unwrap();
        table.insert(first, 1);
        table.remove(first);
        assert_eq!(table.slots.capacity(), 0);
        let again = table.next_key().unwrap();
        assert_eq!(again.slot(), first.slot());
        assert_ne!(again, first);
        table.insert(again, 2);
        assert_eq!(table.get(first), None);
        assert_eq!(table[again], 2);
    }

    #[test]
    fn qp_numbers_stay_within_24_bits() {
        let last = u32::compose(QP_SLOTS as usize - 1, 15).unwrap();
        assert_eq!(last, 0x00FF_FFFF);
        assert_eq!(u32::compose(QP_SLOTS as usize, 0), None);
        assert_eq!(last.slot(), QP_SLOTS as usize - 1);
    }
}
