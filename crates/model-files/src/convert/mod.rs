//! GGUF to a Hugging Face model directory: `model.safetensors` (bf16), `config.json`,
//! `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`. Architectures
//! (`general.architecture`): `llama` (Llama, Mistral, SmolLM; Mixtral where `llama.expert_count`
//! is set), `qwen2`, `qwen3`, `qwen3moe`, `gemma3` (Gemma 3's text model).
//!
//! What differs between the layouts besides names:
//! - GGUF dims are innermost first; PyTorch shapes are the reverse.
//! - llama.cpp's exporter permutes the rows of the Q and K projections of the Llama family (per
//!   head, the two rotary halves are interleaved into pairs, matching its rope kernel). HF's
//!   rotate_half rope expects the halves, so the permutation is undone here; without that the
//!   model only answers `<|im_end|>`. Qwen models (NEOX rope) are stored unpermuted.
//! - A mixture of experts' experts are stacked into one `[experts, rows, cols]` tensor per
//!   projection (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`); HF has one tensor per expert.
//! - Gemma 3's RMS norms compute `x * (1 + w)` in HF, and llama.cpp's exporter stores `1 + w`
//!   (see [`Take::MinusOne`]); its sliding-window layout and local rope are not in the file but
//!   fixed by llama.cpp's loader for the architecture (see [`GemmaParams`]).
//!
//! The output is a pure function of the input file: tensors are sorted by name and every JSON
//! file is written with fixed key order, so converting twice gives identical bytes.

use std::io::BufWriter;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use tandem_core::{DType, Error, Result};

use crate::family::{CheckpointNames, GEMMA3};
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

mod config;
mod gguf_dir;
mod params;
mod tensors;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use config::write_json;
use config::*;
pub use gguf_dir::{gguf_model_dir, gguf_weights, is_gguf, GGUF_WEIGHTS};
use params::*;
use tensors::*;
pub use tensors::{rope_permute, rope_unpermute};

