//! What makes a family a family, apart from its layer: the names HF gives it, its model-wide
//! traits, its config rules and the config keys transformers writes under two names. Each
//! family file exports one [`Family`] (`FAMILY`) beside its layer builder (`layer`); the one
//! list of them is [`super::FAMILIES`].

use serde_json::Value;

use crate::config::{ModelConfig, RawConfig};

/// One family as HF names it, and what the model layer needs to know of it besides its layer.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// `architectures[0]` of config.json, and what [`ModelConfig::architecture`] says.
    pub architecture: &'static str,
    /// The `model_type` that names it where `architectures` is absent.
    pub model_type: &'static str,
    /// Other `architectures` or `model_type` names whose config reads as this family's
    /// ([`Family::prepare`] turns them into it: Gemma 3's multimodal releases).
    pub also: &'static [&'static str],
    /// The input embedding is multiplied by √hidden, rounded to the embedding's type as HF
    /// does (Gemma); the tied head reads the table unscaled.
    pub scaled_embedding: bool,
    /// Every RMS norm weight is stored as `w - 1`: the norm multiplies by `1 + w` (Gemma).
    pub norm_plus_one: bool,
    /// Config keys transformers writes under either of two names (the `attribute_map` of the
    /// family's config class): `(alias, name)`. Whichever a file has, both are read.
    pub key_aliases: &'static [(&'static str, &'static str)],
    /// The config as written, before it is read: defaults HF's config class fills in, a
    /// wrapper's text model unwrapped.
    pub(crate) prepare: fn(Value) -> Result<Value, String>,
    /// What the family adds to the generic fields: its MoE block, sliding windows, defaults
    /// and refusals.
    pub(crate) rules: fn(&RawConfig, &mut ModelConfig) -> Result<(), String>,
}

impl Family {
    /// A family with Llama's traits: an unscaled embedding, plain norm weights, no rules of
    /// its own.
    pub const fn new(architecture: &'static str, model_type: &'static str) -> Family {
        Family {
            architecture,
            model_type,
            also: &[],
            scaled_embedding: false,
            norm_plus_one: false,
            key_aliases: &[],
            prepare: Ok,
            rules: no_rules,
        }
    }

    /// Whether config.json's `architectures[0]` (or `model_type`) names this family.
    pub fn answers_to(&self, name: &str) -> bool {
        self.architecture == name || self.model_type == name || self.also.contains(&name)
    }

    /// `v` with every aliased key written under both names where it has one of them.
    pub fn read_keys(&self, mut v: Value) -> Value {
        if let Value::Object(o) = &mut v {
            for &(alias, name) in self.key_aliases {
                match (o.get(alias).cloned(), o.get(name).cloned()) {
                    (Some(x), None) => {
                        o.insert(name.into(), x);
                    }
                    (None, Some(x)) => {
                        o.insert(alias.into(), x);
                    }
                    _ => {}
                }
            }
        }
        v
    }
}

/// Two families are the same when they name the same architecture.
impl PartialEq for Family {
    fn eq(&self, other: &Family) -> bool {
        self.architecture == other.architecture
    }
}

impl Eq for Family {}

fn no_rules(_: &RawConfig, _: &mut ModelConfig) -> Result<(), String> {
    Ok(())
}

/// The family of a config.json: by `architectures[0]`, else by `model_type`.
pub fn family_of(v: &Value) -> Result<&'static Family, String> {
    let arch = v.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    let name = match (arch, v.get("model_type").and_then(Value::as_str)) {
        (Some(a), _) => a,
        (None, Some(t)) => t,
        (None, None) => return Err("neither `architectures` nor `model_type` is given".into()),
    };
    let by_arch = |f: &&&Family| match arch {
        Some(a) => f.architecture == a || f.also.contains(&a),
        None => f.model_type == name || f.also.contains(&name),
    };
    super::FAMILIES.iter().find(by_arch).copied().ok_or_else(|| {
        let supported: Vec<&str> = super::FAMILIES.iter().map(|f| f.architecture).collect();
        format!("unsupported architecture `{name}` (supported: {})", supported.join(", "))
    })
}

/// The family named `name` (its architecture, `model_type` or another name it answers to).
pub fn family_named(name: &str) -> Option<&'static Family> {
    super::FAMILIES.iter().find(|f| f.answers_to(name)).copied()
}

/// Every family this build runs.
pub fn families() -> impl Iterator<Item = &'static Family> {
    super::FAMILIES.iter().copied()
}
