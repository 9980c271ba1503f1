//! Every request kind drafts and keeps its answer: logprobs (each verified position's are the
//! target's, as without drafts), repetition, frequency and presence penalties, `logit_bias`
//! and `min_tokens` bans (each drafted row penalised as if the drafts before it had been
//! emitted), n > 1 (each completion drafts on its own), greedy and seeded sampled; on the
//! reference backend's real forward, with the rows sampled where the logits are and, beside a
//! constrained penalised request (which brings every row's logits to the host), on the host.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::constraint::AllowedTokens;
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, FinishReason, Guided, Request, SamplingParams, Stats};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-spec-kinds-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path) -> Box<dyn ModelRunner> {
    let opts =
        LoadOptions { max_batch_tokens: 512, max_seqs: 32, num_kv_blocks: 256, block_size: 16, ..Default::default() };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

/// A prompt followed by the model's own greedy continuation of it: what the model tends to
/// give recurs in it, so n-gram drafts are found and often accepted.
fn own_words(dir: &Path, start: Vec<u32>) -> Vec<u32> {
    let mut e = Engine::new(runner(dir), letters(), EngineConfig::default()).unwrap();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(60) };
    let mut s = e.add_request(Request { prompt: start.clone(), params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let mut p = start;
    p.extend(collect(&drain(&mut s), 1).tokens.remove(0));
    p
}

/// Per completion: its tokens, text, finish reason and logprobs (printed, so that equality is
/// bitwise in effect).
type Answer = Vec<(Vec<u32>, String, Option<FinishReason>, Vec<String>)>;

fn run(dir: &Path, spec: Option<SpeculativeConfig>, reqs: &[Request]) -> (Vec<Answer>, Stats) {
    let mut e = Engine::new(runner(dir), letters(), EngineConfig { speculative: spec, ..Default::default() }).unwrap();
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(&mut e);
    let bm = &e.scheduler().bm;
    assert_eq!(bm.num_free(), bm.num_blocks(), "a block leaked");
    let answers = streams
        .iter_mut()
        .zip(reqs)
        .map(|(s, r)| {
            let outs = drain(s);
            let n = r.params.n;
            let c = collect(&outs, n);
            assert_eq!(c.finals.len(), 1, "one final output");
            (0..n)
                .map(|i| {
                    let lps: Vec<String> = outs
                        .iter()
                        .filter(|o| o.index == i)
                        .flat_map(|o| &o.logprobs)
                        .map(|l| format!("{l:?}"))
                        .collect();
                    if r.params.logprobs.is_some() {
                        assert_eq!(lps.len(), c.tokens[i].len(), "one logprobs entry a token");
                    }
                    (c.tokens[i].clone(), c.text[i].clone(), c.finish[i].clone(), lps)
                })
                .collect()
        })
        .collect();
    (answers, e.stats())
}

/// Runs `reqs` without drafts, then with n-gram drafts (k 3), alone and together, and with a
/// constrained penalised request beside them (the host path): every answer the same.
/// Returns the accepted drafts of the batched run.
fn same_with_drafts(dir: &Path, reqs: &[Request]) -> u64 {
    let spec = Some(SpeculativeConfig::ngram(3));
    let (want, _) = run(dir, None, reqs);
    let (got, st) = run(dir, spec.clone(), reqs);
    println!(
        "{} drafts, {} draft tokens, {} accepted",
        st.spec_decode_num_drafts_total,
        st.spec_decode_num_draft_tokens_total,
        st.spec_decode_num_accepted_tokens_total
    );
    assert_eq!(got, want, "in a batch");
    assert!(st.spec_decode_num_drafts_total > 0, "no drafts: {st:?}");
    for (r, w) in reqs.iter().zip(&want) {
        assert_eq!(&run(dir, spec.clone(), std::slice::from_ref(r)).0[0], w, "alone: {:?}", r.params);
    }
    // A constrained row with a penalty is sampled on the host, and so is every row of its steps.
    let host = Request {
        prompt: vec![1, 2, 3],
        params: SamplingParams {
            ignore_eos: true,
            repetition_penalty: 1.2,
            guided: Some(Guided::new(AllowedTokens((0..40).filter(|t| t % 3 == 0).collect()))),
            ..SamplingParams::greedy(80)
        },
        priority: 0,
    };
    let mut with_host = reqs.to_vec();
    with_host.push(host);
    let (want_host, _) = run(dir, None, &with_host);
    assert_eq!(want_host[..reqs.len()], want[..], "the host path changed an answer without drafts");
    let (got, host_st) = run(dir, spec, &with_host);
    assert_eq!(got, want_host, "on the host path");
    assert!(host_st.spec_decode_num_drafts_total > 0, "no drafts on the host path: {host_st:?}");
    st.spec_decode_num_accepted_tokens_total
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) }
}

