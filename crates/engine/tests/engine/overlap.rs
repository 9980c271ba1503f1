//! Async scheduling (`EngineConfig::async_scheduling`): step N+1 is scheduled and sent to the
//! model worker before step N's ids reach the engine. Every request's outputs must be the same
//! as with it off (the synchronous engine), whatever shares the batch; nothing is emitted twice
//! or after a finish; no KV block leaks; and the overlap must actually happen.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tandem_engine::constraint::AllowedTokens;
use tandem_engine::fake_model::FakeModel;
use tandem_engine::{DecodeFn, Engine, EngineConfig, FinishReason, Guided, Request, RequestOutput, SamplingParams};

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(11) + seed * 17) % 60).collect()
}

fn with_async(cfg: &EngineConfig, on: bool) -> EngineConfig {
    EngineConfig { async_scheduling: on, ..cfg.clone() }
}

/// Every message of every request, per completion, timings left out (they differ from run to
/// run), and whether it was the request's last. How the messages of a request's `n`
/// completions interleave is not compared: completions are independent streams.
fn run_all(e: &mut Engine, reqs: &[Request]) -> Vec<Vec<Vec<RequestOutput>>> {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(e);
    streams
        .iter_mut()
        .zip(reqs)
        .map(|(s, r)| {
            let mut outs = drain(s);
            let c = collect(&outs, r.params.n);
            assert_eq!(c.finals.len(), 1, "one final output per request");
            let mut per = vec![vec![]; r.params.n];
            for mut o in outs.drain(..) {
                o.metrics = None;
                per[o.index].push(o);
            }
            per
        })
        .collect()
}

/// A crowd of requests over a tight pool and a small budget: greedy and seeded sampling,
/// stop strings and stop ids, EOS, max_tokens, n > 1, shared prefixes, chunked prefill.
fn crowd(salt: u32) -> Vec<Request> {
    (0..24u32)
        .map(|i| {
            let mut p = if i % 4 == 0 { prompt(40, 1) } else { vec![] };
            p.extend(prompt(1 + ((i + salt) as usize * 13) % 45, i + salt));
            let mut params =
                SamplingParams { max_tokens: Some(3 + ((i + salt) as usize * 7) % 30), ..Default::default() };
            match i % 6 {
                0 => params.temperature = 0.0,
                1 => (params.temperature, params.seed) = (1.0, Some(7 + salt as u64)),
                2 => (params.temperature, params.top_p, params.top_k, params.seed) = (0.8, 0.9, 8, Some(i as u64)),
                3 => (params.temperature, params.min_p, params.stop) = (1.2, 0.05, vec!["ab".into(), "q".into()]),
                4 => (params.temperature, params.n, params.seed, params.ignore_eos) = (1.0, 3, Some(99), true),
                _ => {
                    (params.stop_token_ids, params.include_stop_str_in_output, params.stop) =
                        (vec![5, 17], true, vec!["c".into()])
                }
            }
            Request { prompt: p, params, priority: 0 }
        })
        .collect()
}

#[test]
fn outputs_are_the_same_with_async_scheduling_on_and_off() {
    for (salt, blocks, budget, seqs) in [(0, 20, 48, 8), (1, 12, 32, 6), (2, 64, 128, 16), (3, 9, 20, 4)] {
        let reqs = crowd(salt);
        let base = EngineConfig { seed: salt as u64, resume_protect_steps: 2, ..Default::default() };
        let mut sync = engine(fake(blocks, budget, seqs), with_async(&base, false));
        let want = run_all(&mut sync, &reqs);
        let mut overlapped = engine(fake(blocks, budget, seqs), with_async(&base, true));
        let got = run_all(&mut overlapped, &reqs);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "salt {salt}: request {i} differs with async scheduling");
        }
        let (s, o) = (sync.stats(), overlapped.stats());
        assert_eq!((s.async_steps_total, o.sync_steps_total), (0, 0), "salt {salt}: {s:?} {o:?}");
        assert!(o.async_steps_total > 0);
        if blocks < 20 {
            assert!(
                s.preemptions_total > 0 && o.preemptions_total > 0,
                "salt {salt}: the pool should force preemption"
            );
        }
        for e in [&sync, &overlapped] {
            assert_eq!(e.scheduler().bm.num_free(), blocks, "salt {salt}: blocks leaked");
            assert_eq!(e.scheduler().num_retired_blocks(), 0);
        }
    }
}

