//! GGUF to a Hugging Face model directory: `model.safetensors` (bf16), `config.json`,
//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`. Architectures
//! (`general.architecture`): `llama` (Llama, Mistral, SmolLM; Mixtral where `llama.expert_count`
//! is set), `qwen2`, `qwen3`, `qwen3moe`.
//!
//! What differs between the layouts besides names:
//! - GGUF dims are innermost first; PyTorch shapes are the reverse.
//! - llama.cpp's exporter permutes the rows of the Q and K projections of the Llama family (per
//!   head, the two rotary halves are interleaved into pairs, matching its rope kernel). HF's
//!   rotate_half rope expects the halves, so the permutation is undone here; without that the
//!   model only answers `<|im_end|>`. Qwen models (NEOX rope) are stored unpermuted.
//! - A mixture of experts' experts are stacked into one `[experts, rows, cols]` tensor per
//!   projection (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`); HF has one tensor per expert.
//!
//! The output is a pure function of the input file: tensors are sorted by name and every JSON
//! file is written with fixed key order, so converting twice gives identical bytes.

use std::io::BufWriter;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use tandem_core::{DType, Error, Result};

use crate::gguf::{GgufFile, TensorInfo};
use crate::gguf_tokenizer::GgufTokenizer;
use crate::safetensors_writer::{SafetensorsWriter, TensorSpec};

/// Files a converted directory holds.
pub const OUTPUT_FILES: &[&str] =
    &["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];

/// What a conversion did, for the caller to report.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub tensors: usize,
    pub parameters: usize,
    pub tied: bool,
    pub seconds: f64,
}

/// The GGUF architectures this converter reads (`general.architecture`), each to its HF family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arch {
    /// Llama, Mistral, SmolLM; with `llama.expert_count`, Mixtral.
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
}

impl Arch {
    const NAMES: &'static [&'static str] = &["llama", "qwen2", "qwen3", "qwen3moe"];

    fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            _ => return None,
        })
    }

    /// The metadata keys' prefix (`{arch}.block_count`, ...).
    fn key(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
        }
    }

    /// llama.cpp permutes Q and K rows only for the Llama family (its rope pairs adjacent
    /// dimensions there); Qwen models use the NEOX rope, stored as HF stores them.
    fn permuted(self) -> bool {
        self == Arch::Llama
    }

    /// Per-head RMS norms on q and k (`attn_q_norm`, `attn_k_norm`).
    fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3 | Arch::Qwen3Moe)
    }
}

/// A mixture of experts' sizes, from `{arch}.expert_count` and friends.
#[derive(Debug, Clone, PartialEq)]
struct MoeParams {
    experts: usize,
    top_k: usize,
    /// Each expert's MLP width.
    ff: usize,
}

/// Hyper-parameters read from `{arch}.*` metadata.
#[derive(Debug, Clone, PartialEq)]
struct LlamaParams {
    arch: Arch,
    layers: usize,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rms_eps: f32,
    rope_theta: f32,
    context: usize,
    moe: Option<MoeParams>,
}

