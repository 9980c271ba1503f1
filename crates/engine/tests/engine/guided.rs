//! Constrained decoding in the engine, with small hand-written constraints over the reference
//! backend's tiny model: the mask decides what is sampled, a constrained request leaves the
//! requests beside it unchanged, a finished grammar ends with "stop", one that admits nothing
//! ends with an error and frees its blocks, and each of `n` completions has its own state.

use crate::common;

use std::path::PathBuf;

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::{
    Constraint, ConstraintFactory, Engine, EngineConfig, FinishReason, Guided, Request, SamplingParams,
};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-guided-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

fn engine(dir: &std::path::Path, num_kv_blocks: usize, max_batch_tokens: usize) -> Engine {
    let opts = LoadOptions { max_batch_tokens, max_seqs: 16, num_kv_blocks, block_size: 16, ..Default::default() };
    let runner: Box<dyn ModelRunner> = Box::new(Model::load(RefBackend::new(), dir, opts).unwrap());
    let cfg = EngineConfig { max_num_batched_tokens: Some(max_batch_tokens), ..Default::default() };
    Engine::new(runner, letters(), cfg).unwrap()
}

/// Allows only tokens `t` with `t % modulus == residue`; finished after `len` tokens (if set);
/// admits nothing at all from token `dead_at` on (if set). Records what it was given.
#[derive(Clone, Copy)]
struct Modular {
    modulus: u32,
    residue: u32,
    len: Option<usize>,
    dead_at: Option<usize>,
}

struct ModularState {
    spec: Modular,
    seen: Vec<u32>,
}

impl ConstraintFactory for Modular {
    fn start(&self) -> Result<Box<dyn Constraint>, String> {
        Ok(Box::new(ModularState { spec: *self, seen: vec![] }))
    }
    fn kind(&self) -> &str {
        "modular"
    }
}

impl Constraint for ModularState {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        let dead = self.spec.dead_at.is_some_and(|d| self.seen.len() >= d);
        for (w, word) in mask.iter_mut().enumerate() {
            *word = 0;
            for b in 0..32 {
                let t = (w * 32 + b) as u32;
                if !dead && t % self.spec.modulus == self.spec.residue {
                    *word |= 1 << b;
                }
            }
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        if token % self.spec.modulus != self.spec.residue {
            return Err(format!("token {token} was not allowed"));
        }
        self.seen.push(token);
        Ok(())
    }
    fn is_finished(&self) -> bool {
        self.spec.len.is_some_and(|l| self.seen.len() >= l)
    }
}

fn guided(m: Modular) -> Option<Guided> {
    Some(Guided::new(m))
}

fn prompt(i: u32, vocab: u32) -> Vec<u32> {
    (0..5 + i * 3).map(|j| (j * 53 + i * 11 + 3) % vocab).collect()
}

#[test]
fn a_constrained_request_changes_nothing_for_its_neighbours() {
    let dir = model_dir("neighbours");
    let vocab = 384u32;
    let free = |i: u32| Request {
        prompt: prompt(i, vocab),
        params: SamplingParams {
            seed: Some(7 + i as u64),
            temperature: if i.is_multiple_of(2) { 0.0 } else { 0.9 },
            ignore_eos: true,
            max_tokens: Some(10),
            ..Default::default()
        },
        priority: 0,
    };
    // Each unconstrained request alone.
    let mut want = vec![];
    for i in 0..4 {
        let mut e = engine(&dir, 64, 64);
        let mut s = e.add_request(free(i)).unwrap();
        run_to_idle(&mut e);
        want.push(collect(&drain(&mut s), 1).tokens[0].clone());
    }
    // The same among constrained requests (greedy and sampled), chunked at 24 tokens a step.
    let mut e = engine(&dir, 64, 24);
    let mut streams = vec![];
    for i in 0..4 {
        streams.push(e.add_request(free(i)).unwrap());
        let c = Request {
            prompt: prompt(i + 10, vocab),
            params: SamplingParams {
                temperature: if i.is_multiple_of(2) { 0.0 } else { 1.0 },
                seed: Some(i as u64),
                ignore_eos: true,
                max_tokens: Some(12),
                guided: guided(Modular { modulus: 3, residue: 1, len: None, dead_at: None }),
                // Logprobs bring a step's logits to the host: while this one runs, masked rows
                // sample there; otherwise where the model samples (the mask passed down).
                logprobs: (i == 3).then_some(1),
                ..Default::default()
            },
            priority: 0,
        };
        streams.push(e.add_request(c).unwrap());
    }
    run_to_idle(&mut e);
    for (k, s) in streams.iter_mut().enumerate() {
        let got = collect(&drain(s), 1);
        if k % 2 == 0 {
            assert_eq!(got.tokens[0], want[k / 2], "unconstrained request {} beside constrained ones", k / 2);
        } else {
            assert_eq!(got.tokens[0].len(), 12);
            assert!(got.tokens[0].iter().all(|t| t % 3 == 1), "the mask was not applied: {:?}", got.tokens[0]);
        }
    }
    assert_eq!(e.scheduler().bm.usage(), 0.0, "every block is free again");
    let st = e.stats();
    assert_eq!(st.guided_masks_total, 4 * 12, "one mask per constrained token");
    let _ = std::fs::remove_dir_all(&dir);
}

