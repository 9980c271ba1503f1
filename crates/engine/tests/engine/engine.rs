//! The engine end to end over the fake model: outputs against the fake's greedy oracle, stops,
//! seeds, `n > 1`, aborts, refusals, forward errors, and the threaded handle.

use crate::common;

use std::time::Duration;

use common::*;
use tandem_engine::fake_model::FakeModel;
use tandem_engine::{BatchMode, EngineConfig, FinishReason, Request, SamplingParams, SubmitError};

fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i.wrapping_mul(7) + seed * 13) % 60).collect()
}

fn greedy_req(p: Vec<u32>, max_tokens: usize) -> Request {
    Request { prompt: p, params: SamplingParams::greedy(max_tokens), priority: 0 }
}

#[test]
fn greedy_outputs_match_the_oracle_alone_and_in_a_crowd_under_memory_pressure() {
    let cfg = model_config();
    // 32 requests, some sharing a 32-token prefix; 24 blocks force preemption, budget 48 chunks.
    let reqs: Vec<Request> = (0..32u32)
        .map(|i| {
            let mut p = if i % 3 == 0 { prompt(32, 1) } else { vec![] };
            p.extend(prompt(1 + (i as usize * 7) % 50, i + 2));
            greedy_req(p, 5 + (i as usize * 11) % 40)
        })
        .collect();
    let mut e = engine(fake(24, 48, 16), EngineConfig::default());
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(&mut e);
    let st = e.stats();
    assert!(st.preemptions_total > 0, "the pool should force preemption: {st:?}");
    assert!(st.prefix_cache_hits_total > 0, "shared prefixes should hit: {st:?}");
    assert_eq!(e.scheduler().bm.num_free(), 24);
    for (r, s) in reqs.iter().zip(&mut streams) {
        let c = collect(&drain(s), 1);
        let want = FakeModel::greedy(&cfg, &r.prompt, r.params.max_tokens.unwrap(), false);
        assert_eq!(c.tokens[0], want, "prompt {:?}", r.prompt);
        assert_eq!(c.finals.len(), 1);
        let f = &c.finals[0];
        assert_eq!(f.usage.unwrap().completion_tokens, want.len());
        let stopped_on_eos = want.last() == Some(&EOS) && want.len() < r.params.max_tokens.unwrap();
        let reason = if stopped_on_eos {
            FinishReason::Stop { stop_string: None, stop_token: Some(EOS) }
        } else {
            FinishReason::Length
        };
        assert_eq!(f.finish_reason, Some(reason));
        let m = f.metrics.as_ref().unwrap();
        assert!(m.time_to_first_token.is_some() && m.queue_time.is_some());
        assert_eq!(m.inter_token_seconds.len(), want.len() - 1);
    }
    // The same requests alone, one by one, give the same tokens (batch invariance).
    for r in reqs.iter().take(6) {
        let mut solo = engine(fake(24, 48, 16), EngineConfig::default());
        let mut s = solo.add_request(r.clone()).unwrap();
        run_to_idle(&mut solo);
        let want = FakeModel::greedy(&cfg, &r.prompt, r.params.max_tokens.unwrap(), false);
        assert_eq!(collect(&drain(&mut s), 1).tokens[0], want);
    }
}

#[test]
fn a_seed_gives_the_same_text_whatever_the_batch() {
    let sampled = |seed: u64| Request {
        prompt: prompt(20, 3),
        params: SamplingParams {
            temperature: 1.0,
            top_p: 0.95,
            seed: Some(seed),
            max_tokens: Some(30),
            ignore_eos: true,
            ..Default::default()
        },
        priority: 0,
    };
    let mut alone = engine(fake(64, 64, 16), EngineConfig::default());
    let mut s = alone.add_request(sampled(42)).unwrap();
    run_to_idle(&mut alone);
    let solo = collect(&drain(&mut s), 1).tokens[0].clone();
    assert_eq!(solo.len(), 30);

    let mut crowd = engine(fake(64, 40, 16), EngineConfig::default());
    let mut others: Vec<_> = (0..10).map(|i| crowd.add_request(sampled(100 + i)).unwrap()).collect();
    crowd.step();
    let mut s = crowd.add_request(sampled(42)).unwrap();
    others.push(crowd.add_request(greedy_req(prompt(50, 9), 20)).unwrap());
    run_to_idle(&mut crowd);
    assert_eq!(collect(&drain(&mut s), 1).tokens[0], solo);
    let other = collect(&drain(&mut others[0]), 1).tokens[0].clone();
    assert_ne!(other, solo, "a different seed gives different text");
    // Sampling really samples: the seeded text is not the greedy one.
    assert_ne!(solo, FakeModel::greedy(&model_config(), &prompt(20, 3), 30, true));
}