/// Rows that need the host (logprobs, penalties, min_tokens bans, a constraint) make the
/// engine drain and step synchronously while they live; the others overlap before and after,
/// and every request gets what it gets with async scheduling off.
#[test]
fn rows_that_need_the_host_fall_back_to_synchronous_steps_with_the_same_outputs() {
    // First in line, so that they end early and the crowd overlaps afterwards.
    let mut reqs = vec![];
    let host = |params: SamplingParams, len: usize| Request { prompt: prompt(len, 3), params, priority: 0 };
    reqs.push(host(SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(4) }, 9));
    reqs.push(host(
        SamplingParams { repetition_penalty: 1.3, temperature: 1.0, seed: Some(3), ..SamplingParams::greedy(5) },
        30,
    ));
    reqs.push(host(SamplingParams { min_tokens: 4, ..SamplingParams::greedy(6) }, 12));
    reqs.push(host(
        SamplingParams { guided: Some(Guided::new(AllowedTokens(vec![3, 4, 5, 63]))), ..SamplingParams::greedy(6) },
        14,
    ));
    reqs.push(host(SamplingParams { prompt_logprobs: Some(1), ..SamplingParams::greedy(3) }, 20));
    reqs.extend(crowd(5));
    let cfg = EngineConfig { seed: 5, ..Default::default() };
    let want = run_all(&mut engine(fake(24, 48, 8), with_async(&cfg, false)), &reqs);
    let mut e = engine(fake(24, 48, 8), with_async(&cfg, true));
    let got = run_all(&mut e, &reqs);
    assert_eq!(got, want);
    let st = e.stats();
    assert!(st.sync_steps_total > 0 && st.async_steps_total > 0, "{st:?}");
    assert_eq!(e.scheduler().bm.num_free(), 24);
}

/// A request that ends by length still has a row in the step in flight: that token is never
/// emitted, and the blocks it writes are freed only once that step has come back.
#[test]
fn a_finished_sequence_keeps_its_blocks_until_its_last_step_lands_and_emits_nothing_more() {
    let cfg = model_config();
    let mut e = engine(fake(8, 64, 4), EngineConfig { async_scheduling: true, ..Default::default() });
    let p = prompt(20, 4);
    let mut s = e
        .add_request(Request {
            prompt: p.clone(),
            params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(3) },
            priority: 0,
        })
        .unwrap();
    let mut outs = vec![];
    while !outs.iter().any(|o: &RequestOutput| o.finished) {
        e.step();
        outs.extend(drain(&mut s));
        assert!(e.has_work(), "the final output comes while a step is still in flight");
    }
    // The row of the step after the last token is in flight and writes the sequence's blocks.
    assert_eq!(e.scheduler().num_retired_blocks(), 2);
    assert_eq!(e.scheduler().bm.num_free(), 6);
    // Nobody holds them any more: the usage gauge says so at once.
    assert_eq!(e.stats().kv_usage, 0.0);
    e.step();
    assert!(!e.has_work());
    assert_eq!(e.scheduler().num_retired_blocks(), 0);
    assert_eq!(e.scheduler().bm.num_free(), 8);
    assert!(drain(&mut s).is_empty(), "nothing after the final output");
    let c = collect(&outs, 1);
    assert_eq!(c.tokens[0], FakeModel::greedy(&cfg, &p, 3, true));
    assert_eq!(c.finals[0].usage.unwrap().completion_tokens, 3);
    assert_eq!(c.finish[0], Some(FinishReason::Length));
}

