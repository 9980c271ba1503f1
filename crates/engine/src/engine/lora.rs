//! LoRA adapters loaded and unloaded while the engine serves: each change runs on the engine
//! thread between steps, after every step in flight has come back, so it never races a
//! forward (see [`crate::adapters`] for ids and slots).

use std::sync::Arc;

use tandem_core::lora::LoraAdapter;

use super::Engine;
use crate::sequence::FinishReason;

impl Engine {
    /// Puts `adapter` into a free LoRA slot, or keeps it off the device until a request
    /// needs it and a slot can be swapped, and returns the id requests name it by; an error
    /// (for the caller to report) where the model has no slots, no slot could ever take it
    /// (each holds an adapter that cannot be swapped out), or the adapter does not fit.
    pub fn load_adapter(&mut self, adapter: LoraAdapter) -> Result<u32, String> {
        if !self.scheduler.adapters.enabled() {
            return Err("the model was loaded without LoRA slots (--enable-lora)".into());
        }
        self.land_all();
        self.free_unused_adapters();
        let a = &self.scheduler.adapters;
        if !a.could_place() {
            return Err(format!(
                "every LoRA slot holds an adapter loaded with the model that cannot be swapped out \
                 (--max-loras {}); unload one first",
                a.num_slots()
            ));
        }
        let slot = a.free_slot();
        let mut runner = self.runner.lock().map_err(|_| "the model worker has stopped".to_string())?;
        match slot {
            Some(slot) => runner.load_lora(slot, &adapter).map_err(|e| e.to_string())?,
            // Off the device for now: what a slot would refuse is refused here.
            None => check_rank(&adapter, runner.lora_limits())?,
        }
        drop(runner);
        Ok(self.scheduler.adapters.add(Arc::new(adapter), slot))
    }

    /// Before a step: each waiting sequence's adapter that has no slot, in queue order, takes
    /// one whose adapter no running sequence and no sequence ahead of it in the queue needs,
    /// after every step in flight has landed. An adapter the device refuses ends the requests
    /// that wait for it.
    pub(super) fn swap_in_adapters(&mut self) {
        if !self.scheduler.adapters.any_unplaced() {
            return;
        }
        // Landing only ends sequences: where no slot can be swapped now, none can after.
        let (mut keep, _) = self.scheduler.adapters_in_use();
        if self.scheduler.adapters.slot_to_swap(|x| keep.contains(&x)).is_none() {
            return;
        }
        let s = &self.scheduler;
        if !s.waiting().filter_map(|id| s.seq(id)?.adapter).any(|a| s.adapters.slot_of(a).is_none()) {
            return;
        }
        self.land_all();
        (keep, _) = self.scheduler.adapters_in_use();
        let queue: Vec<u32> = self.scheduler.waiting().filter_map(|id| self.scheduler.seq(id)?.adapter).collect();
        for id in queue {
            if keep.contains(&id) {
                continue;
            }
            if self.scheduler.adapters.slot_of(id).is_some() {
                keep.push(id);
                continue;
            }
            let Some(slot) = self.scheduler.adapters.slot_to_swap(|x| keep.contains(&x)) else { break };
            let Some((copy, dir)) = self.scheduler.adapters.source(id) else { continue };
            let dir = dir.to_path_buf();
            let loaded = match self.runner.lock() {
                Ok(mut r) => {
                    let read = match copy {
                        Some(a) => Ok(a),
                        // Its copy left the CPU cache: read again (memory-mapped).
                        None => LoraAdapter::load(&dir, r.config()).map(Arc::new).map_err(|e| e.to_string()),
                    };
                    read.and_then(|a| r.load_lora(slot, &a).map(|()| a).map_err(|e| e.to_string()))
                }
                Err(_) => Err("the model worker has stopped".into()),
            };
            match loaded {
                Ok(a) => {
                    self.scheduler.adapters.place(slot, id, a);
                    keep.push(id);
                }
                Err(e) => self.adapter_refused(slot, id, &e),
            }
        }
    }

    /// Adapter `id` could not be put into `slot`: the slot is emptied (it may be half
    /// written) and the requests waiting for the adapter end with the error.
    fn adapter_refused(&mut self, slot: usize, id: u32, e: &str) {
        if let Ok(mut r) = self.runner.lock() {
            r.unload_lora(slot);
        }
        self.scheduler.adapters.clear(slot);
        let s = &self.scheduler;
        let rids: Vec<u64> =
            s.seq_ids().filter_map(|q| s.seq(q)).filter(|q| q.adapter == Some(id)).map(|q| q.request_id).collect();
        for rid in rids {
            self.end_request(rid, FinishReason::Error(format!("LoRA adapter {id} could not be loaded: {e}")));
        }
    }

    /// Stops serving adapter `id`: new requests naming it are refused at once; the sequences
    /// holding it run to their end, then its slot is emptied. An error where no adapter `id`
    /// is served.
    pub fn unload_adapter(&mut self, id: u32) -> Result<(), String> {
        if !self.scheduler.adapters.retire(id) {
            return Err(format!("no LoRA adapter {id} is loaded"));
        }
        if self.in_flight.is_empty() {
            self.free_unused_adapters();
        }
        Ok(())
    }

    /// Empties the slots of unloaded adapters no sequence holds any more. Only with nothing in
    /// flight: a step sent before a sequence ended may still read its slot.
    pub(super) fn free_unused_adapters(&mut self) {
        if !self.scheduler.adapters.has_retired() || !self.in_flight.is_empty() {
            return;
        }
        let s = &mut self.scheduler;
        let seqs: Vec<u32> = s.seq_ids().filter_map(|id| s.seq(id).and_then(|q| q.adapter)).collect();
        let freed = s.adapters.take_unused(|id| seqs.contains(&id));
        if freed.is_empty() {
            return;
        }
        if let Ok(mut runner) = self.runner.lock() {
            for slot in freed {
                runner.unload_lora(slot);
            }
        }
    }

    /// A request admitted under an adapter unloaded before it reached this thread gets its
    /// final output, an error, rather than running under nothing. True where that happened.
    pub(super) fn refuse_unloaded_adapter(&mut self, rid: u64, adapter: Option<u32>) -> bool {
        let Some(id) = adapter else { return false };
        if self.scheduler.adapters.is_known(id) {
            return false;
        }
        self.end_request(rid, FinishReason::Error(format!("LoRA adapter {id} was unloaded")));
        true
    }
}

/// What a slot refuses on rank alone, refused before the adapter waits for one.
fn check_rank(adapter: &LoraAdapter, limits: Option<tandem_core::lora::LoraLimits>) -> Result<(), String> {
    match limits {
        Some(l) if adapter.rank > l.max_rank => Err(format!(
            "{}: rank {} is over the limit {} (--max-lora-rank)",
            adapter.dir.display(),
            adapter.rank,
            l.max_rank
        )),
        _ => Ok(()),
    }
}
