//! PEFT's `adapter_config.json`: the rank, alpha and scaling rule of a LoRA adapter and the
//! modules it targets. What this engine does not run (DoRA, per-module ranks, a bias, weights
//! stored transposed, fully trained extra modules) is refused naming the field, never ignored.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};

/// Which modules an adapter targets, as PEFT matches them against a module's full name
/// (`model.layers.0.self_attn.q_proj`).
#[derive(Debug, Clone)]
pub enum Targets {
    /// A name matches the whole module name or its last dotted parts (`q_proj`,
    /// `self_attn.q_proj`).
    Names(Vec<String>),
    /// A regular expression that must match the whole module name (PEFT's `re.fullmatch`).
    Pattern(regex::Regex),
    /// `all-linear`: every linear layer but the output head.
    AllLinear,
}

impl Targets {
    /// Whether `module` (a full module name) is targeted.
    pub fn matches(&self, module: &str) -> bool {
        match self {
            Targets::Names(names) => {
                names.iter().any(|n| module == n || module.strip_suffix(n.as_str()).is_some_and(|r| r.ends_with('.')))
            }
            Targets::Pattern(re) => re.find(module).is_some_and(|m| m.start() == 0 && m.end() == module.len()),
            Targets::AllLinear => true,
        }
    }
}

/// A LoRA adapter's settings.
#[derive(Debug, Clone)]
pub struct AdapterConfig {
    /// `r`: the rank every module of the adapter has.
    pub rank: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `use_rslora`: scale by `alpha / √r` instead of `alpha / r`.
    pub use_rslora: bool,
    pub targets: Targets,
    /// `base_model_name_or_path`, where given (reported, not checked).
    pub base_model: Option<String>,
    /// The file this was read from (for messages).
    pub path: PathBuf,
}

/// The module names (the last part of a module's name) a LoRA adapter may target here.
pub const KNOWN_MODULES: [&str; 9] =
    ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj", "down_proj", "gate_up_proj"];

