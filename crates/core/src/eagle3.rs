//! EAGLE-3 draft heads, as vLLM loads them (`"method": "eagle3"`): a small model directory
//! (config.json + safetensors) holding one decoder layer that proposes the target's next
//! tokens from three of the target's hidden states.
//!
//! The head: `fc` maps the concatenation of the hidden states entering the target's aux
//! layers (vLLM's default `(2, L / 2, L - 3)`, or the config's
//! `eagle_config.eagle_aux_hidden_state_layer_ids`) to the head's width; its one layer's
//! attention reads `[input_layernorm(embed(token)); hidden_norm(fc(aux))]` (q/k/v over twice
//! the hidden width), adds its output to `fc(aux)` (to `hidden_norm(fc(aux))` where the
//! config says `norm_before_residual`), then the MLP as Llama's; `norm` and `lm_head` give
//! logits over a draft vocabulary whose id `i` is target id `i + d2t[i]`. Row `i` of the head
//! reads the token at position `i + 1` and the target's hidden states at position `i`, and
//! predicts the token at `i + 2`; each further draft feeds back the head's own pre-norm
//! output in place of `fc(aux)`.
//!
//! This is the host f32 head, whatever backend runs the target: the oracle, and what runs
//! where the runner cannot hold the head's weights. [`crate::device_head::DeviceHead`] runs
//! the same rows on the target's backend (by default: the `lm_head` over the draft vocabulary
//! alone costs more on the host than a GPU decode step). The drafts only decide how much of
//! the target's verified output is kept, never what it is, so a head's precision cannot change
//! an answer. Its KV is kept per sequence on the host ([`HeadCache`]): the rows of committed
//! positions once (their inputs never change), the draft rows only while proposing.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

use crate::backend::DType;
use crate::config::ModelConfig;
use crate::head_layer::{argmax, matvec, rms_norm, HeadAttention, HeadMlp};
pub use crate::head_layer::{HeadCache, HeadModel};

/// A loaded EAGLE-3 head (every weight as f32 on the host, row-major `[out, in]`).
pub struct Eagle3Head {
    pub(crate) hidden: usize,
    /// The target's hidden width (each aux state's).
    pub(crate) target_hidden: usize,
    pub(crate) eps: f32,
    pub(crate) draft_vocab: usize,
    pub(crate) norm_before_residual: bool,
    pub(crate) aux_layers: Vec<usize>,
    pub(crate) embed: Vec<f32>,
    pub(crate) fc: Vec<f32>,
    pub(crate) input_norm: Vec<f32>,
    pub(crate) hidden_norm: Vec<f32>,
    pub(crate) attn: HeadAttention,
    pub(crate) post_norm: Vec<f32>,
    pub(crate) mlp: HeadMlp,
    pub(crate) norm: Vec<f32>,
    pub(crate) lm_head: Vec<f32>,
    /// Draft id -> offset to its target id.
    pub(crate) d2t: Vec<i64>,
}

/// The head's tensors by their canonical names (vLLM's: `midlayer.` read as `layers.0.`, a
/// leading `model.` dropped).
struct Tensors {
    map: std::collections::HashMap<String, (Vec<usize>, Dtype, Vec<u8>)>,
    dir: String,
}

