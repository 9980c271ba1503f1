//! How much device memory the KV pool gets, as vLLM's `--gpu-memory-utilization` means it:
//! the fraction of the device's TOTAL memory for weights, activations, per-step workspace and
//! KV together. The model measures free memory before its weights, after them, and after every
//! buffer a step uses was allocated ([`crate::backend::Device::reserve_workspace`]); the KV pool
//! gets what is left of `total * utilization` ([`plan_kv_blocks`]). Nothing a step uses is
//! allocated later, so nothing runs out of memory mid-serving.

/// Free-memory readings around a load, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    pub total: u64,
    /// Before the first weight: the CUDA context and other processes hold `total - this`.
    pub free_before_weights: u64,
    pub free_after_weights: u64,
    /// After activations, logits and workspace for the engine's limits.
    pub free_now: u64,
}

impl DeviceMemory {
    pub fn weights(&self) -> u64 {
        self.free_before_weights.saturating_sub(self.free_after_weights)
    }
    /// Activations, logits and per-step workspace.
    pub fn activations(&self) -> u64 {
        self.free_after_weights.saturating_sub(self.free_now)
    }
    /// The context and whatever else shares the device.
    pub fn other(&self) -> u64 {
        self.total.saturating_sub(self.free_before_weights)
    }
}

