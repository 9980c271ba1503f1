//! Speculative decoding never changes a greedy answer: the same requests run with and without
//! n-gram drafts give the same tokens, text and finish reasons, on the reference backend's
//! real forward (a seeded random tiny model) and on the fake model (whose next token hashes
//! every (token, position) read back from the KV cache, so a rejected draft left behind would
//! show). Also: stops and length limits inside an accepted run, abort, preemption, no leaked
//! block, and the counters.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{
    Constraint, ConstraintFactory, Engine, EngineConfig, FinishReason, Guided, Request, SamplingParams, Stats,
};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-spec-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize) -> Box<dyn ModelRunner> {
    let opts = LoadOptions { max_batch_tokens, max_seqs: 16, num_kv_blocks, block_size: 16, ..Default::default() };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

fn spec_on(k: usize, cfg: EngineConfig) -> EngineConfig {
    EngineConfig { speculative: Some(SpeculativeConfig::ngram(k)), ..cfg }
}

/// Each request's tokens, text and finish reason.
type Answer = (Vec<u32>, String, Option<FinishReason>);

fn run(e: &mut Engine, reqs: &[Request]) -> Vec<Answer> {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(e);
    let bm = &e.scheduler().bm;
    assert_eq!(bm.num_free(), bm.num_blocks(), "a block leaked");
    streams
        .iter_mut()
        .map(|s| {
            let c = collect(&drain(s), 1);
            assert_eq!(c.finals.len(), 1, "one final output");
            (c.tokens[0].clone(), c.text[0].clone(), c.finish[0].clone())
        })
        .collect()
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request { prompt, params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) }, priority: 0 }
}

/// Prompts that repeat (drafts found and accepted) and prompts that do not.
fn prompts(vocab: u32) -> Vec<Vec<u32>> {
    let motif: Vec<u32> = (0..7).map(|i| (i * 41 + 3) % vocab).collect();
    let mut out = vec![motif.repeat(4), motif.repeat(2)];
    for i in 0..4u32 {
        out.push((0..9 + i * 6).map(|j| (j * 101 + i * 7 + 1) % vocab).collect());
    }
    out
}

fn check_counters(st: &Stats, k: usize) {
    assert_eq!(st.spec_decode_num_accepted_tokens_per_pos.len(), k);
    let per_pos: u64 = st.spec_decode_num_accepted_tokens_per_pos.iter().sum();
    assert_eq!(per_pos, st.spec_decode_num_accepted_tokens_total);
    assert!(st.spec_decode_num_accepted_tokens_per_pos.windows(2).all(|w| w[0] >= w[1]));
    assert!(st.spec_decode_num_accepted_tokens_total <= st.spec_decode_num_draft_tokens_total);
    assert!(st.spec_decode_num_draft_tokens_total <= st.spec_decode_num_drafts_total * k as u64);
    assert!(st.spec_decode_num_drafts_total <= st.spec_decode_num_draft_tokens_total);
}

