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
//! More adapters than slots (`--max-cpu-loras` over `--max-loras`): an adapter loaded through
//! the engine keeps its CPU copy (memory-mapped), and one with no slot waits there; a waiting
//! sequence's adapter is swapped into a slot that no running sequence's adapter holds, and
//! the scheduler leaves a sequence waiting while its adapter has no slot (it never fails for
//! that). The adapters in the slots when the engine starts have no CPU copy: they stay.
//!
//! Unloading takes the id away from admission at once; the sequences already holding it run to
//! their end (as vLLM's running requests keep their adapter), and the slot is emptied once the
//! last of them is gone and no step in flight can read it.

use std::sync::{Arc, RwLock};

use tandem_core::lora::LoraAdapter;

/// Slots, ids, and the ids a request may name.
pub struct Adapters {
    /// Slot → the id of the adapter in it.
    slots: Vec<Option<u32>>,
    /// Unloaded ids still in their slot, waiting for their last sequence.
    retired: Vec<u32>,
    next_id: u32,
    /// The ids admission accepts, shared with the handles.
    known: Arc<RwLock<Vec<u32>>>,
    /// The CPU copies of the adapters loaded through the engine, by id: what a slot is
    /// refilled from.
    held: Vec<(u32, Arc<LoraAdapter>)>,
    /// Most adapters served at once (`--max-cpu-loras`), at least the slots.
    max_cpu: usize,
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
        }
    }

    /// Serves up to `n` adapters at once (vLLM's `--max-cpu-loras`; None, or fewer than the
    /// slots: as many as the slots).
    pub fn set_max_cpu(&mut self, n: Option<usize>) {
        self.max_cpu = n.unwrap_or(0).max(self.slots.len());
    }

    /// Most adapters served at once.
    pub fn max_cpu(&self) -> usize {
        self.max_cpu
    }

    /// Adapters held: those a request may name, and those unloaded whose requests still run.
    pub fn num_held(&self) -> usize {
        self.known.read().map_or(0, |k| k.len()) + self.retired.len()
    }

    /// The CPU copy of adapter `id`, where it has one.
    pub fn held(&self, id: u32) -> Option<&Arc<LoraAdapter>> {
        self.held.iter().find(|(i, _)| *i == id).map(|(_, a)| a)
    }

    /// Whether some adapter a request may name has no slot.
    pub fn any_unplaced(&self) -> bool {
        self.held.iter().any(|(id, _)| self.slot_of(*id).is_none())
    }

    /// A slot adapter `id` can be swapped into: an empty one, else the first whose adapter
    /// has a CPU copy to come back from, is not unloaded, and is not `busy`.
    pub fn slot_to_swap(&self, busy: impl Fn(u32) -> bool) -> Option<usize> {
        self.free_slot().or_else(|| {
            self.slots
                .iter()
                .position(|s| s.is_some_and(|x| self.held(x).is_some() && !self.retired.contains(&x) && !busy(x)))
        })
    }

    /// Empties `slot` (which the caller has emptied); its adapter waits on the CPU.
    pub fn clear(&mut self, slot: usize) {
        self.slots[slot] = None;
    }

    /// Puts adapter `id` in `slot` (which the caller has filled); the adapter there before
    /// keeps its CPU copy and waits for a slot.
    pub fn place(&mut self, slot: usize, id: u32) {
        self.slots[slot] = Some(id);
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
    /// waits on the CPU), and returns its id.
    pub fn add(&mut self, adapter: Arc<LoraAdapter>, slot: Option<usize>) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(s) = slot {
            self.slots[s] = Some(id);
        }
        self.held.push((id, adapter));
        self.write_known(|k| k.push(id));
        id
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
            held.retain(|(i, _)| *i != id);
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
        // Slot 0's adapter came with the model (no CPU copy): never swapped out.
        assert_eq!(a.slot_to_swap(|id| id == one), None, "slot 1's adapter is busy");
        assert_eq!(a.slot_to_swap(|_| false), Some(1));
        a.place(1, two);
        assert_eq!((a.slot_of(two), a.slot_of(one), a.any_unplaced()), (Some(1), None, true));
        assert!(a.retire(one));
        assert!(a.take_unused(|_| false).is_empty(), "no slot to empty");
        assert!(a.held(one).is_none() && !a.any_unplaced());
    }
}
