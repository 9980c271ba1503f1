//! MTP layers that a checkpoint ships beside its model (`"method": "mtp"`), as vLLM runs
//! MiMo's (`MiMoForCausalLM`: a Qwen2 model whose `model.mtp_layers.N.*` tensors sit in the
//! target's own directory, `num_nextn_predict_layers` of them in its config).
//!
//! One MTP layer: `input_proj` maps `[hidden_layernorm(h); token_layernorm(embed(token))]`
//! (`h`: the target's last hidden state, after its last layer and before its final norm; the
//! embedding zeroed at position 0, as vLLM masks it) to the hidden width; a Qwen2 decoder
//! layer (`input_layernorm`, attention with q/k/v biases, `post_attention_layernorm`, the
//! MLP, each added to its residual) follows, then `final_layernorm`; the target's `lm_head`
//! gives the logits. Row `i` reads the token at position `i + 1` and the target's hidden
//! state at position `i` and predicts the token at `i + 2`; each further draft feeds back the
//! layer's normed output (vLLM's proposer; vLLM's MiMo runs layer 0 for every draft).
//!
//! It runs on the host in f32 with its own per-sequence KV, as the EAGLE-3 host head does
//! ([`crate::head_layer`] has the shared pieces and the proposal loop): the drafts only
//! decide how much of the target's verified output is kept, never what it is.

use std::path::Path;

use crate::config::ModelConfig;
use crate::head_layer::{argmax, matvec, rms_norm, HeadAttention, HeadCache, HeadMlp, HeadModel};
use crate::weights::Weights;

/// A loaded MTP layer (every weight as f32 on the host, row-major `[out, in]`).
pub struct MtpHead {
    hidden: usize,
    vocab: usize,
    eps: f32,
    /// `[num_hidden_layers]`: the target's last layer's output.
    aux_layers: Vec<usize>,
    embed: Vec<f32>,
    token_norm: Vec<f32>,
    hidden_norm: Vec<f32>,
    input_proj: Vec<f32>,
    input_norm: Vec<f32>,
    attn: HeadAttention,
    post_norm: Vec<f32>,
    mlp: HeadMlp,
    final_norm: Vec<f32>,
    lm_head: Vec<f32>,
}

impl MtpHead {
    /// Loads MTP layer 0 of the model in `dir` (whose config `target` is), refusing a model
    /// that ships none (the error names what is missing) or whose layer's shapes do not fit.
    pub fn load(dir: &Path, target: &ModelConfig) -> Result<Self, String> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("MTP layers {}: {e}", path.display()))?;
        let raw: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("MTP layers {}: not JSON: {e}", path.display()))?;
        let bad = |what: String| format!("MTP layers {}: {what}", dir.display());
        match raw.get("num_nextn_predict_layers").and_then(|v| v.as_u64()) {
            Some(n) if n > 0 => {}
            Some(_) => return Err(bad("num_nextn_predict_layers is 0: the model ships no MTP layer".into())),
            None => {
                return Err(bad("config.json has no num_nextn_predict_layers: the model ships no MTP layers \
                     (method mtp reads the target's own model.mtp_layers.N.* tensors)"
                    .into()))
            }
        }
        if !target.architecture.starts_with("Qwen2") {
            return Err(bad(format!(
                "architecture {}: MTP layers are read for MiMo (Qwen2 with model.mtp_layers) only",
                target.architecture
            )));
        }
        let w = Weights::open(dir).map_err(|e| bad(e.to_string()))?;
        let p = "model.mtp_layers.0.";
        if !w.contains(&format!("{p}input_proj.weight")) {
            return Err(bad(format!("tensor `{p}input_proj.weight` is missing: the checkpoint has no MTP layer 0")));
        }
        let get = |name: &str, shape: &[usize]| w.get(name, shape).map(|t| t.to_f32()).map_err(|e| bad(e.to_string()));
        let c = target;
        let (d, hd, inter, vocab) = (c.hidden_size, c.head_dim, c.intermediate_size, c.vocab_size);
        let (qd, kvd) = (c.num_attention_heads * hd, c.num_key_value_heads * hd);
        let a = format!("{p}self_attn.");
        let bias = match c.attention_bias {
            true => Some([
                get(&format!("{a}q_proj.bias"), &[qd])?,
                get(&format!("{a}k_proj.bias"), &[kvd])?,
                get(&format!("{a}v_proj.bias"), &[kvd])?,
            ]),
            false => None,
        };
        let embed = get("model.embed_tokens.weight", &[vocab, d])?;
        let lm_head = match (w.contains("lm_head.weight"), c.tie_word_embeddings) {
            (false, true) => embed.clone(),
            _ => get("lm_head.weight", &[vocab, d])?,
        };
        Ok(MtpHead {
            hidden: d,
            vocab,
            eps: c.rms_norm_eps,
            aux_layers: vec![c.num_hidden_layers],
            embed,
            token_norm: get(&format!("{p}token_layernorm.weight"), &[d])?,
            hidden_norm: get(&format!("{p}hidden_layernorm.weight"), &[d])?,
            input_proj: get(&format!("{p}input_proj.weight"), &[d, 2 * d])?,
            input_norm: get(&format!("{p}input_layernorm.weight"), &[d])?,
            attn: HeadAttention {
                heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: hd,
                inv_freq: c.rope_inv_freq(),
                q: get(&format!("{a}q_proj.weight"), &[qd, d])?,
                k: get(&format!("{a}k_proj.weight"), &[kvd, d])?,
                v: get(&format!("{a}v_proj.weight"), &[kvd, d])?,
                bias,
                o: get(&format!("{a}o_proj.weight"), &[d, qd])?,
                out: d,
            },
            post_norm: get(&format!("{p}post_attention_layernorm.weight"), &[d])?,
            mlp: HeadMlp {
                inter,
                gate: get(&format!("{p}mlp.gate_proj.weight"), &[inter, d])?,
                up: get(&format!("{p}mlp.up_proj.weight"), &[inter, d])?,
                down: get(&format!("{p}mlp.down_proj.weight"), &[d, inter])?,
            },
            final_norm: get(&format!("{p}final_layernorm.weight"), &[d])?,
            lm_head,
        })
    }
}