/// What the KV pool must and may hold.
#[derive(Debug, Clone, Copy)]
pub struct KvNeed {
    /// Bytes of one block, K and V of every layer.
    pub block_bytes: u64,
    /// Fewest blocks worth serving: one sequence at the context limit.
    pub min_blocks: usize,
    /// More than this is never used (every sequence at the context limit).
    pub max_blocks: usize,
    /// The context limit behind `min_blocks`, for the message.
    pub max_context: usize,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// KV blocks for `util` of `m.total`, or why start-up cannot fit and what to change.
pub fn plan_kv_blocks(m: &DeviceMemory, util: f32, need: &KvNeed) -> Result<usize, String> {
    if !(util > 0.0 && util <= 1.0) {
        return Err(format!("gpu_memory_utilization = {util}: expected a fraction in (0, 1]"));
    }
    if need.block_bytes == 0 {
        return Err("a KV block of 0 bytes".into());
    }
    // As the decimal the user wrote: 0.9f32 is 0.89999998, a block short on a round total.
    let frac = (util as f64 * 1e6).round() / 1e6;
    let limit = (m.total as f64 * frac) as u64;
    let used = m.total.saturating_sub(m.free_now);
    // Never more than is free now, whatever the fraction says (another process may hold some).
    let budget = limit.saturating_sub(used).min(m.free_now);
    let blocks = ((budget / need.block_bytes) as usize).min(need.max_blocks);
    if blocks < need.min_blocks.max(1) {
        let want = need.min_blocks.max(1) as u64 * need.block_bytes;
        return Err(format!(
            "not enough device memory for the KV cache: gpu_memory_utilization {util} of {} total is {}; the weights take {}, activations and step workspace {}, the context and other processes {}, leaving {} for KV, but one sequence of {} tokens needs {}. Lower max_num_seqs or max_num_batched_tokens (the workspace grows with them), lower max_model_len, or raise gpu_memory_utilization",
            gib(m.total),
            gib(limit),
            gib(m.weights()),
            gib(m.activations()),
            gib(m.other()),
            gib(budget),
            need.max_context,
            gib(want),
        ));
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn mem(total: u64, other: u64, weights: u64, act: u64) -> DeviceMemory {
        let free_before_weights = total - other;
        let free_after_weights = free_before_weights - weights;
        DeviceMemory { total, free_before_weights, free_after_weights, free_now: free_after_weights - act }
    }

    fn need(block_bytes: u64, min_blocks: usize) -> KvNeed {
        KvNeed { block_bytes, min_blocks, max_blocks: usize::MAX, max_context: min_blocks * 16 }
    }

    /// An H200-like device: 0.9 of 140 GiB less 1 GiB context, 2.5 GiB weights, 1.5 GiB
    /// workspace leaves 121 GiB of KV, counted against TOTAL memory, not free memory.
    #[test]
    fn the_fraction_is_of_total_memory() {
        let m = mem(140 * GIB, GIB, 5 * GIB / 2, 3 * GIB / 2);
        let blocks = plan_kv_blocks(&m, 0.9, &need(GIB / 64, 1)).unwrap();
        let want = ((140.0 * 0.9 - 5.0) * 64.0) as usize;
        assert_eq!(blocks, want);
        // At utilization 1.0 it takes all that is free, never more.
        assert_eq!(plan_kv_blocks(&m, 1.0, &need(GIB / 64, 1)).unwrap(), 135 * 64);
        assert_eq!(m.weights(), 5 * GIB / 2);
        assert_eq!(m.activations(), 3 * GIB / 2);
        assert_eq!(m.other(), GIB);
    }

    #[test]
    fn a_pool_never_exceeds_what_can_be_used() {
        let m = mem(80 * GIB, GIB, GIB, GIB);
        let n = KvNeed { block_bytes: 1 << 20, min_blocks: 8, max_blocks: 100, max_context: 128 };
        assert_eq!(plan_kv_blocks(&m, 0.9, &n).unwrap(), 100);
    }

    /// Weights and workspace beyond the fraction: refused, with the numbers and what to lower.
    #[test]
    fn start_up_that_cannot_fit_says_what_to_lower() {
        let m = mem(24 * GIB, GIB, 16 * GIB, 5 * GIB);
        let e = plan_kv_blocks(&m, 0.9, &need(1 << 20, 1)).unwrap_err();
        for part in [
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "raise gpu_memory_utilization",
            "weights take 16.00 GiB",
            "workspace 5.00 GiB",
        ] {
            assert!(e.contains(part), "`{part}` missing from: {e}");
        }
        // Room for some blocks but not one sequence at the context limit: refused too.
        let m = mem(24 * GIB, GIB, 16 * GIB, GIB);
        let e =
            plan_kv_blocks(&m, 0.9, &KvNeed { block_bytes: GIB, min_blocks: 8, max_blocks: 1000, max_context: 131072 })
                .unwrap_err();
        assert!(e.contains("131072 tokens needs 8.00 GiB"), "{e}");
        assert!(plan_kv_blocks(
            &m,
            0.9,
            &KvNeed { block_bytes: GIB, min_blocks: 3, max_blocks: 1000, max_context: 48 }
        )
        .is_ok());
    }

    #[test]
    fn another_process_holding_memory_caps_the_pool_at_free() {
        // 60 GiB held elsewhere: 0.9 * 80 = 72 minus 60 + 2 used leaves 10 GiB, and 18 are free.
        let m = mem(80 * GIB, 60 * GIB, GIB, GIB);
        assert_eq!(plan_kv_blocks(&m, 0.9, &need(GIB, 1)).unwrap(), 10);
        assert!(plan_kv_blocks(&m, 0.7, &need(GIB, 1)).is_err(), "0.7 of 80 is less than what is already used");
    }

    #[test]
    fn utilization_outside_0_1_is_refused() {
        let m = mem(80 * GIB, GIB, GIB, GIB);
        for u in [0.0, -0.5, 1.5, f32::NAN] {
            assert!(plan_kv_blocks(&m, u, &need(GIB, 1)).unwrap_err().contains("gpu_memory_utilization"), "{u}");
        }
    }
}

/// KV pool size for backends that cannot report free memory (reference, wgpu).
pub const AUTO_KV_BYTES: u64 = 1 << 30;

/// Bytes of one KV block: K and V, every layer, `block_size` tokens of `kv_heads * head_dim`
/// elements of `dtype`. A bf16 cache's block is half an f32 one, so the same memory holds twice
/// the blocks.
pub fn kv_block_bytes(cfg: &crate::config::ModelConfig, block_size: usize, dtype: crate::backend::KvDtype) -> u64 {
    (2 * cfg.num_hidden_layers * block_size * cfg.kv_dim() * dtype.size()) as u64
}

/// The pool's block count: planned from the device's memory where it was measured
/// ([`plan_kv_blocks`]), else [`AUTO_KV_BYTES`] worth, never more than `need.max_blocks`.
pub fn kv_pool_blocks(
    measured: Option<&DeviceMemory>,
    gpu_memory_utilization: f32,
    need: &KvNeed,
) -> std::result::Result<usize, String> {
    let blocks = match measured {
        Some(m) => plan_kv_blocks(m, gpu_memory_utilization, need)?,
        None => ((AUTO_KV_BYTES / need.block_bytes.max(1)) as usize).min(need.max_blocks),
    };
    if blocks == 0 {
        return Err(format!("AUTO_KV_BYTES holds no KV block of {} bytes; pass num_kv_blocks", need.block_bytes));
    }
    Ok(blocks)
}

#[cfg(test)]
mod kv_pool_tests {
    use super::*;
    use crate::backend::KvDtype;
    use crate::config::ModelConfig;

    const GIB: u64 = 1 << 30;

    /// Llama-3.2-1B's KV shape: 16 layers, 8 kv heads of 64.
    fn llama_1b() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":2048,"intermediate_size":8192,"num_hidden_layers":16,
            "num_attention_heads":32,"num_key_value_heads":8,"head_dim":64,"vocab_size":128256,"max_position_embeddings":131072}"#,
        )
        .unwrap()
    }

    /// 2 x layers x kv_heads x head_dim x element size per token: 64 KiB (f32) and 32 KiB (bf16)
    /// for this shape, so the same memory holds exactly twice the bf16 blocks, on a measured
    /// device and where the backend cannot tell (AUTO_KV_BYTES).
    #[test]
    fn a_bf16_pool_has_twice_the_blocks_of_an_f32_one() {
        let c = llama_1b();
        assert_eq!(kv_block_bytes(&c, 16, KvDtype::F32), 16 * 2 * 16 * 512 * 4);
        assert_eq!(kv_block_bytes(&c, 16, KvDtype::Bf16), 16 * 2 * 16 * 512 * 2);
        // An H200-like device: 0.9 of 140 GiB less 1 GiB context, 2.5 GiB weights, 1.5 GiB workspace.
        let m = DeviceMemory {
            total: 140 * GIB,
            free_before_weights: 139 * GIB,
            free_after_weights: 139 * GIB - 5 * GIB / 2,
            free_now: 135 * GIB,
        };
        let blocks = |dtype: KvDtype, measured: Option<&DeviceMemory>| {
            let need = KvNeed {
                block_bytes: kv_block_bytes(&c, 16, dtype),
                min_blocks: 8,
                max_blocks: usize::MAX,
                max_context: 128,
            };
            kv_pool_blocks(measured, 0.9, &need).unwrap()
        };
        let (f32_blocks, bf16_blocks) = (blocks(KvDtype::F32, Some(&m)), blocks(KvDtype::Bf16, Some(&m)));
        assert_eq!(f32_blocks, ((140.0 * 0.9 - 5.0) * GIB as f64) as usize / (16 * 2 * 16 * 512 * 4));
        assert_eq!(bf16_blocks, 2 * f32_blocks, "{bf16_blocks} bf16 blocks vs {f32_blocks} f32");
        assert_eq!(blocks(KvDtype::F32, None), 1024);
        assert_eq!(blocks(KvDtype::Bf16, None), 2048);
        // An fp8 cache's element is one byte: twice bf16's blocks in the same memory.
        for fp8 in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            assert_eq!(kv_block_bytes(&c, 16, fp8), 16 * 2 * 16 * 512);
            assert_eq!(blocks(fp8, Some(&m)), 2 * bf16_blocks);
            assert_eq!(blocks(fp8, None), 4096);
        }
        // A pool that could not hold one sequence in f32 can in bf16.
        let need = |dtype| KvNeed {
            block_bytes: kv_block_bytes(&c, 16, dtype),
            min_blocks: 24000,
            max_blocks: usize::MAX,
            max_context: 384000,
        };
        let small = DeviceMemory {
            total: 24 * GIB,
            free_before_weights: 23 * GIB,
            free_after_weights: 21 * GIB,
            free_now: 20 * GIB,
        };
        assert!(kv_pool_blocks(Some(&small), 0.9, &need(KvDtype::F32)).is_err());
        assert!(kv_pool_blocks(Some(&small), 0.9, &need(KvDtype::Bf16)).is_ok());
    }
}
