//! Weights kept in a GGUF block layout on wgpu (src/backend/quant.rs, shaders/quant_*.wgsl):
//! the embedding gives the dequantized rows, a row's matmul result is the same bits alone and in
//! any batch, a weight bound in row chunks gives the bits of one bound whole, and a tiny GGUF
//! model (Q8_0, and a Q4_K / Q6_K mix) gives the reference's logits and greedy ids. The op suite
//! (`tandem test-ops --backend wgpu --op quant`) checks every layout's matmul against the reference.

use crate::common;

use std::path::PathBuf;

use common::{assert_close, Rng};
use tandem_core::backend::prelude::*;
use tandem_core::config::ModelConfig;
use tandem_core::model::LoadOptions;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_core::{ForwardBatch, Model, ModelRunner};
use tandem_model_files::convert::{gguf_model_dir, gguf_weights, GGUF_WEIGHTS};
use tandem_reference::RefBackend;
use tandem_wgpu::{WgpuBackend, WgpuBuf, WgpuOptions};

/// `blocks` pseudo-random blocks of `layout` whose f16 scales (and mins) are small and finite.
pub(crate) fn random_blocks(layout: QuantLayout, blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = layout.block_bytes();
    let mut out: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
    let fields: &[usize] = match layout {
        QuantLayout::Q8_0 | QuantLayout::Q4_0 | QuantLayout::Q5_0 => &[0],
        QuantLayout::Q6K => &[208],
        _ => &[0, 2],
    };
    for block in out.chunks_exact_mut(bb) {
        for &at in fields {
            let v = half::f16::from_f32((0.25 + rng.f32().abs()) / 512.0);
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn upload<B: Backend>(b: &B, layout: QuantLayout, rows: usize, cols: usize, bytes: &[u8]) -> B::Buf {
    let mut ws = Weights::empty();
    ws.insert_quantized("w", layout, &[rows, cols], bytes, PathBuf::from("<test>")).unwrap();
    b.upload_weight(&ws.get("w", &[rows, cols]).unwrap()).unwrap()
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

#[test]
fn a_quantized_table_embeds_its_dequantized_rows() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("quant embedding");
    let (rows, hidden) = (37, 512);
    for layout in QuantLayout::GGUF {
        let bytes = random_blocks(layout, rows * hidden / layout.block_elems(), &mut rng);
        let table = upload(b, layout, rows, hidden, &bytes);
        let mut all = vec![0f32; rows * hidden];
        layout.dequantize(&bytes, &mut all).unwrap();
        assert_eq!(b.read_f32(&table, rows * hidden).unwrap(), all, "{} read back", layout.name());
        let ids = [36u32, 0, 5, 5, 17];
        let mut id_buf = b.alloc_u32(ids.len()).unwrap();
        b.write_u32(&mut id_buf, &ids).unwrap();
        let mut out = f32_buf(b, &vec![common::POISON; ids.len() * hidden]);
        b.embedding(&table, &id_buf, &mut out, ids.len(), hidden).unwrap();
        let got = b.read_f32(&out, ids.len() * hidden).unwrap();
        let want: Vec<f64> =
            ids.iter().flat_map(|&i| all[i as usize * hidden..][..hidden].iter().map(|&v| v as f64)).collect();
        // The decoders' arithmetic is ggml's; a fused multiply-add in `d * q + m` may round
        // once where the host rounds twice.
        assert_close(&format!("embedding {}", layout.name()), &got, &want, 1e-12);
    }
}

/// A row's result does not depend on how many rows are in the matmul (decode, prefill blocks
/// of several rows per invocation, and the rows past m that a block repeats).
#[test]
fn a_rows_result_is_the_same_bits_alone_and_in_a_batch() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("quant batch invariance");
    let (n, k) = (45, 512);
    for layout in QuantLayout::GGUF {
        let w = upload(b, layout, n, k, &random_blocks(layout, n * k / layout.block_elems(), &mut rng));
        let x = rng.vec(37 * k, 1.0);
        let all = matmul(b, &x, &w, 37, n, k);
        for (row, m) in [(0, 1), (1, 2), (2, 3), (12, 11)] {
            let got = matmul(b, &x[(row + 1 - m) * k..(row + 1) * k], &w, m, n, k);
            assert_eq!(
                bits(&got[(m - 1) * n..]),
                bits(&all[row * n..(row + 1) * n]),
                "{} row {row} m {m}",
                layout.name()
            );
        }
    }
}

/// A weight larger than one storage binding is bound in chunks of whole rows (aligned offsets),
/// in the matmul and the embedding: the same bits as bound whole.
#[test]
fn a_weight_bound_in_row_chunks_gives_the_bits_of_one_bound_whole() {
    let Some(whole) = common::backend() else { return };
    let Some(chunked) = common::open(WgpuOptions { max_storage_binding: Some(4096), ..Default::default() }) else {
        return;
    };
    let mut rng = Rng::new("quant chunks");
    let (n, k, m) = (301, 256, 3);
    for layout in [QuantLayout::Q4_1, QuantLayout::Q6K] {
        let bytes = random_blocks(layout, n * k / layout.block_elems(), &mut rng);
        let x = rng.vec(m * k, 1.0);
        let (a, c) = (upload(whole, layout, n, k, &bytes), upload(&chunked, layout, n, k, &bytes));
        assert_eq!(
            bits(&matmul(&chunked, &x, &c, m, n, k)),
            bits(&matmul(whole, &x, &a, m, n, k)),
            "{}",
            layout.name()
        );
        let ids = [300u32, 0, 150];
        let embed = |b: &WgpuBackend, t: &WgpuBuf| {
            let mut id_buf = b.alloc_u32(3).unwrap();
            b.write_u32(&mut id_buf, &ids).unwrap();
            let mut out = f32_buf(b, &vec![common::POISON; 3 * k]);
            b.embedding(t, &id_buf, &mut out, 3, k).unwrap();
            b.read_f32(&out, 3 * k).unwrap()
        };
        assert_eq!(bits(&embed(&chunked, &c)), bits(&embed(whole, &a)), "{} embedding", layout.name());
    }
}

/// A GGUF file's model kept quantized on wgpu and on the reference: a prefill of two
/// sequences then decode steps, logits to NMSE < 1e-7 and the same greedy ids.
fn same_as_the_reference(file: &str, write: fn(&std::path::Path, usize) -> tandem_core::Result<()>) {
    let root = std::env::temp_dir().join(format!("tandem-wgpu-{file}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let gguf = root.join(file);
    write(&gguf, 3).unwrap();
    let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = gguf_weights(&dir.join(GGUF_WEIGHTS)).unwrap();
    assert!(weights.quantized().count() > 0, "kept quantized");
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 2, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let Some(gpu) = common::open(Default::default()) else { return };
    let mut on_wgpu = Model::from_weights(gpu, cfg.clone(), &weights, opts).unwrap();
    let mut on_ref = Model::from_weights(RefBackend::new(), cfg, &weights, opts).unwrap();
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
        assert_close(&format!("{file} step {step}"), &got, &want64, 1e-7);
        for (s, (g, w)) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).enumerate() {
            let id = tandem_core::backend::argmax_row(w);
            assert_eq!(tandem_core::backend::argmax_row(g), id, "{file} step {step} seq {s}: greedy id");
            seqs[s].push(id);
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// `tandem:model_weights_bytes` (`Device::weight_bytes` over the load) of a Q4_K / Q6_K file
/// kept quantized is within 1.15x of its tensors' bytes, on wgpu and on the reference. Where
/// wgpu holds weights in textures, a weight in the split layout (Q4_K and Q6_K there) also rounds up to
/// whole texture rows (`TEXEL_ROW` units, 64 KiB), which the tiny model's tensors (a few KiB)
/// are far from filling and a real model's (MiBs) make negligible: one row a tensor is allowed.
#[test]
fn a_k_quant_models_weights_take_about_their_files_bytes() {
    let root = std::env::temp_dir().join(format!("tandem-wgpu-weight-bytes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let gguf = root.join("tiny-q4_k.gguf");
    tandem_model_files::tiny_gguf::write_tiny_kquant_gguf(&gguf, 1).unwrap();
    let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = gguf_weights(&dir.join(GGUF_WEIGHTS)).unwrap();
    let stored = weights.stored_bytes() as f64;
    let opts =
        LoadOptions { max_batch_tokens: 16, max_seqs: 1, num_kv_blocks: 2, block_size: 16, ..Default::default() };
    let on_ref = Model::from_weights(RefBackend::new(), cfg.clone(), &weights, opts).unwrap();
    let Some(gpu) = common::open(Default::default()) else { return };
    // K-quant rows are whole super-blocks, so a layout splits whatever the tensor's shape.
    let split = |l| tandem_wgpu::quant_split::QuantSplit::new(l, &[64, 256]).is_some();
    let rows = if gpu.texel_weights() { weights.quantized().filter(|&(_, l)| split(l)).count() } else { 0 };
    let texture_rows = (rows * tandem_wgpu::buffer::TEXEL_ROW * 16) as f64;
    let on_wgpu = Model::from_weights(gpu, cfg, &weights, opts).unwrap();
    for (name, held, slack) in
        [("reference", on_ref.weights_bytes(), 0.0), ("wgpu", on_wgpu.weights_bytes(), texture_rows)]
    {
        let held = held.expect("counted") as f64;
        let ratio = held / stored;
        eprintln!("{name}: {held} bytes held for {stored} stored ({ratio:.3}x; {slack} bytes of texture rows allowed)");
        assert!(
            held >= stored && held <= 1.15 * stored + slack,
            "{name}: {held} bytes held for {stored} stored ({ratio:.3}x; {slack} bytes of texture rows allowed)"
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_q8_0_gguf_model_gives_the_references_greedy_ids() {
    same_as_the_reference("tiny-q8_0.gguf", tandem_model_files::tiny_gguf::write_tiny_gguf);
}

#[test]
fn a_k_quant_gguf_model_gives_the_references_greedy_ids() {
    same_as_the_reference("tiny-q4_k.gguf", tandem_model_files::tiny_gguf::write_tiny_kquant_gguf);
}

/// Where weights sit in textures (CPU adapters), every GGUF layout (Q8_0, Q4_0, Q4_1, Q5_0,
/// Q5_1, Q4_K, Q5_K, Q6_K) is held there in the split layout (tandem_wgpu::quant_split: the
/// K-quants' nibbles and high bits moved within a block); the split weight's matmul and
/// embedding give the bits of the same weight kept in a buffer (`TANDEM_WGPU_QUANT_TEXELS=0`'s
/// layout): the same decoders' arithmetic, the same order.
#[test]
fn split_weights_give_the_bits_of_the_files_layout() {
    let Some(b) = common::backend() else { return };
    if !b.texel_weights() {
        return;
    }
    let Some(plain) = common::open(WgpuOptions { texel_weights: Some(false), ..Default::default() }) else { return };
    let mut rng = Rng::new("quant split");
    let (n, k, m) = (70, 512, 5);
    let x = rng.vec(m * k, 1.0);
    for layout in QuantLayout::GGUF {
        let bytes = random_blocks(layout, n * k / layout.block_elems(), &mut rng);
        let w = upload(b, layout, n, k, &bytes);
        let split = tandem_wgpu::quant_split::QuantSplit::new(layout, &[n, k]).is_some();
        assert!(split, "{}: a split form", layout.name());
        assert!(b.is_texels(&w), "{}: in a texture", layout.name());
        let w_plain = upload(&plain, layout, n, k, &bytes);
        assert!(!plain.is_texels(&w_plain));
        for rows in [1, m] {
            let got = matmul(b, &x[..rows * k], &w, rows, n, k);
            let want = matmul(&plain, &x[..rows * k], &w_plain, rows, n, k);
            assert_eq!(bits(&got), bits(&want), "{} matmul, m = {rows}", layout.name());
        }
        let ids = [69u32, 0, 64, 3];
        let embed = |be: &WgpuBackend, t: &WgpuBuf| {
            let mut id_buf = be.alloc_u32(ids.len()).unwrap();
            be.write_u32(&mut id_buf, &ids).unwrap();
            let mut out = f32_buf(be, &vec![common::POISON; ids.len() * k]);
            be.embedding(t, &id_buf, &mut out, ids.len(), k).unwrap();
            be.read_f32(&out, ids.len() * k).unwrap()
        };
        assert_eq!(bits(&embed(b, &w)), bits(&embed(&plain, &w_plain)), "{} embedding", layout.name());
    }
}
