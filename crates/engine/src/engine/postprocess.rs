//! The postprocess of a step: each sampled row's token joins its sequence and is emitted.
//! A row's token is drawn (taken from the device, or sampled here from its logits after
//! penalties and its mask), passes the one constraint check, is committed to the sequence and
//! its constraint, and is checked against the stops; its output goes to the request's stream,
//! the completion's last when it ends. Rows that computed every prompt position record the
//! prompt's logprobs first.

use std::time::Instant;

use super::forward::Sampled;
use super::speculate::drafted_output;
use super::{banned, banned_at, Engine};
use crate::constraint::{apply_mask, EndOnly};
use crate::detokenize::DecodeFn;
use crate::masks::admits_some;
use crate::request::RequestOutput;
use crate::sampler::{apply_penalties, has_edits, logprobs, rank, sample, spec, TokenLogprobs};
use crate::sampling_params::SamplingParams;
use crate::scheduler::SchedulerOutput;
use crate::sequence::{FinishReason, RequestId, SeqId, Sequence};

/// A row's token, or its logits to sample it from on the host.
pub(super) enum Pick<'a> {
    /// Sampled where the logits are, with its logprobs when the request asked.
    Token(u32, Option<TokenLogprobs>),
    Row(&'a mut [f32]),
}

impl Engine {
    /// Takes a step's forward result: each sampled row's token joins its sequence and is
    /// emitted. A failed forward fails the batch (and every request, when it was fatal).
    pub(super) fn postprocess(&mut self, out: &SchedulerOutput, sampled: Result<Sampled, String>) {
        let sampled = match sampled {
            Ok(s) => s,
            Err(e) => {
                self.fail_batch(out, &e);
                if self.failure.get().is_some() {
                    self.fail_all(&e);
                }
                return;
            }
        };
        self.scheduler.complete_step(out);
        let now = Instant::now();
        match sampled {
            Sampled::Ids(ids) => {
                let mut ids = ids.into_iter();
                for s in out.seqs.iter().filter(|s| s.sample) {
                    if s.num_draft > 0 {
                        let verified = ids.by_ref().take(1 + s.num_draft).map(|t| (t, None)).collect();
                        self.emit_verified(s.seq, verified, now);
                    } else if let Some(token) = ids.next() {
                        self.sample_and_emit(s.seq, Pick::Token(token, None), None, now);
                    }
                }
            }
            Sampled::IdsLogprobs(ids, lps) => {
                let mut rows = ids.into_iter().zip(lps);
                for s in out.seqs.iter().filter(|s| s.sample) {
                    if s.num_draft > 0 {
                        let verified = rows.by_ref().take(1 + s.num_draft).collect();
                        self.emit_verified(s.seq, verified, now);
                    } else if let Some((token, lp)) = rows.next() {
                        self.sample_and_emit(s.seq, Pick::Token(token, lp), None, now);
                    }
                }
            }
            Sampled::Logits(mut logits) => {
                let mut rows = logits.chunks_exact_mut(self.vocab.max(1));
                for s in out.seqs.iter().filter(|s| s.sample || s.all_logits) {
                    if s.num_draft > 0 {
                        let chunk: Vec<&mut [f32]> = rows.by_ref().take(1 + s.num_draft).collect();
                        let verified = self.verified_picks(s.seq, chunk);
                        self.emit_verified(s.seq, verified, now);
                    } else if s.all_logits {
                        let chunk: Vec<&mut [f32]> = rows.by_ref().take(s.num_tokens).collect();
                        if let Some(row) = self.score_prompt(s.seq, s.num_tokens, chunk) {
                            self.sample_and_emit(s.seq, Pick::Row(row), None, now);
                        }
                    } else {
                        let row = rows.next().expect("forward checked the logits' length");
                        self.sample_and_emit(s.seq, Pick::Row(row), None, now);
                    }
                }
            }
        }
    }