/// As vLLM (xgrammar): once the grammar is complete, a model with an EOS token samples it (the
/// only token allowed) and it counts as an output token; the finish names it.
#[test]
fn a_complete_grammar_ends_with_the_eos_it_forces() {
    let dir = model_dir("eos");
    let mut e = engine(&dir, 64, 64);
    // The random model's eos_token_id; the grammar's tokens (3 mod 5) never include it.
    let eos = 2;
    let params = SamplingParams {
        n: 2,
        temperature: 1.0,
        seed: Some(5),
        max_tokens: Some(20),
        guided: guided(Modular { modulus: 5, residue: 3, len: Some(4), dead_at: None }),
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: prompt(1, 384), params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let got = collect(&drain(&mut s), 2);
    for i in 0..2 {
        assert_eq!(got.tokens[i].len(), 5, "completion {i}: {:?}", got.tokens[i]);
        assert!(got.tokens[i][..4].iter().all(|t| t % 5 == 3));
        assert_eq!(got.tokens[i][4], eos);
        assert_eq!(got.finish[i], Some(FinishReason::Stop { stop_string: None, stop_token: Some(eos) }));
    }
    // With room for no more token than the grammar's, it ends as the grammar completes.
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(4),
        guided: guided(Modular { modulus: 5, residue: 3, len: Some(4), dead_at: None }),
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: prompt(1, 384), params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let got = collect(&drain(&mut s), 1);
    assert_eq!(
        (got.tokens[0].len(), got.finish[0].clone()),
        (4, Some(FinishReason::Stop { stop_string: None, stop_token: None }))
    );
    assert_eq!(e.scheduler().bm.usage(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_grammar_decides_the_end_and_n_completions_each_follow_it() {
    let dir = model_dir("end");
    let mut e = engine(&dir, 64, 64);
    // Finished after 4 tokens: "stop", though max_tokens allows 20.
    let params = SamplingParams {
        n: 3,
        temperature: 1.0,
        seed: Some(5),
        max_tokens: Some(20),
        ignore_eos: true,
        guided: guided(Modular { modulus: 5, residue: 2, len: Some(4), dead_at: None }),
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: prompt(1, 384), params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let got = collect(&drain(&mut s), 3);
    for i in 0..3 {
        assert_eq!(got.tokens[i].len(), 4, "completion {i}: {:?}", got.tokens[i]);
        assert!(got.tokens[i].iter().all(|t| t % 5 == 2));
        assert_eq!(got.finish[i], Some(FinishReason::Stop { stop_string: None, stop_token: None }));
    }
    assert_ne!(got.tokens[0], got.tokens[1], "sampled completions differ (each its own draw and state)");
    assert_eq!(e.scheduler().bm.usage(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_grammar_that_admits_nothing_ends_with_an_error_and_frees_its_blocks() {
    let dir = model_dir("dead");
    let mut e = engine(&dir, 64, 64);
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(20),
        ignore_eos: true,
        guided: guided(Modular { modulus: 2, residue: 0, len: None, dead_at: Some(3) }),
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: prompt(2, 384), params, priority: 0 }).unwrap();
    let mut other = e
        .add_request(Request {
            prompt: prompt(3, 384),
            params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(8) },
            priority: 0,
        })
        .unwrap();
    run_to_idle(&mut e);
    let got = collect(&drain(&mut s), 1);
    assert_eq!(got.tokens[0].len(), 3);
    match &got.finish[0] {
        Some(FinishReason::Error(m)) => assert!(m.contains("admits no token"), "{m}"),
        f => panic!("expected an error finish, got {f:?}"),
    }
    assert_eq!(collect(&drain(&mut other), 1).tokens[0].len(), 8, "the request beside it runs to its end");
    assert_eq!(e.scheduler().bm.usage(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}
