//! The LoRA adapters the server answers to: a request whose `model` names one runs with that
//! adapter; `/v1/models` lists each with `parent` (the base model) and `root` (its directory),
//! as vLLM does; `vllm:lora_requests_info` names them.
//!
//! The engine knows an adapter by its LoRA slot; this table maps names to slots.

use std::sync::RwLock;

/// One adapter the server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAdapter {
    /// What a request's `model` names it by.
    pub name: String,
    /// Its directory, as given (`root` in `/v1/models`).
    pub root: String,
    /// `base_model_name` where one was given (`parent` in `/v1/models`; the served model's
    /// name otherwise).
    pub parent: Option<String>,
    /// The engine's LoRA slot.
    pub slot: u32,
}

/// The adapters served, by name.
#[derive(Debug, Default)]
pub struct LoraTable {
    adapters: RwLock<Vec<ServedAdapter>>,
}

impl LoraTable {
    pub fn new(adapters: Vec<ServedAdapter>) -> Self {
        LoraTable { adapters: RwLock::new(adapters) }
    }

    /// The slot of the adapter named `name`, if one is.
    pub fn slot(&self, name: &str) -> Option<u32> {
        self.read().iter().find(|a| a.name == name).map(|a| a.slot)
    }

    /// The name of the adapter in `slot`, if one is.
    pub fn name_of(&self, slot: u32) -> Option<String> {
        self.read().iter().find(|a| a.slot == slot).map(|a| a.name.clone())
    }

    /// Every adapter, in the order they were given.
    pub fn list(&self) -> Vec<ServedAdapter> {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<ServedAdapter>> {
        // A writer that panicked left the table as it was (each write is one push or remove).
        self.adapters.read().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_slots_and_back() {
        let a = |name: &str, slot| ServedAdapter { name: name.into(), root: "/d".into(), parent: None, slot };
        let t = LoraTable::new(vec![a("sql", 0), a("rs", 1)]);
        assert_eq!((t.slot("rs"), t.slot("nope")), (Some(1), None));
        assert_eq!((t.name_of(0).as_deref(), t.name_of(5)), (Some("sql"), None));
        assert_eq!(t.list().len(), 2);
    }
}
