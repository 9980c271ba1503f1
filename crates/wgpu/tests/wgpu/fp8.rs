//! FP8 e4m3 weights kept in 8 bits on wgpu (shaders/quant_fp8.wgsl through the quantized
//! matmul and embedding): the embedding gives the reference's decoded rows bit for bit, a row's
//! matmul result is the same bits alone and in any batch and close to the reference's, and a
//! tiny bf16 model with FP8 projections (128 x 128 block scales, as Qwen3-*-FP8 ships) gives
//! the reference's greedy ids, where the reference kept in 8 bits gives the bits of the same
//! model widened to bf16 at load (what tandem did before) and holds fewer bytes.

use crate::common;

use std::path::PathBuf;

use common::{assert_close, Rng};
use tandem_core::backend::prelude::*;
use tandem_core::config::ModelConfig;
use tandem_core::fp8::{BLOCK_BYTES, BLOCK_ELEMS};
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::{Fp8Scales, QuantLayout};
use tandem_core::weights::Weights;
use tandem_core::{DType, ForwardBatch, Model, ModelRunner};
use tandem_reference::RefBackend;
use tandem_wgpu::WgpuBuf;

const LAYOUT: QuantLayout = QuantLayout::Fp8E4m3(Fp8Scales::Block);

/// `blocks` runs: a small positive f32 scale, then 32 random e4m3 bytes other than the NaNs.
fn random_runs(blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(blocks * BLOCK_BYTES);
    for _ in 0..blocks {
        let scale = (0.25 + rng.f32().abs()) / 4096.0;
        out.extend_from_slice(&scale.to_le_bytes());
        for _ in 0..BLOCK_ELEMS {
            let b = rng.next_u64() as u8;
            out.push(if b & 0x7f == 0x7f { b - 1 } else { b });
        }
    }
    out
}

fn upload<B: Backend>(b: &B, rows: usize, cols: usize, bytes: &[u8]) -> B::Buf {
    let mut ws = Weights::empty();
    ws.insert_quantized("w", LAYOUT, &[rows, cols], bytes, PathBuf::from("<test>")).unwrap();
    b.upload_weight(&ws.get("w", &[rows, cols]).unwrap()).unwrap()
}

fn matmul<B: Backend>(b: &B, x: &[f32], w: &B::Buf, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut xb = b.alloc_f32(x.len()).unwrap();
    b.write_f32(&mut xb, x).unwrap();
    let mut out = b.alloc_f32(m * n).unwrap();
    b.write_f32(&mut out, &vec![common::POISON; m * n]).unwrap();
    b.matmul(&xb, w, None, &mut out, m, n, k).unwrap();
    b.read_f32(&out, m * n).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn an_fp8_table_embeds_the_references_rows_bitwise() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("fp8 embedding");
    let (rows, hidden) = (37, 576);
    let bytes = random_runs(rows * hidden / BLOCK_ELEMS, &mut rng);
    let table = upload(b, rows, hidden, &bytes);
    let mut all = vec![0f32; rows * hidden];
    LAYOUT.dequantize(&bytes, &mut all).unwrap();
    assert_eq!(bits(&b.read_f32(&table, rows * hidden).unwrap()), bits(&all), "read back");
    let ids = [36u32, 0, 5, 5, 17];
    let mut id_buf = b.alloc_u32(ids.len()).unwrap();
    b.write_u32(&mut id_buf, &ids).unwrap();
    let mut out: WgpuBuf = b.alloc_f32(ids.len() * hidden).unwrap();
    b.embedding(&table, &id_buf, &mut out, ids.len(), hidden).unwrap();
    let got = b.read_f32(&out, ids.len() * hidden).unwrap();
    let want: Vec<f32> = ids.iter().flat_map(|&i| all[i as usize * hidden..][..hidden].to_vec()).collect();
    assert_eq!(bits(&got), bits(&want), "the decoder's bits are the reference's");
}

/// A row's result does not depend on how many rows are in the matmul, and is the reference's
/// to f32 rounding (the same decoded weights, dotted in another order).
#[test]
fn an_fp8_rows_result_is_the_same_bits_alone_and_in_a_batch() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("fp8 batch invariance");
    let (n, k) = (45, 576);
    let bytes = random_runs(n * k / BLOCK_ELEMS, &mut rng);
    let w = upload(b, n, k, &bytes);
    let x = rng.vec(37 * k, 1.0);
    let all = matmul(b, &x, &w, 37, n, k);
    let r = RefBackend::new();
    let want: Vec<f64> = matmul(&r, &x, &upload(&r, n, k, &bytes), 37, n, k).iter().map(|&v| v as f64).collect();
    assert_close("fp8 matmul against the reference", &all, &want, 1e-10);
    for (row, m) in [(0, 1), (1, 2), (2, 3), (12, 11)] {
        let got = matmul(b, &x[(row + 1 - m) * k..(row + 1) * k], &w, m, n, k);
        assert_eq!(bits(&got[(m - 1) * n..]), bits(&all[row * n..(row + 1) * n]), "row {row} m {m}");
    }
}

