//! Scheduler cost per step with 256 running sequences against a model that does nothing.
//!
//! Run: `cargo bench -p tandem-engine --bench scheduler` (plain timing loop, no criterion).
//! Prints microseconds per step for `schedule()` + `forward_batch()` + `complete_step()` alone,
//! and for a whole `Engine::step()` (greedy sampling over a 256-token vocabulary included),
//! synchronous and with async scheduling, against a null forward and a 300 us one.
//! Target: under 100 us per step; aim for 20.

use std::sync::Arc;
use std::time::Instant;

use tandem_engine::fake_model::{fake_config, FakeModel};
use tandem_engine::scheduler::{Scheduler, SchedulerConfig};
use tandem_engine::sequence::Sequence;
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams};

const SEQS: usize = 256;
const STEPS: usize = 2000;

fn main() {
    // Pool big enough for 256 x (64 prompt + 2000 decode) tokens: no preemption in the loop.
    let blocks = SEQS * (64 + STEPS + 16).div_ceil(16) + 16;

    // 1. The scheduler alone.
    let now = Instant::now();
    let mut s = Scheduler::new(SchedulerConfig {
        num_blocks: blocks,
        max_num_batched_tokens: 16384,
        max_num_seqs: SEQS,
        ..Default::default()
    });
    for i in 0..SEQS as u64 {
        let prompt: Vec<u32> = (0..64).map(|t| (t + i as u32 * 64) % 250).collect();
        s.add(Sequence::new(i, i, 0, prompt, Arc::new(SamplingParams::greedy(100_000)), 100_000, 0, i, i, now));
    }
    let mut parts = [0f64; 3];
    let mut step = |s: &mut Scheduler| {
        let t0 = Instant::now();
        let out = s.schedule(Instant::now());
        let t1 = Instant::now();
        let batch = s.forward_batch(&out);
        std::hint::black_box(&batch);
        let t2 = Instant::now();
        s.complete_step(&out);
        parts[0] += (t1 - t0).as_secs_f64();
        parts[1] += (t2 - t1).as_secs_f64();
        parts[2] += t2.elapsed().as_secs_f64();
        for sc in out.seqs.iter().filter(|q| q.sample) {
            s.seq_mut(sc.seq).unwrap().tokens.push(1);
        }
        out.seqs.len()
    };
    assert_eq!(step(&mut s), SEQS, "all 256 admitted in the first step");
    let t = Instant::now();
    for _ in 0..STEPS {
        assert_eq!(step(&mut s), SEQS);
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / STEPS as f64;
    let part = |i: usize| parts[i] * 1e6 / (STEPS + 1) as f64;
    println!("scheduler: {SEQS} running decodes: {us:.1} us/step (schedule {:.1} + forward_batch {:.1} + complete_step {:.1})", part(0), part(1), part(2));

    // 2. The whole engine step against a null model; then with a forward that takes 300 us
    // (a device's step), synchronous and with async scheduling, which hides the host's work
    // behind the forward.
    for (delay_us, async_scheduling) in [(0, false), (0, true), (300, false), (300, true)] {
        let us = engine_step_us(blocks, std::time::Duration::from_micros(delay_us), async_scheduling);
        let what = if delay_us == 0 { "null forward".to_string() } else { format!("{delay_us} us forward") };
        let mode = if async_scheduling { "async scheduling" } else { "synchronous" };
        println!("engine: {SEQS} running decodes, {what}, {mode}: {us:.1} us/step (whole step: schedule, forward, sample, detokenize, stream)");
    }
}

fn engine_step_us(blocks: usize, delay: std::time::Duration, async_scheduling: bool) -> f64 {
    let mut m = FakeModel::new(fake_config(256, &[], 1 << 20), blocks, 16, 16384, SEQS);
    m.null = true;
    m.delay = delay;
    let decode: tandem_engine::DecodeFn =
        Arc::new(|ids: &[u32]| ids.iter().map(|&i| char::from(b'a' + (i % 26) as u8)).collect());
    let mut e = Engine::new(Box::new(m), decode, EngineConfig { async_scheduling, ..Default::default() }).unwrap();
    let mut streams = Vec::new();
    for i in 0..SEQS as u32 {
        let prompt: Vec<u32> = (0..64).map(|t| (t + i * 64) % 250).collect();
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(STEPS + 10) };
        streams.push(e.add_request(Request { prompt, params, priority: 0 }).unwrap());
    }
    // Admit everyone (and, with async scheduling, fill the pipeline).
    e.step();
    e.step();
    let t = Instant::now();
    for _ in 0..STEPS {
        assert_eq!(e.step(), SEQS);
        for s in streams.iter_mut() {
            while s.try_recv().is_some() {}
        }
    }
    t.elapsed().as_secs_f64() * 1e6 / STEPS as f64
}
