//! LoRA adapters on wgpu against the reference backend: a batch mixing two adapters and the
//! base model (prefill, then decodes), over the tiny model in f32 and bf16. Logits must agree
//! to NMSE < 1e-7, as the plain forward's do.

use crate::common;

use std::path::{Path, PathBuf};

use common::assert_close;
use tandem_core::backend::Backend;
use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelConfig, ModelRunner};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

/// A PEFT adapter of tests/golden/lora (made for the tiny shape).
fn adapter(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora").join(name)
}

fn with_adapters<B: Backend>(b: B, dir: &Path, opts: LoadOptions) -> Model<B> {
    let mut m = Model::load_with_lora(b, dir, opts, LoraLimits { max_loras: 2, max_rank: 8 }).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    m.load_lora(0, &LoraAdapter::load(&adapter("tiny-all"), &cfg).unwrap()).unwrap();
    m.load_lora(1, &LoraAdapter::load(&adapter("tiny-rs"), &cfg).unwrap()).unwrap();
    m
}

fn run_case(dtype: DType) {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-lora-{}-{}", dtype.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 21, dtype).unwrap();
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 4, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let Some(gpu) = common::open(Default::default()) else { return };
    let mut wgpu_model = with_adapters(gpu, &dir, opts);
    let mut ref_model = with_adapters(RefBackend::new(), &dir, opts);
    let vocab = ref_model.config().vocab_size;
    let prompts: [&[u32]; 3] =
        [&[5, 9, 77, 300, 2, 18, 40], &[100, 3, 8], &[42, 42, 7, 300, 11, 12, 13, 14, 15, 16, 17]];
    let adapters = vec![Some(0), None, Some(1)];
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    let mut batch = ForwardBatch { max_blocks: 1, ..Default::default() };
    for (i, p) in prompts.iter().enumerate() {
        batch.push_seq(p, 0, &[i as u32], 16, true);
    }
    for step in 0..4 {
        batch.adapters = adapters.clone();
        let got = wgpu_model.forward(&batch).unwrap();
        let want = ref_model.forward(&batch).unwrap();
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        assert_close(&format!("lora {} step {step}", dtype.name()), &got, &want64, 1e-7);
        let mut next = ForwardBatch { max_blocks: 1, ..Default::default() };
        for (i, row) in want.chunks_exact(vocab).enumerate() {
            next.push_seq(&[tandem_core::backend::argmax_row(row)], lens[i], &[i as u32], 16, true);
            lens[i] += 1;
        }
        batch = next;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_mixed_batch_f32_matches_the_reference() {
    run_case(DType::F32);
}

#[test]
fn lora_mixed_batch_bf16_matches_the_reference() {
    run_case(DType::BF16);
}

/// The segmented LoRA op: each row alone and the rows reversed give a row its bits in the
/// mixed batch (slots of several ranks, rows with none), with x as it is and rounded to bf16.
#[test]
fn lora_op_gives_a_row_alone_its_bits_in_a_mixed_batch() {
    use tandem_conformance::ops::{lora_rows_alone, Lora};
    let Some(b) = common::open(Default::default()) else { return };
    for operand in [DType::F32, DType::BF16] {
        let case = Lora { rows: 37, inp: 576, out: 192, max_loras: 4, max_rank: 16, operand };
        lora_rows_alone(&b, &case, 7).unwrap();
    }
}

/// The op against the reference's host loop on the conformance suite's lora cases.
#[test]
fn lora_op_matches_the_reference() {
    let Some(b) = common::open(Default::default()) else { return };
    let mut out = Vec::new();
    let rep = tandem_conformance::run(&b, Some("lora"), tandem_conformance::fresh_seed(), &mut out);
    println!("{}", String::from_utf8_lossy(&out));
    assert!(rep.passed >= 6 && rep.ok(), "{}", rep.summary());
}

/// A step where no row names an adapter runs no LoRA op: a base row's logits are bit for bit
/// those it gets beside a row under an adapter (where the op runs and leaves it as it is),
/// over a prefill and three decodes.
#[test]
fn lora_base_only_steps_give_a_base_rows_bits_in_a_mixed_batch() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-lora-base-only-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 21, DType::BF16).unwrap();
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 4, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let run = |adapters: &[Option<u32>]| -> Option<Vec<Vec<f32>>> {
        let mut m = with_adapters(common::open(Default::default())?, &dir, opts);
        let vocab = m.config().vocab_size;
        let prompts: [&[u32]; 2] = [&[5, 9, 77, 300, 2, 18, 40], &[100, 3, 8]];
        let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
        let mut batch = ForwardBatch { max_blocks: 1, ..Default::default() };
        for (i, p) in prompts.iter().enumerate() {
            batch.push_seq(p, 0, &[i as u32], 16, true);
        }
        let mut rows = Vec::new();
        for _ in 0..4 {
            batch.adapters = adapters.to_vec();
            let logits = m.forward(&batch).unwrap();
            let mut next = ForwardBatch { max_blocks: 1, ..Default::default() };
            for (i, row) in logits.chunks_exact(vocab).enumerate() {
                next.push_seq(&[tandem_core::backend::argmax_row(row)], lens[i], &[i as u32], 16, true);
                lens[i] += 1;
            }
            rows.push(logits[..vocab].to_vec());
            batch = next;
        }
        Some(rows)
    };
    let Some(base_only) = run(&[None, None]) else { return };
    let mixed = run(&[None, Some(0)]).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (step, (a, b)) in base_only.iter().zip(&mixed).enumerate() {
        assert_eq!(bits(a), bits(b), "step {step}: the base row alone and beside an adapter's");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