    /// The tokens (and logprobs, when asked) a decode with drafts samples from its rows on the
    /// host: row `i` as output token `j + i`, with the penalties and bans it would have had
    /// drafts `0..i` been emitted, the mask its constraint gives after those drafts, and the
    /// request's spec, as [`draw`] samples a plain row; its logprobs from the row before
    /// penalties, as [`token_output`] gives them. A guided row that keeps no finite logit
    /// gets an empty mask, so that its token fails the constraint check as a plain row's would.
    fn verified_picks(&mut self, id: SeqId, rows: Vec<&mut [f32]>) -> Vec<(u32, Option<TokenLogprobs>)> {
        let Some(seq) = self.scheduler.seq(id) else { return Vec::new() };
        let (p, j) = (&seq.params, seq.num_output_tokens());
        let masks = seq.guide.as_ref().and_then(|g| g.drafted.as_ref()).map(|d| &d.masks);
        let mut dead = vec![];
        let picks = rows
            .into_iter()
            .enumerate()
            .map(|(i, row)| {
                let raw = p.logprobs.map(|_| row.to_vec());
                let b = banned_at(&self.eos, seq, j + i);
                if has_edits(p, &b) {
                    apply_penalties(row, p, seq.prompt(), &drafted_output(seq, i), &b);
                }
                if let Some(mask) = masks.and_then(|m| m.get(i)) {
                    apply_mask(row, mask);
                    if row.iter().all(|x| *x == f32::NEG_INFINITY) {
                        dead.push(i);
                    }
                }
                let token = sample(row, &spec(p, seq.seed, seq.index, j + i));
                (token, p.logprobs.zip(raw).map(|(n, raw)| logprobs(&raw, token, n)))
            })
            .collect();
        let drafted = self.scheduler.seq_mut(id).and_then(|s| s.guide.as_mut()).and_then(|g| g.drafted.as_mut());
        if let Some(d) = drafted {
            for i in dead {
                d.masks[i].fill(0);
            }
        }
        picks
    }

    /// Records prompt logprobs from the rows of a chunk that computed every position (row `j`
    /// is position `start + j`, whose logits score token `start + j + 1`); returns the last row
    /// when the chunk also samples. Rows of positions scored before (a recompute after
    /// preemption) are skipped.
    fn score_prompt<'a>(&mut self, id: SeqId, n: usize, mut rows: Vec<&'a mut [f32]>) -> Option<&'a mut [f32]> {
        let seq = self.scheduler.seq_mut(id)?;
        let start = seq.num_computed_tokens - n;
        let k = seq.params.prompt_logprobs.unwrap_or(0);
        let sample = seq.num_computed_tokens == seq.num_tokens();
        let (tokens, p) = (&seq.tokens, seq.num_prompt_tokens);
        if let Some(lps) = seq.prompt_logprobs.as_mut() {
            for (j, row) in rows.iter().enumerate() {
                let next = start + j + 1;
                if next < p && lps.len() == next {
                    lps.push(Some(logprobs(row, tokens[next], k)));
                    seq.prompt_ranks.push(rank(row, tokens[next]));
                }
            }
        }
        if sample {
            rows.pop()
        } else {
            None
        }
    }

    /// Turns a row's pick into the sequence's next token and emits it. `at`: where the
    /// token's placeholder sits (overlapped mode: the sequence's tokens already count it, and
    /// may hold the next step's placeholder after it); None: the token is appended.
    pub(super) fn sample_and_emit(&mut self, id: SeqId, pick: Pick<'_>, at: Option<usize>, now: Instant) {
        let (eos, decode, max_model_len) = (&self.eos, &self.decode, self.admission.max_model_len);
        let Some(seq) = self.scheduler.seq_mut(id) else { return };
        let (rid, index) = (seq.request_id, seq.index);
        let scores = PromptScores::take(seq);
        if seq.max_tokens == 0 {
            // Scoring only (echo with max_tokens 0): the prompt's logprobs are the answer.
            let o = scores.into_output(RequestOutput::new(rid, index));
            return self.end_seq(id, FinishReason::Length, o);
        }
        // Output tokens before this one.
        let before = at.map_or(seq.num_output_tokens(), |a| a - seq.num_prompt_tokens);
        let drawn = match draw(seq, pick, eos) {
            Ok(d) => d,
            Err(e) => return self.end_seq(id, FinishReason::Error(e), RequestOutput::new(rid, index)),
        };
        let token = drawn.token;
        seq.commit_token(at, token, now);
        let guide_done = match advance_guide(seq, token) {
            Ok(done) => done,
            Err(e) => return self.end_seq(id, FinishReason::Error(e), RequestOutput::new(rid, index)),
        };
        let reason = finish_reason(seq, token, before, guide_done, eos, decode, max_model_len);
        let o = scores.into_output(token_output(seq, drawn, before, reason.is_some(), decode));
        let n = seq.params.n;
        let fork = !seq.forked && n > 1;
        if fork {
            seq.forked = true;
        }
        self.emit(id, rid, fork.then_some(n), o, reason);
    }

    /// Counts a token of request `rid`, forks the request's other completions after its first
    /// token (`fork`: how many completions in all), and sends the token's output: as the
    /// completion's last when `reason` ends it.
    fn emit(&mut self, id: SeqId, rid: RequestId, fork: Option<usize>, o: RequestOutput, reason: Option<FinishReason>) {
        self.generation_tokens += 1;
        if let Some(r) = self.requests.get_mut(&rid) {
            r.completion_tokens += 1;
        }
        if let Some(n) = fork {
            self.fork_completions(id, rid, n);
        }
        match reason {
            Some(reason) => self.end_seq(id, reason, o),
            None => {
                // The receiver is gone: nobody wants this request any more.
                if self.requests.get(&rid).is_some_and(|r| r.tx.send(o).is_err()) {
                    self.abort(rid);
                }
            }
        }
    }
}