#[test]
fn logprobs_are_the_targets_with_drafts() {
    let dir = model_dir("logprobs");
    let p = own_words(&dir, vec![1, 2, 3]);
    let q = own_words(&dir, vec![9, 4]);
    let reqs = vec![
        Request { prompt: p.clone(), params: SamplingParams { logprobs: Some(3), ..greedy(30) }, priority: 0 },
        Request { prompt: q.clone(), params: SamplingParams { logprobs: Some(0), ..greedy(30) }, priority: 0 },
        Request {
            prompt: p.clone(),
            params: SamplingParams {
                temperature: 0.8,
                seed: Some(3),
                logprobs: Some(2),
                max_tokens: Some(30),
                ignore_eos: true,
                ..Default::default()
            },
            priority: 0,
        },
    ];
    assert!(same_with_drafts(&dir, &reqs) > 0, "no draft was accepted");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn penalties_biases_and_bans_see_the_drafts_before_them() {
    let dir = model_dir("penalties");
    let p = own_words(&dir, vec![1, 2, 3]);
    let params = |f: &dyn Fn(&mut SamplingParams)| {
        let mut s = greedy(60);
        f(&mut s);
        Request { prompt: p.clone(), params: s, priority: 0 }
    };
    let reqs = vec![
        params(&|s| s.repetition_penalty = 1.05),
        params(&|s| s.frequency_penalty = 0.02),
        params(&|s| s.frequency_penalty = 0.05),
        params(&|s| s.frequency_penalty = 0.1),
        params(&|s| s.frequency_penalty = 0.2),
        params(&|s| s.frequency_penalty = 0.5),
        params(&|s| s.frequency_penalty = 1.0),
        params(&|s| s.presence_penalty = 0.1),
        params(&|s| s.presence_penalty = 0.5),
        params(&|s| s.presence_penalty = 2.0),
        params(&|s| {
            s.repetition_penalty = 1.1;
            s.frequency_penalty = 0.3;
            s.presence_penalty = 0.2;
        }),
        params(&|s| s.logit_bias = vec![(p[5], 0.5), (p[9], -0.5)]),
        // A ban under min_tokens: the stop tokens may not come before the 6th token, and the
        // drafts cross that point.
        params(&|s| {
            s.min_tokens = 6;
            s.stop_token_ids = vec![p[4], p[7]];
            s.ignore_eos = false;
        }),
        params(&|s| {
            s.temperature = 0.9;
            s.seed = Some(11);
            s.frequency_penalty = 0.2;
            s.logprobs = Some(1);
        }),
    ];
    assert!(same_with_drafts(&dir, &reqs) > 0, "no draft was accepted");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A token pushed up by `logit_bias` repeats (and is drafted again and again) until its
/// frequency penalty, which grows with each copy, lets another token win: a drafted row that
/// did not count the drafts before it would keep the token longer. A stop token banned under
/// `min_tokens` and pushed up ends the answer at exactly `min_tokens`, wherever the drafts
/// cross that point.
#[test]
fn a_penalty_that_grows_with_each_draft_ends_a_run_at_the_same_token() {
    let dir = model_dir("growing");
    let t = 17;
    let mut reqs = vec![];
    for (i, f) in [0.1f32, 0.15, 0.2, 0.3, 0.45].into_iter().enumerate() {
        let params = SamplingParams { logit_bias: vec![(t, 12.0)], frequency_penalty: f, ..greedy(40) };
        let mut prompt = vec![t; 10];
        prompt.extend([3 + i as u32, 9, t, t]);
        reqs.push(Request { prompt, params, priority: 0 });
    }
    let p = own_words(&dir, vec![4, 5]);
    for m in 2..12 {
        let params =
            SamplingParams { logit_bias: vec![(t, 12.0)], stop_token_ids: vec![t], min_tokens: m, ..greedy(40) };
        reqs.push(Request { prompt: p.clone(), params, priority: 0 });
    }
    let (want, _) = run(&dir, None, &reqs);
    let runs: Vec<usize> = want[..5].iter().map(|a| a[0].0.iter().take_while(|&&x| x == t).count()).collect();
    assert!(runs.iter().all(|&r| r > 2 && r < 40), "each run of {t} should end within the answer: {runs:?}");
    for (a, m) in want[5..].iter().zip(2..) {
        assert_eq!(a[0].0.len(), m + 1, "the stop token ends it right after min_tokens");
    }
    assert!(same_with_drafts(&dir, &reqs) > 0, "no draft was accepted");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_of_n_completions_drafts_on_its_own() {
    let dir = model_dir("n");
    let p = own_words(&dir, vec![1, 2, 3]);
    let q = own_words(&dir, vec![7, 7, 1]);
    let sampled = |seed, n| SamplingParams {
        n,
        temperature: 0.7,
        seed: Some(seed),
        max_tokens: Some(30),
        ignore_eos: true,
        ..Default::default()
    };
    let reqs = vec![
        Request { prompt: p.clone(), params: SamplingParams { n: 2, ..greedy(30) }, priority: 0 },
        Request { prompt: p.clone(), params: sampled(5, 3), priority: 0 },
        Request { prompt: q.clone(), params: SamplingParams { logprobs: Some(1), ..sampled(6, 2) }, priority: 0 },
    ];
    assert!(same_with_drafts(&dir, &reqs) > 0, "no draft was accepted");
    let (answers, _) = run(&dir, Some(SpeculativeConfig::ngram(3)), &reqs);
    assert_eq!(answers[0][0], answers[0][1], "greedy completions are one answer");
    assert_ne!(answers[1][0].0, answers[1][1].0, "sampled completions draw on their own");
    let _ = std::fs::remove_dir_all(&dir);
}
