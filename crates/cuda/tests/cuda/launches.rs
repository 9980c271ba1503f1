//! GPU-only: how many kernels one decode step launches per layer, and that the fused norms
//! change no bits.
//!
//! At one or two tokens (`fuses_norm`) a layer is 5 launches: the q/k/v GEMM with the input
//! norm in its prologue and rope and the KV write in its epilogue (head_dim 64 on the 64-wide
//! tiles, 128 on the 128-wide ones), attention (its last partition block combines), o adding
//! into the residual, the gate/up GEMM with the norm and silu, down adding into the residual.
//! Above that, 7: add_rms_norm runs between them. The unfused path launched about 30. Counted
//! by `CudaBackend::launches` around one forward of a seeded random bf16 model, at head_dim 64
//! (SmolLM2-135M's shape) and 128 (`tiny-hd128`: 4 layers, where qkv_proj then rope_kv_write
//! made 6 a layer and 8 above); `qkv_rope_kv_write` is also counted alone at both head_dims
//! (one launch up to 128 rows, two above: matmul_x) and held bitwise to the unfused ops. The fused
//! layer is built to give the unfused layer's bits (kernels/matmul.cu `norm_prologue`), so a
//! sequence's logits decoded alone (fused) equal its row in a three-token step (unfused), bit
//! for bit; and the model stores its matmul inputs in bf16 with the f32 activations' bits. Without a
//! driver each test prints SKIPPED (TANDEM_REQUIRE_CUDA=1 fails).

use tandem_core::backend::prelude::*;
use tandem_core::backend::{KvDest, KvGeometry};
use tandem_core::model::LoadOptions;
use tandem_core::weights::Weights;
use tandem_core::{DType, ForwardBatch, KvDtype, Model, ModelRunner};
use tandem_cuda::CudaBackend;
use tandem_model_files::random_model::Shape;

/// The shapes counted: head_dim 64 (the 64-wide rope epilogue) and 128 (the 128-wide one).
fn shapes() -> [Shape; 2] {
    [crate::shape_hd64(), Shape::TinyHd128]
}

fn model(test: &str, shape: Shape) -> Option<Model<CudaBackend>> {
    let gpu = crate::gpu_or_skip(test)?;
    let dir = crate::random_model(shape);
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 4, num_kv_blocks: 16, block_size: 16, ..Default::default() };
    Some(Model::<CudaBackend>::load(gpu, &dir, opts).unwrap())
}

fn prompt(seed: u32) -> Vec<u32> {
    (0..20).map(|i| (i * 7 + 3 + seed * 31) % 300).collect()
}

#[test]
fn decode_step_launches_five_kernels_per_layer_fused_and_seven_unfused() {
    for shape in shapes() {
        decode_step_launches(shape);
    }
}

fn decode_step_launches(shape: Shape) {
    let Some(mut model) = model("decode launches per layer", shape) else { return };
    let head_dim = model.config().head_dim;
    assert_eq!(head_dim, if shape == Shape::TinyHd128 { 128 } else { 64 }, "{}", shape.name());
    let layers = model.config().num_hidden_layers as u64;
    // Three sequences, blocks 2s and 2s + 1 each, prefilled together.
    let mut batch = ForwardBatch { max_blocks: 2, ..Default::default() };
    for s in 0..3u32 {
        batch.push_seq(&prompt(s), 0, &[2 * s, 2 * s + 1], 16, true);
    }
    model.forward_argmax(&batch).unwrap();
    let count = |model: &mut Model<CudaBackend>, seqs: u32| {
        let mut step = ForwardBatch { max_blocks: 2, ..Default::default() };
        for s in 0..seqs {
            step.push_seq(&[5], 20, &[2 * s, 2 * s + 1], 16, true);
        }
        let before = model.backend().launches();
        model.forward_argmax(&step).unwrap();
        model.backend().launches() - before
    };
    let (one, three) = (count(&mut model, 1), count(&mut model, 3));
    println!("{}: one decode step: {one} kernels at 1 token, {three} at 3 tokens, over {layers} layers (head_dim {head_dim})", shape.name());
    // Outside the layers: the embedding, layer 0's input norm, gather_rows of the logit rows, the
    // final norm, the lm_head GEMM, argmax; unfused also the last residual add.
    assert!(
        one <= 5 * layers + 6,
        "{}: {one} launches at 1 token for {layers} layers: more than 5 per layer (+ 6 outside)",
        shape.name()
    );
    assert!(
        three <= 7 * layers + 7,
        "{}: {three} launches at 3 tokens for {layers} layers: more than 7 per layer (+ 7 outside)",
        shape.name()
    );
}

#[test]
fn fused_norms_give_the_unfused_bits() {
    for shape in shapes() {
        fused_norms_bitwise(shape);
    }
}