impl HeadModel for MtpHead {
    fn aux_layers(&self) -> &[usize] {
        &self.aux_layers
    }

    fn aux_width(&self) -> usize {
        self.hidden
    }

    /// The target's hidden state itself.
    fn hidden_in(&self, aux: &[f32]) -> Vec<f32> {
        aux.to_vec()
    }

    /// The row's `final_layernorm` output is what a further draft feeds back.
    fn row(&self, cache: &mut HeadCache, token: u32, hidden: &[f32], pos: usize) -> (Vec<f32>, u32) {
        let (d, eps) = (self.hidden, self.eps);
        let e = match pos {
            0 => vec![0.0; d],
            _ => self.embed[token as usize * d..(token as usize + 1) * d].to_vec(),
        };
        let mut cat = rms_norm(hidden, &self.hidden_norm, eps);
        cat.extend(rms_norm(&e, &self.token_norm, eps));
        let mut h = matvec(&self.input_proj, &cat, d);
        let attn = self.attn.forward(cache, &rms_norm(&h, &self.input_norm, eps), pos);
        h.iter_mut().zip(&attn).for_each(|(h, a)| *h += a);
        let x2 = rms_norm(&h, &self.post_norm, eps);
        self.mlp.add_to(&mut h, &x2);
        let out = rms_norm(&h, &self.final_norm, eps);
        let id = argmax(&matvec(&self.lm_head, &out, self.vocab));
        (out, id as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn golden() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/mtp-tiny")
    }

    fn target() -> ModelConfig {
        ModelConfig::from_file(&golden().join("config.json")).unwrap()
    }

    /// The layer's greedy drafts equal tests/mtp_golden.py's plain PyTorch MTP layer on the
    /// same tokens and the target's hidden states (from transformers), for growing prefixes
    /// of one sequence through one cache and from scratch.
    #[test]
    fn proposals_equal_pytorchs() {
        let cfg = target();
        assert_eq!(cfg.architecture, "Qwen2ForCausalLM", "MiMo reads as Qwen2");
        let head = MtpHead::load(&golden(), &cfg).unwrap();
        assert_eq!(head.aux_layers(), &[cfg.num_hidden_layers]);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(golden().join("expected.json")).unwrap()).unwrap();
        let ints = |x: &serde_json::Value| -> Vec<u32> {
            x.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
        };
        let tokens = ints(&v["tokens"]);
        let hidden: Vec<f32> = v["hidden"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
        let w = head.aux_width();
        let mut cache = HeadCache::default();
        let mut cases = 0;
        for case in v["cases"].as_array().unwrap() {
            let n = case["len"].as_u64().unwrap() as usize;
            let k = case["k"].as_u64().unwrap() as usize;
            let want = ints(&case["drafts"]);
            let from = cache.len().saturating_sub(1);
            let got = head.propose(&mut cache, &tokens[..n], &hidden[from * w..(n - 1) * w], from, k).unwrap();
            assert_eq!(got, want, "prefix of {n} tokens");
            assert_eq!(cache.len(), n - 1, "only committed rows kept");
            let fresh = head.propose(&mut HeadCache::default(), &tokens[..n], &hidden[..(n - 1) * w], 0, k).unwrap();
            assert_eq!(fresh, want, "prefix of {n} tokens, from scratch");
            cases += 1;
        }
        assert!(cases >= 4);
    }

    #[test]
    fn a_model_without_mtp_layers_is_refused_naming_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("tandem-mtp-refused-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(golden().join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(golden().join("config.json")).unwrap()).unwrap();
        let mut none = cfg.clone();
        none.as_object_mut().unwrap().remove("num_nextn_predict_layers");
        std::fs::write(dir.join("config.json"), none.to_string()).unwrap();
        let e = MtpHead::load(&dir, &target()).err().unwrap();
        assert!(e.contains("num_nextn_predict_layers"), "{e}");
        let mut zero = cfg.clone();
        zero["num_nextn_predict_layers"] = serde_json::json!(0);
        std::fs::write(dir.join("config.json"), zero.to_string()).unwrap();
        let e = MtpHead::load(&dir, &target()).err().unwrap();
        assert!(e.contains("num_nextn_predict_layers"), "{e}");
        // The config promises a layer the checkpoint lacks: the missing tensor is named.
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        let bytes = std::fs::read(golden().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let kept: Vec<_> = st.tensors().into_iter().filter(|(n, _)| !n.contains("mtp_layers")).collect();
        std::fs::write(dir.join("model.safetensors"), safetensors::serialize(kept, None).unwrap()).unwrap();
        let e = MtpHead::load(&dir, &target()).err().unwrap();
        assert!(e.contains("model.mtp_layers.0.input_proj.weight"), "{e}");
        // Not a Qwen2-architecture model.
        let mut llama = serde_json::from_value::<serde_json::Value>(cfg).unwrap();
        llama["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
        let llama_cfg = ModelConfig::from_json(&llama.to_string()).unwrap();
        let e = MtpHead::load(&golden(), &llama_cfg).err().unwrap();
        assert!(e.contains("LlamaForCausalLM"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
