//! Exact scheduler tests (vLLM v1 style): tiny pools, literal block ids and token counts. The
//! model is simulated: after each step every sampled sequence gets token 7 appended, and a
//! sequence leaves when it has `max_tokens` outputs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tandem_engine::scheduler::{
    BatchMode, LongPrefill, Policy, PrefillLimits, ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput,
};
use tandem_engine::sequence::{SeqId, Sequence};
use tandem_engine::SamplingParams;

fn cfg(num_blocks: usize, budget: usize) -> SchedulerConfig {
    SchedulerConfig {
        num_blocks,
        max_num_batched_tokens: budget,
        max_num_seqs: 8,
        resume_protect_steps: 4,
        ..Default::default()
    }
}

/// Sequence `id` with a prompt of `len` tokens `base, base+1, ...`.
fn seq(id: SeqId, len: usize, base: u32, max_tokens: usize, priority: i32, now: Instant) -> Sequence {
    let prompt = (0..len as u32).map(|i| base + i).collect();
    Sequence::new(id, id, 0, prompt, Arc::new(SamplingParams::greedy(max_tokens)), max_tokens, priority, id, 0, now)
}

fn step(s: &mut Scheduler, now: Instant) -> SchedulerOutput {
    let out = s.schedule(now);
    s.complete_step(&out);
    for sc in out.seqs.iter().filter(|sc| sc.sample) {
        s.seq_mut(sc.seq).unwrap().append_token(7, now);
    }
    let done: Vec<SeqId> =
        s.seq_ids().filter(|&i| s.seq(i).is_some_and(|q| q.num_output_tokens() >= q.max_tokens)).collect();
    for id in done {
        s.remove(id);
    }
    s.check_invariants().unwrap();
    out
}

fn sched(seq: SeqId, num_tokens: usize, sample: bool) -> ScheduledSeq {
    ScheduledSeq { seq, num_tokens, sample, all_logits: false, num_draft: 0 }
}

fn table(s: &Scheduler, id: SeqId) -> Vec<u32> {
    s.seq(id).unwrap().block_table.clone()
}

#[test]
fn chunked_prefill_serves_decodes_first_under_one_budget() {
    let now = Instant::now();
    let mut s = Scheduler::new(cfg(20, 32));
    s.add(seq(1, 10, 0, 10, 0, now));
    s.add(seq(2, 70, 100, 10, 0, now));
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 10, true), sched(2, 22, false)]);
    assert_eq!((table(&s, 1), table(&s, 2)), (vec![0], vec![1, 2]));
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(2, 31, false)]);
    assert_eq!(table(&s, 2), vec![1, 2, 3, 4]);
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(2, 17, true)]);
    assert_eq!(table(&s, 2), vec![1, 2, 3, 4, 5]);
    assert_eq!(o.num_tokens, 18);
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(2, 1, true)]);
}

#[test]
fn forward_batch_maps_chunks_to_slots() {
    let now = Instant::now();
    let mut s = Scheduler::new(cfg(20, 32));
    s.add(seq(1, 3, 0, 10, 0, now));
    s.add(seq(2, 40, 100, 10, 0, now));
    let o = s.schedule(now);
    let b = s.forward_batch(&o);
    assert_eq!(b.num_tokens(), 32);
    assert_eq!(b.max_blocks, 2);
    assert_eq!(&b.positions[..5], &[0, 1, 2, 0, 1]);
    assert_eq!(b.slots[3], 16, "sequence 2 starts in block 1");
    assert_eq!(b.slots[31], 2 * 16 + 12, "its 29th token is in block 2");
    assert_eq!(b.logit_rows, vec![2], "only the finished prompt wants logits");
    assert_eq!(b.block_tables, vec![0, 0, 1, 2]);
}

