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
//! Unloading takes the id away from admission at once; the sequences already holding it run to
//! their end (as vLLM's running requests keep their adapter), and the slot is emptied once the
//! last of them is gone and no step in flight can read it.

use std::sync::{Arc, RwLock};

/// Slots, ids, and the ids a request may name.
#[derive(Debug)]
pub struct Adapters {
    /// Slot → the id of the adapter in it.
    slots: Vec<Option<u32>>,
    /// Unloaded ids still in their slot, waiting for their last sequence.
    retired: Vec<u32>,
    next_id: u32,
    /// The ids admission accepts, shared with the handles.
    known: Arc<RwLock<Vec<u32>>>,
}

impl Adapters {
    /// The model's slots as they are (`ModelRunner::lora_slots`): each occupied one serves
    /// under its slot number.
    pub fn new(occupied: &[bool]) -> Self {
        let slots: Vec<Option<u32>> = occupied.iter().enumerate().map(|(s, &o)| o.then_some(s as u32)).collect();
        let known = slots.iter().flatten().copied().collect();
        Adapters { next_id: slots.len() as u32, slots, retired: Vec::new(), known: Arc::new(RwLock::new(known)) }
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

    /// Records a new adapter in `slot` (which the caller has filled) and returns its id.
    pub fn add(&mut self, slot: usize) -> u32 {
        let id = self.next_id;
        self.next_id += 1;
        self.slots[slot] = Some(id);
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

    /// The slots of the retired adapters for which `in_use` is false, emptied here; the caller
    /// empties them on the device.
    pub fn take_unused(&mut self, in_use: impl Fn(u32) -> bool) -> Vec<usize> {
        let mut freed = Vec::new();
        let slots = &mut self.slots;
        self.retired.retain(|&id| {
            if in_use(id) {
                return true;
            }
            if let Some(s) = slots.iter().position(|&x| x == Some(id)) {
                slots[s] = None;
                freed.push(s);
            }
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

    #[test]
    fn ids_are_never_reused_and_a_retired_slot_frees_once_unused() {
        let mut a = Adapters::new(&[true, false]);
        assert_eq!((a.slot_of(0), a.free_slot(), a.is_known(0)), (Some(0), Some(1), true));
        let id = a.add(1);
        assert_eq!((id, a.slot_of(id), a.free_slot()), (2, Some(1), None));
        assert!(a.retire(0) && !a.is_known(0) && !a.retire(0));
        assert!(a.take_unused(|i| i == 0).is_empty(), "a sequence still holds adapter 0");
        assert_eq!(a.take_unused(|_| false), vec![0]);
        assert_eq!((a.slot_of(0), a.free_slot(), a.has_retired()), (None, Some(0), false));
        assert_eq!(a.add(0), 3, "slot 0 refilled under a new id");
        assert!(!Adapters::new(&[]).enabled());
    }
}