/// The prompt's logprobs and ranks, sent with the first output after the prompt is scored.
struct PromptScores {
    logprobs: Option<Vec<Option<TokenLogprobs>>>,
    ranks: Vec<u32>,
}

impl PromptScores {
    /// Takes the sequence's prompt scores, if it has any still to send.
    fn take(seq: &mut Sequence) -> Self {
        let logprobs = seq.prompt_logprobs.take();
        let ranks = if logprobs.is_some() { std::mem::take(&mut seq.prompt_ranks) } else { Vec::new() };
        PromptScores { logprobs, ranks }
    }

    fn into_output(self, mut o: RequestOutput) -> RequestOutput {
        o.prompt_logprobs = self.logprobs;
        o.prompt_ranks = self.ranks;
        o
    }
}

/// A row's token, and what its logprobs come from.
struct Drawn {
    token: u32,
    /// The row's logits before penalties and mask (host sampling, logprobs asked).
    raw: Option<Vec<f32>>,
    /// Logprobs computed where the logits are.
    device_lp: Option<TokenLogprobs>,
}

/// The row's token: the device's, or sampled from the row's logits once penalties and the
/// constraint's mask are applied. Err: the constraint check failed.
fn draw(seq: &mut Sequence, pick: Pick<'_>, eos: &[u32]) -> Result<Drawn, String> {
    match pick {
        Pick::Token(token, device_lp) => {
            check_constraint(seq, None)?;
            Ok(Drawn { token, raw: None, device_lp })
        }
        Pick::Row(row) => {
            let raw = seq.params.logprobs.map(|_| row.to_vec());
            apply_penalties(row, &seq.params, seq.prompt(), seq.output(), &banned(eos, seq));
            check_constraint(seq, Some(&mut *row))?;
            let token = sample(row, &spec(&seq.params, seq.seed, seq.index, seq.num_output_tokens()));
            Ok(Drawn { token, raw, device_lp: None })
        }
    }
}

/// The check of a constrained row before its token is taken (a no-op for an unconstrained
/// one): its mask was computed, its constraint did not fail, and some token is allowed. A row
/// sampled on the device was sampled under the mask when the mask allowed some token; a row
/// sampled here (`row`: its logits, penalties applied) has the mask applied now, and must
/// keep some finite logit (a ban may have taken the only allowed token: EOS under min_tokens).
fn check_constraint(seq: &mut Sequence, row: Option<&mut [f32]>) -> Result<(), String> {
    let Some(g) = seq.guide.as_mut() else { return Ok(()) };
    let mask = match g.mask.take() {
        Some(Ok(mask)) => mask,
        Some(Err(e)) => return Err(format!("the constraint failed: {e}")),
        None => return Err("no mask was computed for a constrained row".to_string()),
    };
    let allows_some = match row {
        Some(row) => {
            apply_mask(row, &mask);
            row.iter().any(|x| *x > f32::NEG_INFINITY)
        }
        None => admits_some(&mask),
    };
    match allows_some {
        true => Ok(()),
        false => Err("the constraint admits no token here".to_string()),
    }
}

/// Commits the token to the sequence's constraint; whether the grammar is now complete.
fn advance_guide(seq: &mut Sequence, token: u32) -> Result<bool, String> {
    let Some(g) = seq.guide.as_mut() else { return Ok(false) };
    g.constraint.commit(token).map_err(|e| format!("the constraint rejected token {token}: {e}"))?;
    Ok(g.constraint.is_finished())
}

/// The stop strings in force: none while the sequence has fewer than `min_tokens` outputs
/// (`before`: its outputs before this token).
fn active_stops(p: &SamplingParams, before: usize) -> &[String] {
    if before < p.min_tokens {
        &[]
    } else {
        &p.stop
    }
}

