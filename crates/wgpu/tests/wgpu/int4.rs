//! Int4 weights (AWQ, GPTQ, compressed-tensors, converted at load into `tandem_core::int4`'s
//! blocks) on wgpu (shaders/quant_int4.wgsl through quant_matmul.wgsl): the matmul gives the
//! dequantized weight's product, a row's result is the same bits alone and in any batch, and
//! the three tiny checkpoints of tests/golden/int4 (whose reference run equals HF transformers'
//! greedy ids: crates/conformance int4_reference.rs) give the reference's logits and greedy ids,
//! holding about half a byte a weight.

use crate::common;

use std::path::{Path, PathBuf};

use common::{assert_close, Rng};
use tandem_core::backend::prelude::*;
use tandem_core::config::ModelConfig;
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_core::DType;
use tandem_core::{ForwardBatch, Model, ModelRunner};
use tandem_reference::RefBackend;
use tandem_wgpu::buffer::{Texels, TEXEL_ROW};
use tandem_wgpu::quant_split::QuantSplit;
use tandem_wgpu::{WgpuBackend, WgpuBuf};

/// `n` rows of `k` int4 values in groups of `group`: random nibbles, zero points in 0..=15 and
/// small positive scales.
fn random_int4(n: usize, k: usize, group: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = QuantLayout::Int4Group { group }.block_bytes();
    let mut out: Vec<u8> = (0..n * k / group * bb).map(|_| rng.next_u64() as u8).collect();
    for block in out.chunks_exact_mut(bb) {
        let s = (0.25 + rng.f32().abs()) / (16.0 * (k as f32).sqrt());
        block[..4].copy_from_slice(&s.to_le_bytes());
        block[4] %= 16;
        block[5..8].fill(0);
    }
    out
}

fn upload<B: Backend>(b: &B, group: usize, n: usize, k: usize, bytes: &[u8]) -> B::Buf {
    let mut ws = Weights::empty();
    ws.insert_quantized("w", QuantLayout::Int4Group { group }, &[n, k], bytes, PathBuf::from("<test>")).unwrap();
    b.upload_weight(&ws.get("w", &[n, k]).unwrap()).unwrap()
}

fn f32_buf(b: &WgpuBackend, data: &[f32]) -> WgpuBuf {
    let mut buf = b.alloc_f32(data.len()).unwrap();
    b.write_f32(&mut buf, data).unwrap();
    buf
}

fn matmul(b: &WgpuBackend, x: &[f32], w: &WgpuBuf, m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = f32_buf(b, &vec![common::POISON; m * n]);
    b.matmul(&f32_buf(b, x), w, None, &mut out, m, n, k).unwrap();
    b.read_f32(&out, m * n).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The weight reads back as core's decoder gives it, and the matmul is its product (f64 on
/// the host) to f32 rounding, at decode and prefill, groups of 32 and 128.
#[test]
fn an_int4_matmul_is_the_dequantized_weights_product() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("int4 matmul");
    for (group, m, n, k) in [(32, 1, 45, 256), (128, 5, 33, 512), (32, 37, 7, 96)] {
        let layout = QuantLayout::Int4Group { group };
        let bytes = random_int4(n, k, group, &mut rng);
        let w = upload(b, group, n, k, &bytes);
        let mut values = vec![0f32; n * k];
        layout.dequantize(&bytes, &mut values).unwrap();
        assert_eq!(b.read_f32(&w, n * k).unwrap(), values, "{} read back", layout.name());
        let x = rng.vec(m * k, 1.0);
        let want: Vec<f64> =
            (0..m * n).map(|i| (0..k).map(|j| x[i / n * k + j] as f64 * values[i % n * k + j] as f64).sum()).collect();
        assert_close(&format!("{} m {m}", layout.name()), &matmul(b, &x, &w, m, n, k), &want, 1e-10);
    }
}

/// A row's result does not depend on how many rows are in the matmul.
#[test]
fn an_int4_rows_result_is_the_same_bits_alone_and_in_a_batch() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("int4 batch invariance");
    let (n, k) = (45, 512);
    for group in [32, 128] {
        let w = upload(b, group, n, k, &random_int4(n, k, group, &mut rng));
        let x = rng.vec(37 * k, 1.0);
        let all = matmul(b, &x, &w, 37, n, k);
        for (row, m) in [(0, 1), (1, 2), (2, 3), (12, 11)] {
            let got = matmul(b, &x[(row + 1 - m) * k..(row + 1) * k], &w, m, n, k);
            assert_eq!(bits(&got[(m - 1) * n..]), bits(&all[row * n..(row + 1) * n]), "group {group} row {row} m {m}");
        }
    }
}

fn golden_int4(format: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/int4").join(format)
}