#[test]
fn stop_strings_are_cut_and_never_streamed() {
    let cfg = model_config();
    let p = prompt(10, 5);
    let want = FakeModel::greedy(&cfg, &p, 40, true);
    let text: String = letters()(&want);
    // A 3-letter stop string taken from the middle of the greedy text.
    let stop = text[12..15].to_string();
    let cut = text.find(&stop).unwrap();
    let mut e = engine(fake(64, 64, 8), EngineConfig::default());
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(40),
        ignore_eos: true,
        stop: vec![stop.clone()],
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: p, params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let outs = drain(&mut s);
    let c = collect(&outs, 1);
    assert_eq!(c.text[0], text[..cut]);
    assert_eq!(c.finish[0], Some(FinishReason::Stop { stop_string: Some(stop.clone()), stop_token: None }));
    let mut shown = String::new();
    for o in &outs {
        shown += &o.text;
        assert!(!shown.contains(&stop));
    }
}

#[test]
fn stop_token_ids_min_tokens_and_logprobs() {
    let cfg = model_config();
    let p = prompt(12, 8);
    let want = FakeModel::greedy(&cfg, &p, 20, true);
    let k = 6;
    let stop_id = want[k];
    let first = want.iter().position(|&t| t == stop_id).unwrap();
    let mut e = engine(fake(64, 64, 8), EngineConfig::default());
    let base = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(20),
        ignore_eos: true,
        stop_token_ids: vec![stop_id],
        logprobs: Some(3),
        ..Default::default()
    };
    let mut a = e.add_request(Request { prompt: p.clone(), params: base.clone(), priority: 0 }).unwrap();
    let mut b = e
        .add_request(Request {
            prompt: p.clone(),
            params: SamplingParams { min_tokens: first + 1, ..base },
            priority: 0,
        })
        .unwrap();
    run_to_idle(&mut e);
    let oa = drain(&mut a);
    let ca = collect(&oa, 1);
    assert_eq!(ca.tokens[0], want[..=first]);
    assert_eq!(ca.finish[0], Some(FinishReason::Stop { stop_string: None, stop_token: Some(stop_id) }));
    for (o, &t) in oa.iter().zip(&want) {
        let lp = &o.logprobs[0];
        assert_eq!((lp.token, lp.top.len(), lp.top[0].0), (t, 3, t), "greedy takes the top logprob");
        assert!(lp.logprob < 0.0 && lp.top[0].1 >= lp.top[1].1);
    }
    // Under min_tokens the stop id is banned at position `first`, so the text goes on.
    let cb = collect(&drain(&mut b), 1);
    assert!(cb.tokens[0].len() > first + 1);
    assert_ne!(cb.tokens[0][first], stop_id);
}