impl LlamaParams {
    fn from_gguf(g: &GgufFile) -> Result<Self> {
        let name = g.get_str("general.architecture")?;
        let Some(arch) = Arch::from_name(name) else {
            return Err(Error::config(&g.path, format!("general.architecture is `{name}`; this converter reads {}", Arch::NAMES.join(", "))));
        };
        let k = arch.key();
        let has = |key: &str| g.get(&format!("{k}.{key}")).is_some();
        let u = |key: &str| g.get_u64(&format!("{k}.{key}")).map(|v| v as usize);
        let heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let kv_heads = if has("attention.head_count_kv") { u("attention.head_count_kv")? } else { heads };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::config(&g.path, format!("{k}.attention.head_count ({heads}) must be a positive multiple of head_count_kv ({kv_heads})")));
        }
        let head_dim = if has("attention.key_length") { u("attention.key_length")? } else { hidden / heads };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::config(&g.path, format!("head dimension {head_dim} must be positive and even")));
        }
        if let Some(kind) = g.get(&format!("{k}.rope.scaling.type")).and_then(|v| v.as_str()) {
            if kind != "none" {
                return Err(Error::config(&g.path, format!("{k}.rope.scaling.type `{kind}` is not supported by this converter")));
            }
        }
        if g.tensor("rope_freqs.weight").is_some() {
            return Err(Error::config(&g.path, "tensor `rope_freqs.weight` (Llama 3.1 rope scaling) is not supported by this converter"));
        }
        // Every layer has nine tensors at least: a count the file cannot hold is refused before
        // anything is sized from it (found by fuzz/gguf: a huge block_count in a 6 KB file).
        let layers = u("block_count")?;
        if layers == 0 || layers > g.tensors.len() / 9 {
            return Err(Error::config(&g.path, format!("{k}.block_count is {layers}, but the file's {} tensors hold at most {} layers of 9", g.tensors.len(), g.tensors.len() / 9)));
        }
        let intermediate = u("feed_forward_length").or_else(|e| if arch == Arch::Qwen3Moe { u("expert_feed_forward_length") } else { Err(e) })?;
        let moe = match (arch, has("expert_count")) {
            (Arch::Qwen3Moe, _) | (Arch::Llama, true) => {
                let experts = u("expert_count")?;
                let top_k = u("expert_used_count")?;
                let ff = if arch == Arch::Qwen3Moe { u("expert_feed_forward_length")? } else { intermediate };
                if experts == 0 || top_k == 0 || top_k > experts || experts > g.tensors.len() * 1024 {
                    return Err(Error::config(&g.path, format!("{k}.expert_used_count ({top_k}) must be in 1..={k}.expert_count ({experts})")));
                }
                Some(MoeParams { experts, top_k, ff })
            }
            _ => None,
        };
        Ok(LlamaParams {
            arch,
            layers,
            hidden,
            intermediate,
            heads,
            kv_heads,
            head_dim,
            rms_eps: g.get_f64(&format!("{k}.attention.layer_norm_rms_epsilon"))? as f32,
            rope_theta: if has("rope.freq_base") { g.get_f64(&format!("{k}.rope.freq_base"))? as f32 } else { 10000.0 },
            context: u("context_length")?,
            moe,
        })
    }

    /// Where a layer's experts live in HF's names, and their projections' names.
    fn moe_names(&self) -> (&'static str, [&'static str; 3]) {
        match self.arch {
            Arch::Llama => ("block_sparse_moe", ["w1", "w3", "w2"]),
            _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
        }
    }
}

/// What a GGUF tensor becomes besides renamed: rows un-permuted (Q and K of a Llama, with the
/// head count), or one expert's slice of a merged expert tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Take {
    Whole,
    Unpermute(usize),
    Expert(usize),
}

/// The HF tensors a GGUF tensor becomes (several for a merged expert tensor), or `None` for a
/// tensor this converter does not know.
fn hf_names(gguf: &str, p: &LlamaParams) -> Option<Vec<(String, Take)>> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some(vec![(t.to_string(), Take::Whole)]);
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= p.layers {
        return None;
    }
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let unpermute = |n: usize| if p.arch.permuted() { Take::Unpermute(n) } else { Take::Whole };
    let at = |hf: &str| format!("model.layers.{layer}.{hf}.{kind}");
    if let Some(moe) = &p.moe {
        let (block, [gate, up, down]) = p.moe_names();
        let proj = match part {
            "ffn_gate_inp" if kind == "weight" => return Some(vec![(at(&format!("{block}.gate")), Take::Whole)]),
            "ffn_gate_exps" => gate,
            "ffn_up_exps" => up,
            "ffn_down_exps" => down,
            _ => "",
        };
        if !proj.is_empty() && kind == "weight" {
            return Some((0..moe.experts).map(|e| (at(&format!("{block}.experts.{e}.{proj}")), Take::Expert(e))).collect());
        }
    }
    let (hf, take) = match part {
        "attn_norm" => ("input_layernorm", Take::Whole),
        "attn_q" => ("self_attn.q_proj", unpermute(p.heads)),
        "attn_k" => ("self_attn.k_proj", unpermute(p.kv_heads)),
        "attn_v" => ("self_attn.v_proj", Take::Whole),
        "attn_output" => ("self_attn.o_proj", Take::Whole),
        "attn_q_norm" if p.arch.qk_norm() => ("self_attn.q_norm", Take::Whole),
        "attn_k_norm" if p.arch.qk_norm() => ("self_attn.k_norm", Take::Whole),
        "ffn_norm" => ("post_attention_layernorm", Take::Whole),
        "ffn_gate" => ("mlp.gate_proj", Take::Whole),
        "ffn_up" => ("mlp.up_proj", Take::Whole),
        "ffn_down" => ("mlp.down_proj", Take::Whole),
        _ => return None,
    };
    Some(vec![(at(hf), take)])
}

