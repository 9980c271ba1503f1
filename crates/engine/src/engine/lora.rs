//! LoRA adapters loaded and unloaded while the engine serves: each change runs on the engine
//! thread between steps, after every step in flight has come back, so it never races a
//! forward (see [`crate::adapters`] for ids and slots).

use tandem_core::lora::LoraAdapter;

use super::Engine;
use crate::sequence::FinishReason;

impl Engine {
    /// Puts `adapter` into a free LoRA slot and returns the id requests name it by; an error
    /// (for the caller to report) where the model has no slots, every slot holds an adapter,
    /// or the adapter does not fit them.
    pub fn load_adapter(&mut self, adapter: &LoraAdapter) -> Result<u32, String> {
        if !self.scheduler.adapters.enabled() {
            return Err("the model was loaded without LoRA slots (--enable-lora)".into());
        }
        self.land_all();
        self.free_unused_adapters();
        let Some(slot) = self.scheduler.adapters.free_slot() else {
            return Err(format!(
                "every LoRA slot holds an adapter (--max-loras {}); unload one first",
                self.scheduler.adapters.num_slots()
            ));
        };
        let mut runner = self.runner.lock().map_err(|_| "the model worker has stopped".to_string())?;
        runner.load_lora(slot, adapter).map_err(|e| e.to_string())?;
        drop(runner);
        Ok(self.scheduler.adapters.add(slot))
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
        if self.scheduler.adapters.slot_of(id).is_some() && self.scheduler.adapters.is_known(id) {
            return false;
        }
        self.end_request(rid, FinishReason::Error(format!("LoRA adapter {id} was unloaded")));
        true
    }
}
