//! Randomized scheduler properties over many seeds: random arrivals, lengths, `n`, priorities
//! and aborts, in pools small enough to force preemption. After every step no block is leaked
//! or owned wrongly (ref counts equal the number of block tables holding each block); at the
//! end every request ended exactly once, greedy ones with the oracle's tokens, and the free
//! count is back to the total.

use crate::common;

use std::time::Duration;

use common::*;
use tandem_engine::fake_model::FakeModel;
use tandem_engine::{BatchMode, EngineConfig, FinishReason, Policy, Request, SamplingParams};

fn below(r: &mut Rng, n: u64) -> u64 {
    r.next_u64() % n
}

struct Case {
    seed: u64,
    preemptions: u64,
    finished: usize,
    aborted: usize,
}

fn run_case(seed: u64, async_scheduling: bool) -> Case {
    let mut r = Rng::new(seed);
    let num_blocks = 6 + below(&mut r, 20) as usize;
    let budget = 16 + below(&mut r, 80) as usize;
    let max_seqs = 2 + below(&mut r, 7) as usize;
    let block_size = if below(&mut r, 3) == 0 { 32 } else { 16 };
    let slots = num_blocks * block_size;
    let mode = if below(&mut r, 5) == 0 {
        BatchMode::Static { batch_size: 1 + below(&mut r, max_seqs as u64) as usize, max_wait: Duration::ZERO }
    } else {
        BatchMode::Continuous
    };
    let cfg = EngineConfig {
        policy: if below(&mut r, 2) == 0 { Policy::Fcfs } else { Policy::Priority },
        enable_prefix_caching: below(&mut r, 4) != 0,
        resume_protect_steps: below(&mut r, 6),
        mode,
        seed,
        async_scheduling,
        ..Default::default()
    };
    let mut e = engine(FakeModel::new(model_config(), num_blocks, block_size, budget, max_seqs), cfg);
    let prefixes: Vec<Vec<u32>> =
        (0..3).map(|_| (0..16 + below(&mut r, 24)).map(|_| below(&mut r, 60) as u32).collect()).collect();
    let mut live = vec![];
    let mut done = vec![];
    for step in 0..3000 {
        if step < 80 {
            for _ in 0..below(&mut r, 3) {
                let mut prompt =
                    if below(&mut r, 2) == 0 { prefixes[below(&mut r, 3) as usize].clone() } else { vec![] };
                prompt.extend((0..1 + below(&mut r, 40)).map(|_| below(&mut r, 64) as u32));
                prompt.truncate(slots / 2);
                prompt.truncate(200);
                let max_tokens = 1 + below(&mut r, (slots - prompt.len()).min(40) as u64) as usize;
                let n = if below(&mut r, 4) == 0 { 1 + below(&mut r, 3) as usize } else { 1 };
                let greedy = below(&mut r, 2) == 0;
                let params = SamplingParams {
                    n,
                    temperature: if greedy { 0.0 } else { 1.0 },
                    max_tokens: Some(max_tokens),
                    seed: Some(below(&mut r, 1000)),
                    ignore_eos: below(&mut r, 3) == 0,
                    ..Default::default()
                };
                let req = Request { prompt, params, priority: below(&mut r, 3) as i32 };
                match e.add_request(req.clone()) {
                    Ok(s) => live.push((req, s)),
                    // Static batches reserve n copies; those may not fit a tiny pool.
                    Err(err) => {
                        assert!(matches!(mode, BatchMode::Static { .. }) && req.params.n > 1, "seed {seed}: {err}")
                    }
                }
            }
        }
        if below(&mut r, 20) == 0 && !live.is_empty() {
            let i = below(&mut r, live.len() as u64) as usize;
            e.abort(live[i].1.id());
        }
        e.step();
        e.scheduler().check_invariants().unwrap_or_else(|m| panic!("seed {seed}, step {step}: {m}"));
        for (_, s) in live.iter_mut() {
            while let Some(o) = s.try_recv() {
                done.push(o);
            }
        }
        if step >= 80 && !e.has_work() {
            break;
        }
    }
    assert!(!e.has_work(), "seed {seed}: work left after 3000 steps");
    assert_eq!(e.scheduler().bm.num_free(), num_blocks, "seed {seed}: blocks leaked");
    assert_eq!(e.num_requests(), 0);
    let (mut finished, mut aborted) = (0, 0);
    for (req, s) in live.iter_mut() {
        let mut outs: Vec<_> = done.iter().filter(|o| o.request_id == s.id()).cloned().collect();
        outs.extend(std::iter::from_fn(|| s.try_recv()));
        let c = collect(&outs, req.params.n);
        assert_eq!(c.finals.len(), 1, "seed {seed}: request {} ended {} times", s.id(), c.finals.len());
        assert!(c.finish.iter().all(|f| f.is_some()), "seed {seed}: a completion never ended");
        if c.finish.iter().any(|f| f == &Some(FinishReason::Abort)) {
            aborted += 1;
            continue;
        }
        finished += 1;
        if req.params.temperature == 0.0 {
            let want =
                FakeModel::greedy(&model_config(), &req.prompt, req.params.max_tokens.unwrap(), req.params.ignore_eos);
            for t in &c.tokens {
                assert_eq!(t, &want, "seed {seed}: greedy output differs from the oracle");
            }
        }
    }
    Case { seed, preemptions: e.stats().preemptions_total, finished, aborted }
}

#[test]
fn random_arrivals_aborts_and_pressure_keep_every_invariant() {
    let cases: Vec<Case> = (0..150).map(|s| run_case(s, false)).collect();
    let preempting = cases.iter().filter(|c| c.preemptions > 0).count();
    let finished: usize = cases.iter().map(|c| c.finished).sum();
    let aborted: usize = cases.iter().map(|c| c.aborted).sum();
    println!("150 seeds: {preempting} with preemption, {finished} requests finished, {aborted} aborted");
    assert!(preempting > 20, "too few seeds exercise preemption ({preempting}); the test is not testing");
    assert!(aborted > 20 && finished > 1000);
    assert!(cases.iter().all(|c| c.seed < 150));
}

/// The same random cases with async scheduling: aborts land while steps are in flight,
/// preemption picks sequences whose token is in flight, finished sequences keep their blocks
/// one step longer; every invariant still holds and greedy outputs still match the oracle.
#[test]
fn random_arrivals_aborts_and_pressure_keep_every_invariant_with_async_scheduling() {
    let cases: Vec<Case> = (0..150).map(|s| run_case(s, true)).collect();
    let preempting = cases.iter().filter(|c| c.preemptions > 0).count();
    let finished: usize = cases.iter().map(|c| c.finished).sum();
    let aborted: usize = cases.iter().map(|c| c.aborted).sum();
    println!("150 seeds, async: {preempting} with preemption, {finished} requests finished, {aborted} aborted");
    assert!(preempting > 20 && aborted > 20 && finished > 1000);
}