/// llama.cpp's exporter permutation of Q/K rows, `[n_head * head_dim, cols]` row-major:
/// `reshape(n_head, 2, head_dim/2, cols).swapaxes(1, 2)`. Row `h*hd + 2i + j` of the result is
/// row `h*hd + j*hd/2 + i` of the input. Kept for the round-trip test and for fixtures.
pub fn rope_permute(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / n_head;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * hd / 2 + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The inverse of [`rope_permute`]: `reshape(n_head, head_dim/2, 2, cols).swapaxes(1, 2)`.
pub fn rope_unpermute(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
    if cols == 0 || n_head == 0 {
        return w.to_vec();
    }
    let hd = w.len() / cols / n_head;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + j * hd / 2 + i;
                let src = h * hd + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// f32 as the shortest decimal that reads back to it, so config.json says 1e-05, not
/// 9.999999747378752e-06.
fn f32_json(v: f32) -> serde_json::Value {
    let shortest: f64 = v.to_string().parse().unwrap_or(v as f64);
    json!(shortest)
}

/// Converts `gguf_path` into `out_dir` (created if needed). `progress(done, total, name)` is
/// called after each tensor.
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<ConvertSummary> {
    let start = Instant::now();
    let g = GgufFile::open(gguf_path)?;
    let p = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let vocab = tok.vocab.len();

    let mut plan: std::collections::HashMap<String, (&TensorInfo, Take)> = std::collections::HashMap::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let Some(names) = hf_names(&t.name, &p) else {
            return Err(Error::tensor(&g.path, &t.name, format!("is not a tensor this converter knows for general.architecture `{}`", p.arch.key())));
        };
        for (name, take) in names {
            let shape = t.torch_shape();
            // Found by fuzz/gguf: a Q tensor of zero columns divided by zero in the un-permutation.
            if shape.contains(&0) {
                return Err(Error::tensor(&g.path, &t.name, format!("has an empty dimension (shape {shape:?})")));
            }
            match take {
                Take::Unpermute(_) if shape.len() != 2 => {
                    return Err(Error::tensor(&g.path, &t.name, format!("has shape {shape:?}, expected [rows, cols]")));
                }
                Take::Unpermute(n) if Some(shape[0]) != n.checked_mul(p.head_dim) => {
                    return Err(Error::tensor(&g.path, &t.name, format!("has {} rows, expected {n} heads x {} = {}", shape[0], p.head_dim, n.saturating_mul(p.head_dim))));
                }
                Take::Expert(_) if shape.len() != 3 || shape[0] != p.moe.as_ref().map_or(0, |m| m.experts) => {
                    return Err(Error::tensor(&g.path, &t.name, format!("has shape {shape:?}, expected [experts, rows, cols] with {} experts", p.moe.as_ref().map_or(0, |m| m.experts))));
                }
                _ => {}
            }
            plan.insert(name, (t, take));
        }
    }
    let embed = g.tensor("token_embd.weight").ok_or_else(|| Error::tensor(&g.path, "token_embd.weight", "missing"))?;
    if embed.torch_shape() != [vocab, p.hidden] {
        return Err(Error::tensor(&g.path, "token_embd.weight", format!("has shape {:?}, expected [{vocab}, {}] (vocab from the token list, hidden)", embed.torch_shape(), p.hidden)));
    }
    let tied = g.tensor("output.weight").is_none();
    // Catch a missing tensor here, with its GGUF name, rather than when a backend loads the result.
    let mut required = vec!["output_norm.weight".to_string()];
    let mut dense_layers = vec![];
    for i in 0..p.layers {
        let mut parts = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"];
        if p.arch.qk_norm() {
            parts.extend(["attn_q_norm", "attn_k_norm"]);
        }
        // A MoE model's layer may keep a dense MLP (Qwen3-MoE's mlp_only_layers).
        if p.moe.is_some() && g.tensor(&format!("blk.{i}.ffn_gate.weight")).is_none() {
            parts.extend(["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]);
        } else {
            parts.extend(["ffn_gate", "ffn_up", "ffn_down"]);
            dense_layers.push(i);
        }
        required.extend(parts.iter().map(|part| format!("blk.{i}.{part}.weight")));
    }
    if let Some(missing) = required.iter().find(|n| g.tensor(n).is_none()) {
        return Err(Error::tensor(&g.path, missing, format!("missing ({}.block_count is {})", p.arch.key(), p.layers)));
    }
    let shape_of = |t: &TensorInfo, take: Take| match take {
        Take::Expert(_) => t.torch_shape()[1..].to_vec(),
        _ => t.torch_shape(),
    };

    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let st_path = out_dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|e| Error::io(&st_path, e))?;
    let specs = plan.iter().map(|(name, (t, take))| TensorSpec::new(name.clone(), DType::BF16, &shape_of(t, *take))).collect();
    let mut w = SafetensorsWriter::new(BufWriter::with_capacity(1 << 20, file), &st_path, specs)?;
    let order: Vec<String> = w.specs().iter().map(|s| s.name.clone()).collect();
    let mut parameters = 0;
    for (k, name) in order.iter().enumerate() {
        let (t, take) = plan[name];
        let values = match take {
            Take::Whole => g.tensor_f32(t)?,
            Take::Unpermute(n) => {
                let cols = if t.dims.len() == 1 { 1 } else { t.dims[0] as usize };
                rope_unpermute(&g.tensor_f32(t)?, n, cols)
            }
            // One expert's rows: a whole number of quantisation blocks (rows never share one).
            Take::Expert(e) => {
                let per = (t.dims[0] * t.dims[1]) as usize;
                let bytes = g.tensor_bytes(t)?;
                let size = t.ggml_type.byte_size(per as u64).map_err(|m| Error::tensor(&g.path, &t.name, m))? as usize;
                let slice = &bytes[e * size..(e + 1) * size];
                crate::quant::dequantize(t.ggml_type, slice, per).map_err(|m| Error::tensor(&g.path, &t.name, m))?
            }
        };
        parameters += values.len();
        w.push(&values)?;
        progress(k + 1, order.len(), name);
    }
    w.finish()?;

    write_json(&out_dir.join("config.json"), &config_json(&p, &tok, tied, &dense_layers, g.tensor("blk.0.attn_q.bias").is_some()))?;
    write_json(&out_dir.join("tokenizer.json"), &tok.tokenizer_json())?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer_config_json(&tok, p.context))?;
    let mut gen = serde_json::Map::new();
    gen.insert("bos_token_id".into(), json!(tok.bos_id));
    gen.insert("eos_token_id".into(), json!(tok.eos_id));
    if let Some(pad) = tok.pad_id {
        gen.insert("pad_token_id".into(), json!(pad));
    }
    write_json(&out_dir.join("generation_config.json"), &serde_json::Value::Object(gen))?;
    Ok(ConvertSummary { tensors: order.len(), parameters, tied, seconds: start.elapsed().as_secs_f64() })
}

fn config_json(p: &LlamaParams, tok: &GgufTokenizer, tied: bool, dense_layers: &[usize], bias: bool) -> serde_json::Value {
    let (architecture, model_type) = match (p.arch, &p.moe) {
        (Arch::Llama, None) => ("LlamaForCausalLM", "llama"),
        (Arch::Llama, Some(_)) => ("MixtralForCausalLM", "mixtral"),
        (Arch::Qwen2, _) => ("Qwen2ForCausalLM", "qwen2"),
        (Arch::Qwen3, _) => ("Qwen3ForCausalLM", "qwen3"),
        (Arch::Qwen3Moe, _) => ("Qwen3MoeForCausalLM", "qwen3_moe"),
    };
    let mut c = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": tok.vocab.len(),
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": f32_json(p.rms_eps),
        "rope_theta": f32_json(p.rope_theta),
        "rope_scaling": null,
        "max_position_embeddings": p.context,
        "tie_word_embeddings": tied,
        "attention_bias": bias,
        "mlp_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
        "bos_token_id": tok.bos_id,
        "eos_token_id": tok.eos_id,
        "pad_token_id": tok.pad_id,
        "torch_dtype": "bfloat16",
    });
    if let Some(m) = &p.moe {
        let o = c.as_object_mut().expect("an object");
        o.insert("num_experts_per_tok".into(), json!(m.top_k));
        if p.arch == Arch::Qwen3Moe {
            // llama.cpp's qwen3moe graph renormalises the kept weights, as Qwen3-MoE's configs
            // ask (norm_topk_prob: true); GGUF does not carry the flag.
            o.insert("num_experts".into(), json!(m.experts));
            o.insert("moe_intermediate_size".into(), json!(m.ff));
            o.insert("norm_topk_prob".into(), json!(true));
            o.insert("decoder_sparse_step".into(), json!(1));
            o.insert("mlp_only_layers".into(), json!(dense_layers));
        } else {
            o.insert("num_local_experts".into(), json!(m.experts));
        }
    }
    c
}