impl Tensors {
    fn open(dir: &Path) -> Result<Self, String> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("EAGLE-3 head {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("EAGLE-3 head {}: no .safetensors file", dir.display()));
        }
        let mut map = std::collections::HashMap::new();
        for f in files {
            let bytes = std::fs::read(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e}", f.display()))?;
            for (name, view) in st.tensors() {
                let mut canon = name.strip_prefix("model.").unwrap_or(&name).replace("midlayer.", "layers.0.");
                if canon.ends_with("draft_id_to_target_id") {
                    canon = "d2t".into();
                }
                map.insert(canon, (view.shape().to_vec(), view.dtype(), view.data().to_vec()));
            }
        }
        Ok(Tensors { map, dir: dir.display().to_string() })
    }

    /// Tensor `name` as f32, refused unless its shape is `shape`.
    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
        let (have, dtype, data) =
            self.map.get(name).ok_or_else(|| format!("EAGLE-3 head {}: tensor `{name}` is missing", self.dir))?;
        if have != shape {
            return Err(format!("EAGLE-3 head {}: `{name}` has shape {have:?}, the target needs {shape:?}", self.dir));
        }
        let d = match dtype {
            Dtype::F32 => DType::F32,
            Dtype::BF16 => DType::BF16,
            Dtype::F16 => DType::F16,
            other => return Err(format!("EAGLE-3 head {}: `{name}` is {other:?}, not a float type", self.dir)),
        };
        Ok(d.to_f32(data))
    }

    /// `d2t` as offsets (int64 as published; int32 read too).
    fn offsets(&self, name: &str, len: usize) -> Result<Vec<i64>, String> {
        let (have, dtype, data) =
            self.map.get(name).ok_or_else(|| format!("EAGLE-3 head {}: tensor `{name}` is missing", self.dir))?;
        if have.as_slice() != [len] {
            return Err(format!(
                "EAGLE-3 head {}: `{name}` has shape {have:?}, draft_vocab_size needs [{len}]",
                self.dir
            ));
        }
        match dtype {
            Dtype::I64 => {
                Ok(data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect())
            }
            Dtype::I32 => {
                Ok(data.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64).collect())
            }
            other => Err(format!("EAGLE-3 head {}: `{name}` is {other:?}, not an integer type", self.dir)),
        }
    }
}