fn fused_norms_bitwise(shape: Shape) {
    let Some(mut model) = model("fused norms bitwise", shape) else { return };
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
    assert!(
        model.backend().fuses_norm(model.config().hidden_size, 1)
            && !model.backend().fuses_norm(model.config().hidden_size, 3)
    );
    let same = a.iter().zip(&t[..vocab]).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "{}: sequence 0's logits differ between the fused (alone) and unfused (3-token) steps", shape.name());
}

/// The activations a matmul reads are stored in bf16 by default (`Storage::activation_dtype`)
/// and in f32 with `set_f32_activations`; the tokens' bits are the same (the stored value is
/// the GEMM's own rounding, kernels/common.cuh `store_act`): logits of a 200-token prefill
/// (the m128 tile kernel, no matmul_x pass) and of decode steps at 1 token (fused norms) and 3
/// (add_rms_norm), bit for bit, at head_dim 64 and 128.
#[test]
fn activations_stored_in_bf16_give_the_f32_bits() {
    for shape in shapes() {
        let Some(gpu16) = crate::gpu_or_skip("activations in bf16") else { return };
        let Some(mut gpu32) = crate::gpu_or_skip("activations in bf16") else { return };
        gpu32.set_f32_activations(true);
        let dir = crate::random_model(shape);
        let opts =
            LoadOptions { max_batch_tokens: 256, max_seqs: 4, num_kv_blocks: 64, block_size: 16, ..Default::default() };
        let mut m16 = Model::<CudaBackend>::load(gpu16, &dir, opts).unwrap();
        let mut m32 = Model::<CudaBackend>::load(gpu32, &dir, opts).unwrap();
        assert_eq!(m16.activation_dtypes().x, DType::BF16, "{}", shape.name());
        assert_eq!(
            (m16.activation_dtypes().act, m16.activation_dtypes().last_normed),
            (DType::BF16, DType::BF16),
            "{}",
            shape.name()
        );
        assert_eq!(m32.activation_dtypes().x, DType::F32, "{}", shape.name());
        let tables: Vec<Vec<u32>> = (0..3u32).map(|s| (16 * s..16 * s + 16).collect()).collect();
        let mut prefill = ForwardBatch { max_blocks: 16, ..Default::default() };
        prefill.push_seq(&(0..200u32).map(|i| (i * 13 + 1) % 300).collect::<Vec<_>>(), 0, &tables[0], 16, true);
        prefill.push_seq(&prompt(1), 0, &tables[1], 16, true);
        prefill.push_seq(&prompt(2), 0, &tables[2], 16, true);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert!(
            bits(m16.forward(&prefill).unwrap()) == bits(m32.forward(&prefill).unwrap()),
            "{}: prefill logits differ",
            shape.name()
        );
        for seqs in [1usize, 3] {
            let mut step = ForwardBatch { max_blocks: 16, ..Default::default() };
            for (s, table) in tables.iter().enumerate().take(seqs) {
                let pos = if s == 0 { 200 } else { 20 };
                step.push_seq(&[7 + s as u32], pos, table, 16, true);
            }
            assert!(
                bits(m16.forward(&step).unwrap()) == bits(m32.forward(&step).unwrap()),
                "{}: decode logits at {seqs} tokens differ",
                shape.name()
            );
        }
    }
}