fn tokenizer_config_json(tok: &GgufTokenizer, context: usize) -> serde_json::Value {
    let mut decoder = serde_json::Map::new();
    for a in &tok.added {
        decoder.insert(
            a.id.to_string(),
            json!({ "content": a.content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": a.special }),
        );
    }
    json!({
        "add_bos_token": tok.add_bos,
        "add_eos_token": tok.add_eos,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": tok.token(tok.bos_id),
        "chat_template": tok.chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": tok.token(tok.eos_id),
        "model_max_length": context,
        "pad_token": tok.token(tok.pad_id),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tok.token(tok.unk_id),
        "vocab_size": tok.vocab.len(),
    })
}

pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).map_err(|e| Error::config(path, format!("cannot serialise: {e}")))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::{writer, Value};
    use crate::gguf_tokenizer::tests::tiny_gguf_tokenizer_meta;
    use tandem_core::weights::Weights;
    use tandem_core::ModelConfig;

    #[test]
    fn permute_then_unpermute_is_identity_and_not_trivial() {
        let (n_head, hd, cols) = (3, 4, 5);
        let w: Vec<f32> = (0..n_head * hd * cols).map(|i| i as f32).collect();
        let p = rope_permute(&w, n_head, cols);
        assert_ne!(p, w, "the permutation moves rows");
        // Head 0, head_dim 4: the halves [r0 r1 | r2 r3] interleave to [r0 r2 r1 r3].
        let row = |m: &[f32], r: usize| m[r * cols];
        assert_eq!([row(&p, 0), row(&p, 1), row(&p, 2), row(&p, 3)], [0.0, 10.0, 5.0, 15.0]);
        assert_eq!(rope_unpermute(&p, n_head, cols), w);
        assert_eq!(rope_permute(&rope_unpermute(&w, n_head, cols), n_head, cols), w);
    }

    #[test]
    fn shortest_float_in_json() {
        assert_eq!(f32_json(1e-5).as_f64(), Some(1e-5));
        assert_ne!((1e-5f32) as f64, 1e-5, "the naive widening is what this avoids");
        assert_eq!(f32_json(100000.0).to_string(), "100000.0");
    }

    /// A 1-layer llama GGUF: hidden 32, 2 heads of 16, 1 KV head, ffn 64, tokenizer of 261 tokens.
    /// Q and K are stored permuted, as llama.cpp's exporter does; everything else is F32 except
    /// the embedding (Q8_0) and gate (Q4_1).
    pub(crate) fn tiny_llama_gguf(path: &Path, tied: bool, skip: Option<&str>) -> (Vec<f32>, Vec<f32>) {
        let (hidden, heads, kv, hd, ffn, vocab) = (32usize, 2usize, 1usize, 16usize, 64usize, 261usize);
        let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let vals = |n: usize, salt: f32| (0..n).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect::<Vec<f32>>();
        let q = vals(heads * hd * hidden, 1.0); // HF layout [q_dim, hidden]
        let k = vals(kv * hd * hidden, 2.0);
        // Q8_0 embedding: every block scale 0.5, q = (i % 7) - 3.
        let mut embd = vec![];
        for b in 0..vocab * hidden / 32 {
            embd.extend(half::f16::from_f32(0.5).to_le_bytes());
            embd.extend((0..32).map(|i| (((b * 32 + i) % 7) as i8 - 3) as u8));
        }
        // Q4_1 gate: d = 0.125, m = -1, nibbles 0..15.
        let mut gate = vec![];
        for _ in 0..ffn * hidden / 32 {
            gate.extend(half::f16::from_f32(0.125).to_le_bytes());
            gate.extend(half::f16::from_f32(-1.0).to_le_bytes());
            gate.extend((0..16u8).map(|j| (j << 4) | j));
        }
        let mut meta = vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(1)),
            ("llama.context_length", Value::U32(256)),
            ("llama.embedding_length", Value::U32(hidden as u32)),
            ("llama.feed_forward_length", Value::U32(ffn as u32)),
            ("llama.attention.head_count", Value::U32(heads as u32)),
            ("llama.attention.head_count_kv", Value::U32(kv as u32)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("llama.rope.freq_base", Value::F32(100000.0)),
        ];
        meta.extend(tiny_gguf_tokenizer_meta());
        let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
        let mut tensors = vec![
            ("token_embd.weight", d(vocab, hidden), 8, embd),
            ("output_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 3.0))),
            ("blk.0.attn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 4.0))),
            ("blk.0.attn_q.weight", d(heads * hd, hidden), 0, f32b(&rope_permute(&q, heads, hidden))),
            ("blk.0.attn_k.weight", d(kv * hd, hidden), 0, f32b(&rope_permute(&k, kv, hidden))),
            ("blk.0.attn_v.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 5.0))),
            ("blk.0.attn_output.weight", d(hidden, heads * hd), 0, f32b(&vals(hidden * heads * hd, 6.0))),
            ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 7.0))),
            ("blk.0.ffn_gate.weight", d(ffn, hidden), 3, gate),
            ("blk.0.ffn_up.weight", d(ffn, hidden), 0, f32b(&vals(ffn * hidden, 8.0))),
            ("blk.0.ffn_down.weight", d(hidden, ffn), 0, f32b(&vals(hidden * ffn, 9.0))),
        ];
        if !tied {
            tensors.push(("output.weight", d(vocab, hidden), 0, f32b(&vals(vocab * hidden, 10.0))));
        }
        tensors.retain(|t| Some(t.0) != skip);
        std::fs::write(path, writer::file(&meta, &tensors, 32)).unwrap();
        (q, k)
    }

    fn bf16_round(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect()
    }

    /// The GGUF fuzz target's findings (fuzz/regressions/gguf, each fixed), replayed here on the
    /// stable toolchain: every one converts to an error naming the file, quickly.
    #[test]
    fn fuzz_findings_are_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/gguf");
        let out = std::env::temp_dir().join(format!("tandem-convert-fuzz-{}", std::process::id()));
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let t = std::time::Instant::now();
            let r = convert_gguf(&p, &out, &mut |_, _, _| {});
            let msg = r.err().unwrap_or_else(|| panic!("{} converted", p.display())).to_string();
            assert!(msg.contains(&p.display().to_string()), "{msg}");
            assert!(t.elapsed().as_secs() < 5, "{} took {:?}", p.display(), t.elapsed());
            n += 1;
        }
        assert!(n > 0, "no inputs under {}", dir.display());
        let _ = std::fs::remove_dir_all(&out);
    }

    /// A 1-layer Qwen3-MoE GGUF as llama.cpp writes one (hidden 32, 2 heads of 16, 1 KV head,
    /// per-head q/k norms, Q/K not permuted, 4 experts of width 32 stacked in `*_exps` tensors,
    /// top 2, a `qwen2` pre-tokenizer): the converter names and slices each expert, keeps Q/K
    /// as stored, and writes Qwen3-MoE's config.
    #[test]
    fn converts_a_tiny_qwen3_moe() {
        let root = std::env::temp_dir().join(format!("tandem-convert-qwen3moe-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let (hidden, heads, kv, hd, ff, experts, vocab) = (32usize, 2usize, 1usize, 16usize, 32usize, 4usize, 261usize);
        let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let vals = |n: usize, salt: f32| (0..n).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect::<Vec<f32>>();
        let mut meta = vec![
            ("general.architecture", Value::String("qwen3moe".into())),
            ("qwen3moe.block_count", Value::U32(1)),
            ("qwen3moe.context_length", Value::U32(256)),
            ("qwen3moe.embedding_length", Value::U32(hidden as u32)),
            ("qwen3moe.feed_forward_length", Value::U32(64)),
            ("qwen3moe.expert_feed_forward_length", Value::U32(ff as u32)),
            ("qwen3moe.expert_count", Value::U32(experts as u32)),
            ("qwen3moe.expert_used_count", Value::U32(2)),
            ("qwen3moe.attention.head_count", Value::U32(heads as u32)),
            ("qwen3moe.attention.head_count_kv", Value::U32(kv as u32)),
            ("qwen3moe.attention.key_length", Value::U32(hd as u32)),
            ("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("qwen3moe.rope.freq_base", Value::F32(1e6)),
        ];
        meta.extend(tiny_gguf_tokenizer_meta().into_iter().map(|(k, v)| if k == "tokenizer.ggml.pre" { (k, Value::String("qwen2".into())) } else { (k, v) }));
        let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
        let q = vals(heads * hd * hidden, 1.0);
        let gate = vals(experts * ff * hidden, 2.0);
        let down = vals(experts * hidden * ff, 3.0);
        let tensors = vec![
            ("token_embd.weight", d(vocab, hidden), 0, f32b(&vals(vocab * hidden, 4.0))),
            ("output_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 5.0))),
            ("blk.0.attn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 6.0))),
            ("blk.0.attn_q.weight", d(heads * hd, hidden), 0, f32b(&q)),
            ("blk.0.attn_k.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 7.0))),
            ("blk.0.attn_v.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 8.0))),
            ("blk.0.attn_output.weight", d(hidden, heads * hd), 0, f32b(&vals(hidden * heads * hd, 9.0))),
            ("blk.0.attn_q_norm.weight", vec![hd as u64], 0, f32b(&vals(hd, 10.0))),
            ("blk.0.attn_k_norm.weight", vec![hd as u64], 0, f32b(&vals(hd, 11.0))),
            ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 12.0))),
            ("blk.0.ffn_gate_inp.weight", d(experts, hidden), 0, f32b(&vals(experts * hidden, 13.0))),
            ("blk.0.ffn_gate_exps.weight", vec![hidden as u64, ff as u64, experts as u64], 0, f32b(&gate)),
            ("blk.0.ffn_up_exps.weight", vec![hidden as u64, ff as u64, experts as u64], 0, f32b(&vals(experts * ff * hidden, 14.0))),
            ("blk.0.ffn_down_exps.weight", vec![ff as u64, hidden as u64, experts as u64], 0, f32b(&down)),
        ];
        let gguf = root.join("tiny-qwen3moe.gguf");
        std::fs::write(&gguf, writer::file(&meta, &tensors, 32)).unwrap();
        let out = root.join("out");
        let s = convert_gguf(&gguf, &out, &mut |_, _, _| {}).unwrap();
        assert_eq!(s.tensors, 14 - 3 + 3 * experts, "each merged expert tensor becomes one tensor per expert");
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["architectures"], json!(["Qwen3MoeForCausalLM"]));
        assert_eq!((cfg["num_experts"].clone(), cfg["num_experts_per_tok"].clone(), cfg["moe_intermediate_size"].clone()), (json!(4), json!(2), json!(32)));
        assert_eq!((cfg["head_dim"].clone(), cfg["norm_topk_prob"].clone(), cfg["mlp_only_layers"].clone()), (json!(16), json!(true), json!([])));
        let w = Weights::open(&out).unwrap();
        // Q as stored (no permutation for Qwen), each expert its own slice.
        assert_eq!(w.get("model.layers.0.self_attn.q_proj.weight", &[32, 32]).unwrap().to_f32(), bf16_round(&q));
        assert!(w.get("model.layers.0.self_attn.q_norm.weight", &[16]).is_ok());
        assert!(w.get("model.layers.0.mlp.gate.weight", &[4, 32]).is_ok());
        for e in 0..experts {
            let g = w.get(&format!("model.layers.0.mlp.experts.{e}.gate_proj.weight"), &[ff, hidden]).unwrap().to_f32();
            assert_eq!(g, bf16_round(&gate[e * ff * hidden..(e + 1) * ff * hidden]), "expert {e}");
            let dn = w.get(&format!("model.layers.0.mlp.experts.{e}.down_proj.weight"), &[hidden, ff]).unwrap().to_f32();
            assert_eq!(dn, bf16_round(&down[e * hidden * ff..(e + 1) * hidden * ff]), "expert {e}");
        }
        // The qwen2 pre-tokenizer: Qwen2's split, NFC.
        let tok: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap()).unwrap();
        assert_eq!(tok["normalizer"]["type"], "NFC");
        assert!(tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).is_ok());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn converts_a_tiny_llama_and_core_loads_it() {
        let root = std::env::temp_dir().join(format!("tandem-convert-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let gguf = root.join("tiny.gguf");
        let (q, k) = tiny_llama_gguf(&gguf, true, None);
        let out = root.join("out");
        let mut seen = 0;
        let s = convert_gguf(&gguf, &out, &mut |done, total, _| {
            seen = done;
            assert_eq!(total, 11);
        })
        .unwrap();
        assert_eq!((s.tensors, seen), (11, 11));
        assert!(s.tied);
        let cfg = ModelConfig::from_file(&out.join("config.json")).unwrap();
        assert_eq!((cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim), (261, 32, 2, 1, 16));
        assert!(cfg.tie_word_embeddings);
        assert_eq!((cfg.rms_norm_eps, cfg.rope_theta), (1e-5, 100000.0));
        assert_eq!((cfg.bos_token_id, cfg.eos_token_ids.clone()), (Some(1), vec![2]));
        let w = Weights::open(&out).unwrap();
        assert!(!w.contains("lm_head.weight"));
        // Q and K come back in HF order (bf16-rounded), not in llama.cpp's.
        assert_eq!(w.get("model.layers.0.self_attn.q_proj.weight", &[32, 32]).unwrap().to_f32(), bf16_round(&q));
        assert_eq!(w.get("model.layers.0.self_attn.k_proj.weight", &[16, 32]).unwrap().to_f32(), bf16_round(&k));
        let e = w.get("model.embed_tokens.weight", &[261, 32]).unwrap().to_f32();
        assert_eq!(&e[..8], &[-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, -1.5]);
        let gate = w.get("model.layers.0.mlp.gate_proj.weight", &[64, 32]).unwrap().to_f32();
        assert_eq!((gate[0], gate[15], gate[16], gate[31]), (-1.0, 0.875, -1.0, 0.875));
        let tc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
        assert_eq!(tc["eos_token"], "<|im_end|>");
        assert_eq!(tc["bos_token"], "<|im_start|>");
        assert_eq!(tc["unk_token"], "<|endoftext|>");
        assert_eq!(tc["add_bos_token"], false);
        assert!(tc["chat_template"].as_str().unwrap().contains("messages"));
        tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();

        // Deterministic: a second conversion gives identical bytes in every file.
        let out2 = root.join("out2");
        convert_gguf(&gguf, &out2, &mut |_, _, _| {}).unwrap();
        for f in OUTPUT_FILES {
            assert_eq!(std::fs::read(out.join(f)).unwrap(), std::fs::read(out2.join(f)).unwrap(), "{f} differs");
        }

        let gguf_untied = root.join("untied.gguf");
        tiny_llama_gguf(&gguf_untied, false, None);
        let out3 = root.join("out3");
        assert!(!convert_gguf(&gguf_untied, &out3, &mut |_, _, _| {}).unwrap().tied);
        assert!(Weights::open(&out3).unwrap().get("lm_head.weight", &[261, 32]).is_ok());
        assert!(!ModelConfig::from_file(&out3.join("config.json")).unwrap().tie_word_embeddings);
    }

    #[test]
    fn unknown_tensors_and_architectures_are_named() {
        let root = std::env::temp_dir().join(format!("tandem-convert-bad-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let p = root.join("gpt.gguf");
        std::fs::write(&p, writer::file(&[("general.architecture", Value::String("gpt2".into()))], &[], 32)).unwrap();
        let e = convert_gguf(&p, &root.join("o"), &mut |_, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("`gpt2`") && e.contains("gpt.gguf"), "{e}");
        let p2 = root.join("no-up.gguf");
        tiny_llama_gguf(&p2, true, Some("blk.0.ffn_up.weight"));
        let e = convert_gguf(&p2, &root.join("o2"), &mut |_, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("`blk.0.ffn_up.weight`") && e.contains("missing"), "{e}");
        let params = LlamaParams { arch: Arch::Llama, layers: 1, hidden: 8, intermediate: 8, heads: 2, kv_heads: 1, head_dim: 4, rms_eps: 1e-5, rope_theta: 1e4, context: 8, moe: None };
        assert!(hf_names("blk.0.attn_qkv.weight", &params).is_none());
        // Qwen3's q/k norms are no Llama tensors.
        assert!(hf_names("blk.0.attn_q_norm.weight", &params).is_none());
        assert!(hf_names("blk.0.attn_q_norm.weight", &LlamaParams { arch: Arch::Qwen3, ..params }).is_some());
    }
}
