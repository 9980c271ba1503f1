//! The LoRA adapters the engine serves: which adapter sits in which slot of the model, by an id
//! that is never reused.
//!
//! A request names its adapter by id, not by slot: a slot is a place on the device, refilled
//! when an adapter is unloaded and another loaded, and the prefix cache must never take the K/V
//! one adapter computed for another (the cache roots each sequence's hash chain on its id:
//! [`crate::block_manager::adapter_root`]). The adapters in the model's slots when the engine
//! starts have their slot number as id; each adapter loaded later takes the next id above the
//! slots.
//!
//! More adapters than slots (`--lora-modules` or run-time loads beyond `--max-loras`): each
//! adapter named with its directory may wait off the device, and a waiting sequence's adapter
//! is swapped into a slot that no running sequence's adapter holds (the least recently placed
//! first); the scheduler leaves a sequence waiting while its adapter has no slot (it never
//! fails for that). `--max-cpu-loras` bounds the CPU copies (memory-mapped) as vLLM's LRU cache
//! does: beyond it the least recently used copy of an adapter not in a slot is dropped, and
//! read again from its directory when a request needs it. An adapter put in a slot by the
//! caller before the engine started, without its directory, has nothing to come back from:
//! it stays.
//!
//! Unloading takes the id away from admission at once; the sequences already holding it run to
//! their end (as vLLM's running requests keep their adapter), and the slot is emptied once the
//! last of them is gone and no step in flight can read it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tandem_core::lora::LoraAdapter;

/// An adapter that can come back into a slot: where to read it, and its CPU copy while the
/// LRU keeps one.
struct Held {
    id: u32,
    dir: PathBuf,
    copy: Option<Arc<LoraAdapter>>,
    /// When it was last loaded or placed (the LRU's clock).
    used: u64,
}

/// Slots, ids, and the ids a request may name.
pub struct Adapters {
    /// Slot → the id of the adapter in it.
    slots: Vec<Option<u32>>,
    /// Unloaded ids still in their slot, waiting for their last sequence.
    retired: Vec<u32>,
    next_id: u32,
    /// The ids admission accepts, shared with the handles.
    known: Arc<RwLock<Vec<u32>>>,
    /// The adapters that can be swapped, by id: what a slot is refilled from.
    held: Vec<Held>,
    /// Most CPU copies kept (`--max-cpu-loras`), at least the slots.
    max_cpu: usize,
    clock: u64,
}

impl Adapters {
    /// The model's slots as they are (`ModelRunner::lora_slots`): each occupied one serves
    /// under its slot number.
    pub fn new(occupied: &[bool]) -> Self {
        let slots: Vec<Option<u32>> = occupied.iter().enumerate().map(|(s, &o)| o.then_some(s as u32)).collect();
        let known = slots.iter().flatten().copied().collect();
        Adapters {
            next_id: slots.len() as u32,
            max_cpu: slots.len(),
            slots,
            retired: Vec::new(),
            known: Arc::new(RwLock::new(known)),
            held: Vec::new(),
            clock: 0,
        }
    }

    /// The adapters named when the engine starts (`--lora-modules`), adapter `i` under id `i`:
    /// those below the slots sit in their slot already (the caller put them there) and may now
    /// be swapped out; the others wait, to be read from their directory when a request needs
    /// them. Called once, before any other adapter is added.
    pub fn name_at_start(&mut self, dirs: &[PathBuf]) -> Result<(), String> {
        if self.next_id != self.slots.len() as u32 || !self.held.is_empty() {
            return Err("adapters were added before those named at start".into());
        }
        for (i, dir) in dirs.iter().enumerate() {
            let id = i as u32;
            if i < self.slots.len() {
                if self.slots[i] != Some(id) {
                    return Err(format!("LoRA adapter {} (id {i}) is not in slot {i}", dir.display()));
                }
            } else {
                self.next_id += 1;
                self.write_known(|k| k.push(id));
            }
            self.held.push(Held { id, dir: dir.clone(), copy: None, used: 0 });
        }
        Ok(())
    }

    /// Keeps up to `n` CPU copies (vLLM's `--max-cpu-loras`; None, or fewer than the slots: as
    /// many as the slots).
    pub fn set_max_cpu(&mut self, n: Option<usize>) {
        self.max_cpu = n.unwrap_or(0).max(self.slots.len());
        self.trim();
    }

    /// Most CPU copies kept.
    pub fn max_cpu(&self) -> usize {
        self.max_cpu
    }

    /// The CPU copies kept now.
    pub fn num_copies(&self) -> usize {
        self.held.iter().filter(|h| h.copy.is_some()).count()
    }