/// Aborts while steps are in flight: each request ends exactly once, what it got before is a
/// prefix of the oracle, nothing arrives after the abort, and every block comes back.
#[test]
fn aborts_mid_flight_end_each_request_once_and_free_every_block() {
    let cfg = model_config();
    let reqs: Vec<Request> = (0..12u32)
        .map(|i| Request { prompt: prompt(5 + i as usize * 3, i), params: SamplingParams::greedy(40), priority: 0 })
        .collect();
    for abort_at in [1usize, 2, 3, 5, 8] {
        let mut e = engine(fake(40, 64, 8), EngineConfig { async_scheduling: true, ..Default::default() });
        let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
        let mut outs: Vec<Vec<RequestOutput>> = vec![vec![]; reqs.len()];
        let mut step = 0;
        while e.has_work() {
            e.step();
            step += 1;
            e.scheduler().check_invariants().unwrap();
            for (o, s) in outs.iter_mut().zip(&mut streams) {
                o.extend(drain(s));
            }
            if step == abort_at {
                let free = e.scheduler().bm.num_free();
                for s in streams.iter().step_by(2) {
                    e.abort(s.id());
                }
                // A sequence with a row in flight keeps its blocks until that step lands.
                assert!(e.scheduler().num_retired_blocks() > 0 || step == 1, "abort at {abort_at}");
                assert!(e.scheduler().bm.num_free() >= free);
            }
            assert!(step < 10_000);
        }
        for (o, s) in outs.iter_mut().zip(&mut streams) {
            o.extend(drain(s));
        }
        assert_eq!(e.scheduler().bm.num_free(), 40, "abort at {abort_at}: blocks leaked");
        assert_eq!(e.num_requests(), 0);
        for (i, (o, r)) in outs.iter().zip(&reqs).enumerate() {
            let c = collect(o, 1);
            assert_eq!(c.finals.len(), 1);
            let want = FakeModel::greedy(&cfg, &r.prompt, 40, false);
            assert_eq!(c.tokens[0], want[..c.tokens[0].len()], "abort at {abort_at}, request {i}");
            if i % 2 == 0 {
                assert_eq!(c.finish[0], Some(FinishReason::Abort), "abort at {abort_at}, request {i}");
            } else {
                assert_eq!(c.tokens[0], want);
            }
        }
    }
}

/// A failed forward fails the requests in its batch, with the next step already sent; the
/// engine goes on, each request ends once and the pool comes back whole.
#[test]
fn a_failed_step_in_flight_fails_its_requests_once_and_the_engine_goes_on() {
    let mut m = fake(32, 64, 8);
    m.fail_calls = vec![3];
    let mut e = engine(m, EngineConfig { async_scheduling: true, ..Default::default() });
    let reqs: Vec<Request> = (0..6u32)
        .map(|i| Request { prompt: prompt(4 + i as usize, i), params: SamplingParams::greedy(10), priority: 0 })
        .collect();
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(&mut e);
    let errors = streams
        .iter_mut()
        .map(|s| collect(&drain(s), 1).finish[0].clone())
        .filter(|f| matches!(f, Some(FinishReason::Error(_))))
        .count();
    assert!(errors > 0);
    let mut after =
        e.add_request(Request { prompt: prompt(6, 9), params: SamplingParams::greedy(5), priority: 0 }).unwrap();
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut after), 1).tokens[0], FakeModel::greedy(&model_config(), &prompt(6, 9), 5, false));
    assert_eq!(e.scheduler().bm.num_free(), 32);
}

