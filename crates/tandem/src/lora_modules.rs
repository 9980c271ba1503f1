//! The LoRA adapters a model is served with, as vLLM takes them: `--enable-lora`,
//! `--lora-modules name=path` (or its JSON form `{"name": ..., "path": ..., "base_model_name":
//! ...}`), `--max-loras`, `--max-lora-rank` and `--max-cpu-loras`. Adapter `i` of the list is
//! served under id `i`: the first `--max-loras` are loaded into slot `i` of the model at load
//! ([`crate::backend::load_model_with_lora`]), the others wait off the device and the engine
//! swaps each into a slot when a request names it (`EngineConfig::lora_modules`), keeping at
//! most `--max-cpu-loras` CPU copies as vLLM does. A request names an adapter by its name.

use std::path::PathBuf;

use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::ModelConfig;

use crate::error::{Error, Result};

/// One `--lora-modules` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    /// What a request's `model` names it by.
    pub name: String,
    /// The PEFT directory (`adapter_config.json`, `adapter_model.safetensors`).
    pub path: PathBuf,
    /// The JSON form's `base_model_name`: `parent` in `/v1/models` (the served model otherwise).
    pub base_model_name: Option<String>,
}

/// Adapters to load with the model, and the slots' limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraModules {
    pub limits: LoraLimits,
    /// vLLM's `--max-cpu-loras`: adapters kept in host memory; `None` is `max_loras`.
    pub max_cpu_loras: Option<usize>,
    /// Id `i` for entry `i` (slot `i` at load for the first `max_loras`).
    pub modules: Vec<LoraModule>,
}

impl LoraModule {
    /// One `--lora-modules` value: `name=path`, or `{"name": "...", "path": "...",
    /// "base_model_name": "..."}`.
    pub fn parse(s: &str) -> Result<LoraModule> {
        let bad = |why: &str| Error::Config(format!("--lora-modules {s:?}: {why}"));
        let (name, path, base_model_name) = if s.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(s).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
            let Some(o) = v.as_object() else { return Err(bad("expected a JSON object")) };
            if let Some(k) = o.keys().find(|k| !["name", "path", "base_model_name"].contains(&k.as_str())) {
                return Err(bad(&format!("unknown field {k:?} (name, path, base_model_name)")));
            }
            let field = |k: &str| match o.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(x)) => Ok(Some(x.clone())),
                Some(_) => Err(bad(&format!("\"{k}\" must be a string"))),
            };
            let name = field("name")?.ok_or_else(|| bad("no \"name\""))?;
            let path = field("path")?.ok_or_else(|| bad("no \"path\""))?;
            (name, path, field("base_model_name")?)
        } else {
            let (n, p) = s.split_once('=').ok_or_else(|| bad("expected name=path"))?;
            (n.to_string(), p.to_string(), None)
        };
        if name.is_empty() || path.is_empty() {
            return Err(bad("the name and the path must not be empty"));
        }
        Ok(LoraModule { name, path: PathBuf::from(path), base_model_name })
    }
}

impl LoraModules {
    /// No adapters yet, with vLLM's limits.
    pub fn new(limits: LoraLimits) -> Self {
        LoraModules { limits, max_cpu_loras: None, modules: Vec::new() }
    }

    /// The id of adapter `name` (its slot at load, for the first `max_loras`), if it is one of
    /// these.
    pub fn slot(&self, name: &str) -> Option<u32> {
        self.modules.iter().position(|m| m.name == name).map(|i| i as u32)
    }

    /// `--max-cpu-loras`, its default applied.
    pub fn max_cpu_loras(&self) -> usize {
        self.max_cpu_loras.unwrap_or(self.limits.max_loras)
    }

    /// Checks the list against the limits: positive limits, names unique. More adapters than
    /// slots (or than `--max-cpu-loras`) are fine: those beyond wait off the device.
    pub fn validate(&self) -> Result<()> {
        let LoraLimits { max_loras, max_rank } = self.limits;
        if max_loras == 0 || max_rank == 0 {
            return Err(Error::Config(format!(
                "--max-loras ({max_loras}) and --max-lora-rank ({max_rank}) must be positive"
            )));
        }
        if self.max_cpu_loras() < max_loras {
            return Err(Error::Config(format!(
                "--max-cpu-loras ({}) must be >= --max-loras ({max_loras})",
                self.max_cpu_loras()
            )));
        }
        for (i, m) in self.modules.iter().enumerate() {
            if self.modules[..i].iter().any(|o| o.name == m.name) {
                return Err(Error::Config(format!("LoRA module name {:?} given twice", m.name)));
            }
        }
        Ok(())
    }

    /// The directories of the adapters, adapter `i` under id `i` (`EngineConfig::lora_modules`).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.modules.iter().map(|m| m.path.clone()).collect()
    }

    /// Reads every adapter (memory-mapped) against the base model `cfg` and the rank limit,
    /// before anything is loaded: the first that does not fit is an error naming it, its file
    /// and what does not fit.
    pub fn check(&self, cfg: &ModelConfig) -> Result<()> {
        self.validate()?;
        for m in &self.modules {
            let named = |e| Error::Config(format!("LoRA module {:?}: {e}", m.name));
            let a = LoraAdapter::load(&m.path, cfg).map_err(named)?;
            if a.rank > self.limits.max_rank {
                return Err(named(tandem_core::Error::config(
                    m.path.join("adapter_config.json"),
                    format!("rank {} is over the limit {} (--max-lora-rank)", a.rank, self.limits.max_rank),
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_parse_and_bad_ones_are_named() {
        let m = LoraModule::parse("sql=/a/b").unwrap();
        assert_eq!((m.name.as_str(), m.path.to_str(), m.base_model_name), ("sql", Some("/a/b"), None));
        let json = r#"{"name": "sql", "path": "/a/b", "base_model_name": "m"}"#;
        let m = LoraModule::parse(json).unwrap();
        assert_eq!((m.name.as_str(), m.path.to_str(), m.base_model_name.as_deref()), ("sql", Some("/a/b"), Some("m")));
        for bad in ["sql", "=/a", "sql=", r#"{"name": "x"}"#, "{nope", r#"{"name": "x", "path": "/p", "rank": 8}"#] {
            let e = LoraModule::parse(bad).unwrap_err().to_string();
            assert!(e.contains("--lora-modules"), "{bad}: {e}");
        }
    }

    #[test]
    fn more_modules_than_slots_are_served_and_a_name_twice_is_refused() {
        let m = |names: &[&str], max_loras| LoraModules {
            limits: LoraLimits { max_loras, max_rank: 16 },
            max_cpu_loras: None,
            modules: names
                .iter()
                .map(|n| LoraModule { name: n.to_string(), path: PathBuf::from("/x"), base_model_name: None })
                .collect(),
        };
        assert!(m(&["a", "b"], 2).validate().is_ok());
        assert_eq!(m(&["a", "b"], 2).slot("b"), Some(1));
        let beyond = m(&["a", "b", "c"], 1);
        assert!(beyond.validate().is_ok(), "adapters beyond the slots wait off the device");
        assert_eq!((beyond.slot("c"), beyond.dirs().len()), (Some(2), 3));
        assert!(m(&["a", "a"], 2).validate().unwrap_err().to_string().contains("twice"));
        let few_cpu = LoraModules { max_cpu_loras: Some(1), ..m(&["a"], 2) };
        assert!(few_cpu.validate().unwrap_err().to_string().contains("--max-cpu-loras (1) must be >= --max-loras (2)"));
    }
}