    /// Where adapter `id` comes back from: its CPU copy where one is kept, and its directory;
    /// None where it cannot be swapped.
    pub fn source(&self, id: u32) -> Option<(Option<Arc<LoraAdapter>>, &Path)> {
        self.held.iter().find(|h| h.id == id).map(|h| (h.copy.clone(), h.dir.as_path()))
    }

    /// Whether some adapter a request may name has no slot.
    pub fn any_unplaced(&self) -> bool {
        self.held.iter().any(|h| self.slot_of(h.id).is_none() && !self.retired.contains(&h.id))
    }

    /// A slot adapter `id` can be swapped into: an empty one, else the least recently placed
    /// whose adapter can come back, is not unloaded, and is not `busy`.
    pub fn slot_to_swap(&self, busy: impl Fn(u32) -> bool) -> Option<usize> {
        self.free_slot().or_else(|| {
            let swappable = |x: u32| !self.retired.contains(&x) && !busy(x);
            let used = |x: u32| self.held.iter().find(|h| h.id == x).map(|h| h.used);
            (0..self.slots.len())
                .filter_map(|s| {
                    let x = self.slots[s]?;
                    Some((used(x)?, s)).filter(|_| swappable(x))
                })
                .min()
                .map(|(_, s)| s)
        })
    }

    /// Whether an adapter added now could ever take a slot: one is empty, will be emptied (an
    /// unloaded adapter's), or holds an adapter that can be swapped out.
    pub fn could_place(&self) -> bool {
        self.slots.iter().any(|s| s.is_none_or(|x| self.retired.contains(&x) || self.source(x).is_some()))
    }

    /// Empties `slot` (which the caller has emptied); its adapter waits off the device.
    pub fn clear(&mut self, slot: usize) {
        self.slots[slot] = None;
    }

    /// Puts adapter `id`, read as `copy`, in `slot` (which the caller has filled); the adapter
    /// there before waits off the device.
    pub fn place(&mut self, slot: usize, id: u32, copy: Arc<LoraAdapter>) {
        self.slots[slot] = Some(id);
        self.clock += 1;
        let now = self.clock;
        if let Some(h) = self.held.iter_mut().find(|h| h.id == id) {
            (h.copy, h.used) = (Some(copy), now);
        }
        self.trim();
    }

    /// `--max-loras`: the model's slots.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Whether the model has LoRA slots at all.
    pub fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    /// The slot adapter `id` sits in.
    pub fn slot_of(&self, id: u32) -> Option<u32> {
        self.slots.iter().position(|&s| s == Some(id)).map(|s| s as u32)
    }

    /// The ids a request may name (what admission checks against).
    pub(crate) fn known(&self) -> Arc<RwLock<Vec<u32>>> {
        self.known.clone()
    }

    /// Whether a request may name `id` now.
    pub fn is_known(&self, id: u32) -> bool {
        self.known.read().map(|k| k.contains(&id)).unwrap_or(false)
    }

    /// A slot no adapter holds.
    pub fn free_slot(&self) -> Option<usize> {
        self.slots.iter().position(Option::is_none)
    }