/// The point of it: with a model whose forward takes a while, the engine thread's
/// postprocessing of step N (detokenizing, here timed by the decode function) runs while the
/// worker is inside step N+1's forward. With async scheduling off it never does.
#[test]
fn postprocessing_runs_during_the_next_forward_only_with_async_scheduling() {
    for on in [true, false] {
        let forwards = Arc::new(Mutex::new(Vec::new()));
        let decodes = Arc::new(Mutex::new(Vec::new()));
        let mut m = fake(32, 64, 8);
        m.delay = Duration::from_millis(20); // long enough that a loaded machine still overlaps
        m.forward_times = Some(forwards.clone());
        let (letters, log) = (letters(), decodes.clone());
        let decode: DecodeFn = Arc::new(move |ids: &[u32]| {
            log.lock().unwrap().push(Instant::now());
            letters(ids)
        });
        let mut e =
            Engine::new(Box::new(m), decode, EngineConfig { async_scheduling: on, ..Default::default() }).unwrap();
        let mut streams: Vec<_> = (0..3)
            .map(|i| {
                e.add_request(Request {
                    prompt: prompt(6, i),
                    params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) },
                    priority: 0,
                })
                .unwrap()
            })
            .collect();
        run_to_idle(&mut e);
        for s in &mut streams {
            assert_eq!(collect(&drain(s), 1).tokens[0].len(), 6);
        }
        let (f, d) = (forwards.lock().unwrap().clone(), decodes.lock().unwrap().clone());
        let inside = d.iter().filter(|t| f.iter().any(|(a, b, _)| a < *t && *t < b)).count();
        if on {
            // Every step but the first lands while the next runs (the last one lands alone).
            assert!(inside * 2 >= d.len(), "async: {inside} of {} decodes ran during a forward", d.len());
            assert!(e.stats().async_steps_total >= 6);
        } else {
            assert_eq!(inside, 0, "sync: a decode ran during a forward");
        }
    }
}

/// On a real forward pass (the reference backend over a seeded tiny model): greedy and seeded
/// requests, `n = 2`, shared prefixes, chunked prefill and preemption under a small pool give
/// the same outputs with async scheduling on and off.
#[test]
fn the_reference_model_gives_the_same_outputs_with_async_scheduling() {
    use tandem_core::model::LoadOptions;
    use tandem_core::{DType, Model};
    let dir = std::env::temp_dir().join(format!("tandem-engine-overlap-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tandem_model_files::random_model::write_random_model(
        &dir,
        tandem_model_files::random_model::Shape::Tiny,
        11,
        DType::F32,
    )
    .unwrap();
    let runner = || {
        let opts =
            LoadOptions { max_batch_tokens: 24, max_seqs: 16, num_kv_blocks: 14, block_size: 16, ..Default::default() };
        Box::new(Model::load(tandem_reference::RefBackend::new(), &dir, opts).unwrap())
    };
    let vocab = tandem_core::ModelRunner::config(runner().as_ref()).vocab_size as u32;
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..8u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 5).map(|j| (j * 101 + i * 7 + 1) % vocab));
            let mut params = SamplingParams {
                temperature: [0.0, 1.0, 0.7][i as usize % 3],
                seed: Some(50 + i as u64),
                ignore_eos: true,
                max_tokens: Some(10),
                ..Default::default()
            };
            match i {
                1 => params.top_k = 5,
                2 => params.top_p = 0.8,
                4 => params.n = 2,
                _ => {}
            }
            Request { prompt: p, params, priority: 0 }
        })
        .collect();
    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let mut sync = Engine::new(runner(), letters(), with_async(&cfg, false)).unwrap();
    let want = run_all(&mut sync, &reqs);
    let mut overlapped = Engine::new(runner(), letters(), with_async(&cfg, true)).unwrap();
    let got = run_all(&mut overlapped, &reqs);
    assert_eq!(got, want);
    let (s, o) = (sync.stats(), overlapped.stats());
    assert!(s.preemptions_total > 0 && o.preemptions_total > 0, "the pool should force preemption");
    assert!(o.async_steps_total > 0 && o.sync_steps_total == 0, "{o:?}");
    assert_eq!(overlapped.scheduler().bm.num_free(), 14);
    let _ = std::fs::remove_dir_all(&dir);
}
