//! The JSON files a converted directory holds besides the weights: config.json,
//! tokenizer_config.json and the end-of-sequence ids.

use std::path::Path;

use serde_json::json;
use tandem_core::{Error, Result};

use super::params::{GemmaParams, LlamaParams};
use crate::family::{named, CheckpointNames, GEMMA3, QWEN3_MOE};
use crate::gguf_tokenizer::GgufTokenizer;

/// f32 as the shortest decimal that reads back to it, so config.json says 1e-05, not
/// 9.999999747378752e-06.
pub(super) fn f32_json(v: f32) -> serde_json::Value {
    let shortest: f64 = v.to_string().parse().unwrap_or(v as f64);
    json!(shortest)
}

pub(super) fn config_json(
    p: &LlamaParams,
    tok: &GgufTokenizer,
    tied: bool,
    dense_layers: &[usize],
    bias: bool,
) -> serde_json::Value {
    if let Some(gm) = &p.gemma {
        return gemma3_config_json(p, gm, tok, tied);
    }
    let (architecture, model_type) = p.family.hf_names();
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
        if p.family.is(QWEN3_MOE) {
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

/// Gemma 3's text config as HF transformers writes it (`Gemma3TextConfig`), with the legacy
/// rope fields (`rope_theta`, `rope_local_base_freq`, `rope_scaling`) and, agreeing with them,
/// the `rope_parameters` that transformers 5 saves (per layer type).
pub(super) fn gemma3_config_json(
    p: &LlamaParams,
    gm: &GemmaParams,
    tok: &GgufTokenizer,
    tied: bool,
) -> serde_json::Value {
    // llama.cpp's attention scale: 1/sqrt(hidden / heads) for the 62-layer 27B, else 1/sqrt(head_dim).
    let query_pre_attn_scalar = if p.layers == 62 { p.hidden / p.heads } else { p.head_dim };
    let rope_scaling = match gm.linear_factor {
        Some(f) => json!({ "rope_type": "linear", "factor": f32_json(f) }),
        None => serde_json::Value::Null,
    };
    let mut full = json!({ "rope_type": "default", "rope_theta": f32_json(p.rope_theta) });
    if let Some(f) = gm.linear_factor {
        full = json!({ "rope_type": "linear", "factor": f32_json(f), "rope_theta": f32_json(p.rope_theta) });
    }
    json!({
        "architectures": [named(GEMMA3).hf_names().0],
        "model_type": named(GEMMA3).hf_names().1,
        "vocab_size": tok.vocab.len(),
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "head_dim": p.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": f32_json(p.rms_eps),
        "query_pre_attn_scalar": query_pre_attn_scalar,
        "sliding_window": gm.sliding_window,
        "layer_types": GemmaParams::layer_types(p.layers),
        "rope_theta": f32_json(p.rope_theta),
        "rope_local_base_freq": f32_json(GemmaParams::LOCAL_ROPE_BASE),
        "rope_scaling": rope_scaling,
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": { "rope_type": "default", "rope_theta": f32_json(GemmaParams::LOCAL_ROPE_BASE) },
        },
        "max_position_embeddings": p.context,
        "tie_word_embeddings": tied,
        "final_logit_softcapping": gm.final_logit_softcapping.map(f32_json),
        "attn_logit_softcapping": null,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "bos_token_id": tok.bos_id,
        "eos_token_id": eos_json(p, tok),
        "pad_token_id": tok.pad_id,
        "torch_dtype": "bfloat16",
    })
}

/// `eos_token_id`: the file's EOS, except for Gemma 3, whose turn end also stops generation in
/// llama.cpp (and in HF's configs): a list there when it holds more than one id.
pub(super) fn eos_json(p: &LlamaParams, tok: &GgufTokenizer) -> serde_json::Value {
    match p.family.architecture {
        GEMMA3 => match tok.end_ids().as_slice() {
            [] => serde_json::Value::Null,
            [one] => json!(one),
            many => json!(many),
        },
        _ => json!(tok.eos_id),
    }
}

pub(super) fn tokenizer_config_json(tok: &GgufTokenizer, context: usize) -> serde_json::Value {
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
        "tokenizer_class": if tok.sentencepiece { "GemmaTokenizer" } else { "GPT2Tokenizer" },
        "unk_token": tok.token(tok.unk_id),
        "vocab_size": tok.vocab.len(),
    })
}

pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut text =
        serde_json::to_string_pretty(v).map_err(|e| Error::config(path, format!("cannot serialise: {e}")))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}