/// `qkv_rope_kv_write` (the fused q/k/v weight of bf16 parts, with bias) is one launch at
/// head_dim 64 and 128 up to 128 rows, two above (matmul_x, then the tile kernel), and leaves
/// q and both caches (bf16 and f32) bitwise as qkv_proj then rope_kv_write leave them.
#[test]
fn qkv_rope_kv_write_is_one_launch_at_head_dim_64_and_128_with_the_unfused_bits() {
    let Some(b) = crate::gpu_or_skip("qkv_rope_kv_write launches") else { return };
    // Deterministic values in [-scale, scale): a weight's rows differ, no zeros.
    let vals = |len: usize, seed: u64, scale: f32| -> Vec<f32> {
        (0..len as u64)
            .map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
            .map(|v| v * scale)
            .collect()
    };
    for (hd, q_heads, kv_heads, hidden) in [(64, 8, 2, 512), (128, 8, 2, 1024)] {
        let g = KvGeometry { num_blocks: 16, block_size: 16, num_kv_heads: kv_heads, head_dim: hd };
        let (nq, nkv) = (q_heads * hd, kv_heads * hd);
        let mut ws = Weights::empty();
        for (i, (name, rows)) in [("q", nq), ("k", nkv), ("v", nkv)].into_iter().enumerate() {
            ws.replace(
                name,
                DType::BF16,
                &[rows, hidden],
                &vals(rows * hidden, i as u64, 1.0 / (hidden as f32).sqrt()),
            )
            .unwrap();
            ws.replace(&format!("{name}.bias"), DType::BF16, &[rows], &vals(rows, 10 + i as u64, 0.5)).unwrap();
        }
        let t = |name: &str, shape: &[usize]| ws.get(name, shape).unwrap();
        let (qw, kw, vw) = (t("q", &[nq, hidden]), t("k", &[nkv, hidden]), t("v", &[nkv, hidden]));
        let (qb, kb, vb) = (t("q.bias", &[nq]), t("k.bias", &[nkv]), t("v.bias", &[nkv]));
        let (w, bias) = b.fuse_qkv(&qw, &kw, &vw, Some([&qb, &kb, &vb])).unwrap().expect("bf16 q/k/v fuse on CUDA");
        let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 10000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
        let inv_freq = upload_f32(&b, &inv_freq);
        for kv_dtype in [KvDtype::Bf16, KvDtype::F32] {
            for (m, want_launches) in [(1usize, 1u64), (2, 1), (3, 1), (17, 1), (200, 2)] {
                let x = upload_f32(&b, &vals(m * hidden, 20 + m as u64, 1.0));
                let positions: Vec<u32> = (0..m as u32).map(|r| (r * 37 + 5) % 4000).collect();
                let slots: Vec<u32> = (0..m as u32).map(|r| (r * 7 + 3) % g.slots() as u32).collect();
                let (positions, slots) = (upload_u32(&b, &positions), upload_u32(&b, &slots));
                // Both caches start from the same values in every slot.
                let old = (vals(g.layer_elems(), 30, 1.0), vals(g.layer_elems(), 31, 1.0));
                let all: Vec<u32> = (0..g.slots() as u32).collect();
                let cache = || {
                    let (mut kc, mut vc) = (b.alloc_kv_as(g, kv_dtype).unwrap(), b.alloc_kv_as(g, kv_dtype).unwrap());
                    b.kv_write(
                        &upload_f32(&b, &old.0),
                        &upload_f32(&b, &old.1),
                        &mut kc,
                        &mut vc,
                        &upload_u32(&b, &all),
                        g.slots(),
                        g,
                    )
                    .unwrap();
                    (kc, vc)
                };
                let scratch = || {
                    (
                        upload_f32(&b, &vec![f32::NAN; m * nq]),
                        upload_f32(&b, &vec![f32::NAN; m * nkv]),
                        upload_f32(&b, &vec![f32::NAN; m * nkv]),
                    )
                };
                let ((mut kc, mut vc), (mut q, mut k, mut v)) = (cache(), scratch());
                let before = b.launches();
                let kv = KvDest {
                    k_cache: &mut kc,
                    v_cache: &mut vc,
                    positions: &positions,
                    inv_freq: &inv_freq,
                    slots: &slots,
                    geometry: g,
                };
                b.qkv_rope_kv_write(&x, &w, bias.as_ref(), &mut q, &mut k, &mut v, m, nq, hidden, None, kv).unwrap();
                let launches = b.launches() - before;
                let ((mut kc2, mut vc2), (mut q2, mut k2, mut v2)) = (cache(), scratch());
                b.qkv_proj(&x, &w, bias.as_ref(), &mut q2, &mut k2, &mut v2, m, nq, nkv, hidden, None).unwrap();
                b.rope_kv_write(
                    &mut q2, &mut k2, &v2, &mut kc2, &mut vc2, &positions, &inv_freq, &slots, m, q_heads, g,
                )
                .unwrap();
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                let what = format!("head_dim {hd}, m {m}, {kv_dtype:?} cache");
                assert_eq!(launches, want_launches, "{what}: qkv_rope_kv_write launched {launches} kernels");
                assert!(
                    bits(b.read_f32(&q, m * nq).unwrap()) == bits(b.read_f32(&q2, m * nq).unwrap()),
                    "{what}: q differs from qkv_proj + rope_kv_write"
                );
                assert!(
                    bits(b.read_kv(&kc, g).unwrap()) == bits(b.read_kv(&kc2, g).unwrap()),
                    "{what}: the K cache differs"
                );
                assert!(
                    bits(b.read_kv(&vc, g).unwrap()) == bits(b.read_kv(&vc2, g).unwrap()),
                    "{what}: the V cache differs"
                );
            }
        }
    }
}

fn upload_f32(b: &CudaBackend, data: &[f32]) -> <CudaBackend as Storage>::Buf {
    let mut buf = b.alloc_f32(data.len().max(1)).unwrap();
    b.write_f32(&mut buf, data).unwrap();
    buf
}

fn upload_u32(b: &CudaBackend, data: &[u32]) -> <CudaBackend as Storage>::Buf {
    let mut buf = b.alloc_u32(data.len().max(1)).unwrap();
    b.write_u32(&mut buf, data).unwrap();
    buf
}