#[test]
fn prefix_cache_hits_full_blocks_and_counts_tokens() {
    let now = Instant::now();
    let mut s = Scheduler::new(cfg(11, 64));
    s.add(seq(1, 40, 0, 3, 0, now));
    step(&mut s, now);
    assert_eq!(table(&s, 1), vec![0, 1, 2]);
    // Same first 32 tokens, then a different tail.
    let mut b = seq(2, 40, 0, 2, 0, now);
    for t in &mut b.tokens[32..] {
        *t += 1000;
    }
    s.add(b);
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(2, 8, true)]);
    assert_eq!(table(&s, 2), vec![0, 1, 3]);
    assert_eq!(s.seq(2).unwrap().num_computed_tokens, 40);
    assert_eq!((s.bm.ref_count(0), s.bm.ref_count(1), s.bm.ref_count(2)), (2, 2, 1));
    assert_eq!((s.bm.prefix_queries_tokens, s.bm.prefix_hits_tokens), (80, 32));
    // Both finish; a third request with sequence 1's prompt still hits its cached blocks.
    step(&mut s, now);
    assert_eq!(s.num_running(), 0);
    assert_eq!(s.bm.num_free(), 11);
    s.add(seq(3, 40, 0, 2, 0, now));
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(3, 8, true)]);
    assert_eq!(&table(&s, 3)[..2], &[0, 1]);
    assert_eq!(s.bm.prefix_hits_tokens, 64);
}

#[test]
fn preemption_by_recompute_then_resume_then_protection() {
    let now = Instant::now();
    let mut c = cfg(7, 128);
    c.resume_protect_steps = 20;
    let mut s = Scheduler::new(c);
    s.add(seq(1, 47, 0, 100, 0, now)); // X
    s.add(seq(2, 31, 200, 3, 0, now)); // Z: finishes after step 3
    s.add(seq(3, 31, 400, 100, 0, now)); // Y: the latest arrival, the victim
    step(&mut s, now);
    assert_eq!((table(&s, 1), table(&s, 2), table(&s, 3)), (vec![0, 1, 2], vec![3, 4], vec![5, 6]));
    step(&mut s, now);
    // Step 3: X needs a 4th block and none is free: Y goes back to waiting, keeping its
    // two generated tokens; X takes Y's least recently released block, Z the other.
    let o = step(&mut s, now);
    assert_eq!(o.preempted, vec![3]);
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(2, 1, true)]);
    assert_eq!(table(&s, 1), vec![0, 1, 2, 6]);
    let y = s.seq(3).unwrap();
    assert_eq!((y.num_tokens(), y.num_computed_tokens, y.block_table.len()), (33, 0, 0));
    assert!(s.seq(2).is_none(), "Z finished and released [3, 4, 5]");
    // Step 4: Y resumes and recomputes all 33 tokens (its cached blocks were evicted).
    let o = step(&mut s, now);
    assert!(o.preempted.is_empty());
    assert_eq!(o.seqs, vec![sched(1, 1, true), sched(3, 33, true)]);
    assert_eq!(table(&s, 3), vec![5, 4, 3]);
    assert_eq!(s.bm.num_free(), 0);
    assert_eq!(s.num_preemptions, 1);
    // X crosses into a 5th block at 65 tokens (step 19), Y into a 4th at 49 (step 20). Y is
    // protected until step 24: nobody is preempted, the one asking waits.
    for st in 5..=23 {
        let o = step(&mut s, now);
        assert!(o.preempted.is_empty(), "step {st}: {:?}", o.preempted);
        let x_ran = o.seqs.iter().any(|q| q.seq == 1);
        let y_ran = o.seqs.iter().any(|q| q.seq == 3);
        assert_eq!(x_ran, st < 19, "step {st}");
        assert_eq!(y_ran, st < 20, "step {st}");
    }
    // Step 24: the protection lapsed; X preempts Y again.
    let o = step(&mut s, now);
    assert_eq!(o.preempted, vec![3]);
    assert_eq!(o.seqs, vec![sched(1, 1, true)]);
    assert_eq!(s.num_preemptions, 2);
}