impl Eagle3Head {
    /// Loads the head in `dir` for `target`, refusing one whose shapes or vocabulary do not
    /// fit it (the error names what differs).
    pub fn load(dir: &Path, target: &ModelConfig) -> Result<Self, String> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("EAGLE-3 head {}: {e}", path.display()))?;
        let raw: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("EAGLE-3 head {}: not JSON: {e}", path.display()))?;
        // The head's layer is Llama's: read its config as a Llama config.
        let mut as_llama = raw.clone();
        as_llama["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        as_llama["num_hidden_layers"] = serde_json::json!(1);
        let cfg = ModelConfig::from_json(&as_llama.to_string())
            .map_err(|e| format!("EAGLE-3 head {}: {e}", path.display()))?;
        let bad = |what: String| format!("EAGLE-3 head {}: {what}", dir.display());
        let target_hidden =
            raw.get("target_hidden_size").and_then(|v| v.as_u64()).map_or(cfg.hidden_size, |v| v as usize);
        if target_hidden != target.hidden_size {
            return Err(bad(format!(
                "target hidden size {target_hidden}, the target model's is {}",
                target.hidden_size
            )));
        }
        if cfg.vocab_size != target.vocab_size {
            return Err(bad(format!("vocab_size {}, the target's is {}", cfg.vocab_size, target.vocab_size)));
        }
        let draft_vocab = raw.get("draft_vocab_size").and_then(|v| v.as_u64()).map_or(cfg.vocab_size, |v| v as usize);
        if draft_vocab == 0 || draft_vocab > cfg.vocab_size {
            return Err(bad(format!("draft_vocab_size {draft_vocab} must be in 1..={}", cfg.vocab_size)));
        }
        let layers = target.num_hidden_layers;
        let aux_layers: Vec<usize> = match raw.pointer("/eagle_config/eagle_aux_hidden_state_layer_ids") {
            Some(ids) => ids
                .as_array()
                .and_then(|a| a.iter().map(|x| x.as_u64().map(|x| x as usize)).collect::<Option<Vec<_>>>())
                .ok_or_else(|| bad("eagle_aux_hidden_state_layer_ids must be a list of layer indices".into()))?,
            None if layers >= 4 => vec![2, layers / 2, layers - 3],
            None => {
                return Err(bad(format!(
                    "the target has {layers} layers, too few for the default aux layers (2, L/2, L-3): \
                     name them in eagle_config.eagle_aux_hidden_state_layer_ids"
                )))
            }
        };
        if aux_layers.is_empty() || aux_layers.iter().any(|&l| l >= layers) {
            return Err(bad(format!("aux layers {aux_layers:?} must be layers of the target (0..{layers})")));
        }
        if cfg.attention_bias {
            return Err(bad("attention_bias: a head with q/k/v biases is not supported".into()));
        }
        let layers_in_head = raw.get("num_hidden_layers").and_then(|v| v.as_u64()).unwrap_or(1);
        if layers_in_head != 1 {
            return Err(bad(format!("num_hidden_layers {layers_in_head}: an EAGLE-3 head has one layer")));
        }
        let norm_before_residual = raw.get("norm_before_residual").and_then(|v| v.as_bool()).unwrap_or(false);
        let t = Tensors::open(dir)?;
        let (d, hd) = (cfg.hidden_size, cfg.head_dim);
        let (qd, kvd, inter) = (cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, cfg.intermediate_size);
        let embed =
            match t.map.contains_key("embed_tokens.weight") {
                true => t.f32("embed_tokens.weight", &[cfg.vocab_size, d])?,
                false => return Err(bad(
                    "tensor `embed_tokens.weight` is missing (a head sharing the target's embedding is not read yet)"
                        .into(),
                )),
            };
        let fc_in = aux_layers.len() * target_hidden;
        let d2t = t.offsets("d2t", draft_vocab)?;
        if let Some((i, off)) =
            d2t.iter().enumerate().find(|&(i, &o)| i as i64 + o < 0 || i as i64 + o >= target.vocab_size as i64)
        {
            return Err(bad(format!("d2t[{i}] = {off} maps outside the target's vocabulary of {}", target.vocab_size)));
        }
        Ok(Eagle3Head {
            hidden: d,
            target_hidden,
            eps: cfg.rms_norm_eps,
            draft_vocab,
            norm_before_residual,
            embed,
            fc: t.f32("fc.weight", &[d, fc_in])?,
            input_norm: t.f32("layers.0.input_layernorm.weight", &[d])?,
            hidden_norm: t.f32("layers.0.hidden_norm.weight", &[d])?,
            attn: HeadAttention {
                heads: cfg.num_attention_heads,
                kv_heads: cfg.num_key_value_heads,
                head_dim: hd,
                inv_freq: cfg.rope_inv_freq(),
                q: t.f32("layers.0.self_attn.q_proj.weight", &[qd, 2 * d])?,
                k: t.f32("layers.0.self_attn.k_proj.weight", &[kvd, 2 * d])?,
                v: t.f32("layers.0.self_attn.v_proj.weight", &[kvd, 2 * d])?,
                bias: None,
                o: t.f32("layers.0.self_attn.o_proj.weight", &[d, qd])?,
                out: d,
            },
            post_norm: t.f32("layers.0.post_attention_layernorm.weight", &[d])?,
            mlp: HeadMlp {
                inter,
                gate: t.f32("layers.0.mlp.gate_proj.weight", &[inter, d])?,
                up: t.f32("layers.0.mlp.up_proj.weight", &[inter, d])?,
                down: t.f32("layers.0.mlp.down_proj.weight", &[d, inter])?,
            },
            norm: t.f32("norm.weight", &[d])?,
            lm_head: t.f32("lm_head.weight", &[draft_vocab, d])?,
            d2t,
            aux_layers,
        })
    }
}

impl HeadModel for Eagle3Head {
    /// The target layers whose input hidden states the head reads, in `fc`'s order.
    fn aux_layers(&self) -> &[usize] {
        &self.aux_layers
    }

    /// `aux_layers.len() * target hidden`.
    fn aux_width(&self) -> usize {
        self.aux_layers.len() * self.target_hidden
    }

    /// `fc(aux)`.
    fn hidden_in(&self, aux: &[f32]) -> Vec<f32> {
        matvec(&self.fc, aux, self.hidden)
    }

