//! One LoRA adapter read from a PEFT directory: its A and B per layer and projection, as views
//! into the memory-mapped `adapter_model.safetensors`, checked against the base model's shapes.
//!
//! PEFT names a module's tensors `base_model.model.{module}.lora_A.weight` (`[r, in]`) and
//! `...lora_B.weight` (`[out, r]`), `{module}` being the base model's module name
//! (`model.layers.3.self_attn.q_proj`). A fused module of the checkpoint (Phi-3's `qkv_proj`,
//! `gate_up_proj`) has one A and one B whose rows are q's then k's then v's (gate's then up's):
//! the model holds those projections apart (`model::layers` splits them at load), so each gets
//! the shared A and its rows of B, which is the same update.

use std::path::{Path, PathBuf};

use super::config::AdapterConfig;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::weights::{TensorView, Weights};

/// A projection of a decoder layer that an adapter can update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    /// Every projection, in the order of [`LoraAdapter::layers`]' arrays.
    pub const ALL: [Proj; 7] = [Proj::Q, Proj::K, Proj::V, Proj::O, Proj::Gate, Proj::Up, Proj::Down];

    pub fn index(self) -> usize {
        self as usize
    }

    /// HF's module name.
    pub fn hf_name(self) -> &'static str {
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"][self.index()]
    }

    /// `(out, in)` of the base weight in a model of `cfg`.
    pub fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let (d, qd, kvd, inter) = (cfg.hidden_size, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        match self {
            Proj::Q => (qd, d),
            Proj::K | Proj::V => (kvd, d),
            Proj::O => (d, qd),
            Proj::Gate | Proj::Up => (inter, d),
            Proj::Down => (d, inter),
        }
    }
}

/// One projection's update: A `[r, in]`, B `[out, r]`.
#[derive(Clone)]
pub struct LoraPair {
    pub a: TensorView,
    pub b: TensorView,
}

/// A LoRA adapter over a base model: every layer's updates, one per [`Proj`] or none.
pub struct LoraAdapter {
    /// The directory it was read from.
    pub dir: PathBuf,
    pub rank: usize,
    /// `alpha / r` (or rsLoRA's `alpha / √r`).
    pub scale: f32,
    /// Per layer, indexed by [`Proj::index`].
    pub layers: Vec<[Option<LoraPair>; 7]>,
}

/// Where in a module name an adapter's tensors sit: `model.layers.{layer}.{block}.{name}`.
fn parse_module(module: &str) -> Option<(usize, &str, &str)> {
    let rest = module.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (block, name) = rest.split_once('.')?;
    Some((layer.parse().ok()?, block, name))
}

impl LoraAdapter {
    /// Reads a PEFT adapter directory (`adapter_config.json`, `adapter_model.safetensors`) for
    /// a base model of `cfg`.
    pub fn load(dir: &Path, cfg: &ModelConfig) -> Result<Self> {
        let config = AdapterConfig::from_file(&dir.join("adapter_config.json"))?;
        let file = dir.join("adapter_model.safetensors");
        if !file.exists() {
            let msg = match dir.join("adapter_model.bin").exists() {
                true => {
                    "no adapter_model.safetensors (adapter_model.bin, a pickle, is not read: save with safetensors)"
                }
                false => "no adapter_model.safetensors in this directory",
            };
            return Err(Error::config(dir, msg));
        }
        let mut w = Weights::empty();
        w.add_file(&file)?;
        w.refuse_ints()?;
        Self::from_parts(dir, &config, &w, cfg)
    }

