//! The whole forward pass on wgpu against the reference backend, over seeded random tiny
//! models: a prefill of two sequences, decode steps, and a prefill chunk over a cached prefix
//! next to a decode token. Logits must agree to NMSE < 1e-7.

use crate::common;

use std::path::PathBuf;

use common::{assert_close, Rng};
use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelRunner};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;
use tandem_wgpu::WgpuBackend;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-wgpu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A sequence the test drives by hand: its tokens so far and its blocks.
struct Seq {
    tokens: Vec<u32>,
    blocks: Vec<u32>,
}

fn run_case(shape: Shape, dtype: DType, block_size: usize) {
    let mut rng = Rng::new(&format!("model {} {} bs{block_size}", shape.name(), dtype.name()));
    let dir = temp_dir(&format!("{}-{}-{block_size}", shape.name(), dtype.name()));
    write_random_model(&dir, shape, rng.next_u64(), dtype).unwrap();
    let opts = LoadOptions { max_batch_tokens: 128, max_seqs: 4, num_kv_blocks: 24, block_size, ..Default::default() };
    let Some(gpu) = common::open(Default::default()) else { return };
    let mut wgpu_model = Model::<WgpuBackend>::load(gpu, &dir, opts).unwrap();
    let mut ref_model = Model::<RefBackend>::load(RefBackend::new(), &dir, opts).unwrap();
    let vocab = wgpu_model.config().vocab_size;

    let mut free: Vec<u32> = (0..opts.num_kv_blocks as u32).collect();
    rng.shuffle(&mut free);
    let mut seqs: Vec<Seq> = (0..2).map(|_| Seq { tokens: vec![], blocks: vec![] }).collect();
    let max_blocks = 6;

    // Each step: for each sequence, how many new tokens it brings (0 = not in this batch).
    let steps: [[usize; 2]; 6] = [
        [21, 35], // prefill of both, the second ending mid-block
        [1, 1],   // decode
        [1, 1],
        [1, 10], // a decode token next to a prefill chunk over a cached prefix
        [0, 1],  // one sequence alone
        [1, 1],
    ];
    for (step, news) in steps.iter().enumerate() {
        let mut batch = ForwardBatch { max_blocks, ..Default::default() };
        for (s, &n) in news.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let seq = &mut seqs[s];
            let start = seq.tokens.len();
            let new: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
            seq.tokens.extend(&new);
            while seq.blocks.len() * block_size < seq.tokens.len() {
                seq.blocks.push(free.pop().unwrap());
            }
            batch.push_seq(&new, start, &seq.blocks, block_size, true);
        }
        let got = wgpu_model.forward(&batch).unwrap();
        let want = ref_model.forward(&batch).unwrap();
        assert_eq!(got.len(), batch.logit_rows.len() * vocab);
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        assert_close(
            &format!("{} {} bs{block_size} step {step} {news:?}", shape.name(), dtype.name()),
            &got,
            &want64,
            1e-7,
        );
        // Re-running the batch rewrites the same K/V into the same slots, so the greedy ids
        // computed on the device must be the reference's argmax wherever the top two differ clearly.
        let ids = wgpu_model.forward_argmax(&batch).unwrap();
        for (r, row) in want.chunks_exact(vocab).enumerate() {
            let best = tandem_core::backend::argmax_row(row);
            let second =
                row.iter().enumerate().filter(|(i, _)| *i as u32 != best).map(|(_, v)| *v).fold(f32::MIN, f32::max);
            if row[best as usize] - second > 1e-3 {
                assert_eq!(ids[r], best, "step {step} row {r}: device argmax");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tiny_bf16_block16() {
    run_case(Shape::Tiny, DType::BF16, 16);
}

#[test]
fn tiny_tied_f32_block32() {
    run_case(Shape::TinyTied, DType::F32, 32);
}

#[test]
fn tiny_f16_block16() {
    run_case(Shape::Tiny, DType::F16, 16);
}

/// Issue 15, finding 5: a prefill chunk that samples nothing returned as soon as it was
/// recorded, so an aborted prompt's chunks stayed queued on the device ahead of the next
/// request. A forward returns only once its work has run.
#[test]
fn a_forward_that_reads_nothing_back_leaves_the_device_idle() {
    let dir = temp_dir("idle");
    write_random_model(&dir, Shape::Tiny, 5, DType::F32).unwrap();
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 2, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let Some(gpu) = common::open(Default::default()) else { return };
    let mut model = Model::<WgpuBackend>::load(gpu, &dir, opts).unwrap();
    for chunk in 0..3usize {
        let mut batch = ForwardBatch { max_blocks: 4, ..Default::default() };
        let tokens: Vec<u32> = (0..16).map(|i| (i * 7 + chunk as u32) % 50).collect();
        batch.push_seq(&tokens, chunk * 16, &[0, 1, 2, 3], 16, false);
        assert!(model.forward(&batch).unwrap().is_empty());
        assert!(
            model.backend().is_idle().unwrap(),
            "chunk {chunk}: work still queued on the device after forward returned"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// "Greedy output bitwise the same alone and in any batch": a sequence's logits for one decode
/// token, run alone (one token in the step) and beside two other sequences (three tokens),
/// must be the same bits, whatever path each step size takes inside the backend.
#[test]
fn decode_logits_are_bitwise_the_same_alone_and_in_a_batch() {
    for dtype in [DType::BF16, DType::F32] {
        let dir = temp_dir(&format!("alone-batch-{}", dtype.name()));
        write_random_model(&dir, Shape::Tiny, 11, dtype).unwrap();
        let opts =
            LoadOptions { max_batch_tokens: 128, max_seqs: 4, num_kv_blocks: 12, block_size: 16, ..Default::default() };
        let Some(gpu) = common::open(Default::default()) else { return };
        let mut model = Model::<WgpuBackend>::load(gpu, &dir, opts).unwrap();
        let vocab = model.config().vocab_size;
        let prompt = |s: u32| -> Vec<u32> { (0..21).map(|i| (i * 5 + 1 + 13 * s) % 200).collect() };
        let mut batch = ForwardBatch { max_blocks: 2, ..Default::default() };
        for s in 0..3u32 {
            batch.push_seq(&prompt(s), 0, &[2 * s, 2 * s + 1], 16, true);
        }
        model.forward(&batch).unwrap();
        let step = |model: &mut Model<WgpuBackend>, seqs: u32| {
            let mut b = ForwardBatch { max_blocks: 2, ..Default::default() };
            for s in 0..seqs {
                b.push_seq(&[17 + s], 21, &[2 * s, 2 * s + 1], 16, true);
            }
            model.forward(&b).unwrap()
        };
        let (alone, together) = (step(&mut model, 1), step(&mut model, 3));
        let differ = alone.iter().zip(&together[..vocab]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(
            differ,
            0,
            "{}: {differ} of {vocab} logits of sequence 0 differ between its step alone and in a batch of 3",
            dtype.name()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