    /// The row's pre-norm output is what a further draft feeds back.
    fn row(&self, cache: &mut HeadCache, token: u32, hidden: &[f32], pos: usize) -> (Vec<f32>, u32) {
        let (d, eps) = (self.hidden, self.eps);
        let e = &self.embed[token as usize * d..(token as usize + 1) * d];
        let hn = rms_norm(hidden, &self.hidden_norm, eps);
        let mut x = rms_norm(e, &self.input_norm, eps);
        x.extend_from_slice(&hn);
        let attn = self.attn.forward(cache, &x, pos);
        let residual = if self.norm_before_residual { hn } else { hidden.to_vec() };
        let mut h: Vec<f32> = attn.iter().zip(&residual).map(|(a, r)| a + r).collect();
        let x2 = rms_norm(&h, &self.post_norm, eps);
        self.mlp.add_to(&mut h, &x2);
        let logits = matvec(&self.lm_head, &rms_norm(&h, &self.norm, eps), self.draft_vocab);
        let best = argmax(&logits);
        (h, (best as i64 + self.d2t[best]) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny")
    }

    /// The `tiny` random target's shape (what the golden head was made for).
    fn target(hidden: usize, vocab: usize, layers: usize) -> ModelConfig {
        ModelConfig::from_json(
            &serde_json::json!({
                "architectures": ["LlamaForCausalLM"], "hidden_size": hidden, "intermediate_size": 160,
                "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                "vocab_size": vocab, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
            })
            .to_string(),
        )
        .unwrap()
    }

    /// The head's greedy drafts equal tests/eagle3_golden.py's plain PyTorch head on the same
    /// tokens and aux states, for growing prefixes of one sequence through one cache (rows of
    /// committed positions computed once, drafts' rows dropped).
    #[test]
    fn proposals_equal_pytorchs() {
        let head = Eagle3Head::load(&golden(), &target(64, 384, 2)).unwrap();
        assert_eq!(head.aux_layers(), &[0, 1, 1]);
        let text = std::fs::read_to_string(golden().join("expected.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let aux: Vec<f32> = v["aux"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let w = head.aux_width();
        let mut cache = HeadCache::default();
        for case in v["cases"].as_array().unwrap() {
            let n = case["len"].as_u64().unwrap() as usize;
            let k = case["k"].as_u64().unwrap() as usize;
            let want: Vec<u32> =
                case["drafts"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
            // Through the cache only the rows from the last one it holds are needed.
            let from = cache.len().saturating_sub(1);
            let got = head.propose(&mut cache, &tokens[..n], &aux[from * w..(n - 1) * w], from, k).unwrap();
            assert_eq!(got, want, "prefix of {n} tokens");
            assert_eq!(cache.len(), n - 1, "only committed rows kept");
            // From scratch gives the same.
            let fresh = head.propose(&mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, k).unwrap();
            assert_eq!(fresh, want);
        }
        // Aux rows that do not match the tokens, or that start past the cache: no drafts.
        assert!(head.propose(&mut cache, &tokens[..5], &aux[..3 * w], 0, 2).is_none());
        assert!(head.propose(&mut HeadCache::default(), &tokens[..5], &aux[w..4 * w], 1, 2).is_none());
    }

    #[test]
    fn a_head_that_does_not_fit_the_target_is_refused_naming_what_differs() {
        for (cfg, names) in [
            (target(64, 512, 2), "vocab_size"),
            (target(32, 384, 2), "hidden size"),
            (target(64, 384, 1), "aux layers"),
        ] {
            let e = Eagle3Head::load(&golden(), &cfg).err().unwrap();
            assert!(e.contains(names), "{e}");
        }
        // The head's own config: what this engine cannot run is refused by name.
        let dir = std::env::temp_dir().join(format!("tandem-eagle3-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(golden().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(golden().join("config.json")).unwrap()).unwrap();
        for (key, value, names) in [
            ("attention_bias", serde_json::json!(true), "attention_bias"),
            ("num_hidden_layers", serde_json::json!(2), "num_hidden_layers"),
            ("draft_vocab_size", serde_json::json!(100), "draft_vocab_size"),
            ("intermediate_size", serde_json::json!(64), "gate_proj"),
        ] {
            let mut c = cfg.clone();
            c[key] = value;
            std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
            let e = Eagle3Head::load(&dir, &target(64, 384, 2)).err().unwrap();
            assert!(e.contains(names), "{key}: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        let e = Eagle3Head::load(Path::new("/nonexistent-eagle3"), &target(64, 384, 2)).err().unwrap();
        assert!(e.contains("nonexistent-eagle3"), "{e}");
    }
}
