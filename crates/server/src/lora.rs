//! The LoRA adapters the server answers to: a request whose `model` names one runs with that
//! adapter; `/v1/models` lists each with `parent` (the base model) and `root` (its directory),
//! as vLLM does; `vllm:lora_requests_info` names them.
//!
//! The engine knows an adapter by its LoRA slot; this table maps names to slots.

use std::sync::RwLock;

use crate::engine_client::EngineStats;

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

    /// vLLM's `vllm:lora_requests_info`: a gauge whose labels name the adapters of the running
    /// and of the waiting requests (comma-separated) and `--max-loras`, its value the time of
    /// the report (Unix seconds).
    pub fn render_info(&self, max_loras: usize, stats: &EngineStats, now: u64) -> String {
        let names = |slots: &[u32]| slots.iter().filter_map(|&s| self.name_of(s)).collect::<Vec<_>>().join(",");
        format!(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{{max_lora=\"{max_loras}\",waiting_lora_adapters=\"{}\",running_lora_adapters=\"{}\"}} {now}\n",
            names(&stats.waiting_lora_adapters),
            names(&stats.running_lora_adapters),
        )
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

    #[test]
    fn lora_requests_info_names_running_and_waiting_adapters() {
        let a = |name: &str, slot| ServedAdapter { name: name.into(), root: "/d".into(), parent: None, slot };
        let t = LoraTable::new(vec![a("sql", 0), a("rs", 1)]);
        let st =
            EngineStats { running_lora_adapters: vec![0, 1], waiting_lora_adapters: vec![1], ..Default::default() };
        let text = t.render_info(2, &st, 1700000000);
        let want = "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"rs\",running_lora_adapters=\"sql,rs\"} 1700000000";
        assert!(text.lines().any(|l| l == want), "{text}");
        assert!(text.contains("# TYPE vllm:lora_requests_info gauge"), "{text}");
    }
}