/// Why the sequence ends with `token` (committed; `before`: its outputs before it), if it
/// does: a stop token, else a stop string in its text (the token's text is added here), else
/// a complete grammar, else its length. A grammar complete early enough instead hands over to
/// an end-of-sequence-only constraint, and the sequence goes on one more token.
fn finish_reason(
    seq: &mut Sequence,
    token: u32,
    before: usize,
    guide_done: bool,
    eos: &[u32],
    decode: &DecodeFn,
    max_model_len: usize,
) -> Option<FinishReason> {
    let p = &seq.params;
    let under_min = before < p.min_tokens;
    if !under_min && ((!p.ignore_eos && eos.contains(&token)) || p.stop_token_ids.contains(&token)) {
        return Some(FinishReason::Stop { stop_string: None, stop_token: Some(token) });
    }
    if let Some(s) = seq.text.push_keeping(decode, token, active_stops(p, before), p.include_stop_str_in_output) {
        return Some(FinishReason::Stop { stop_string: Some(s), stop_token: None });
    }
    if guide_done
        && !eos.is_empty()
        && !p.ignore_eos
        && before + 1 >= p.min_tokens
        && before + 2 <= seq.max_tokens
        && seq.num_prompt_tokens + before + 2 <= max_model_len
    {
        // The grammar is complete; as vLLM, the model samples the end-of-sequence token it
        // forces next (counted as an output token, left out of the text).
        if let Some(g) = seq.guide.as_mut() {
            g.constraint = Box::new(EndOnly::new(eos.to_vec()));
        }
        return None;
    }
    if guide_done {
        // The grammar is complete: what it describes is whole (OpenAI's "stop").
        return Some(FinishReason::Stop { stop_string: None, stop_token: None });
    }
    if before + 1 >= seq.max_tokens || seq.num_prompt_tokens + before + 1 >= max_model_len {
        return Some(FinishReason::Length);
    }
    None
}

/// The output of one committed token: its id, the text it completes (all that is left when
/// the sequence `ends`), and its logprobs when asked.
fn token_output(seq: &mut Sequence, drawn: Drawn, before: usize, ends: bool, decode: &DecodeFn) -> RequestOutput {
    if ends {
        seq.text.finish(decode);
    }
    let p = &seq.params;
    let mut o = RequestOutput::new(seq.request_id, seq.index);
    o.token_ids.push(drawn.token);
    o.text = seq.text.take_new(active_stops(p, before), ends);
    if let (Some(_), Some(lp)) = (p.logprobs, drawn.device_lp) {
        o.logprobs.push(lp);
    } else if let (Some(n), Some(raw)) = (p.logprobs, drawn.raw) {
        o.logprobs.push(logprobs(&raw, drawn.token, n));
    }
    o
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::constraint::{AllowedTokens, ConstraintFactory};
    use crate::sequence::GuideState;

    /// A sequence over a vocabulary of 8 whose constraint allows token 3, with `mask`.
    fn guided(mask: Option<Result<Vec<u32>, String>>) -> Sequence {
        let mut seq =
            Sequence::new(1, 1, 0, vec![1, 2], Arc::new(SamplingParams::default()), 4, 0, 0, 0, Instant::now());
        seq.guide = Some(GuideState { constraint: AllowedTokens(vec![3]).start().unwrap(), mask, drafted: None });
        seq
    }

    const ONLY_3: u32 = 1 << 3;

    #[test]
    fn an_unconstrained_row_passes_the_check() {
        let mut seq = guided(None);
        seq.guide = None;
        assert_eq!(check_constraint(&mut seq, None), Ok(()));
        assert_eq!(check_constraint(&mut seq, Some(&mut [0.0; 8])), Ok(()));
    }

    #[test]
    fn a_missing_or_failed_mask_fails_both_paths() {
        for host in [false, true] {
            let (mut r1, mut r2) = ([0.0f32; 8], [0.0f32; 8]);
            let e = check_constraint(&mut guided(None), host.then_some(&mut r1[..])).unwrap_err();
            assert_eq!(e, "no mask was computed for a constrained row");
            let e = check_constraint(&mut guided(Some(Err("bad".into()))), host.then_some(&mut r2[..])).unwrap_err();
            assert_eq!(e, "the constraint failed: bad");
        }
    }

    #[test]
    fn a_device_row_needs_a_mask_that_allows_some_token() {
        assert_eq!(check_constraint(&mut guided(Some(Ok(vec![ONLY_3]))), None), Ok(()));
        let e = check_constraint(&mut guided(Some(Ok(vec![0]))), None).unwrap_err();
        assert_eq!(e, "the constraint admits no token here");
    }

    /// On the host the mask is applied to the penalized logits: a ban that took the only
    /// allowed token leaves nothing.
    #[test]
    fn a_host_row_is_masked_and_needs_a_finite_logit_left() {
        let mut row = [1.0f32; 8];
        assert_eq!(check_constraint(&mut guided(Some(Ok(vec![ONLY_3]))), Some(&mut row)), Ok(()));
        assert_eq!(row.iter().filter(|x| x.is_finite()).count(), 1);
        assert!(row[3].is_finite());
        let mut banned = [1.0f32; 8];
        banned[3] = f32::NEG_INFINITY;
        let e = check_constraint(&mut guided(Some(Ok(vec![ONLY_3]))), Some(&mut banned)).unwrap_err();
        assert_eq!(e, "the constraint admits no token here");
    }
}