#[test]
fn priority_policy_admits_lowest_value_first_and_preempts_the_least_important() {
    let now = Instant::now();
    let mut c = cfg(4, 64);
    c.policy = Policy::Priority;
    c.max_num_seqs = 2;
    let mut s = Scheduler::new(c);
    s.add(seq(1, 16, 0, 40, 5, now));
    s.add(seq(2, 16, 100, 40, 1, now));
    s.add(seq(3, 16, 200, 40, 1, now));
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(2, 16, true), sched(3, 16, true)], "priority 1 before 5, ties by arrival");
    assert_eq!(s.waiting().collect::<Vec<_>>(), vec![1]);
    // Under fcfs the first arrival goes first whatever its priority.
    let mut f = Scheduler::new(cfg(4, 64));
    f.add(seq(1, 16, 0, 40, 5, now));
    f.add(seq(2, 16, 100, 40, 1, now));
    assert_eq!(step(&mut f, now).seqs[0], sched(1, 16, true));

    // Pool pressure under priority: 4 blocks, three sequences of 2 blocks each at 17+ tokens.
    let mut c = cfg(4, 64);
    c.policy = Policy::Priority;
    let mut p = Scheduler::new(c);
    p.add(seq(1, 15, 0, 40, 0, now)); // most important
    p.add(seq(2, 15, 100, 40, 9, now)); // least important
    step(&mut p, now); // 16 tokens each, one block each
    p.add(seq(3, 15, 200, 40, 3, now));
    step(&mut p, now); // 1 and 2 decode their 16th token; 3 takes block 2
    assert_eq!((table(&p, 1), table(&p, 2), table(&p, 3)), (vec![0], vec![1], vec![2]));
    // 1 and 2 need a 2nd block, one is left: 1 takes it, 3 still fits, and 2, the least
    // important, gives way itself.
    let o = step(&mut p, now);
    assert_eq!(o.preempted, vec![2]);
    assert_eq!(o.seqs.iter().map(|q| q.seq).collect::<Vec<_>>(), vec![1, 3]);
}

#[test]
fn abort_frees_blocks_of_waiting_and_running_sequences() {
    let now = Instant::now();
    let mut s = Scheduler::new(cfg(4, 64));
    s.add(seq(1, 40, 0, 10, 0, now));
    s.add(seq(2, 40, 100, 10, 0, now)); // cannot fit next to 1
    step(&mut s, now);
    assert_eq!((s.num_running(), s.num_waiting(), s.bm.num_free()), (1, 1, 1));
    assert_eq!(s.remove(2).unwrap().block_table.len(), 0);
    assert_eq!(s.num_waiting(), 0);
    s.remove(1);
    assert_eq!(s.bm.num_free(), 4);
    s.check_invariants().unwrap();
    assert!(!s.has_work());
}

#[test]
fn static_batch_gathers_then_runs_to_completion_admitting_nobody() {
    let t0 = Instant::now();
    let mut c = cfg(20, 256);
    c.mode = BatchMode::Static { batch_size: 3, max_wait: Duration::from_millis(50) };
    let mut s = Scheduler::new(c);
    s.add(seq(1, 5, 0, 2, 0, t0));
    s.add(seq(2, 5, 100, 4, 0, t0));
    assert!(step(&mut s, t0).is_empty(), "two of three, before the deadline");
    assert_eq!(s.next_deadline(), Some(t0 + Duration::from_millis(50)));
    // The deadline passes: the partial batch starts.
    let t1 = t0 + Duration::from_millis(60);
    let o = step(&mut s, t1);
    assert_eq!(o.seqs, vec![sched(1, 5, true), sched(2, 5, true)]);
    s.add(seq(3, 5, 200, 2, 0, t1));
    s.add(seq(4, 5, 300, 2, 0, t1));
    s.add(seq(5, 5, 400, 2, 0, t1));
    // A full batch is waiting but the running one is not done: nobody is admitted.
    assert_eq!(step(&mut s, t1).seqs, vec![sched(1, 1, true), sched(2, 1, true)]);
    assert_eq!(step(&mut s, t1).seqs, vec![sched(2, 1, true)]);
    assert_eq!(step(&mut s, t1).seqs, vec![sched(2, 1, true)]);
    assert_eq!(s.num_running(), 0);
    // The next batch: three waiting, full, starts at once.
    let o = step(&mut s, t1);
    assert_eq!(o.seqs.iter().map(|q| q.seq).collect::<Vec<_>>(), vec![3, 4, 5]);
}

#[test]
fn static_batch_reserves_whole_sequences() {
    let t0 = Instant::now();
    let mut c = cfg(4, 256);
    c.mode = BatchMode::Static { batch_size: 3, max_wait: Duration::ZERO };
    let mut s = Scheduler::new(c);
    for id in 1..=3 {
        s.add(seq(id, 10, id as u32 * 100, 20, 0, t0)); // 30 tokens: 2 blocks reserved each
    }
    let o = step(&mut s, t0);
    assert_eq!(o.seqs.len(), 2, "only two reservations fit in four blocks");
    // The first two run 20 steps, then the third alone 20 more; none is ever preempted.
    for st in 2..=40 {
        let o = step(&mut s, t0);
        assert!(o.preempted.is_empty());
        assert_eq!(o.seqs.len(), if st <= 20 { 2 } else { 1 }, "step {st}");
    }
    assert!(step(&mut s, t0).is_empty());
    assert_eq!(s.num_running() + s.num_waiting(), 0);
    assert_eq!(s.num_preemptions, 0);
}