impl AdapterConfig {
    /// Reads `adapter_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parses the text of an `adapter_config.json` (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self> {
        let err = |msg: String| Error::config(path, msg);
        let v: Value = serde_json::from_str(text).map_err(|e| err(format!("not valid JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| err("not a JSON object".into()))?;
        let field = |k: &str| obj.get(k).filter(|v| !v.is_null());
        if let Some(t) = field("peft_type") {
            if t.as_str() != Some("LORA") {
                return Err(err(format!("`peft_type` is {t}: only LORA adapters are supported")));
            }
        }
        let rank = field("r")
            .and_then(Value::as_u64)
            .filter(|&r| r > 0)
            .ok_or_else(|| err("`r` must be a positive integer".into()))? as usize;
        let alpha = match field("lora_alpha") {
            None => 8.0, // PEFT's default
            Some(a) => a.as_f64().ok_or_else(|| err(format!("`lora_alpha` must be a number, not {a}")))?,
        };
        let flag = |k: &str| -> Result<bool> {
            match field(k) {
                None => Ok(false),
                Some(Value::Bool(b)) => Ok(*b),
                Some(other) => Err(err(format!("`{k}` must be true or false, not {other}"))),
            }
        };
        let use_rslora = flag("use_rslora")?;
        if flag("fan_in_fan_out")? {
            return Err(err(
                "`fan_in_fan_out` is true (weights stored transposed, GPT-2's Conv1D): not supported".into()
            ));
        }
        if flag("use_dora")? {
            return Err(err("`use_dora` is true: DoRA adapters are not supported".into()));
        }
        if flag("lora_bias")? {
            return Err(err("`lora_bias` is true: a bias on lora_B is not supported".into()));
        }
        if let Some(b) = field("bias") {
            if b.as_str() != Some("none") {
                return Err(err(format!("`bias` is {b}: only \"none\" is supported (trained biases are not loaded)")));
            }
        }
        if let Some(m) = field("modules_to_save") {
            let names: Vec<String> = match m {
                Value::Array(a) => a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), String::from)).collect(),
                other => vec![other.to_string()],
            };
            if !names.is_empty() {
                return Err(err(format!(
                    "`modules_to_save` names {}: fully trained modules are not supported, only LoRA updates",
                    names.join(", ")
                )));
            }
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if field(k).and_then(Value::as_object).is_some_and(|o| !o.is_empty()) {
                return Err(err(format!("`{k}` is set: per-module ranks and alphas are not supported")));
            }
        }
        for k in ["layers_to_transform", "layers_pattern"] {
            if field(k).is_some_and(|v| !v.as_array().is_some_and(|a| a.is_empty())) {
                return Err(err(format!("`{k}` is set: adapters on a subset of layers by pattern are not supported")));
            }
        }
        // Newer PEFT settings that change what the adapter computes: refused where set.
        for k in [
            "exclude_modules",
            "layer_replication",
            "target_parameters",
            "trainable_token_indices",
            "alora_invocation_tokens",
            "use_qalora",
            "use_bdlora",
        ] {
            let set = match field(k) {
                None | Some(Value::Bool(false)) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Object(o)) => !o.is_empty(),
                Some(_) => true,
            };
            if set {
                return Err(err(format!("`{k}` is set: not supported")));
            }
        }
        let targets = match field("target_modules") {
            None => return Err(err("`target_modules` is missing".into())),
            Some(Value::String(s)) if s == "all-linear" => Targets::AllLinear,
            Some(Value::String(s)) => Targets::Pattern(
                regex::Regex::new(s)
                    .map_err(|e| err(format!("`target_modules` is not a valid regular expression: {e}")))?,
            ),
            Some(Value::Array(a)) => {
                let mut names = Vec::with_capacity(a.len());
                for x in a {
                    let n = x.as_str().ok_or_else(|| err(format!("`target_modules` holds {x}, not a name")))?;
                    let last = n.rsplit('.').next().unwrap_or(n);
                    if !KNOWN_MODULES.contains(&last) {
                        return Err(err(format!(
                            "`target_modules` names `{n}`: LoRA is supported on {} only",
                            KNOWN_MODULES.join(", ")
                        )));
                    }
                    names.push(n.to_string());
                }
                Targets::Names(names)
            }
            Some(other) => {
                return Err(err(format!("`target_modules` must be a list of names or a string, not {other}")))
            }
        };
        let base_model = field("base_model_name_or_path").and_then(Value::as_str).map(String::from);
        Ok(AdapterConfig { rank, alpha, use_rslora, targets, base_model, path: path.to_path_buf() })
    }

    /// The factor of the low-rank product: `alpha / r`, or `alpha / √r` with rsLoRA, computed
    /// in f64 as PEFT does in Python, then rounded to f32 (what an f32 tensor is multiplied by).
    pub fn scale(&self) -> f32 {
        let r = self.rank as f64;
        let s = if self.use_rslora { self.alpha / r.sqrt() } else { self.alpha / r };
        s as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AdapterConfig> {
        AdapterConfig::from_json(text, Path::new("adapter_config.json"))
    }

    #[test]
    fn reads_rank_alpha_and_scale() {
        let c = parse(r#"{"peft_type":"LORA","r":8,"lora_alpha":16,"target_modules":["q_proj","v_proj"],"bias":"none","modules_to_save":null,"fan_in_fan_out":false}"#).unwrap();
        assert_eq!((c.rank, c.alpha, c.use_rslora), (8, 16.0, false));
        assert_eq!(c.scale(), 2.0);
        let rs = parse(r#"{"r":4,"lora_alpha":6,"use_rslora":true,"target_modules":["q_proj"]}"#).unwrap();
        assert_eq!(rs.scale(), 3.0);
    }

    #[test]
    fn names_match_the_last_parts_of_a_module_name() {
        let c = parse(r#"{"r":2,"target_modules":["q_proj","mlp.down_proj"]}"#).unwrap();
        assert!(c.targets.matches("model.layers.0.self_attn.q_proj"));
        assert!(c.targets.matches("model.layers.3.mlp.down_proj"));
        assert!(!c.targets.matches("model.layers.0.self_attn.k_proj"));
        assert!(!c.targets.matches("model.layers.0.self_attn.xq_proj"));
    }

    #[test]
    fn a_pattern_must_match_the_whole_name() {
        let c = parse(r#"{"r":2,"target_modules":".*\\.(q_proj|v_proj)"}"#).unwrap();
        assert!(c.targets.matches("model.layers.1.self_attn.v_proj"));
        assert!(!c.targets.matches("model.layers.1.self_attn.o_proj"));
        let c = parse(r#"{"r":2,"target_modules":"q_proj"}"#).unwrap();
        assert!(!c.targets.matches("model.layers.1.self_attn.q_proj"), "fullmatch, not search");
    }

    #[test]
    fn what_is_not_supported_is_refused_by_name() {
        let refused = [
            (r#"{"r":2,"target_modules":["q_proj"],"fan_in_fan_out":true}"#, "fan_in_fan_out"),
            (r#"{"r":2,"target_modules":["q_proj"],"modules_to_save":["lm_head"]}"#, "lm_head"),
            (r#"{"r":2,"target_modules":["q_proj"],"bias":"lora_only"}"#, "`bias`"),
            (r#"{"r":2,"target_modules":["q_proj"],"use_dora":true}"#, "use_dora"),
            (r#"{"r":2,"target_modules":["embed_tokens"]}"#, "embed_tokens"),
            (r#"{"r":0,"target_modules":["q_proj"]}"#, "`r`"),
            (r#"{"r":2}"#, "target_modules"),
            (r#"{"r":2,"target_modules":"(q_proj"}"#, "regular expression"),
            (r#"{"r":2,"target_modules":["q_proj"],"rank_pattern":{"q_proj":4}}"#, "rank_pattern"),
            (r#"{"r":2,"target_modules":["q_proj"],"peft_type":"IA3"}"#, "peft_type"),
            (r#"{"r":2,"target_modules":["q_proj"],"exclude_modules":["lm_head"]}"#, "exclude_modules"),
            (r#"{"r":2,"target_modules":["q_proj"],"use_qalora":true}"#, "use_qalora"),
        ];
        for (text, names) in refused {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(names) && e.contains("adapter_config.json"), "{text}: {e}");
        }
    }
}
