//! An fp8 KV cache through the engine, on the reference backend over a seeded random tiny
//! model: greedy tokens of each prompt run alone equal its tokens among all the others (prefix
//! hits, chunked prefill, preemption), bit for bit, as with an f32 cache. The rounding on write
//! depends on the value alone, so where a token's K and V were computed cannot change them.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, KvDtype, Model, ModelRunner};
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir(test: &str, shape: Shape) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-kvfp8-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, shape, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path, kv: KvDtype, num_kv_blocks: usize, max_batch_tokens: usize) -> Box<dyn ModelRunner> {
    let opts = LoadOptions {
        max_batch_tokens,
        max_seqs: 16,
        num_kv_blocks,
        block_size: 16,
        kv_dtype: Some(kv),
        ..Default::default()
    };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

fn run(e: &mut Engine, reqs: &[Request]) -> (Vec<Vec<u32>>, u64, u64) {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(e);
    let toks = streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect();
    let st = e.stats();
    (toks, st.preemptions_total, st.prefix_cache_hits_total)
}

fn greedy_invariance(dir: &Path, kv: KvDtype) {
    let vocab = runner(dir, kv, 4, 16).config().vocab_size as u32;
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..8u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 5).map(|j| (j * 101 + i * 7 + 1) % vocab));
            Request {
                prompt: p,
                params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) },
                priority: 0,
            }
        })
        .collect();

    let mut want = Vec::new();
    for r in &reqs {
        let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
        let mut alone = Engine::new(runner(dir, kv, 64, 256), letters(), cfg).unwrap();
        want.push(run(&mut alone, std::slice::from_ref(r)).0.remove(0));
    }
    let mut distinct: Vec<u32> = want.concat();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 10, "a degenerate model would prove nothing: {want:?}");

    // 11 blocks for 8 sequences of 38-85 tokens: preemption; 24 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let mut crowd = Engine::new(runner(dir, kv, 11, 24), letters(), cfg).unwrap();
    let (got, preemptions, hits) = run(&mut crowd, &reqs);
    assert!(preemptions > 0, "the pool should force preemption");
    assert!(hits > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want, "{} KV", kv.name());
}

#[test]
fn fp8_e4m3_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    let dir = model_dir("e4m3", Shape::Tiny);
    greedy_invariance(&dir, KvDtype::Fp8E4m3);
    let _ = std::fs::remove_dir_all(&dir);
}

/// e5m2 on a family with its own attention pieces (Qwen3's per-head q/k norms).
#[test]
fn fp8_e5m2_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    let dir = model_dir("e5m2", Shape::TinyQwen3);
    greedy_invariance(&dir, KvDtype::Fp8E5m2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cache really is fp8: after a prefill every stored K/V element is a value of the format
/// (the f32 cache of the same model holds values that are not).
#[test]
fn the_cache_holds_fp8_values() {
    let dir = model_dir("values", Shape::Tiny);
    let mut seen = Vec::new();
    for kv in [KvDtype::F32, KvDtype::Fp8E4m3] {
        let opts = LoadOptions {
            max_batch_tokens: 64,
            max_seqs: 4,
            num_kv_blocks: 8,
            block_size: 16,
            kv_dtype: Some(kv),
            ..Default::default()
        };
        let mut m = Model::load(RefBackend::new(), &dir, opts).unwrap();
        tandem_core::greedy::generate(&mut m, &(1..30).collect::<Vec<u32>>(), 1, &[], false, |_| {}).unwrap();
        seen.push(m.kv_dtype());
        let nonzero: Vec<f32> = m.read_kv_pool().unwrap().into_iter().filter(|v| *v != 0.0).collect();
        assert!(nonzero.len() > 100, "{}: the prefill wrote {} values", kv.name(), nonzero.len());
        let f = tandem_core::fp8::Fp8Format::E4M3;
        let representable = nonzero.iter().filter(|&&v| f.decode(tandem_core::fp8_round::encode(f, v)) == v).count();
        match kv {
            KvDtype::F32 => assert!(representable < nonzero.len() / 2, "f32 cache: {representable} fp8 values"),
            _ => assert_eq!(representable, nonzero.len(), "every fp8 cache element is an e4m3 value"),
        }
    }
    assert_eq!(seen, [KvDtype::F32, KvDtype::Fp8E4m3]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint's per-layer `k_scale` / `v_scale`: an fp8 cache stores `x / scale` and reads
/// it back times the scale (each cached value is a fixed point of that rounding with its own
/// layer's scale, not of 1.0's), greedy tokens stay the same alone and in a batch, and an
/// e5m2 cache, which vLLM does not scale, is refused.
#[test]
fn checkpoint_kv_scales_scale_the_fp8_cache() {
    let dir = model_dir("scales", Shape::Tiny);
    let layers = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap().num_hidden_layers;
    let scales: Vec<[f32; 2]> = (0..layers).map(|i| [0.037 * (i + 1) as f32, 0.011 + 0.3 * i as f32]).collect();
    tandem_model_files::fp8::add_kv_scales(&dir, &scales).unwrap();
    let opts = LoadOptions {
        max_batch_tokens: 64,
        max_seqs: 4,
        num_kv_blocks: 8,
        block_size: 16,
        kv_dtype: Some(KvDtype::Fp8E4m3),
        ..Default::default()
    };
    let mut m = Model::load(RefBackend::new(), &dir, opts).unwrap();
    tandem_core::greedy::generate(&mut m, &(1..30).collect::<Vec<u32>>(), 1, &[], false, |_| {}).unwrap();
    let pool = m.read_kv_pool().unwrap();
    let per = pool.len() / (2 * layers); // K then V of every layer
    let f = tandem_core::fp8::Fp8Format::E4M3;
    let fixed =
        |v: f32, s: f32| tandem_core::fp8_round::dequantize(f, tandem_core::fp8_round::quantize(f, v, s), s) == v;
    for (l, [ks, vs]) in scales.iter().enumerate() {
        for (c, s) in [(0, ks), (1, vs)] {
            let part = &pool[(2 * l + c) * per..][..per];
            let nonzero: Vec<f32> = part.iter().copied().filter(|v| *v != 0.0).collect();
            assert!(nonzero.len() > 50, "layer {l}: {} values", nonzero.len());
            assert!(nonzero.iter().all(|&v| fixed(v, *s)), "layer {l} cache {c}: not scaled by {s}");
            let unscaled = nonzero.iter().filter(|&&v| fixed(v, 1.0)).count();
            assert!(unscaled < nonzero.len() / 2, "layer {l} cache {c}: {unscaled} values as if unscaled");
        }
    }
    greedy_invariance(&dir, KvDtype::Fp8E4m3);
    let e5m2 = LoadOptions { kv_dtype: Some(KvDtype::Fp8E5m2), ..opts };
    let Err(e) = Model::load(RefBackend::new(), &dir, e5m2) else { panic!("e5m2 with checkpoint scales loaded") };
    assert!(e.to_string().contains("fp8_e4m3 only"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
