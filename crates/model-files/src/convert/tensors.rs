//! GGUF tensor names onto HF's, and the row permutation llama.cpp applies to Q and K.

use super::params::LlamaParams;
use crate::family::{CheckpointNames, GEMMA3};

/// What a GGUF tensor becomes besides renamed: rows un-permuted (Q and K of a Llama, with the
/// head count), one expert's slice of a merged expert tensor, or a Gemma norm less one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Take {
    Whole,
    Unpermute(usize),
    Expert(usize),
    /// Gemma 3's RMS norm weights: HF's Gemma3RMSNorm computes `x * (1 + w)`; llama.cpp's
    /// exporter (convert_hf_to_gguf.py, `Gemma3Model.norm_shift` / `modify_tensors`) adds 1.0 to
    /// every tensor whose HF name ends in `norm.weight` (input, post-attention, pre- and
    /// post-feedforward, q/k and the final norm) so its graph multiplies by `w` alone. The
    /// exporter first widens bf16 to f32 and stores norms as F32, so `(1 + w) - 1` in f32 gives
    /// HF's bf16 `w` back exactly for `|w| >= 2^-16`.
    MinusOne,
}

/// The HF tensors a GGUF tensor becomes (several for a merged expert tensor), or `None` for a
/// tensor this converter does not know.
pub(super) fn hf_names(gguf: &str, p: &LlamaParams) -> Option<Vec<(String, Take)>> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        let take = if p.family.is(GEMMA3) && gguf == "output_norm.weight" { Take::MinusOne } else { Take::Whole };
        return Some(vec![(t.to_string(), take)]);
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
    let unpermute = |n: usize| if p.family.gguf_permuted() { Take::Unpermute(n) } else { Take::Whole };
    let at = |hf: &str| format!("model.layers.{layer}.{hf}.{kind}");
    if p.family.is(GEMMA3) && kind == "weight" {
        // Gemma's sandwich norms: llama.cpp's `ffn_norm` is HF's pre-feedforward norm here
        // (tensor_mapping.py's FFN_PRE_NORM), not the Llama post-attention norm.
        let hf = match part {
            "attn_norm" => "input_layernorm",
            "attn_q_norm" => "self_attn.q_norm",
            "attn_k_norm" => "self_attn.k_norm",
            "post_attention_norm" => "post_attention_layernorm",
            "ffn_norm" => "pre_feedforward_layernorm",
            "post_ffw_norm" => "post_feedforward_layernorm",
            _ => "",
        };
        if !hf.is_empty() {
            return Some(vec![(at(hf), Take::MinusOne)]);
        }
    }
    if let Some(moe) = &p.moe {
        let (block, [gate, up, down]) = p.family.moe_names();
        let proj = match part {
            "ffn_gate_inp" if kind == "weight" => return Some(vec![(at(&format!("{block}.gate")), Take::Whole)]),
            "ffn_gate_exps" => gate,
            "ffn_up_exps" => up,
            "ffn_down_exps" => down,
            _ => "",
        };
        if !proj.is_empty() && kind == "weight" {
            return Some(
                (0..moe.experts).map(|e| (at(&format!("{block}.experts.{e}.{proj}")), Take::Expert(e))).collect(),
            );
        }
    }
    let (hf, take) = match part {
        "attn_norm" => ("input_layernorm", Take::Whole),
        "attn_q" => ("self_attn.q_proj", unpermute(p.heads)),
        "attn_k" => ("self_attn.k_proj", unpermute(p.kv_heads)),
        "attn_v" => ("self_attn.v_proj", Take::Whole),
        "attn_output" => ("self_attn.o_proj", Take::Whole),
        "attn_q_norm" if p.family.qk_norm() => ("self_attn.q_norm", Take::Whole),
        "attn_k_norm" if p.family.qk_norm() => ("self_attn.k_norm", Take::Whole),
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