#[test]
fn n_completions_share_the_prompt_blocks() {
    let mut e = engine(fake(32, 64, 8), EngineConfig::default());
    let p = prompt(40, 2);
    let params = SamplingParams {
        n: 3,
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(12),
        ignore_eos: true,
        ..Default::default()
    };
    let mut s = e.add_request(Request { prompt: p.clone(), params, priority: 0 }).unwrap();
    e.step(); // prefill; completion 0 samples, 1 and 2 are forked
    let sched = e.scheduler();
    assert_eq!(sched.num_running(), 3);
    assert_eq!(
        (sched.bm.ref_count(0), sched.bm.ref_count(1), sched.bm.ref_count(2)),
        (3, 3, 1),
        "full prompt blocks shared, the tail not"
    );
    assert_eq!(sched.bm.num_free(), 32 - 3, "children get their tail blocks when they first run");
    run_to_idle(&mut e);
    let outs = drain(&mut s);
    let c = collect(&outs, 3);
    assert!(c.tokens.iter().all(|t| t.len() == 12));
    assert!(c.tokens[0] != c.tokens[1] || c.tokens[1] != c.tokens[2], "seeded completions differ");
    assert_eq!(c.finals.len(), 1);
    assert_eq!(c.finals[0].usage.unwrap().completion_tokens, 36);
    assert_eq!(e.scheduler().bm.num_free(), 32);
    // Greedy completions are all the oracle's.
    let mut e = engine(fake(32, 64, 8), EngineConfig::default());
    let mut s = e
        .add_request(Request {
            prompt: p.clone(),
            params: SamplingParams { n: 2, ..SamplingParams::greedy(9) },
            priority: 0,
        })
        .unwrap();
    run_to_idle(&mut e);
    let c = collect(&drain(&mut s), 2);
    let want = FakeModel::greedy(&model_config(), &p, 9, false);
    assert_eq!((&c.tokens[0], &c.tokens[1]), (&want, &want));
}

#[test]
fn abort_while_waiting_and_while_running_frees_blocks_at_once() {
    let mut e = engine(fake(4, 64, 8), EngineConfig::default());
    let mut a = e.add_request(greedy_req(prompt(40, 1), 20)).unwrap();
    let mut b = e.add_request(greedy_req(prompt(40, 2), 20)).unwrap();
    e.step();
    assert_eq!((e.scheduler().num_running(), e.scheduler().num_waiting()), (1, 1));
    e.abort(b.id());
    e.abort(a.id());
    assert_eq!(e.scheduler().bm.num_free(), 4);
    assert!(!e.has_work());
    for s in [&mut a, &mut b] {
        let c = collect(&drain(s), 1);
        assert_eq!(c.finals.len(), 1);
        assert_eq!(c.finals[0].finish_reason, Some(FinishReason::Abort));
    }
    e.abort(a.id()); // twice is harmless
    assert_eq!(e.stats().requests_abort_total, 2);
    // The high-water mark outlives the blocks it counted.
    e.step();
    let st = e.stats();
    assert_eq!(st.kv_usage, 0.0);
    assert!(st.kv_usage_peak >= 0.5, "one 40-token prompt held at least 2 of 4 blocks: {st:?}");
}

#[test]
fn requests_that_can_never_fit_are_refused_at_submission() {
    // 8 blocks of 16 = 128 tokens of pool; the model's context is 4096.
    let mut e = engine(fake(8, 64, 8), EngineConfig { max_pending_requests: Some(2), ..Default::default() });
    let err = |e: &mut tandem_engine::Engine, r: Request| e.add_request(r).err().expect("refused");
    assert_eq!(
        err(&mut e, greedy_req(prompt(100, 1), 29)),
        SubmitError::TooLong { prompt: 100, max_tokens: 29, max_model_len: 128 }
    );
    assert_eq!(err(&mut e, greedy_req(vec![], 4)), SubmitError::EmptyPrompt);
    assert_eq!(err(&mut e, greedy_req(vec![1, 64], 4)), SubmitError::TokenOutOfVocab { index: 1, id: 64, vocab: 64 });
    let bad = Request { prompt: vec![1], params: SamplingParams { top_p: 0.0, ..Default::default() }, priority: 0 };
    assert!(matches!(err(&mut e, bad), SubmitError::InvalidParams(m) if m.field == "top_p"));
    // max_tokens left out: whatever the context leaves.
    let mut s = e
        .add_request(Request {
            prompt: prompt(100, 1),
            params: SamplingParams { max_tokens: None, ignore_eos: true, temperature: 0.0, ..Default::default() },
            priority: 0,
        })
        .unwrap();
    let _t = e.add_request(greedy_req(vec![1], 1)).unwrap();
    assert!(matches!(err(&mut e, greedy_req(vec![1], 1)), SubmitError::Overloaded { pending: 2, limit: 2 }));
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut s), 1).tokens[0].len(), 28);
    assert!(e.add_request(greedy_req(vec![1], 1)).is_ok(), "finished requests leave the bound");

    // Static mode reserves all n completions: 3 x 80 tokens = 15 blocks > 8.
    let stat =
        EngineConfig { mode: BatchMode::Static { batch_size: 4, max_wait: Duration::ZERO }, ..Default::default() };
    let mut e = engine(fake(8, 64, 8), stat);
    let r =
        Request { prompt: prompt(40, 1), params: SamplingParams { n: 3, ..SamplingParams::greedy(40) }, priority: 0 };
    assert_eq!(err(&mut e, r), SubmitError::NeverFits { needed: 15, copies: 3, tokens: 80, pool: 8 });
}

