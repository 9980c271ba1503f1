//! The engine's sampling on wgpu: seeded requests (temperature, top-k, top-p, min-p, n = 2)
//! give the same tokens alone and together (prefix-cache hits, chunked prefill, preemption), and
//! a request's tokens do not depend on the path its rows take: greedy steps through the device
//! argmax (`ModelRunner::forward_sampled`) give the tokens the host gives when the request asks
//! for logprobs (which brings its steps' logits back), and so do sampled steps; a constrained
//! request (its rows masked and sampled on the host) leaves the ids of the others unchanged.
//! Needs a Vulkan adapter: SKIPPED without one, a failure under TANDEM_REQUIRE_WGPU=1.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::constraint::AllowedTokens;
use tandem_engine::{Engine, EngineConfig, FinishReason, Guided, Request, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};

fn runner(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize) -> Option<Box<dyn ModelRunner>> {
    let opts = LoadOptions { max_batch_tokens, max_seqs: 8, num_kv_blocks, block_size: 16, ..Default::default() };
    Some(Box::new(Model::load(common::open(Default::default())?, dir, opts).unwrap()))
}

fn engine(runner: Box<dyn ModelRunner>, cfg: EngineConfig) -> Engine {
    let text: tandem_engine::DecodeFn =
        Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect());
    Engine::new(runner, text, cfg).unwrap()
}

/// Each request's tokens, per completion.
fn run(e: &mut Engine, reqs: &[Request]) -> Vec<Vec<Vec<u32>>> {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    streams
        .iter_mut()
        .zip(reqs)
        .map(|(s, r)| {
            let mut t = vec![vec![]; r.params.n];
            while let Some(o) = s.try_recv() {
                assert!(!matches!(o.finish_reason, Some(FinishReason::Error(_))), "{o:?}");
                t[o.index].extend(o.token_ids);
            }
            t
        })
        .collect()
}

#[test]
fn wgpu_seeded_tokens_are_the_same_alone_and_together_and_on_either_path() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-sampling-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 5, DType::F32).unwrap();
    let Some(probe) = runner(&dir, 4, 16) else { return };
    let vocab = probe.config().vocab_size as u32;
    drop(probe);

    let shared: Vec<u32> = (0..34).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..6u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..4 + i * 9).map(|j| (j * 101 + i * 13 + 1) % vocab));
            let mut params = SamplingParams {
                temperature: [1.0, 0.8][i as usize % 2],
                seed: Some(7 + i as u64),
                ignore_eos: true,
                max_tokens: Some(8),
                ..Default::default()
            };
            match i {
                1 => params.top_k = 8,
                2 => params.top_p = 0.85,
                3 => params.min_p = 0.05,
                4 => params.n = 2,
                _ => {}
            }
            Request { prompt: p, params, priority: 0 }
        })
        .collect();

    let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
    let mut alone = engine(runner(&dir, 64, 256).unwrap(), cfg);
    let want: Vec<_> = reqs.iter().map(|r| run(&mut alone, std::slice::from_ref(r)).remove(0)).collect();
    assert_ne!(want[4][0], want[4][1], "the two completions of a request draw differently");

    // 9 blocks of 16 for 7 sequences of 12-57 tokens: preemption; 32 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(32), ..Default::default() };
    let mut crowd = engine(runner(&dir, 9, 32).unwrap(), cfg);
    let got = run(&mut crowd, &reqs);
    let st = crowd.stats();
    println!(
        "preemptions {}, prefix-cache hits {} tokens, {} steps",
        st.preemptions_total, st.prefix_cache_hits_total, st.steps_total
    );
    assert!(st.preemptions_total > 0, "the pool should force preemption");
    assert!(st.prefix_cache_hits_total > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want);

    // Beside a constrained request every step's logits come to the host (a masked row is
    // sampled there): the others still get the ids the device gave them alone.
    let allowed: Vec<u32> = (0..vocab).filter(|t| t % 7 == 3).collect();
    let guided = Request {
        params: SamplingParams {
            seed: Some(1),
            ignore_eos: true,
            max_tokens: Some(10),
            guided: Some(Guided::new(AllowedTokens(allowed))),
            ..Default::default()
        },
        ..reqs[1].clone()
    };
    let mut mixed = reqs.clone();
    mixed.insert(3, guided);
    let mut e =
        engine(runner(&dir, 64, 64).unwrap(), EngineConfig { max_num_batched_tokens: Some(64), ..Default::default() });
    let mut got = run(&mut e, &mixed);
    let constrained = got.remove(3);
    assert_eq!(got, want, "a constrained neighbour changed the ids");
    assert_eq!(constrained[0].len(), 10);
    assert!(constrained[0].iter().all(|t| t % 7 == 3), "the mask was not applied: {constrained:?}");

    // The same requests asking for logprobs take the host path; greedy ones the device argmax.
    let greedy =
        Request { params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) }, ..reqs[0].clone() };
    let mut e =
        engine(runner(&dir, 64, 256).unwrap(), EngineConfig { enable_prefix_caching: false, ..Default::default() });
    for r in [&greedy, &reqs[0], &reqs[2]] {
        let on_model = run(&mut e, std::slice::from_ref(r)).remove(0);
        let with_logprobs = Request { params: SamplingParams { logprobs: Some(1), ..r.params.clone() }, ..r.clone() };
        assert_eq!(run(&mut e, &[with_logprobs]).remove(0), on_model, "host and model paths differ for {:?}", r.params);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
