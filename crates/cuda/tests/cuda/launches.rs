//! GPU-only: how many kernels one decode step launches per layer, and that the fused norms
//! change no bits.
//!
//! At one or two tokens (`fuses_norm`) a layer is 5 launches: the q/k/v GEMM with the input
//! norm in its prologue and rope and the KV write in its epilogue (head_dim 64 fits its
//! tiles), attention (its last partition block combines), o adding into the residual, the
//! gate/up GEMM with the norm and silu, down adding into the residual. Above that, 7:
//! add_rms_norm runs between them. The unfused path launched about 30. Counted
//! by `CudaBackend::launches` around one forward of a seeded random bf16 model. The fused
//! layer is built to give the unfused layer's bits (kernels/matmul.cu `norm_prologue`), so a
//! sequence's logits decoded alone (fused) equal its row in a three-token step (unfused), bit
//! for bit. Without a driver each test prints SKIPPED (TANDEM_REQUIRE_CUDA=1 fails).

use tandem_core::backend::Backend;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, LlamaModel, ModelRunner};
use tandem_cuda::CudaBackend;
use tandem_models::random_model::{write_random_model, Shape};

fn model(test: &str) -> Option<(LlamaModel<CudaBackend>, std::path::PathBuf)> {
    let gpu = crate::gpu_or_skip(test)?;
    let dir = std::env::temp_dir().join(format!("tandem-cuda-launches-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Smollm2_135m, 7, DType::BF16).unwrap();
    let opts = LoadOptions { max_batch_tokens: 64, max_seqs: 4, num_kv_blocks: 16, block_size: 16, ..Default::default() };
    Some((LlamaModel::<CudaBackend>::load(gpu, &dir, opts).unwrap(), dir))
}

fn prompt(seed: u32) -> Vec<u32> {
    (0..20).map(|i| (i * 7 + 3 + seed * 31) % 300).collect()
}

#[test]
fn decode_step_launches_five_kernels_per_layer_fused_and_seven_unfused() {
    let Some((mut model, dir)) = model("decode launches per layer") else { return };
    let layers = model.config().num_hidden_layers as u64;
    // Three sequences, blocks 2s and 2s + 1 each, prefilled together.
    let mut batch = ForwardBatch { max_blocks: 2, ..Default::default() };
    for s in 0..3u32 {
        batch.push_seq(&prompt(s), 0, &[2 * s, 2 * s + 1], 16, true);
    }
    model.forward_argmax(&batch).unwrap();
    let count = |model: &mut LlamaModel<CudaBackend>, seqs: u32| {
        let mut step = ForwardBatch { max_blocks: 2, ..Default::default() };
        for s in 0..seqs {
            step.push_seq(&[5], 20, &[2 * s, 2 * s + 1], 16, true);
        }
        let before = model.backend().launches();
        model.forward_argmax(&step).unwrap();
        model.backend().launches() - before
    };
    let (one, three) = (count(&mut model, 1), count(&mut model, 3));
    println!("one decode step: {one} kernels at 1 token, {three} at 3 tokens, over {layers} layers");
    // Outside the layers: the embedding, layer 0's input norm, gather_rows of the logit rows, the
    // final norm, the lm_head GEMM, argmax; unfused also the last residual add.
    assert!(one <= 5 * layers + 6, "{one} launches at 1 token for {layers} layers: more than 5 per layer (+ 6 outside)");
    assert!(three <= 7 * layers + 7, "{three} launches at 3 tokens for {layers} layers: more than 7 per layer (+ 7 outside)");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fused_norms_give_the_unfused_bits() {
    let Some((mut model, dir)) = model("fused norms bitwise") else { return };
    let vocab = model.config().vocab_size;
    let mut batch = ForwardBatch { max_blocks: 2, ..Default::default() };
    for s in 0..3u32 {
        batch.push_seq(&prompt(s), 0, &[2 * s, 2 * s + 1], 16, true);
    }
    model.forward(&batch).unwrap();
    // Sequence 0's next token alone (1 token: fused) and beside two others (3 tokens: unfused);
    // each rewrites the same K/V into the same slot.
    let mut alone = ForwardBatch { max_blocks: 2, ..Default::default() };
    alone.push_seq(&[9], 20, &[0, 1], 16, true);
    let a = model.forward(&alone).unwrap();
    let mut three = ForwardBatch { max_blocks: 2, ..Default::default() };
    for s in 0..3u32 {
        three.push_seq(&[9], 20, &[2 * s, 2 * s + 1], 16, true);
    }
    let t = model.forward(&three).unwrap();
    assert!(model.backend().fuses_norm(model.config().hidden_size, 1) && !model.backend().fuses_norm(model.config().hidden_size, 3));
    let same = a.iter().zip(&t[..vocab]).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "sequence 0's logits differ between the fused (alone) and unfused (3-token) steps");
    let _ = std::fs::remove_dir_all(&dir);
}
