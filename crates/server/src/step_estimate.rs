//! The step estimate: vLLM's `vllm:estimated_flops_per_gpu_total`,
//! `vllm:estimated_read_bytes_per_gpu_total` and `vllm:estimated_write_bytes_per_gpu_total`,
//! an analytic count of the work the engine's steps did, from the model's shape and the
//! engine's counts of tokens, attention keys and KV rows (one GPU: no tensor parallelism).
//!
//! - FLOPs: 2 per weight per token computed (every linear layer, the LM head included, as if
//!   each token got a logit row), plus 4 per layer, query head, head dimension and key
//!   attended (the scores and the weighted sum of values).
//! - Bytes read: every weight once a step (all experts of a MoE layer), and each step's
//!   sequences' KV context once per layer.
//! - Bytes written: the K and V rows of every token computed.
//!
//! Weights and KV are counted at the checkpoint's dtype (2 bytes unless it says float32).
//! Unlike vLLM's estimate (`vllm/v1/metrics/perf.py`), activations, norms, rotary embeddings
//! and the embedding gather are not counted, and the KV cache's own dtype is not known here:
//! these are floors, as the benchmarks' roofline estimates are.

use tandem_core::ModelConfig;

/// The engine's cumulative counts the estimate is made from.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepCounts {
    /// Steps that computed anything.
    pub steps: u64,
    /// Tokens computed (prompt chunks and decodes).
    pub tokens: u64,
    /// Keys attended, summed over the tokens computed.
    pub attended_keys: u64,
    /// KV rows read, summed over each step's sequences.
    pub kv_rows_read: u64,
}

/// Cumulative estimates: FLOPs, bytes read, bytes written.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepEstimate {
    pub flops: f64,
    pub read_bytes: f64,
    pub write_bytes: f64,
}

/// Weights a token passes through (the active experts only), and all the weights there are.
fn weights(cfg: &ModelConfig) -> (f64, f64) {
    let (h, layers) = (cfg.hidden_size as f64, cfg.num_hidden_layers as f64);
    let q = (cfg.num_attention_heads * cfg.head_dim) as f64;
    let kv = (cfg.num_key_value_heads * cfg.head_dim) as f64;
    let attention = h * q + 2.0 * h * kv + q * h;
    let dense_mlp = 3.0 * h * cfg.intermediate_size as f64;
    let (active_mlp, all_mlp) = match &cfg.moe {
        None => (dense_mlp * layers, dense_mlp * layers),
        Some(m) => {
            let dense = m.dense_layers.len().min(cfg.num_hidden_layers) as f64;
            let sparse = layers - dense;
            let expert = 3.0 * h * m.intermediate_size as f64;
            let router = h * m.num_experts as f64;
            (
                dense * dense_mlp + sparse * (router + m.top_k as f64 * expert),
                dense * dense_mlp + sparse * (router + m.num_experts as f64 * expert),
            )
        }
    };
    let head = h * cfg.vocab_size as f64;
    (attention * layers + active_mlp + head, attention * layers + all_mlp + head)
}

fn dtype_bytes(cfg: &ModelConfig) -> f64 {
    match cfg.dtype.as_deref() {
        Some("float32") => 4.0,
        _ => 2.0,
    }
}

/// The estimate for the engine's counts so far.
pub fn estimate(cfg: &ModelConfig, c: &StepCounts) -> StepEstimate {
    let (active, all) = weights(cfg);
    let layers = cfg.num_hidden_layers as f64;
    let bytes = dtype_bytes(cfg);
    let attention_flops = 4.0 * layers * (cfg.num_attention_heads * cfg.head_dim) as f64;
    // K and V of one token in every layer.
    let kv_row = 2.0 * layers * (cfg.num_key_value_heads * cfg.head_dim) as f64 * bytes;
    StepEstimate {
        flops: 2.0 * active * c.tokens as f64 + attention_flops * c.attended_keys as f64,
        read_bytes: all * bytes * c.steps as f64 + kv_row * c.kv_rows_read as f64,
        write_bytes: kv_row * c.tokens as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A two-layer model: the counts by hand.
    #[test]
    fn estimate_counts_weights_attention_and_kv() {
        let json = r#"{"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 4,
            "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1, "head_dim": 2, "max_position_embeddings": 64,
            "torch_dtype": "bfloat16"}"#;
        let cfg = ModelConfig::from_json(json).unwrap();
        // Per layer: q 4x4, k and v 4x2 each, o 4x4 = 48; MLP 3x4x8 = 96. Head 4x10 = 40.
        let w = 2.0 * (48.0 + 96.0) + 40.0;
        assert_eq!(weights(&cfg), (w, w));
        // One prefill of 3 tokens (1 + 2 + 3 keys) in one step.
        let c = StepCounts { steps: 1, tokens: 3, attended_keys: 6, kv_rows_read: 3 };
        let e = estimate(&cfg, &c);
        let kv_row = 2.0 * 2.0 * 2.0 * 2.0;
        assert_eq!(e.flops, 2.0 * w * 3.0 + 4.0 * 2.0 * 4.0 * 6.0);
        assert_eq!(e.read_bytes, w * 2.0 + kv_row * 3.0);
        assert_eq!(e.write_bytes, kv_row * 3.0);
    }
}
