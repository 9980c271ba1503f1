//! GPU-only: the routed mixture of experts (crates/cuda/src/moe.rs, the default) gives the
//! every-expert path's bits (`set_moe_routed(false)`, TANDEM_CUDA_MOE=dense) on whole models:
//! tiny-qwen3-moe (8 experts, top 2) in bf16 (the tensor-core grouped GEMM) and f32 (the SIMT
//! one), tiny-mixtral (4 experts, top 2) in bf16; logits of a prefill of three sequences and of
//! decode steps at 1 and 3 tokens, bit for bit; and a sequence decoded alone has the bits of its
//! row among others (batch invariance). Without a driver each test prints SKIPPED
//! (TANDEM_REQUIRE_CUDA=1 fails).

use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelRunner};
use tandem_cuda::CudaBackend;
use tandem_model_files::random_model::{write_random_model, Shape};

#[test]
fn routed_experts_give_the_every_expert_bits() {
    for (shape, dtype) in
        [(Shape::TinyQwen3Moe, DType::BF16), (Shape::TinyQwen3Moe, DType::F32), (Shape::TinyMixtral, DType::BF16)]
    {
        let Some(routed) = crate::gpu_or_skip("routed experts") else { return };
        let Some(mut dense) = crate::gpu_or_skip("routed experts") else { return };
        dense.set_moe_routed(false);
        let name = format!("{} {dtype:?}", shape.name());
        let dir =
            std::env::temp_dir().join(format!("tandem-cuda-moe-{}-{dtype:?}-{}", shape.name(), std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_random_model(&dir, shape, 5, dtype).unwrap();
        let opts = LoadOptions {
            max_batch_tokens: 128,
            max_seqs: 4,
            num_kv_blocks: 32,
            block_size: 16,
            graphs: false,
            ..Default::default()
        };
        let mut mr = Model::<CudaBackend>::load(routed, &dir, opts).unwrap();
        let mut md = Model::<CudaBackend>::load(dense, &dir, opts).unwrap();
        let tables: Vec<Vec<u32>> = (0..3u32).map(|s| (8 * s..8 * s + 8).collect()).collect();
        let lens = [40u32, 5, 9];
        let mut prefill = ForwardBatch { max_blocks: 8, ..Default::default() };
        for (s, table) in tables.iter().enumerate() {
            let toks: Vec<u32> = (0..lens[s]).map(|i| (i * 7 + 3 * s as u32 + 1) % 300).collect();
            prefill.push_seq(&toks, 0, table, 16, true);
        }
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert!(
            bits(mr.forward(&prefill).unwrap()) == bits(md.forward(&prefill).unwrap()),
            "{name}: prefill logits differ between routed and dense"
        );
        let mut rows = Vec::new();
        for seqs in [1usize, 3] {
            let mut step = ForwardBatch { max_blocks: 8, ..Default::default() };
            for (s, table) in tables.iter().enumerate().take(seqs) {
                step.push_seq(&[11 + s as u32], lens[s] as usize, table, 16, true);
            }
            let r = bits(mr.forward(&step).unwrap());
            assert!(
                r == bits(md.forward(&step).unwrap()),
                "{name}: decode logits at {seqs} tokens differ between routed and dense"
            );
            rows.push(r);
        }
        let vocab = rows[0].len();
        assert!(rows[0] == rows[1][..vocab], "{name}: sequence 0's routed logits alone differ from its row among 3");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