#[test]
fn a_failed_forward_fails_its_batch_and_the_engine_goes_on() {
    let mut m = fake(32, 64, 8);
    m.fail_calls = vec![1];
    let mut e = engine(m, EngineConfig::default());
    let mut a = e.add_request(greedy_req(prompt(10, 1), 5)).unwrap();
    let mut b = e.add_request(greedy_req(prompt(10, 2), 5)).unwrap();
    e.step(); // call 0: fine
    e.step(); // call 1: fails both
    assert!(!e.has_work());
    assert_eq!(e.scheduler().bm.num_free(), 32);
    for s in [&mut a, &mut b] {
        let c = collect(&drain(s), 1);
        assert_eq!(c.tokens[0].len(), 1);
        assert!(matches!(&c.finals[0].finish_reason, Some(FinishReason::Error(m)) if m.contains("injected failure")));
    }
    let mut c = e.add_request(greedy_req(prompt(10, 3), 5)).unwrap();
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut c), 1).tokens[0], FakeModel::greedy(&model_config(), &prompt(10, 3), 5, false));
    assert_eq!(e.stats().forward_errors_total, 1);
}

#[test]
fn token_budget_is_never_exceeded() {
    // Record every forward's token count through a model wrapper.
    struct Spy(FakeModel, std::sync::Arc<std::sync::Mutex<Vec<usize>>>);
    impl tandem_core::ModelRunner for Spy {
        fn config(&self) -> &tandem_core::ModelConfig {
            self.0.config()
        }
        fn backend_name(&self) -> &'static str {
            "spy"
        }
        fn kv_geometry(&self) -> tandem_core::backend::KvGeometry {
            self.0.kv_geometry()
        }
        fn max_batch_tokens(&self) -> usize {
            self.0.max_batch_tokens()
        }
        fn max_seqs(&self) -> usize {
            self.0.max_seqs()
        }
        fn forward(&mut self, b: &tandem_core::ForwardBatch) -> tandem_core::Result<Vec<f32>> {
            self.1.lock().unwrap().push(b.num_tokens());
            self.0.forward(b)
        }
    }
    let sizes = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
    let spy = Spy(fake(64, 256, 16), sizes.clone());
    let mut e = tandem_engine::Engine::new(
        Box::new(spy),
        letters(),
        EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() },
    )
    .unwrap();
    let mut d = e.add_request(greedy_req(prompt(5, 2), 30)).unwrap();
    let mut s = e.add_request(greedy_req(prompt(100, 1), 3)).unwrap();
    for _ in 0..5 {
        e.step();
        assert_eq!(drain(&mut d).len(), 1, "the decode gets a token every step");
    }
    run_to_idle(&mut e);
    let sizes = sizes.lock().unwrap().clone();
    assert!(sizes.iter().all(|&n| n <= 24), "{sizes:?}");
    // 5 + 19, then 1 + 23 three times, then 1 + the last 12 of the long prompt.
    assert_eq!(&sizes[..5], &[24, 24, 24, 24, 13], "the long prompt is chunked next to the decodes: {sizes:?}");
    assert_eq!(collect(&drain(&mut s), 1).tokens[0], FakeModel::greedy(&model_config(), &prompt(100, 1), 3, false));
}

#[test]
fn threaded_handle_streams_and_aborts_on_drop() {
    threaded_handle(EngineConfig::default());
}

/// The same on the engine thread with async scheduling: a drop's abort and the shutdown
/// arrive while steps are in flight.
#[test]
fn threaded_handle_streams_and_aborts_on_drop_with_async_scheduling() {
    threaded_handle(EngineConfig { async_scheduling: true, ..Default::default() });
}