    /// The adapter from its parsed config and its tensors `w` (`dir` names it).
    pub fn from_parts(dir: &Path, config: &AdapterConfig, w: &Weights, cfg: &ModelConfig) -> Result<Self> {
        let file = dir.join("adapter_model.safetensors");
        let r = config.rank;
        let mut layers: Vec<[Option<LoraPair>; 7]> = (0..cfg.num_hidden_layers).map(|_| Default::default()).collect();
        let mut seen = 0usize;
        for name in w.names().map(String::from).collect::<Vec<_>>() {
            let refuse = |msg: String| Error::tensor(&file, &name, msg);
            let Some(module) = name.strip_prefix("base_model.model.").and_then(|n| n.strip_suffix(".lora_A.weight"))
            else {
                if name.ends_with(".lora_B.weight") && name.starts_with("base_model.model.") {
                    continue; // read with its A
                }
                return Err(refuse("not a LoRA A or B of a module (`base_model.model.{module}.lora_A.weight`)".into()));
            };
            let Some((l, block, proj)) = parse_module(module) else {
                return Err(refuse(format!("module `{module}` is not a projection of a decoder layer")));
            };
            if l >= cfg.num_hidden_layers {
                return Err(refuse(format!("layer {l}, but the base model has {} layers", cfg.num_hidden_layers)));
            }
            let parts: &[Proj] = match (block, proj) {
                ("self_attn", "q_proj") => &[Proj::Q],
                ("self_attn", "k_proj") => &[Proj::K],
                ("self_attn", "v_proj") => &[Proj::V],
                ("self_attn", "o_proj") => &[Proj::O],
                ("self_attn", "qkv_proj") => &[Proj::Q, Proj::K, Proj::V],
                ("mlp", "gate_proj") => &[Proj::Gate],
                ("mlp", "up_proj") => &[Proj::Up],
                ("mlp", "down_proj") => &[Proj::Down],
                ("mlp", "gate_up_proj") => &[Proj::Gate, Proj::Up],
                _ => {
                    return Err(refuse(format!(
                        "module `{module}` is not supported (LoRA on q/k/v/o, gate/up/down and fused qkv_proj, gate_up_proj)"
                    )))
                }
            };
            if block == "mlp" && cfg.moe.is_some() {
                return Err(refuse(format!(
                    "module `{module}`: LoRA on a mixture of experts' MLP is not supported (attention only)"
                )));
            }
            if !config.targets.matches(module) {
                return Err(refuse(format!("module `{module}` is not among the config's `target_modules`")));
            }
            let in_dim = parts[0].shape(cfg).1;
            let out: Vec<usize> = parts.iter().map(|p| p.shape(cfg).0).collect();
            let a = w.get(&name, &[r, in_dim])?;
            let b_name = format!("base_model.model.{module}.lora_B.weight");
            let b = w.get(&b_name, &[out.iter().sum(), r])?;
            let mut start = 0;
            for (&p, &n) in parts.iter().zip(&out) {
                let slot = &mut layers[l][p.index()];
                if slot.is_some() {
                    return Err(refuse(format!("layer {l}'s {} is updated twice", p.hf_name())));
                }
                let b = if parts.len() == 1 { b.clone() } else { b.rows(start..start + n)? };
                *slot = Some(LoraPair { a: a.clone(), b });
                start += n;
            }
            seen += 1;
        }
        // Every B read with its A.
        for name in w.names() {
            if let Some(module) = name.strip_prefix("base_model.model.").and_then(|n| n.strip_suffix(".lora_B.weight"))
            {
                if !w.contains(&format!("base_model.model.{module}.lora_A.weight")) {
                    return Err(Error::tensor(&file, name, "a lora_B without its lora_A"));
                }
            }
        }
        if seen == 0 {
            return Err(Error::config(&file, "no LoRA tensors (`base_model.model.{module}.lora_A.weight`)"));
        }
        Ok(LoraAdapter { dir: dir.to_path_buf(), rank: r, scale: config.scale(), layers })
    }

    /// The projections this adapter updates, layer by layer (for messages and tests).
    pub fn updated(&self) -> impl Iterator<Item = (usize, Proj)> + '_ {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(l, ps)| Proj::ALL.into_iter().filter(move |p| ps[p.index()].is_some()).map(move |p| (l, p)))
    }
}