/// Converts `gguf_path` into `out_dir` (created if needed). `progress(done, total, name)` is
/// called after each tensor.
pub fn convert_gguf(
    gguf_path: &Path,
    out_dir: &Path,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<ConvertSummary> {
    let start = Instant::now();
    let g = GgufFile::open(gguf_path)?;
    let p = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let Plan { tensors: plan, tied, dense_layers } = plan(&g, &p, tok.vocab.len())?;
    let shape_of = |t: &TensorInfo, take: Take| match take {
        Take::Expert(_) => t.torch_shape()[1..].to_vec(),
        _ => t.torch_shape(),
    };

    // Every tensor's type is checked before anything is written: an IQ-quantised file fails at
    // once, naming the tensor, its type and the supported list.
    for (t, _) in plan.values() {
        t.ggml_type.check_dequantizable().map_err(|m| Error::tensor(&g.path, &t.name, m))?;
    }
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let st_path = out_dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|e| Error::io(&st_path, e))?;
    let specs =
        plan.iter().map(|(name, (t, take))| TensorSpec::new(name.clone(), DType::BF16, &shape_of(t, *take))).collect();
    let mut w = SafetensorsWriter::new(BufWriter::with_capacity(1 << 20, file), &st_path, specs)?;
    let order: Vec<String> = w.specs().iter().map(|s| s.name.clone()).collect();
    let mut parameters = 0;
    for (k, name) in order.iter().enumerate() {
        let (t, take) = plan[name];
        let values = match take {
            Take::Whole => g.tensor_f32(t)?,
            Take::MinusOne => g.tensor_f32(t)?.into_iter().map(|x| x - 1.0).collect(),
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

    let plan = Plan { tensors: plan, tied, dense_layers };
    write_metadata(&g, &p, &tok, &plan, out_dir)?;
    Ok(ConvertSummary { tensors: order.len(), parameters, tied, seconds: start.elapsed().as_secs_f64() })
}

/// What a GGUF file becomes: every HF tensor with the GGUF tensor it comes from and how, whether
/// the head is tied to the embedding, and the layers with a dense MLP.
struct Plan<'g> {
    tensors: std::collections::HashMap<String, (&'g TensorInfo, Take)>,
    tied: bool,
    dense_layers: Vec<usize>,
}

/// The [`Plan`] of `g`, every tensor's name, shape and presence checked (its type is not).
fn plan<'g>(g: &'g GgufFile, p: &LlamaParams, vocab: usize) -> Result<Plan<'g>> {
    let mut plan: std::collections::HashMap<String, (&TensorInfo, Take)> =
        std::collections::HashMap::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let Some(names) = hf_names(&t.name, p) else {
            return Err(Error::tensor(
                &g.path,
                &t.name,
                format!("is not a tensor this converter knows for general.architecture `{}`", p.family.gguf_name()),
            ));
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
                    return Err(Error::tensor(
                        &g.path,
                        &t.name,
                        format!(
                            "has {} rows, expected {n} heads x {} = {}",
                            shape[0],
                            p.head_dim,
                            n.saturating_mul(p.head_dim)
                        ),
                    ));
                }
                Take::Expert(_) if shape.len() != 3 || shape[0] != p.moe.as_ref().map_or(0, |m| m.experts) => {
                    return Err(Error::tensor(
                        &g.path,
                        &t.name,
                        format!(
                            "has shape {shape:?}, expected [experts, rows, cols] with {} experts",
                            p.moe.as_ref().map_or(0, |m| m.experts)
                        ),
                    ));
                }
                _ => {}
            }
            plan.insert(name, (t, take));
        }
    }
    let embed = g.tensor("token_embd.weight").ok_or_else(|| Error::tensor(&g.path, "token_embd.weight", "missing"))?;
    if embed.torch_shape() != [vocab, p.hidden] {
        return Err(Error::tensor(
            &g.path,
            "token_embd.weight",
            format!(
                "has shape {:?}, expected [{vocab}, {}] (vocab from the token list, hidden)",
                embed.torch_shape(),
                p.hidden
            ),
        ));
    }
    let tied = g.tensor("output.weight").is_none();
    // Catch a missing tensor here, with its GGUF name, rather than when a backend loads the result.
    let mut required = vec!["output_norm.weight".to_string()];
    let mut dense_layers = vec![];
    for i in 0..p.layers {
        let mut parts = vec!["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"];
        if p.family.qk_norm() {
            parts.extend(["attn_q_norm", "attn_k_norm"]);
        }
        if p.family.is(GEMMA3) {
            parts.extend(["post_attention_norm", "post_ffw_norm"]);
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
        return Err(Error::tensor(
            &g.path,
            missing,
            format!("missing ({}.block_count is {})", p.family.gguf_name(), p.layers),
        ));
    }
    Ok(Plan { tensors: plan, tied, dense_layers })
}

/// The metadata files of a converted directory, all but `model.safetensors`, into `out_dir`.
fn write_metadata(g: &GgufFile, p: &LlamaParams, tok: &GgufTokenizer, plan: &Plan, out_dir: &Path) -> Result<()> {
    write_json(
        &out_dir.join("config.json"),
        &config_json(p, tok, plan.tied, &plan.dense_layers, g.tensor("blk.0.attn_q.bias").is_some()),
    )?;
    write_json(&out_dir.join("tokenizer.json"), &tok.tokenizer_json())?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer_config_json(tok, p.context))?;
    let mut gen = serde_json::Map::new();
    gen.insert("bos_token_id".into(), json!(tok.bos_id));
    gen.insert("eos_token_id".into(), eos_json(p, tok));
    if let Some(pad) = tok.pad_id {
        gen.insert("pad_token_id".into(), json!(pad));
    }
    write_json(&out_dir.join("generation_config.json"), &serde_json::Value::Object(gen))
}
