//! Decides, each step, which sequences compute how many tokens.
//!
//! There is no prefill phase and no decode phase (vLLM v1): each sequence's
//! `num_computed_tokens` catches up with its token count under one token budget per step
//! (`max_num_batched_tokens`) and a cap on sequences (`max_num_seqs`). Running decodes are
//! served first, then running prefill chunks, then waiting sequences are admitted, so a long
//! prompt is cut into chunks and never stalls the decodes around it.
//!
//! Order: `fcfs` (arrival) or `priority` (lower value first, ties by arrival).
//!
//! Preemption is by recompute: when a running sequence needs a block and none is free, the
//! least important (highest key: lowest priority, latest arrival) running sequence that was not
//! scheduled yet this step goes back to waiting, keeps its generated tokens, and drops its
//! blocks (its full blocks stay in the prefix cache, so resuming is usually cheap).
//! Anti-thrashing rule: a sequence that resumed within the last `resume_protect_steps` steps is
//! never chosen as a victim. If every less important candidate is protected, the one asking
//! waits (is skipped this step) instead of evicting anyone; if no less important candidate
//! exists at all, the one asking gives way itself, unless it is protected, in which case it
//! waits too. Protection lapses with steps, so waiting always ends. No sequence is admitted in
//! a step that preempted.
//!
//! Static mode: gather up to `batch_size` waiting sequences, waiting at most `max_wait` for them,
//! admit them only if their whole reservation (prompt + max_tokens) fits so that none is ever
//! preempted, run them to completion, and admit nobody meanwhile.

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Unbounded};
use std::time::{Duration, Instant};

use tandem_core::ForwardBatch;

use crate::adapters::Adapters;
use crate::block_manager::BlockManager;
use crate::sequence::{IdMap, SeqId, SeqStatus, Sequence};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Fcfs,
    Priority,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchMode {
    Continuous,
    Static { batch_size: usize, max_wait: Duration },
}

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_num_batched_tokens: usize,
    pub max_num_seqs: usize,
    pub policy: Policy,
    pub mode: BatchMode,
    pub num_blocks: usize,
    /// 16 by default; 32 allowed.
    pub block_size: usize,
    pub enable_prefix_caching: bool,
    /// Steps after a resume during which a sequence cannot be preempted again.
    pub resume_protect_steps: u64,
    /// Logit rows one step may use beyond one per sequence (the runner's `max_logit_rows` less
    /// `max_num_seqs`): the chunks of sequences that score their prompt take them.
    pub prompt_logit_rows: usize,
    /// How long prompts share a step with newcomers.
    pub prefill: PrefillLimits,
}

/// How prefills share a step: vLLM's `--long-prefill-token-threshold`,
/// `--max-num-partial-prefills` and `--max-long-partial-prefills`, with vLLM's meaning, and
/// Tandem's default that keeps a newcomer's first token within a step of its admission while a
/// long prompt prefills. Without any of it one step's whole budget goes to the running prefill
/// first (a 2-token request waited 67.8 s behind a 2,048-token prompt on a CPU: issue 29).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongPrefill {
    /// No threshold: a prefill chunk takes whatever budget is left (vLLM's default).
    Off,
    /// vLLM's threshold: no prefill chunk is longer than this, and a prompt longer than this is
    /// long (for `max_long_partial_prefills`).
    Threshold(usize),
    /// Tandem's default: while a sequence waits to be admitted, a running prefill's chunk takes
    /// at most half the step's budget, so the other half admits the newcomer; a prefill alone
    /// takes the whole budget (no throughput lost when nobody waits). No prompt counts as long.
    HalfWhileWaiting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillLimits {
    pub long: LongPrefill,
    /// At most this many sequences with part of their prompt still to compute; a newcomer that
    /// would be one more waits (0: no limit).
    pub max_num_partial_prefills: usize,
    /// Of those, at most this many long ones; a long newcomer beyond it lets the shorter prompts
    /// behind it go first (0: no limit).
    pub max_long_partial_prefills: usize,
}