/// Logits of a prefill of two sequences then decode steps, and the greedy ids they pick.
fn run<B: Backend>(model: &mut Model<B>, steps: usize) -> (Vec<Vec<f32>>, Vec<Vec<u32>>) {
    let vocab = model.config().vocab_size;
    let mut seqs: Vec<Vec<u32>> = vec![vec![5, 40, 41, 42, 97, 3, 200], vec![9, 8, 7, 120, 121]];
    let mut logits = vec![];
    for step in 0..steps {
        let mut batch = ForwardBatch { max_blocks: 4, ..Default::default() };
        for (s, toks) in seqs.iter().enumerate() {
            let blocks = [s as u32 * 4, s as u32 * 4 + 1, s as u32 * 4 + 2, s as u32 * 4 + 3];
            let start = if step == 0 { 0 } else { toks.len() - 1 };
            batch.push_seq(&toks[start..], start, &blocks, 16, true);
        }
        let out = model.forward(&batch).unwrap();
        for (s, row) in out.chunks_exact(vocab).enumerate() {
            seqs[s].push(tandem_core::backend::argmax_row(row));
        }
        logits.push(out);
    }
    (logits, seqs)
}

#[test]
fn a_bf16_model_with_fp8_projections_is_kept_in_8_bits_and_gives_the_widened_ids() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-fp8-model-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let shape = tandem_model_files::random_model::Shape::parse("tiny").unwrap();
    tandem_model_files::random_model::write_random_model(&dir, shape, 21, DType::BF16).unwrap();
    tandem_model_files::fp8::quantize_dir(&dir, [128, 128]).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let kept = Weights::open(&dir).unwrap();
    let layouts: Vec<QuantLayout> = kept.quantized().map(|(_, l)| l).collect();
    assert!(!layouts.is_empty() && layouts.iter().all(|l| matches!(l, QuantLayout::Fp8E4m3(_))), "{layouts:?}");
    // The same model as tandem loaded it before: every kept weight widened to bf16.
    let mut widened = Weights::open(&dir).unwrap();
    let names: Vec<String> = kept.quantized().map(|(n, _)| n.to_string()).collect();
    for name in &names {
        let shape = kept.shape(name).unwrap().to_vec();
        widened.replace(name, DType::BF16, &shape, &kept.get(name, &shape).unwrap().to_f32()).unwrap();
    }
    assert_eq!(widened.quantized().count(), 0);
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 2, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let mut on_ref = Model::from_weights(RefBackend::new(), cfg.clone(), &kept, opts).unwrap();
    let mut on_ref_wide = Model::from_weights(RefBackend::new(), cfg.clone(), &widened, opts).unwrap();
    let (held, held_wide) = (on_ref.weights_bytes().unwrap(), on_ref_wide.weights_bytes().unwrap());
    assert!(held < held_wide, "kept {held} bytes, widened {held_wide}");
    let (ref_logits, ref_ids) = run(&mut on_ref, 6);
    let (wide_logits, wide_ids) = run(&mut on_ref_wide, 6);
    assert_eq!(ref_ids, wide_ids, "greedy ids kept and widened");
    for (step, (a, w)) in ref_logits.iter().zip(&wide_logits).enumerate() {
        assert_eq!(bits(a), bits(w), "reference logits kept and widened, step {step}");
    }
    let Some(gpu) = common::open(Default::default()) else { return };
    let mut on_wgpu = Model::from_weights(gpu, cfg, &kept, opts).unwrap();
    let (gpu_logits, gpu_ids) = run(&mut on_wgpu, 6);
    assert_eq!(gpu_ids, ref_ids, "greedy ids on wgpu and the reference");
    for (step, (g, r)) in gpu_logits.iter().zip(&ref_logits).enumerate() {
        let want: Vec<f64> = r.iter().map(|&v| v as f64).collect();
        assert_close(&format!("fp8 model step {step}"), g, &want, 1e-7);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
