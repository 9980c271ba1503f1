//! What the draft-head tests (EAGLE-3 heads, MTP layers) share: a reference-backend runner, a
//! mixed set of requests (greedy, n = 2, seeded), and a run of them to idle that checks no KV
//! block leaked and gives each request's completions.

use crate::common;

use std::path::Path;

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{Model, ModelRunner};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams, Stats};
use tandem_reference::RefBackend;

pub fn runner(dir: &Path, blocks: usize) -> Box<dyn ModelRunner> {
    let opts = LoadOptions {
        max_batch_tokens: 512,
        max_seqs: 32,
        num_kv_blocks: blocks,
        block_size: 16,
        ..Default::default()
    };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

/// Each request's completions as (tokens, text) pairs.
pub type Answer = Vec<(Vec<u32>, String)>;

pub fn run(dir: &Path, blocks: usize, spec: Option<SpeculativeConfig>, reqs: &[Request]) -> (Vec<Answer>, Stats) {
    let cfg = EngineConfig { speculative: spec, ..Default::default() };
    let mut e = Engine::new(runner(dir, blocks), letters(), cfg).unwrap();
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(&mut e);
    let bm = &e.scheduler().bm;
    assert_eq!(bm.num_free(), bm.num_blocks(), "a block leaked");
    let answers = streams
        .iter_mut()
        .zip(reqs)
        .map(|(s, r)| {
            let c = collect(&drain(s), r.params.n);
            assert_eq!(c.finals.len(), 1, "one final output");
            c.tokens.into_iter().zip(c.text).collect()
        })
        .collect();
    (answers, e.stats())
}

pub fn greedy(n: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) }
}

pub fn requests() -> Vec<Request> {
    let req = |prompt: Vec<u32>, params| Request { prompt, params, priority: 0 };
    vec![
        req(vec![1, 2, 3], greedy(40)),
        req((10..40).collect(), greedy(30)),
        req(vec![7; 20], SamplingParams { n: 2, ..greedy(25) }),
        req(vec![5, 9], SamplingParams { temperature: 0.8, seed: Some(3), ..greedy(30) }),
    ]
}