impl PrefillLimits {
    /// No limit at all: the scheduler as it was before these flags (the default of a bare
    /// `SchedulerConfig`; the engine's default is [`PrefillLimits::tandem`]).
    pub const OFF: PrefillLimits =
        PrefillLimits { long: LongPrefill::Off, max_num_partial_prefills: 0, max_long_partial_prefills: 0 };

    /// What `tandem serve` and the library use unless told otherwise.
    pub fn tandem() -> PrefillLimits {
        PrefillLimits { long: LongPrefill::HalfWhileWaiting, ..PrefillLimits::OFF }
    }

    fn threshold(&self) -> Option<usize> {
        match self.long {
            LongPrefill::Threshold(t) if t > 0 => Some(t),
            _ => None,
        }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_batched_tokens: 512,
            max_num_seqs: 64,
            policy: Policy::Fcfs,
            mode: BatchMode::Continuous,
            num_blocks: 256,
            block_size: 16,
            enable_prefix_caching: true,
            resume_protect_steps: 8,
            prompt_logit_rows: 0,
            prefill: PrefillLimits::OFF,
        }
    }
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub seq: SeqId,
    /// Tokens computed this step, starting at the sequence's `num_computed_tokens`.
    pub num_tokens: usize,
    /// The chunk reaches the last token, so a new token is sampled from its logits.
    pub sample: bool,
    /// Every token of the chunk gets a logit row (prompt logprobs), not only a sampled last.
    pub all_logits: bool,
    /// Of `num_tokens`, the draft tokens at the end (speculative decoding): the sequence's
    /// `draft`, each with a logit row of its own, as the last committed token has.
    pub num_draft: usize,
}

impl ScheduledSeq {
    /// Logit rows the chunk takes: every token's (prompt logprobs), the last committed token's
    /// and each draft's, the last token's when it samples, or none.
    pub fn logit_rows(&self) -> usize {
        if self.all_logits {
            self.num_tokens
        } else if self.sample {
            1 + self.num_draft
        } else {
            0
        }
    }
}