#[test]
fn greedy_answers_are_identical_with_and_without_drafts() {
    let dir = model_dir("identical");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let reqs: Vec<Request> = prompts(vocab).into_iter().map(|p| greedy(p, 40)).collect();
    let want = run(&mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(), &reqs);
    for k in [1, 3, 5] {
        // Together in one batch, and each alone.
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(k, EngineConfig::default())).unwrap();
        assert_eq!(run(&mut e, &reqs), want, "k = {k}, in a batch");
        let st = e.stats();
        check_counters(&st, k);
        assert!(st.spec_decode_num_accepted_tokens_total > 0, "k = {k}: no draft was accepted: {st:?}");
        assert!(
            st.spec_decode_num_accepted_tokens_total < st.spec_decode_num_draft_tokens_total,
            "k = {k}: no draft was rejected"
        );
        for (r, w) in reqs.iter().zip(&want) {
            let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(k, EngineConfig::default())).unwrap();
            assert_eq!(&run(&mut e, std::slice::from_ref(r))[0], w, "k = {k}, alone");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Logprobs and n > 1 requests keep their answers beside greedy and seeded sampled ones, all
/// speculating, token for token (a sampled token is
/// the draw plain decoding makes: see `tandem_engine::speculative`). With async scheduling on
/// the engine runs such steps synchronously.
#[test]
fn mixed_batches_keep_every_answer() {
    let dir = model_dir("mixed");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let ps = prompts(vocab);
    let mut reqs: Vec<Request> = ps.iter().take(3).map(|p| greedy(p.clone(), 30)).collect();
    let sampled = SamplingParams {
        temperature: 0.9,
        seed: Some(7),
        max_tokens: Some(30),
        ignore_eos: true,
        ..Default::default()
    };
    reqs.push(Request { prompt: ps[0].clone(), params: sampled.clone(), priority: 0 });
    let lp = SamplingParams { logprobs: Some(2), ignore_eos: true, ..SamplingParams::greedy(30) };
    reqs.push(Request { prompt: ps[1].clone(), params: lp, priority: 0 });
    let n2 = SamplingParams { n: 2, ..sampled };
    reqs.push(Request { prompt: ps[3].clone(), params: n2, priority: 0 });
    let answers = |cfg: EngineConfig| {
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), cfg).unwrap();
        let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
        run_to_idle(&mut e);
        let got: Vec<_> = streams
            .iter_mut()
            .map(|s| {
                let outs = drain(s);
                let c = collect(&outs, 2);
                let lps: Vec<_> = outs.iter().flat_map(|o| o.logprobs.iter().map(|l| format!("{l:?}"))).collect();
                (c.tokens, c.text, c.finish, lps)
            })
            .collect::<Vec<_>>();
        (got, e.stats())
    };
    let (want, _) = answers(EngineConfig::default());
    let (got, st) = answers(spec_on(4, EngineConfig::default()));
    assert_eq!(got, want);
    assert!(st.spec_decode_num_accepted_tokens_total > 0);
    let (got, st) = answers(spec_on(4, EngineConfig { async_scheduling: true, ..Default::default() }));
    assert_eq!(got, want, "async scheduling");
    assert!(st.spec_decode_num_drafts_total > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every stop string and every `max_tokens` that lands within the answer ends it at the same
/// token with drafts as without, wherever the accepted runs fall.
#[test]
fn stops_and_lengths_inside_accepted_runs_end_at_the_same_token() {
    let dir = model_dir("stops");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let prompt = prompts(vocab).remove(0);
    let base = run(
        &mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(),
        &[greedy(prompt.clone(), 24)],
    )
    .remove(0);
    let text = base.1.clone();
    let mut accepted = 0;
    for n in 1..=24 {
        let r = greedy(prompt.clone(), n);
        let want = run(
            &mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(),
            std::slice::from_ref(&r),
        );
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(4, EngineConfig::default())).unwrap();
        assert_eq!(run(&mut e, &[r]), want, "max_tokens {n}");
        assert_eq!(want[0].2, Some(FinishReason::Length));
        accepted += e.stats().spec_decode_num_accepted_tokens_total;
    }
    assert!(accepted > 0);
    for start in 2..text.len().saturating_sub(2) {
        let stop = text[start..start + 2].to_string();
        let r = Request {
            prompt: prompt.clone(),
            params: SamplingParams { stop: vec![stop.clone()], ignore_eos: true, ..SamplingParams::greedy(24) },
            priority: 0,
        };
        let want = run(
            &mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(),
            std::slice::from_ref(&r),
        );
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(4, EngineConfig::default())).unwrap();
        let got = run(&mut e, &[r]);
        assert_eq!(got, want, "stop {stop:?}");
        assert!(matches!(got[0].2, Some(FinishReason::Stop { .. })), "stop {stop:?}: {:?}", got[0].2);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pool too small for everyone: sequences with drafts are preempted and resumed, and every
/// answer is still the one each prompt gets alone without drafts.
#[test]
fn preemption_under_a_small_pool_keeps_the_answers() {
    let dir = model_dir("preempt");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let mut reqs: Vec<Request> = prompts(vocab).into_iter().map(|p| greedy(p, 40)).collect();
    reqs.extend(prompts(vocab).into_iter().take(3).map(|p| greedy(p, 40)));
    let want: Vec<Answer> = reqs
        .iter()
        .map(|r| {
            let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
            run(&mut Engine::new(runner(&dir, 64, 256), letters(), cfg).unwrap(), std::slice::from_ref(r)).remove(0)
        })
        .collect();
    let cfg = spec_on(4, EngineConfig { max_num_batched_tokens: Some(32), ..Default::default() });
    let mut e = Engine::new(runner(&dir, 14, 32), letters(), cfg).unwrap();
    assert_eq!(run(&mut e, &reqs), want);
    let st = e.stats();
    assert!(st.preemptions_total > 0, "the pool should force preemption");
    assert!(st.spec_decode_num_accepted_tokens_total > 0);
    check_counters(&st, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An abort while drafts are in play frees every block; the other requests finish unchanged.
#[test]
fn abort_mid_way_frees_everything() {
    let dir = model_dir("abort");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let ps = prompts(vocab);
    let keep = greedy(ps[1].clone(), 30);
    let want = run(
        &mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(),
        std::slice::from_ref(&keep),
    );
    let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(4, EngineConfig::default())).unwrap();
    let mut gone = e.add_request(greedy(ps[0].clone(), 200)).unwrap();
    let mut kept = e.add_request(keep).unwrap();
    for _ in 0..6 {
        e.step();
        e.scheduler().check_invariants().unwrap();
    }
    assert!(e.stats().spec_decode_num_drafts_total > 0, "drafts should be in play by now");
    e.abort(gone.id());
    run_to_idle(&mut e);
    let c = collect(&drain(&mut gone), 1);
    assert_eq!(c.finish[0], Some(FinishReason::Abort));
    let k = collect(&drain(&mut kept), 1);
    assert_eq!((k.tokens[0].clone(), k.text[0].clone(), k.finish[0].clone()), want[0]);
    let bm = &e.scheduler().bm;
    assert_eq!(bm.num_free(), bm.num_blocks(), "a block leaked");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fake model reads every position back from its KV cache: a rejected draft's K/V left
/// where a committed token belongs, or a wrongly shared block, would change its tokens.
#[test]
fn fake_model_answers_match_its_oracle_with_drafts() {
    let cfg = model_config();
    let mut rng = Rng::new(5);
    let reqs: Vec<Request> = (0..12)
        .map(|i| {
            let len = 3 + (rng.next_u64() % 40) as usize;
            let prompt: Vec<u32> = if i % 3 == 0 {
                [5, 6, 7].repeat(len / 3 + 1)
            } else {
                (0..len).map(|_| (rng.next_u64() % 60) as u32).collect()
            };
            greedy(prompt, 20 + i * 3)
        })
        .collect();
    for (blocks, budget) in [(200, 256), (12, 24)] {
        let mut model = fake(blocks, budget, 8);
        model.spare_logit_rows = 32;
        let e_cfg = spec_on(3, EngineConfig { max_num_batched_tokens: Some(budget), ..Default::default() });
        let mut e = engine(model, e_cfg);
        let got = run(&mut e, &reqs);
        for (r, g) in reqs.iter().zip(&got) {
            assert_eq!(g.0, tandem_engine::fake_model::FakeModel::greedy(&cfg, &r.prompt, g.0.len(), true));
            assert_eq!(g.0.len(), r.params.max_tokens.unwrap());
        }
        let st = e.stats();
        check_counters(&st, 3);
        assert!(st.spec_decode_num_drafts_total > 0);
    }
}

/// Allows only odd tokens.
struct Odd;

impl ConstraintFactory for Odd {
    fn start(&self) -> Result<Box<dyn Constraint>, String> {
        Ok(Box::new(Odd))
    }
    fn kind(&self) -> &str {
        "odd"
    }
}

impl Constraint for Odd {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        mask.fill(0xAAAA_AAAA);
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        match token % 2 {
            1 => Ok(()),
            _ => Err(format!("token {token} was not allowed")),
        }
    }
    fn is_finished(&self) -> bool {
        false
    }
}

/// Structured output beside speculating requests: the constrained rows are found among the
/// draft rows (its mask goes to its own row), and every answer is as without drafts.
#[test]
fn structured_output_beside_drafts_keeps_every_answer() {
    let dir = model_dir("guided");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let ps = prompts(vocab);
    let mut reqs = vec![];
    for (i, p) in ps.iter().enumerate() {
        reqs.push(greedy(p.clone(), 24));
        let mut g = greedy(p.clone(), 16);
        g.params.guided = Some(Guided::new(Odd));
        if i % 2 == 1 {
            g.params.temperature = 1.0;
            g.params.seed = Some(i as u64);
        }
        reqs.push(g);
    }
    let want = run(&mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(), &reqs);
    assert!(want.iter().skip(1).step_by(2).all(|a| a.0.iter().all(|t| t % 2 == 1)));
    let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(4, EngineConfig::default())).unwrap();
    assert_eq!(run(&mut e, &reqs), want);
    assert!(e.stats().spec_decode_num_accepted_tokens_total > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Allows every token (a guided request whose answer is the unguided one, so drafts that
/// repeat the prompt are accepted).
struct Any;

impl ConstraintFactory for Any {
    fn start(&self) -> Result<Box<dyn Constraint>, String> {
        Ok(Box::new(Any))
    }
    fn kind(&self) -> &str {
        "any"
    }
}

impl Constraint for Any {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        mask.fill(u32::MAX);
        Ok(())
    }
    fn commit(&mut self, _: u32) -> Result<(), String> {
        Ok(())
    }
    fn is_finished(&self) -> bool {
        false
    }
    fn fork(&self) -> Option<Box<dyn Constraint>> {
        Some(Box::new(Any))
    }
}

/// A guided decode's masks count once per row it samples, its draft rows included (as vLLM
/// fills a bitmask row for each scheduled draft and the one after them): each step a decode
/// with `d` drafts emits its accepted drafts and one more token, so the masks are the output
/// tokens less the accepted drafts, plus the draft tokens verified.
#[test]
fn guided_masks_count_the_draft_rows() {
    let dir = model_dir("guided-masks");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let reqs: Vec<Request> = prompts(vocab)
        .into_iter()
        .map(|p| {
            let mut g = greedy(p, 16);
            g.params.guided = Some(Guided::new(Any));
            g
        })
        .collect();
    let mut plain = Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap();
    let want = run(&mut plain, &reqs);
    let outputs: usize = want.iter().map(|a| a.0.len()).sum();
    assert_eq!(plain.stats().guided_masks_total, outputs as u64, "one mask per token without drafts");
    let mut e = Engine::new(runner(&dir, 64, 256), letters(), spec_on(4, EngineConfig::default())).unwrap();
    assert_eq!(run(&mut e, &reqs), want);
    let st = e.stats();
    assert!(st.spec_decode_num_accepted_tokens_total > 0, "no draft was accepted: {st:?}");
    assert_eq!(
        st.guided_masks_total,
        outputs as u64 - st.spec_decode_num_accepted_tokens_total + st.spec_decode_num_draft_tokens_total,
        "{st:?}"
    );
    assert_eq!(st.guided_mask_seconds.len() as u64, st.guided_masks_total, "each mask's time is kept");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_is_refused_naming_the_field() {
    let cfg = EngineConfig {
        speculative: Some(SpeculativeConfig { prompt_lookup_min: 0, ..SpeculativeConfig::ngram(2) }),
        ..Default::default()
    };
    let err = Engine::new(Box::new(fake(16, 64, 4)), letters(), cfg).err().unwrap();
    assert!(err.to_string().contains("prompt_lookup_min"), "{err}");
}

/// The draft length adapts to load: with more decodes running than
/// `speculative::DRAFT_ROWS / 2`, none gets a draft; with few, they do; the answers are the
/// fake model's own either way.
#[test]
fn a_large_batch_gets_no_drafts() {
    let cfg = model_config();
    let reqs = |n: usize| -> Vec<Request> { (0..n).map(|i| greedy([5, 6, 7].repeat(3 + i % 4), 12)).collect() };
    for (n, drafts) in [(4, true), (tandem_engine::speculative::DRAFT_ROWS / 2 + 1, false)] {
        let mut model = fake(2048, 1024, n);
        model.spare_logit_rows = 512;
        let mut e = engine(model, spec_on(3, EngineConfig::default()));
        let rs = reqs(n);
        let got = run(&mut e, &rs);
        for (r, g) in rs.iter().zip(&got) {
            assert_eq!(g.0, tandem_engine::fake_model::FakeModel::greedy(&cfg, &r.prompt, g.0.len(), true));
        }
        assert_eq!(e.stats().spec_decode_num_drafts_total > 0, drafts, "{n} decodes");
    }
}

/// Suffix decoding: the same answers as without drafts, alone and in a batch; and a request
/// whose answer an earlier request already gave drafts it from that output: a second pass
/// over the same prompts accepts more than the first, unless the cache of outputs is off.
#[test]
fn suffix_drafts_keep_answers_and_learn_from_earlier_outputs() {
    let dir = model_dir("suffix");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let reqs: Vec<Request> = prompts(vocab).into_iter().map(|p| greedy(p, 40)).collect();
    let want = run(&mut Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap(), &reqs);
    let suffix = |cached: usize| EngineConfig {
        speculative: Some(SpeculativeConfig {
            suffix_decoding_max_cached_requests: cached,
            ..SpeculativeConfig::suffix(6)
        }),
        ..Default::default()
    };
    let mut e = Engine::new(runner(&dir, 64, 256), letters(), suffix(100)).unwrap();
    assert_eq!(run(&mut e, &reqs), want, "in a batch");
    check_counters(&e.stats(), 6);
    for cached in [100, 0] {
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), suffix(cached)).unwrap();
        let mut accepted = vec![];
        for pass in 0..2 {
            let before = e.stats().spec_decode_num_accepted_tokens_total;
            for (r, w) in reqs.iter().zip(&want) {
                assert_eq!(&run(&mut e, std::slice::from_ref(r))[0], w, "pass {pass}, alone");
            }
            accepted.push(e.stats().spec_decode_num_accepted_tokens_total - before);
        }
        assert!(accepted[0] > 0, "{accepted:?}");
        if cached > 0 {
            assert!(accepted[1] > accepted[0], "earlier outputs should help: {accepted:?}");
        } else {
            assert_eq!(accepted[1], accepted[0], "no cache: the second pass drafts as the first");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fake model's oracle with suffix drafts (its next token depends on every K/V read back).
#[test]
fn fake_model_answers_match_its_oracle_with_suffix_drafts() {
    let cfg = model_config();
    let mut rng = Rng::new(9);
    let reqs: Vec<Request> = (0..12)
        .map(|i| {
            let len = 3 + (rng.next_u64() % 40) as usize;
            let prompt: Vec<u32> = if i % 2 == 0 {
                [5, 6, 7, 8].repeat(len / 4 + 1)
            } else {
                (0..len).map(|_| (rng.next_u64() % 60) as u32).collect()
            };
            greedy(prompt, 20 + i * 3)
        })
        .collect();
    let mut model = fake(200, 256, 8);
    model.spare_logit_rows = 64;
    let e_cfg = EngineConfig {
        speculative: Some(SpeculativeConfig::suffix(8)),
        max_num_batched_tokens: Some(256),
        ..Default::default()
    };
    let mut e = engine(model, e_cfg);
    for _ in 0..2 {
        let got = run(&mut e, &reqs);
        for (r, g) in reqs.iter().zip(&got) {
            assert_eq!(g.0, tandem_engine::fake_model::FakeModel::greedy(&cfg, &r.prompt, g.0.len(), true));
            assert_eq!(g.0.len(), r.params.max_tokens.unwrap());
        }
    }
    let st = e.stats();
    check_counters(&st, 8);
    assert!(st.spec_decode_num_accepted_tokens_total > 0);
}

/// Preemption and abort with sampled requests and both draft sources: a pool too small for
/// everyone preempts sequences that carry drafts, one request is aborted mid-way, and every
/// other answer (greedy, or sampled with a seed) is still the one its prompt gets alone
/// without drafts; no block leaks.
#[test]
fn preemption_and_abort_keep_sampled_and_suffix_answers() {
    let dir = model_dir("preempt-sampled");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let mut reqs: Vec<Request> = vec![];
    for (i, p) in prompts(vocab).into_iter().enumerate() {
        reqs.push(greedy(p.clone(), 36));
        let params = SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: Some(100 + i as u64),
            max_tokens: Some(36),
            ignore_eos: true,
            ..Default::default()
        };
        reqs.push(Request { prompt: p, params, priority: 0 });
    }
    let alone = EngineConfig { enable_prefix_caching: false, ..Default::default() };
    let want: Vec<Answer> = reqs
        .iter()
        .map(|r| {
            run(&mut Engine::new(runner(&dir, 64, 256), letters(), alone.clone()).unwrap(), std::slice::from_ref(r))
                .remove(0)
        })
        .collect();
    for spec in [SpeculativeConfig::ngram(4), SpeculativeConfig::suffix(4)] {
        let cfg =
            EngineConfig { max_num_batched_tokens: Some(32), speculative: Some(spec.clone()), ..Default::default() };
        let mut e = Engine::new(runner(&dir, 14, 32), letters(), cfg).unwrap();
        let mut gone = e.add_request(greedy(prompts(vocab)[0].clone(), 150)).unwrap();
        let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
        let mut steps = 0;
        while e.stats().spec_decode_num_drafts_total == 0 || steps < 12 {
            e.step();
            e.scheduler().check_invariants().unwrap();
            steps += 1;
            assert!(steps < 10_000, "no drafts");
        }
        e.abort(gone.id());
        run_to_idle(&mut e);
        assert_eq!(collect(&drain(&mut gone), 1).finish[0], Some(FinishReason::Abort));
        let got: Vec<Answer> = streams
            .iter_mut()
            .map(|s| {
                let c = collect(&drain(s), 1);
                (c.tokens[0].clone(), c.text[0].clone(), c.finish[0].clone())
            })
            .collect();
        assert_eq!(got, want, "{:?}", spec.method);
        let st = e.stats();
        assert!(st.preemptions_total > 0, "{:?}: the pool should force preemption", spec.method);
        assert!(st.spec_decode_num_accepted_tokens_total > 0, "{:?}", spec.method);
        check_counters(&st, 4);
        let bm = &e.scheduler().bm;
        assert_eq!(bm.num_free(), bm.num_blocks(), "{:?}: a block leaked", spec.method);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
