//! Batch invariance on a real forward pass: the reference backend over a seeded random tiny
//! model. Greedy tokens of each prompt run alone (no prefix cache, no chunking, ample pool)
//! must equal the tokens of the same prompt among all the others with prefix-cache hits,
//! chunked prefill and preemption.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, LlamaModel, ModelRunner};
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams};
use tandem_models::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-ref-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize) -> Box<dyn ModelRunner> {
    let opts = LoadOptions { max_batch_tokens, max_seqs: 16, num_kv_blocks, block_size: 16, ..Default::default() };
    Box::new(LlamaModel::load(RefBackend::new(), dir, opts).unwrap())
}

fn run(e: &mut Engine, reqs: &[Request]) -> (Vec<Vec<u32>>, u64, u64) {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(e);
    let toks = streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect();
    let st = e.stats();
    (toks, st.preemptions_total, st.prefix_cache_hits_total)
}

#[test]
fn greedy_tokens_are_the_same_alone_and_in_a_batch() {
    let dir = model_dir();
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..10u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 5).map(|j| (j * 101 + i * 7 + 1) % vocab));
            Request { prompt: p, params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) }, priority: 0 }
        })
        .collect();

    let mut want = Vec::new();
    for r in &reqs {
        let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
        let mut alone = Engine::new(runner(&dir, 64, 256), letters(), cfg).unwrap();
        want.push(run(&mut alone, std::slice::from_ref(r)).0.remove(0));
    }

    let mut distinct: Vec<u32> = want.concat();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 10, "a degenerate model would prove nothing: {want:?}");

    // 14 blocks for 10 sequences of 38-95 tokens: preemption; 24 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let mut crowd = Engine::new(runner(&dir, 14, 24), letters(), cfg).unwrap();
    let (got, preemptions, hits) = run(&mut crowd, &reqs);
    assert!(preemptions > 0, "the pool should force preemption");
    assert!(hits > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want);
    let _ = std::fs::remove_dir_all(&dir);
}