    /// Records a new adapter, its CPU copy and the slot the caller has put it in (None: it
    /// waits off the device), and returns its id.
    pub fn add(&mut self, adapter: Arc<LoraAdapter>, slot: Option<usize>) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(s) = slot {
            self.slots[s] = Some(id);
        }
        self.clock += 1;
        self.held.push(Held { id, dir: adapter.dir.clone(), copy: Some(adapter), used: self.clock });
        self.write_known(|k| k.push(id));
        self.trim();
        id
    }

    /// Drops the least recently used CPU copies of adapters in no slot while more than
    /// `max_cpu` are kept (those in slots are at most the slots, so that always ends there).
    fn trim(&mut self) {
        while self.num_copies() > self.max_cpu {
            let slots = &self.slots;
            let oldest = self
                .held
                .iter_mut()
                .filter(|h| h.copy.is_some() && !slots.contains(&Some(h.id)))
                .min_by_key(|h| h.used);
            match oldest {
                Some(h) => h.copy = None,
                None => break,
            }
        }
    }

    /// Takes `id` away from admission; it stays in its slot (retired) until
    /// [`Self::take_unused`] frees it. False where no such adapter is served.
    pub fn retire(&mut self, id: u32) -> bool {
        if !self.is_known(id) {
            return false;
        }
        self.write_known(|k| k.retain(|&x| x != id));
        self.retired.push(id);
        true
    }

    /// The slots of the retired adapters for which `in_use` is false, emptied here (their CPU
    /// copies dropped); the caller empties them on the device.
    pub fn take_unused(&mut self, in_use: impl Fn(u32) -> bool) -> Vec<usize> {
        let mut freed = Vec::new();
        let (slots, held) = (&mut self.slots, &mut self.held);
        self.retired.retain(|&id| {
            if in_use(id) {
                return true;
            }
            if let Some(s) = slots.iter().position(|&x| x == Some(id)) {
                slots[s] = None;
                freed.push(s);
            }
            held.retain(|h| h.id != id);
            false
        });
        freed
    }

    /// Whether an unloaded adapter still waits for its sequences.
    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    fn write_known(&self, f: impl FnOnce(&mut Vec<u32>)) {
        // A writer that panicked left a whole list (each write is one push or retain).
        f(&mut self.known.write().unwrap_or_else(|e| e.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adapter() -> Arc<LoraAdapter> {
        Arc::new(LoraAdapter { dir: "/a".into(), rank: 1, scale: 1.0, layers: Vec::new() })
    }

    #[test]
    fn ids_are_never_reused_and_a_retired_slot_frees_once_unused() {
        let mut a = Adapters::new(&[true, false]);
        assert_eq!((a.slot_of(0), a.free_slot(), a.is_known(0)), (Some(0), Some(1), true));
        let id = a.add(adapter(), Some(1));
        assert_eq!((id, a.slot_of(id), a.free_slot()), (2, Some(1), None));
        assert!(a.retire(0) && !a.is_known(0) && !a.retire(0));
        assert!(a.take_unused(|i| i == 0).is_empty(), "a sequence still holds adapter 0");
        assert_eq!(a.take_unused(|_| false), vec![0]);
        assert_eq!((a.slot_of(0), a.free_slot(), a.has_retired()), (None, Some(0), false));
        assert_eq!(a.add(adapter(), Some(0)), 3, "slot 0 refilled under a new id");
        assert!(!Adapters::new(&[]).enabled());
    }

    #[test]
    fn an_adapter_without_a_slot_takes_one_no_busy_adapter_holds() {
        let mut a = Adapters::new(&[true, false]);
        a.set_max_cpu(Some(4));
        assert_eq!(a.max_cpu(), 4);
        let one = a.add(adapter(), Some(1));
        let two = a.add(adapter(), None);
        assert!(a.any_unplaced() && a.is_known(two) && a.slot_of(two).is_none());
        // Slot 0's adapter came with the model (no directory): never swapped out.
        assert_eq!(a.slot_to_swap(|id| id == one), None, "slot 1's adapter is busy");
        assert_eq!(a.slot_to_swap(|_| false), Some(1));
        a.place(1, two, adapter());
        assert_eq!((a.slot_of(two), a.slot_of(one), a.any_unplaced()), (Some(1), None, true));
        assert!(a.retire(one));
        assert!(a.take_unused(|_| false).is_empty(), "no slot to empty");
        assert!(a.source(one).is_none() && !a.any_unplaced());
    }

    #[test]
    fn adapters_named_at_start_beyond_the_slots_wait_and_the_lru_bounds_the_copies() {
        let mut a = Adapters::new(&[true, true]);
        let dirs: Vec<PathBuf> = (0..5).map(|i| PathBuf::from(format!("/a{i}"))).collect();
        a.name_at_start(&dirs).unwrap();
        assert!((0..5).all(|i| a.is_known(i)), "every adapter named at start is served");
        assert_eq!((a.slot_of(1), a.slot_of(2), a.num_copies()), (Some(1), None, 0));
        assert_eq!(a.source(4).map(|(c, d)| (c.is_none(), d.to_path_buf())), Some((true, dirs[4].clone())));
        a.set_max_cpu(Some(3));
        // Least recently placed first: slot 0 (never placed), then slot 1.
        for (id, want) in [(2, 0), (3, 1), (4, 0)] {
            let s = a.slot_to_swap(|_| false).unwrap();
            assert_eq!(s, want, "adapter {id}");
            a.place(s, id, adapter());
        }
        assert_eq!((a.slot_of(4), a.slot_of(3), a.slot_of(2)), (Some(0), Some(1), None));
        assert_eq!(a.num_copies(), 3);
        let id = a.add(adapter(), None);
        assert_eq!((id, a.num_copies()), (5, 3), "adapter 2's copy, the oldest outside a slot, dropped");
        assert!(a.source(2).is_some_and(|(c, _)| c.is_none()) && a.source(5).is_some_and(|(c, _)| c.is_some()));
        assert!(a.could_place());
        let mut b = Adapters::new(&[false, true]);
        assert!(b.name_at_start(&dirs[..1]).unwrap_err().contains("not in slot 0"));
        assert!(!Adapters::new(&[true]).could_place(), "a slot filled by the caller, no directory");
    }
}
