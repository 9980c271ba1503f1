//! Issue 29 in wall-clock time, on the threaded engine: a step's time follows its token budget,
//! so with a small budget a prefill abandoned midway frees the device (its KV blocks, the
//! model's time) within about one step, and a request arriving during a long prefill gets its
//! first token within about two steps, where a budget holding the whole prompt would keep it
//! waiting for the whole prefill.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use tandem_engine::fake_model::{FakeModel, ForwardTimes};
use tandem_engine::{EngineConfig, Request, SamplingParams};

const PER_TOKEN: Duration = Duration::from_millis(1);
const BUDGET: usize = 64;
/// One full step: `BUDGET` tokens at `PER_TOKEN`.
const STEP: Duration = Duration::from_millis(64);
/// Scheduling noise on a loaded 2-core machine; the whole prefill is 2 s, 30x a step.
const SLACK: Duration = Duration::from_millis(150);

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(7) + seed * 13) % 60).collect()
}

/// The engine over the fake model at a CPU backend's pace (`PER_TOKEN` a token), and the log
/// of its forwards: (start, end, tokens).
fn spawn(budget: usize) -> (tandem_engine::EngineHandle, ForwardTimes) {
    let log = ForwardTimes::default();
    let mut model = fake(512, budget, 8);
    model.per_token = PER_TOKEN;
    model.forward_times = Some(log.clone());
    let cfg = EngineConfig {
        max_num_batched_tokens: Some(budget),
        max_model_len: Some(4096),
        enable_prefix_caching: false,
        ..Default::default()
    };
    (tandem_engine::Engine::spawn(Box::new(model), letters(), cfg).unwrap(), log)
}

#[test]
fn an_abandoned_prefill_frees_the_device_within_one_step() {
    let (h, log) = spawn(BUDGET);
    let long = h.submit(Request { prompt: prompt(2048, 1), params: SamplingParams::greedy(4), priority: 0 }).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(h.stats().kv_usage > 0.0, "the prefill holds KV blocks");
    let t = Instant::now();
    drop(long); // the client goes away: the request is aborted
    while h.stats().kv_usage > 0.0 {
        assert!(t.elapsed() < Duration::from_secs(5), "the aborted request's blocks are never freed");
        std::thread::sleep(Duration::from_millis(2));
    }
    let freed = t.elapsed();
    // Let any step still running land, then read what the model ran after the abort.
    std::thread::sleep(STEP * 2);
    let after: Vec<(Duration, usize)> =
        log.lock().unwrap().iter().filter(|(s, _, _)| *s > t).map(|(s, _, n)| (*s - t, *n)).collect();
    h.shutdown();
    println!("KV freed {freed:?} after the abort (a step is {STEP:?}); forwards started after it: {after:?}");
    assert!(freed <= STEP + SLACK, "KV freed {freed:?} after the abort, more than a step ({STEP:?}) + {SLACK:?}");
    assert!(after.iter().all(|(s, _)| *s <= SLACK), "the model kept running the abandoned prompt: {after:?}");
}

#[test]
fn a_newcomer_gets_its_first_token_within_two_steps_of_a_long_prefill() {
    let first_token = |budget: usize| -> (Duration, Vec<u32>) {
        let (h, _) = spawn(budget);
        let mut long =
            h.submit(Request { prompt: prompt(2048, 1), params: SamplingParams::greedy(4), priority: 0 }).unwrap();
        std::thread::sleep(Duration::from_millis(150));
        let t = Instant::now();
        let mut short =
            h.submit(Request { prompt: prompt(2, 2), params: SamplingParams::greedy(4), priority: 0 }).unwrap();
        let mut ttft = None;
        let mut outs = Vec::new();
        while let Some(o) = short.blocking_recv() {
            if ttft.is_none() && !o.token_ids.is_empty() {
                ttft = Some(t.elapsed());
            }
            outs.push(o);
        }
        // The long prompt's greedy output is what it is alone: chunking does not change it.
        let long_outs: Vec<_> = std::iter::from_fn(|| long.blocking_recv()).collect();
        assert_eq!(collect(&long_outs, 1).tokens[0], FakeModel::greedy(&model_config(), &prompt(2048, 1), 4, false));
        h.shutdown();
        (ttft.expect("the short request produced a token"), collect(&outs, 1).tokens[0].clone())
    };
    let (small, tokens) = first_token(BUDGET);
    assert_eq!(tokens, FakeModel::greedy(&model_config(), &prompt(2, 2), 4, false));
    // A budget holding the whole prompt: one 2-second step that the newcomer waits out.
    let (whole, _) = first_token(2048);
    println!("first token of a 2-token request during a 2,048-token prefill: budget {BUDGET}: {small:?}; budget 2048: {whole:?} (a {BUDGET}-token step is {STEP:?})");
    assert!(
        small <= STEP * 2 + SLACK,
        "budget {BUDGET}: first token after {small:?}, more than two steps ({:?}) + {SLACK:?}",
        STEP * 2
    );
    assert!(whole > Duration::from_secs(1), "budget 2048: the newcomer should have waited out the prefill ({whole:?})");
}