#[derive(Debug, Default, Clone)]
pub struct SchedulerOutput {
    pub seqs: Vec<ScheduledSeq>,
    pub preempted: Vec<SeqId>,
    pub num_tokens: usize,
    pub num_logit_rows: usize,
    /// Logit rows beyond one per sequence (bounded by `prompt_logit_rows`).
    pub extra_logit_rows: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    pub bm: BlockManager,
    seqs: IdMap<Sequence>,
    /// (priority, arrival) -> sequence; priority is 0 under fcfs.
    waiting: BTreeMap<(i32, u64), SeqId>,
    /// Sorted by key, most important first.
    running: Vec<SeqId>,
    step: u64,
    pub num_preemptions: u64,
    pub num_prompt_tokens: u64,
    /// Overlapped engine: the first step whose forward has not come back yet (None: none).
    in_flight_from: Option<u64>,
    /// Block tables (and hashes) of sequences removed while a step still in flight writes
    /// them: (the last such step, table, hashes). Freed when that step has come back.
    retired: Vec<(u64, Vec<u32>, Vec<u64>)>,
    /// The LoRA adapters and their slots (sequences name adapters by id; a batch by slot).
    pub adapters: Adapters,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig) -> Self {
        let bm = BlockManager::new(cfg.num_blocks, cfg.block_size, cfg.enable_prefix_caching);
        Scheduler {
            cfg,
            bm,
            seqs: IdMap::default(),
            waiting: BTreeMap::new(),
            running: Vec::new(),
            step: 0,
            num_preemptions: 0,
            num_prompt_tokens: 0,
            in_flight_from: None,
            retired: Vec::new(),
            adapters: Adapters::new(&[]),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    /// Whether a sequence, waiting or running, holds LoRA adapter `id`.
    pub fn adapter_in_use(&self, id: u32) -> bool {
        self.seqs.values().any(|s| s.adapter == Some(id))
    }
    /// The LoRA adapter ids of the running and of the waiting sequences, each once, ascending.
    pub fn adapters_in_use(&self) -> (Vec<u32>, Vec<u32>) {
        let slots = |ids: &mut dyn Iterator<Item = &SeqId>| {
            let mut v: Vec<u32> = ids.filter_map(|id| self.seqs.get(id).and_then(|s| s.adapter)).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        (slots(&mut self.running.iter()), slots(&mut self.waiting.values()))
    }
    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }
    pub fn seq(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }
    pub fn seq_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }
    pub fn seq_ids(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.seqs.keys().copied()
    }
    /// Running sequences, most important first.
    pub fn running(&self) -> &[SeqId] {
        &self.running
    }
    /// Waiting sequences in the order they would be admitted.
    pub fn waiting(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.waiting.values().copied()
    }

    fn waiting_key(&self, s: &Sequence) -> (i32, u64) {
        match self.cfg.policy {
            Policy::Fcfs => (0, s.arrival_order),
            Policy::Priority => s.key(),
        }
    }
    fn running_key(&self, id: SeqId) -> (i32, u64) {
        self.waiting_key(&self.seqs[&id])
    }

    pub fn add(&mut self, mut seq: Sequence) {
        seq.status = SeqStatus::Waiting;
        let key = self.waiting_key(&seq);
        self.waiting.insert(key, seq.id);
        self.seqs.insert(seq.id, seq);
    }

    /// Every sequence, waiting or running.
    pub fn seqs(&self) -> impl Iterator<Item = &Sequence> + '_ {
        self.seqs.values()
    }
    /// The id of the last step scheduled (the one `schedule` just returned).
    pub fn current_step(&self) -> u64 {
        self.step
    }

    /// The overlapped engine sent `step`'s batch to the model and will take its results later:
    /// until [`Scheduler::landed`] says so, a sequence removed with a row in it keeps its blocks.
    pub fn dispatched(&mut self, step: u64) {
        self.in_flight_from.get_or_insert(step);
    }

    /// `step`'s forward has come back; `next` is the next step still in flight, if any. The
    /// blocks of sequences removed while only steps up to `step` wrote them are freed now.
    pub fn landed(&mut self, step: u64, next: Option<u64>) {
        self.in_flight_from = next;
        let (free, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retired).into_iter().partition(|r| r.0 <= step);
        self.retired = keep;
        for (_, mut table, mut hashes) in free {
            self.bm.free(&mut table, &mut hashes);
        }
    }

    /// Blocks held by sequences already removed, waiting for a step in flight to come back.
    pub fn num_retired_blocks(&self) -> usize {
        self.retired.iter().map(|r| r.1.len()).sum()
    }

    /// Fraction of the pool held by live sequences: blocks only removed sequences hold (free
    /// once the step in flight lands) do not count, so the gauge reads 0 as soon as the last
    /// request has ended, whatever is still in flight.
    pub fn kv_usage(&self) -> f32 {
        if self.retired.is_empty() {
            return self.bm.usage();
        }
        let mut refs: IdMap<u32> = IdMap::default();
        for b in self.retired.iter().flat_map(|r| r.1.iter()) {
            *refs.entry(*b as u64).or_default() += 1;
        }
        let only_retired = refs.iter().filter(|(b, n)| self.bm.ref_count(**b as u32) == **n).count();
        let held = self.bm.num_blocks() - self.bm.num_free() - only_retired;
        held as f32 / self.bm.num_blocks().max(1) as f32
    }

    /// Registers in the prefix cache the full blocks of `id` up to `num_computed` tokens (at
    /// most its computed ones; `usize::MAX`: all of those): the overlapped engine does it when
    /// the step that wrote them has come back, never before, so no other sequence hits a block
    /// whose K/V is not written (or whose step failed).
    pub fn cache_computed(&mut self, id: SeqId, num_computed: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            let n = num_computed.min(seq.num_computed_tokens);
            self.bm.cache_full_blocks_under(seq.cache_root(), &seq.block_table, &mut seq.block_hashes, &seq.tokens, n);
        }
    }

    /// Removes a sequence wherever it is and frees its blocks at once, or, when a step in
    /// flight still writes them, once that step has come back.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        match seq.status {
            SeqStatus::Waiting => {
                let key = self.waiting_key(&seq);
                self.waiting.remove(&key);
            }
            SeqStatus::Running => self.running.retain(|&r| r != id),
            SeqStatus::Finished => {}
        }
        if self.in_flight_from.is_some_and(|f| seq.scheduled_at_step >= f) {
            let (table, hashes) = (std::mem::take(&mut seq.block_table), std::mem::take(&mut seq.block_hashes));
            self.retired.push((seq.scheduled_at_step, table, hashes));
        } else {
            self.bm.free(&mut seq.block_table, &mut seq.block_hashes);
        }
        seq.status = SeqStatus::Finished;
        Some(seq)
    }

    /// Starts `child` (a completion of the same prompt) as a running sequence that shares the
    /// parent's full prompt blocks. It recomputes only the tail of the prompt (at least one
    /// token, to have logits of its own).
    ///
    /// A parent preempted since its first token was scheduled (the overlapped engine forks
    /// when that step lands) has no blocks to share: the child then waits like any new
    /// sequence and computes its prompt (mostly from the prefix cache).
    pub fn fork(&mut self, parent: SeqId, mut child: Sequence) {
        let p = &self.seqs[&parent];
        let shared = (p.num_prompt_tokens - 1) / self.cfg.block_size;
        if p.status != SeqStatus::Running || p.block_table.len() < shared {
            return self.add(child);
        }
        let (table, hashes) = self.bm.fork(&p.block_table, &p.block_hashes, shared);
        child.block_table = table;
        child.block_hashes = hashes;
        child.num_computed_tokens = shared * self.cfg.block_size;
        child.status = SeqStatus::Running;
        child.times.first_scheduled = p.times.first_scheduled;
        let id = child.id;
        self.seqs.insert(id, child);
        self.insert_running(id);
    }

    fn insert_running(&mut self, id: SeqId) {
        let key = self.running_key(id);
        let at = self.running.partition_point(|&r| self.running_key(r) < key);
        self.running.insert(at, id);
    }

    /// The earliest moment a static batch could start, when one is pending.
    pub fn next_deadline(&self) -> Option<Instant> {
        match self.cfg.mode {
            BatchMode::Static { max_wait, .. } if self.running.is_empty() => {
                self.oldest_waiting_arrival().map(|t| t + max_wait)
            }
            _ => None,
        }
    }

    fn oldest_waiting_arrival(&self) -> Option<Instant> {
        self.waiting.values().map(|id| self.seqs[id].times.arrival).min()
    }

    pub fn schedule(&mut self, now: Instant) -> SchedulerOutput {
        self.step += 1;
        let mut out = SchedulerOutput::default();
        self.schedule_running(&mut out, true);
        self.schedule_running(&mut out, false);
        if out.preempted.is_empty() && self.admission_open(now) {
            self.schedule_waiting(&mut out, now);
        }
        out
    }

    fn budget_left(&self, out: &SchedulerOutput) -> usize {
        self.cfg.max_num_batched_tokens - out.num_tokens
    }

    /// Most tokens `seq` may compute this step: the token budget left, and, when each of its
    /// tokens needs a logit row (prompt logprobs), one row of its own plus the extra rows left.
    fn chunk_cap(&self, seq: &Sequence, out: &SchedulerOutput) -> usize {
        let budget = self.budget_left(out);
        if !seq.wants_prompt_logits() {
            return budget;
        }
        budget.min(1 + self.cfg.prompt_logit_rows - out.extra_logit_rows)
    }

    /// Draft tokens a decode of `seq` may add this step: its drafts, as far as the token budget
    /// (after its own token), the spare logit rows and the free blocks go (drafts never
    /// preempt anyone).
    fn drafts_cap(&self, seq: &Sequence, out: &SchedulerOutput) -> usize {
        let rows = self.cfg.prompt_logit_rows.saturating_sub(out.extra_logit_rows);
        let mut d = seq.draft.len().min(self.budget_left(out).saturating_sub(1)).min(rows);
        while d > 0 && !self.bm.can_append(&seq.block_table, seq.num_computed_tokens + 1 + d) {
            d -= 1;
        }
        d
    }

    /// Most tokens one prefill chunk may take this step (PrefillLimits): `waiting_behind`
    /// sequences wait to be admitted after it.
    fn prefill_cap(&self, waiting_behind: bool) -> usize {
        match self.cfg.prefill.long {
            LongPrefill::Off => usize::MAX,
            LongPrefill::Threshold(0) => usize::MAX,
            LongPrefill::Threshold(t) => t,
            LongPrefill::HalfWhileWaiting if waiting_behind => (self.cfg.max_num_batched_tokens / 2).max(1),
            LongPrefill::HalfWhileWaiting => usize::MAX,
        }
    }

    /// Whether `seq`'s prompt is long (longer than the threshold, where one is set).
    fn is_long(&self, seq: &Sequence) -> bool {
        self.cfg.prefill.threshold().is_some_and(|t| seq.num_prompt_tokens > t)
    }

    /// Running sequences with part of their prompt still to compute, and how many are long.
    fn partial_prefills(&self) -> (usize, usize) {
        let partial =
            self.running.iter().map(|id| &self.seqs[id]).filter(|q| q.num_computed_tokens < q.num_prompt_tokens);
        partial.fold((0, 0), |(n, l), q| (n + 1, l + usize::from(self.is_long(q))))
    }

    /// One pass over the running sequences: decodes (one token left) or prefill chunks.
    fn schedule_running(&mut self, out: &mut SchedulerOutput, decodes: bool) {
        let ids = self.running.clone();
        let prefill_cap = self.prefill_cap(!self.waiting.is_empty());
        for id in ids {
            let Some(seq) = self.seqs.get(&id) else { continue };
            let left = seq.num_uncomputed();
            if seq.status != SeqStatus::Running
                || seq.scheduled_at_step == self.step
                || left == 0
                || (left == 1) != decodes
            {
                continue;
            }
            let cap = if decodes { usize::MAX } else { prefill_cap };
            let n = left.min(self.chunk_cap(seq, out)).min(cap);
            if n == 0 || out.seqs.len() >= self.cfg.max_num_seqs {
                return;
            }
            let drafts = if decodes { self.drafts_cap(seq, out) } else { 0 };
            if self.make_room(id, seq.num_computed_tokens + n + drafts, out) {
                self.push(out, id, n + drafts, drafts);
            }
        }
    }

    /// Grows `id`'s block table to `total` tokens, preempting others if needed. False if `id`
    /// was preempted or skipped instead.
    fn make_room(&mut self, id: SeqId, total: usize, out: &mut SchedulerOutput) -> bool {
        loop {
            let seq = self.seqs.get_mut(&id).expect("running sequence exists");
            if self.bm.append_slots(&mut seq.block_table, total) {
                return true;
            }
            let key = self.running_key(id);
            // Candidates: running, not `id`, not already given tokens this step.
            let less_important =
                |r: &SeqId| *r != id && self.seqs[r].scheduled_at_step != self.step && self.running_key(*r) > key;
            let victim = self.running.iter().rev().copied().find(|r| less_important(r) && !self.is_protected(*r));
            if let Some(v) = victim {
                self.preempt(v, out);
                continue;
            }
            // Only protected sequences could give way: wait for their protection to lapse
            // rather than evict someone more important. Otherwise `id` gives way itself.
            let protected_below = self.running.iter().any(less_important);
            if !protected_below && !self.is_protected(id) {
                self.preempt(id, out);
            }
            return false;
        }
    }

    fn is_protected(&self, id: SeqId) -> bool {
        self.seqs[&id].resumed_at_step.is_some_and(|s| self.step < s + self.cfg.resume_protect_steps)
    }

    /// A victim may have a row in a step still in flight (the overlapped engine); its blocks
    /// are freed at once all the same and may go to a sequence of the step being scheduled.
    /// That is safe because the model runs steps in the order sent: the step in flight writes
    /// only the victim's slots past its registered (prefix-cached) blocks, and a block new to a
    /// sequence is written by that sequence's step before its attention reads it, so nobody
    /// reads what the older step left there. The victim's own token in flight is filled in
    /// when that step comes back; it is recomputed on resume, and no step that preempts admits.
    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        // The anti-thrashing rule; the randomized tests run with debug assertions on.
        debug_assert!(
            !self.is_protected(id),
            "seq {id} preempted {} steps after resuming",
            self.step - self.seqs[&id].resumed_at_step.unwrap_or(0)
        );
        self.running.retain(|&r| r != id);
        let key = self.waiting_key(&self.seqs[&id]);
        let seq = self.seqs.get_mut(&id).expect("preempted sequence exists");
        self.bm.free(&mut seq.block_table, &mut seq.block_hashes);
        seq.draft.clear();
        seq.num_computed_tokens = 0;
        seq.num_preemptions += 1;
        seq.status = SeqStatus::Waiting;
        self.waiting.insert(key, id);
        self.num_preemptions += 1;
        out.preempted.push(id);
    }

    fn admission_open(&self, now: Instant) -> bool {
        match self.cfg.mode {
            BatchMode::Continuous => true,
            BatchMode::Static { batch_size, max_wait } => {
                self.running.is_empty()
                    && (self.waiting.len() >= batch_size
                        || self.oldest_waiting_arrival().is_some_and(|t| now >= t + max_wait))
            }
        }
    }

    /// Admits waiting sequences in order while blocks, budget and the sequence cap allow
    /// (head-of-line: the first that does not fit stops admission, so nobody jumps the queue;
    /// the one exception is vLLM's: a long prompt held back by `max_long_partial_prefills` lets
    /// the prompts behind it go first).
    fn schedule_waiting(&mut self, out: &mut SchedulerOutput, now: Instant) {
        let (max_seqs, static_mode) = match self.cfg.mode {
            BatchMode::Continuous => (self.cfg.max_num_seqs, false),
            BatchMode::Static { batch_size, .. } => (batch_size.min(self.cfg.max_num_seqs), true),
        };
        let (mut reserved, free_at_start) = (0, self.bm.num_free());
        let (mut partial, mut long_partial) = self.partial_prefills();
        let limits = self.cfg.prefill;
        // A cursor over the waiting queue in order (admitted entries are removed behind it), not
        // a copy of the whole queue each step, which cost O(waiting) however few were admitted.
        let mut after: Option<(i32, u64)> = None;
        while self.running.len() < max_seqs && out.seqs.len() < self.cfg.max_num_seqs {
            let next = match after {
                None => self.waiting.iter().next(),
                Some(k) => self.waiting.range((Excluded(k), Unbounded)).next(),
            };
            let Some((key, id)) = next.map(|(k, v)| (*k, *v)) else { break };
            after = Some(key);
            // Its LoRA adapter waits on the CPU for a slot: so does it (the engine swaps).
            if self.seqs[&id].adapter.is_some_and(|a| self.adapters.slot_of(a).is_none()) {
                continue;
            }
            // A newcomer's own chunk is cut only by a threshold: the half-budget default holds
            // back running prefills for newcomers, not newcomers for each other (two long
            // prompts admitted half each could both outgrow the pool and preempt).
            let prefill_cap = self.prefill_cap(false);
            let long = self.is_long(&self.seqs[&id]);
            let cap = self.chunk_cap(&self.seqs[&id], out).min(prefill_cap);
            let seq = self.seqs.get_mut(&id).expect("waiting sequence exists");
            // Prompt scoring needs the logits of every position: nothing may come from the cache.
            let hits = if seq.wants_prompt_logits() {
                Vec::new()
            } else {
                self.bm.find_cached_prefix_under(seq.cache_root(), &seq.tokens)
            };
            let cached = hits.len() * self.cfg.block_size;
            let n = (seq.num_tokens() - cached).min(cap);
            // A prompt this step leaves unfinished is one more partial prefill.
            if !static_mode && cached + n < seq.num_prompt_tokens {
                if long && limits.max_long_partial_prefills > 0 && long_partial >= limits.max_long_partial_prefills {
                    continue;
                }
                if limits.max_num_partial_prefills > 0 && partial >= limits.max_num_partial_prefills {
                    break;
                }
                partial += 1;
                long_partial += usize::from(long);
            }
            if static_mode {
                // Reserve the whole sequence so that the batch can never preempt itself.
                let copies = if seq.forked { 1 } else { seq.params.n };
                let reserve = self.bm.blocks_for(seq.num_tokens() + seq.max_tokens - seq.num_output_tokens()) * copies;
                if reserved + reserve > free_at_start {
                    break;
                }
                reserved += reserve;
            } else if n == 0 {
                break;
            }
            let total = seq.num_tokens();
            if !self.bm.allocate(&mut seq.block_table, &mut seq.block_hashes, &hits, cached + n, total) {
                break;
            }
            self.waiting.remove(&key);
            seq.num_computed_tokens = cached;
            seq.num_cached_tokens.get_or_insert(cached);
            seq.status = SeqStatus::Running;
            seq.times.first_scheduled.get_or_insert(now);
            if seq.num_preemptions > 0 {
                seq.resumed_at_step = Some(self.step);
            } else if seq.index == 0 {
                self.num_prompt_tokens += seq.num_prompt_tokens as u64;
            }
            self.insert_running(id);
            if n > 0 {
                self.push(out, id, n, 0);
            }
        }
    }

    /// Schedules `n` tokens of `id`, the last `num_draft` of them its drafts (the drafts it
    /// had beyond those are dropped).
    fn push(&mut self, out: &mut SchedulerOutput, id: SeqId, n: usize, num_draft: usize) {
        let seq = self.seqs.get_mut(&id).expect("scheduled sequence exists");
        seq.scheduled_at_step = self.step;
        seq.draft.truncate(num_draft);
        let sample = seq.num_computed_tokens + n - num_draft == seq.num_tokens();
        let all_logits = seq.wants_prompt_logits();
        let s = ScheduledSeq { seq: id, num_tokens: n, sample, all_logits, num_draft };
        out.seqs.push(s);
        out.num_tokens += n;
        out.num_logit_rows += s.logit_rows();
        out.extra_logit_rows += s.logit_rows().saturating_sub(1);
    }

    /// The flattened batch for the model: each scheduled chunk with its positions and table.
    /// (Same layout as `ForwardBatch::push_seq`, written in place: that one allocates a row per
    /// sequence, which is most of this function's time at 256 sequences.)
    pub fn forward_batch(&self, out: &SchedulerOutput) -> ForwardBatch {
        let bs = self.cfg.block_size;
        let max_blocks = out.seqs.iter().map(|s| self.seqs[&s.seq].block_table.len()).max().unwrap_or(1).max(1);
        let t = out.num_tokens;
        let mut b = ForwardBatch {
            tokens: Vec::with_capacity(t),
            positions: Vec::with_capacity(t),
            slots: Vec::with_capacity(t),
            token_seq: Vec::with_capacity(t),
            block_tables: vec![0; out.seqs.len() * max_blocks], // [num_seqs, max_blocks]
            max_blocks,
            logit_rows: Vec::with_capacity(out.num_logit_rows),
            adapters: Vec::new(),
        };
        if out.seqs.iter().any(|s| self.seqs[&s.seq].adapter.is_some()) {
            let slot = |id: Option<u32>| id.and_then(|id| self.adapters.slot_of(id));
            b.adapters = out.seqs.iter().map(|s| slot(self.seqs[&s.seq].adapter)).collect();
        }
        for (row, s) in out.seqs.iter().enumerate() {
            let seq = &self.seqs[&s.seq];
            let table = &seq.block_table;
            b.block_tables[row * max_blocks..row * max_blocks + table.len()].copy_from_slice(table);
            let start = seq.num_computed_tokens;
            let end = start + s.num_tokens;
            for pos in start..end {
                if s.all_logits || (s.sample && pos + s.num_draft >= end - 1) {
                    b.logit_rows.push(b.tokens.len() as u32);
                }
                b.tokens.push(seq.tokens.get(pos).copied().unwrap_or_else(|| seq.draft[pos - seq.tokens.len()]));
                b.positions.push(pos as u32);
                b.slots.push(table[pos / bs] * bs as u32 + (pos % bs) as u32);
                b.token_seq.push(row as u32);
            }
        }
        b
    }

    /// After the forward: the scheduled tokens are in the cache now; full blocks join the
    /// prefix cache. Drafts are not counted yet: [`Scheduler::settle_drafts`] counts those the
    /// target accepted.
    pub fn complete_step(&mut self, out: &SchedulerOutput) {
        for s in &out.seqs {
            let Some(seq) = self.seqs.get_mut(&s.seq) else { continue };
            seq.num_computed_tokens += s.num_tokens - s.num_draft;
            self.cache_computed(s.seq, usize::MAX);
        }
    }

    /// After a verified step: `id`'s drafts are gone (those accepted are committed tokens now,
    /// counted in `num_computed_tokens`), its newly full blocks join the prefix cache, and the
    /// blocks past what its tokens need (allocated for rejected drafts) go back to the pool.
    pub fn settle_drafts(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        seq.draft.clear();
        let keep = self.bm.blocks_for(seq.num_tokens()).max(self.bm.blocks_for(seq.num_computed_tokens));
        if seq.block_table.len() > keep {
            let mut tail = seq.block_table.split_off(keep);
            self.bm.free(&mut tail, &mut Vec::new());
        }
        self.cache_computed(id, usize::MAX);
    }

    /// Pool and queue invariants (tests call this after every step).
    pub fn check_invariants(&self) -> Result<(), String> {
        let retired = self.retired.iter().map(|r| r.1.as_slice());
        self.bm.check_invariants(self.seqs.values().map(|s| s.block_table.as_slice()).chain(retired))?;
        for (id, s) in &self.seqs {
            let in_waiting = self.waiting.values().filter(|&&w| w == *id).count();
            let in_running = self.running.iter().filter(|&&r| r == *id).count();
            match s.status {
                SeqStatus::Waiting
                    if in_waiting == 1 && in_running == 0 && s.block_table.is_empty() && s.num_computed_tokens == 0 => {
                }
                SeqStatus::Running if in_running == 1 && in_waiting == 0 => {
                    if s.num_computed_tokens > s.num_tokens()
                        || self.bm.blocks_for(s.num_computed_tokens) > s.block_table.len()
                    {
                        return Err(format!(
                            "seq {id}: {} computed of {} tokens with {} blocks",
                            s.num_computed_tokens,
                            s.num_tokens(),
                            s.block_table.len()
                        ));
                    }
                }
                st => {
                    return Err(format!(
                        "seq {id}: status {st:?}, in waiting {in_waiting}x, in running {in_running}x, {} blocks",
                        s.block_table.len()
                    ))
                }
            }
        }
        if self.waiting.len() + self.running.len() != self.seqs.len() {
            return Err("queues and sequence table disagree".into());
        }
        if !self.running.windows(2).all(|w| self.running_key(w[0]) < self.running_key(w[1])) {
            return Err("running queue out of order".into());
        }
        Ok(())
    }
}