/// Each int4 checkpoint kept 4-bit on wgpu and on the reference: a prefill of two sequences
/// then decode steps, logits to NMSE < 1e-7 and the same greedy ids. The projections take
/// 0.75 bytes a weight (groups of 32: 16 bytes of nibbles and 8 of scale and zero a group),
/// stored and held on wgpu; the whole model on the reference holds its stored bytes (the
/// tiny model's f32 embedding and head are most of them).
#[test]
fn int4_checkpoints_give_the_references_greedy_ids() {
    let Some(gpu) = common::open(Default::default()) else { return };
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 2, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let mut gpu = Some(gpu);
    for format in ["ct", "awq", "gptq"] {
        let dir = golden_int4(format);
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let weights = Weights::open(&dir).unwrap();
        assert_eq!(weights.quantized().count(), 14, "{format}: kept quantized");
        let stored = weights.stored_bytes() as f64;
        let backend = gpu.take().or_else(|| common::open(Default::default())).unwrap();
        let (mut params, mut bytes, held_before) = (0usize, 0usize, backend.weight_bytes().unwrap_or(0));
        let names: Vec<String> = weights.quantized().map(|(n, _)| n.to_string()).collect();
        let mut held = vec![];
        for name in &names {
            let view = weights.get(name, weights.shape(name).unwrap()).unwrap();
            (params, bytes) = (params + view.numel(), bytes + view.bytes().len());
            held.push(backend.upload_weight(&view).unwrap());
        }
        let on_device = (backend.weight_bytes().unwrap_or(0) - held_before) as usize;
        eprintln!("{format}: {params} int4 weights in {bytes} bytes, {on_device} held on wgpu");
        assert_eq!(bytes * 4, params * 3, "{format}: 0.75 bytes a weight");
        // In a texture (CPU adapters), each weight in the split layout: its rows tiled 64 at a
        // time, in whole texture rows of 4096 texels (tandem_wgpu::quant_split), plus the
        // 16-byte placeholder buffer; else the stored bytes padded to 16.
        let textured: usize = names
            .iter()
            .zip(&held)
            .filter(|(_, w)| w.in_texture())
            .map(|(name, _)| {
                let split =
                    QuantSplit::new(QuantLayout::Int4Group { group: 32 }, weights.shape(name).unwrap()).unwrap();
                16 + Texels::rows_for(split.tiled().bytes(DType::F32) as usize / 16) * TEXEL_ROW * 16
            })
            .sum();
        if textured > 0 {
            assert!(held.iter().all(|w| w.in_texture()), "{format}: every int4 weight in a texture or none");
            assert_eq!(on_device, textured, "{format}: {on_device} held for {bytes} in textures");
        } else {
            assert!(
                on_device >= bytes && on_device <= bytes + 16 * names.len(),
                "{format}: {on_device} held for {bytes}"
            );
        }
        drop(held);
        let mut on_wgpu = Model::from_weights(backend, cfg.clone(), &weights, opts).unwrap();
        let mut on_ref = Model::from_weights(RefBackend::new(), cfg, &weights, opts).unwrap();
        let ratio = on_ref.weights_bytes().expect("counted") as f64 / stored;
        eprintln!(
            "{format}: the reference holds {ratio:.3}x the stored bytes; wgpu {:?} bytes",
            on_wgpu.weights_bytes()
        );
        assert!((1.0..=1.15).contains(&ratio), "{format} on the reference: {ratio:.3}x");
        let vocab = on_ref.config().vocab_size;
        let mut seqs: Vec<Vec<u32>> = vec![vec![5, 40, 41, 42, 97, 3, 200], vec![9, 8, 7, 120, 121]];
        for step in 0..6 {
            let mut batch = ForwardBatch { max_blocks: 4, ..Default::default() };
            for (s, toks) in seqs.iter().enumerate() {
                let blocks = [s as u32 * 4, s as u32 * 4 + 1, s as u32 * 4 + 2, s as u32 * 4 + 3];
                let start = if step == 0 { 0 } else { toks.len() - 1 };
                batch.push_seq(&toks[start..], start, &blocks, 16, true);
            }
            let got = on_wgpu.forward(&batch).unwrap();
            let want = on_ref.forward(&batch).unwrap();
            let want64: Vec<f64> = want.iter().map(|&v| v as f64).collect();
            assert_close(&format!("{format} step {step}"), &got, &want64, 1e-7);
            for (s, (g, w)) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).enumerate() {
                let id = tandem_core::backend::argmax_row(w);
                assert_eq!(tandem_core::backend::argmax_row(g), id, "{format} step {step} seq {s}: greedy id");
                seqs[s].push(id);
            }
        }
    }
}
