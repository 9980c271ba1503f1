//! The LoRA adapters a model is served with, as vLLM takes them: `--enable-lora`,
//! `--lora-modules name=path` (or its JSON form `{"name": ..., "path": ...}`), `--max-loras`
//! and `--max-lora-rank`. Adapter `i` of the list is loaded into LoRA slot `i` of the model at
//! load ([`crate::backend::load_model_with_lora`]); a request names it by its name.

use std::path::PathBuf;

use tandem_core::lora::LoraLimits;

use crate::error::{Error, Result};

/// Adapters to load with the model, and the slots' limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraModules {
    pub limits: LoraLimits,
    /// `(name, adapter directory)`, slot `i` for entry `i`.
    pub modules: Vec<(String, PathBuf)>,
}

impl LoraModules {
    /// One `--lora-modules` value: `name=path`, or `{"name": "...", "path": "..."}`.
    pub fn parse_module(s: &str) -> Result<(String, PathBuf)> {
        let bad = |why: &str| Error::Config(format!("--lora-modules {s:?}: {why}"));
        let (name, path) = if s.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(s).map_err(|e| bad(&format!("not valid JSON: {e}")))?;
            let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(String::from);
            (field("name").ok_or_else(|| bad("no \"name\""))?, field("path").ok_or_else(|| bad("no \"path\""))?)
        } else {
            let (n, p) = s.split_once('=').ok_or_else(|| bad("expected name=path"))?;
            (n.to_string(), p.to_string())
        };
        if name.is_empty() || path.is_empty() {
            return Err(bad("the name and the path must not be empty"));
        }
        Ok((name, PathBuf::from(path)))
    }

    /// The slot of adapter `name`, if it is one of these.
    pub fn slot(&self, name: &str) -> Option<u32> {
        self.modules.iter().position(|(n, _)| n == name).map(|i| i as u32)
    }

    /// Checks the list against the limits: no more adapters than slots, names unique.
    pub fn validate(&self) -> Result<()> {
        if self.modules.len() > self.limits.max_loras {
            return Err(Error::Config(format!(
                "{} LoRA modules, but --max-loras is {} (every adapter is loaded at start)",
                self.modules.len(),
                self.limits.max_loras
            )));
        }
        for (i, (n, _)) in self.modules.iter().enumerate() {
            if self.modules[..i].iter().any(|(m, _)| m == n) {
                return Err(Error::Config(format!("LoRA module name {n:?} given twice")));
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
        assert_eq!(LoraModules::parse_module("sql=/a/b").unwrap(), ("sql".into(), PathBuf::from("/a/b")));
        let json = r#"{"name": "sql", "path": "/a/b", "base_model_name": "m"}"#;
        assert_eq!(LoraModules::parse_module(json).unwrap(), ("sql".into(), PathBuf::from("/a/b")));
        for bad in ["sql", "=/a", "sql=", r#"{"name": "x"}"#, "{nope"] {
            let e = LoraModules::parse_module(bad).unwrap_err().to_string();
            assert!(e.contains("--lora-modules"), "{bad}: {e}");
        }
    }

    #[test]
    fn more_modules_than_slots_or_a_name_twice_is_refused() {
        let m = |names: &[&str], max_loras| LoraModules {
            limits: LoraLimits { max_loras, max_rank: 16 },
            modules: names.iter().map(|n| (n.to_string(), PathBuf::from("/x"))).collect(),
        };
        assert!(m(&["a", "b"], 2).validate().is_ok());
        assert_eq!(m(&["a", "b"], 2).slot("b"), Some(1));
        assert!(m(&["a", "b"], 1).validate().unwrap_err().to_string().contains("--max-loras is 1"));
        assert!(m(&["a", "a"], 2).validate().unwrap_err().to_string().contains("twice"));
    }
}