fn threaded_handle(cfg: EngineConfig) {
    // 2 ms a forward: the 1000-token requests below must still be running when the test drops
    // or shuts them down (an unpaced fake model finished one, 1000 steps, while this thread was
    // descheduled between its first token and `shutdown`: a Length end where Abort was due).
    let mut model = fake(64, 64, 16);
    model.delay = Duration::from_millis(2);
    let h = tandem_engine::Engine::spawn(Box::new(model), letters(), cfg).unwrap();
    let threads: Vec<_> = (0..4u32)
        .map(|i| {
            let h = h.clone();
            std::thread::spawn(move || {
                let p = prompt(5 + i as usize, i);
                let mut s = h.submit(greedy_req(p.clone(), 10)).unwrap();
                let mut outs = vec![];
                while let Some(o) = s.blocking_recv() {
                    outs.push(o);
                }
                (p, outs)
            })
        })
        .collect();
    for t in threads {
        let (p, outs) = t.join().unwrap();
        let c = collect(&outs, 1);
        assert_eq!(c.finals.len(), 1);
        assert_eq!(c.tokens[0], FakeModel::greedy(&model_config(), &p, 10, false));
    }
    // A dropped stream aborts its request.
    let long = Request {
        prompt: prompt(5, 1),
        params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(1000) },
        priority: 0,
    };
    let mut s = h.submit(long).unwrap();
    s.blocking_recv().unwrap();
    drop(s);
    let t0 = std::time::Instant::now();
    while h.stats().requests_abort_total == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the dropped request was not aborted");
        std::thread::sleep(Duration::from_millis(1));
    }
    // Shutdown ends what is still open with a final output.
    let mut s = h
        .submit(Request {
            prompt: prompt(5, 2),
            params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(1000) },
            priority: 0,
        })
        .unwrap();
    s.blocking_recv().unwrap();
    h.shutdown();
    let rest: Vec<_> = std::iter::from_fn(|| s.blocking_recv()).collect();
    assert_eq!(rest.last().unwrap().finish_reason, Some(FinishReason::Abort));
    assert!(matches!(h.submit(greedy_req(vec![1], 1)), Err(SubmitError::Stopped(_))));
}

#[test]
fn a_fatal_forward_error_fails_every_request_and_stops_the_engine() {
    let mut m = fake(64, 64, 2);
    m.fatal_calls = vec![1];
    let mut e = engine(m, EngineConfig::default());
    // Two run (max_seqs 2); the third waits; the fourth (n = 2) waits with an unforked sibling.
    let mut streams: Vec<_> = (0..3).map(|i| e.add_request(greedy_req(prompt(10, i), 5)).unwrap()).collect();
    streams.push(
        e.add_request(Request {
            prompt: prompt(6, 7),
            params: SamplingParams { n: 2, ..SamplingParams::greedy(5) },
            priority: 0,
        })
        .unwrap(),
    );
    e.step(); // call 0: fine
    assert!(e.failure().is_none());
    e.step(); // call 1: the device is lost
    let why = e.failure().expect("a fatal error stops the engine").to_string();
    assert!(why.contains("device lost") && why.contains("illegal address"), "{why}");
    assert!(!e.has_work(), "nothing is left to run on a lost device");
    assert_eq!(e.num_requests(), 0);
    for (i, s) in streams.iter_mut().enumerate() {
        let outs = drain(s);
        let n = if i == 3 { 2 } else { 1 };
        let c = collect(&outs, n);
        assert_eq!(c.finals.len(), 1, "request {i}: exactly one final output");
        for f in &c.finish {
            assert!(matches!(f, Some(FinishReason::Error(m)) if m.contains("illegal address")), "request {i}: {f:?}");
        }
    }
    assert!(
        matches!(e.add_request(greedy_req(prompt(4, 1), 2)), Err(SubmitError::Stopped(m)) if m.contains("illegal address"))
    );
    assert_eq!(e.step(), 0, "no forward after the failure");
    let st = e.stats();
    // Completions ended: the two in the batch and one of each waiting request (an unforked
    // sibling gets its finish reason but is not counted, as on any other end).
    assert_eq!((st.forward_errors_total, st.requests_error_total), (1, 4));
}