fn with_prefill(mut c: SchedulerConfig, prefill: PrefillLimits) -> SchedulerConfig {
    c.prefill = prefill;
    c
}

/// Tandem's default: a long prompt alone takes the whole budget; once a request waits, its
/// chunk takes half, and the newcomer is admitted and samples its first token in that step
/// (the issue: a 2-token request waited out a whole 2,048-token prefill).
#[test]
fn a_newcomer_starts_in_the_next_step_while_a_long_prompt_prefills() {
    let now = Instant::now();
    let mut s = Scheduler::new(with_prefill(cfg(20, 32), PrefillLimits::tandem()));
    s.add(seq(1, 200, 0, 4, 0, now));
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 32, false)], "alone: the whole budget");
    s.add(seq(2, 2, 1000, 4, 0, now));
    let o = step(&mut s, now);
    assert_eq!(o.seqs, vec![sched(1, 16, false), sched(2, 2, true)], "half while seq 2 waits; seq 2 samples at once");
    // Nobody waits any more: the long prompt takes what the decode leaves.
    assert_eq!(step(&mut s, now).seqs, vec![sched(2, 1, true), sched(1, 31, false)]);
    // Without the limits, the same arrival waits until the prompt has run out of budget.
    let mut s = Scheduler::new(cfg(20, 32));
    s.add(seq(1, 200, 0, 4, 0, now));
    step(&mut s, now);
    s.add(seq(2, 2, 1000, 4, 0, now));
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 32, false)]);
}

/// vLLM's threshold: no chunk above it, whoever waits.
#[test]
fn the_long_prefill_threshold_caps_every_chunk() {
    let now = Instant::now();
    let limits = PrefillLimits { long: LongPrefill::Threshold(8), ..PrefillLimits::OFF };
    let mut s = Scheduler::new(with_prefill(cfg(20, 32), limits));
    s.add(seq(1, 20, 0, 2, 0, now));
    s.add(seq(2, 6, 100, 2, 0, now));
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 8, false), sched(2, 6, true)]);
    assert_eq!(step(&mut s, now).seqs, vec![sched(2, 1, true), sched(1, 8, false)]);
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 4, true)]);
}

/// max_num_partial_prefills: a prompt that would be one more partial prefill waits; one that
/// finishes its prompt in the step is no partial prefill and goes.
#[test]
fn partial_prefills_are_bounded() {
    let now = Instant::now();
    let limits =
        PrefillLimits { long: LongPrefill::Threshold(8), max_num_partial_prefills: 1, max_long_partial_prefills: 0 };
    let mut s = Scheduler::new(with_prefill(cfg(20, 32), limits));
    s.add(seq(1, 20, 0, 2, 0, now));
    s.add(seq(2, 20, 100, 2, 0, now));
    s.add(seq(3, 4, 200, 2, 0, now));
    // 1 becomes the one partial prefill; 2 would be a second (head of line: admission stops).
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 8, false)]);
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 8, false)]);
    // 1 finishes its prompt this step but still counts as partial at scheduling time.
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 4, true)]);
    // 2 is the partial prefill now; 3 finishes its prompt in the step, so it is none.
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 1, true), sched(2, 8, false), sched(3, 4, true)]);
}

/// max_long_partial_prefills: a long prompt beyond it lets a short one behind it go first
/// (vLLM: "shorter prompts jump the queue in front of longer prompts").
#[test]
fn short_prompts_pass_a_held_back_long_one() {
    let now = Instant::now();
    let limits =
        PrefillLimits { long: LongPrefill::Threshold(8), max_num_partial_prefills: 2, max_long_partial_prefills: 1 };
    let mut s = Scheduler::new(with_prefill(cfg(20, 32), limits));
    s.add(seq(1, 30, 0, 2, 0, now));
    assert_eq!(step(&mut s, now).seqs, vec![sched(1, 8, false)]);
    s.add(seq(2, 30, 100, 2, 0, now));
    s.add(seq(3, 5, 200, 2, 0, now));
    assert_eq!(
        step(&mut s, now).seqs,
        vec![sched(1, 8, false), sched(3, 5, true)],
        "2 is long and held back; 3 passes it"
    );
    assert!(s.seq(2).is_some_and(|q| q.num_computed_tokens == 0));
}