#[test]
fn threaded_engine_refuses_submissions_after_a_fatal_error() {
    let mut m = fake(64, 64, 8);
    m.fatal_calls = vec![0];
    let h = tandem_engine::Engine::spawn(Box::new(m), letters(), EngineConfig::default()).unwrap();
    assert!(h.failure().is_none());
    let mut s = h.submit(greedy_req(prompt(8, 1), 4)).unwrap();
    let outs: Vec<_> = std::iter::from_fn(|| s.blocking_recv()).collect();
    let c = collect(&outs, 1);
    assert_eq!(c.finals.len(), 1);
    assert!(matches!(&c.finish[0], Some(FinishReason::Error(m)) if m.contains("illegal address")));
    // The failure is set before the failed request's final output is sent.
    assert!(h.failure().is_some_and(|f| f.contains("illegal address")));
    assert!(
        matches!(h.submit(greedy_req(prompt(8, 2), 4)), Err(SubmitError::Stopped(m)) if m.contains("illegal address"))
    );
    h.shutdown();
}

#[test]
fn threaded_static_batch_waits_for_max_wait_then_runs() {
    let cfg = EngineConfig {
        mode: BatchMode::Static { batch_size: 4, max_wait: Duration::from_millis(40) },
        ..Default::default()
    };
    let h = tandem_engine::Engine::spawn(Box::new(fake(64, 64, 8)), letters(), cfg).unwrap();
    let mut s = h.submit(greedy_req(prompt(8, 1), 4)).unwrap();
    let outs: Vec<_> = std::iter::from_fn(|| s.blocking_recv()).collect();
    let c = collect(&outs, 1);
    assert_eq!(c.tokens[0], FakeModel::greedy(&model_config(), &prompt(8, 1), 4, false));
    let q = c.finals[0].metrics.as_ref().unwrap().queue_time.unwrap();
    assert!(q >= Duration::from_millis(40), "a lone request waits for the batch to fill: {q:?}");
    // A full batch does not wait.
    let mut streams: Vec<_> = (0..4).map(|i| h.submit(greedy_req(prompt(8, i), 2)).unwrap()).collect();
    for s in streams.iter_mut() {
        let outs: Vec<_> = std::iter::from_fn(|| s.blocking_recv()).collect();
        assert_eq!(collect(&outs, 1).finals.len(), 1);
    }
    h.shutdown();
}

/// Issue 29's case through the engine: a 2-token request arriving while a 2,048-token prompt
/// prefills gets its first token in the step after it arrives (default settings), where it
/// used to wait out the whole prefill; with vLLM's defaults spelled out (no threshold) it does.
#[test]
fn a_short_request_is_not_held_behind_a_long_prefill() {
    let first_token_step = |cfg: EngineConfig| -> usize {
        let mut e = engine(fake(512, 512, 8), cfg);
        let _long = e.add_request(greedy_req(prompt(2048, 1), 4)).unwrap();
        e.step();
        let mut short = e.add_request(greedy_req(prompt(2, 2), 4)).unwrap();
        for step in 1..=8 {
            e.step();
            if drain(&mut short).iter().any(|o| !o.token_ids.is_empty()) {
                return step;
            }
        }
        usize::MAX
    };
    let base = EngineConfig { max_num_batched_tokens: Some(512), max_model_len: Some(4096), ..Default::default() };
    assert_eq!(
        first_token_step(base.clone()),
        1,
        "the default: half the budget for the long prompt while the short one waits"
    );
    assert!(
        first_token_step(EngineConfig { long_prefill_token_threshold: Some(0), ..base.clone() }) >= 4,
        "no threshold: behind the 2,048-token prefill"
    );
    assert_eq!(
        first_token_step(EngineConfig { long_prefill_token_threshold: Some(256), ..base.clone() }),
        1,
        "vLLM's threshold"
    );
    assert!(tandem_engine::Engine::new(
        Box::new(fake(512, 512, 8)),
        letters(),
        EngineConfig { max_num_partial_prefills: 1, max_long_partial_prefills: 2, ..base }
    )
    .is_err());
}
