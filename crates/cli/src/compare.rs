//! `tandem compare --backend B --model DIR`: one whole model on backend B against the
//! reference backend, then B against itself (batch invariance through the engine).
//!
//! 1. A few prompts of random ids (lengths 1, 17, 64, 200, ... from a seed) run greedily on B
//!    and on the reference (`tandem_core::greedy::generate`, logits kept). Per prompt: are the
//!    greedy ids equal, where do they first differ, the NMSE of the logits per step, the largest
//!    |Δlogit|. Rule (vLLM's `check_logprobs_close`, as in crates/conformance/src/golden.rs):
//!    ids equal up to the first divergence, where each side's token is in the other's top-5;
//!    while they agree, every step's NMSE is under `--nmse-limit` and the log-probabilities of
//!    the reference's top-5 are within `--logprob-tol`.
//! 2. `--batch` requests made of those prompts (exact repeats, which hit the prefix cache, and
//!    perturbed copies) run together through `tandem_engine` on B, with a small token budget
//!    (chunked prefill) and a small KV pool (preemption); each must give the same greedy ids as
//!    it gave alone on B.
//!
//! The last line is `compare: N passed, M failed`; the exit status is non-zero on any failure.
//! `--json OUT` writes the prompts and both sides' greedy ids and top-5 log-probabilities, for
//! `gpu/hf_compare.py` to hold against HF transformers.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;
use tandem_conformance::numerics::Bf16Numerics;
use tandem_conformance::rng::Rng;
use tandem_core::backend::{DType, KvDtype};
use tandem_core::greedy::{self, Step};
use tandem_core::model::{LoadOptions, Model};
use tandem_core::ModelRunner;
use tandem_engine::{Engine, EngineConfig, FinishReason, Request, SamplingParams};

use crate::backends::{self, BackendKind};

/// Prompt lengths, in order: one token (decode right after a one-token prefill), lengths that
/// end mid-block, one that spans several prefill chunks.
const LENGTHS: [usize; 8] = [1, 17, 64, 200, 5, 33, 128, 300];
const BLOCK: usize = 16;

/// The whole-model compare's limits against the f32 reference.
struct Limits {
    nmse: f64,
    logprob: f64,
}

impl Limits {
    /// f32 numerics: only summation order differs from the reference (the GPU check's compares
    /// passed 1e-5 on the H200 when CUDA computed in f32). 16-bit numerics: each projection's
    /// input and each K/V value carries a relative rounding error of up to 2^-8 (bf16's 8
    /// significant bits), which compounds over the layers; rather than bound that loosely, the
    /// limits are what the reference gives when it rounds at exactly those points
    /// (`--numerics bf16`), with a margin. Measured on 2026-12-01 with the random models the GPU
    /// check uses, 16 greedy steps: tiny bf16 (8 prompts, seeds 1-3) NMSE at most 1.35e-4,
    /// |dlogprob| at most 4.7e-2; smollm2-135m bf16 (4 prompts) 9.3e-5 and 5.4e-2. The limits
    /// are about 7x (NMSE) and 4.7x (log-probability) the worst of those; the unit test below
    /// keeps the tiny model's figures under a fifth and a quarter of them.
    fn for_numerics(rounds: bool) -> Limits {
        if rounds {
            Limits { nmse: BF16_NMSE_LIMIT, logprob: BF16_LOGPROB_TOL }
        } else {
            Limits { nmse: 1e-5, logprob: 1e-3 }
        }
    }
}
const BF16_NMSE_LIMIT: f64 = 1e-3;
const BF16_LOGPROB_TOL: f64 = 0.25;

#[derive(clap::Args)]
pub struct Args {
    /// The backend under test.
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// A model directory (config.json + safetensors), e.g. from `tandem gen-model`.
    #[arg(long)]
    model: PathBuf,
    /// The backend it is held against.
    #[arg(long, value_enum, default_value_t = BackendKind::Reference)]
    against: BackendKind,
    /// Number of prompts (lengths 1, 17, 64, 200, 5, 33, 128, 300, then again).
    #[arg(long, default_value_t = 4)]
    prompts: usize,
    /// Greedy steps per prompt.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Seed of the prompt ids.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Most tokens per forward (longer prompts are prefilled in chunks over their own prefix).
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    /// Concurrent requests in the batch-invariance check; 0 skips it.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// KV blocks of 16 tokens on B (default: small enough that the batch check preempts).
    #[arg(long)]
    kv_blocks: Option<usize>,
    /// Largest NMSE of one step's logits against the reference. Default: by what the backend
    /// under test rounds (see `Limits::for_numerics`): 1e-5 where it computes in f32, the bf16
    /// limit where it rounds projection inputs or K/V to 16 bits (CUDA by default).
    #[arg(long)]
    nmse_limit: Option<f64>,
    /// Largest |Δ log-probability| over the reference's top-5 while the ids agree. Default: by
    /// the backend's numerics, as --nmse-limit.
    #[arg(long)]
    logprob_tol: Option<f64>,
    /// `bf16`: the backend under test is the reference wrapped to round where CUDA rounds
    /// (projection inputs to the weights' 16-bit type, K/V to bf16; tandem_conformance::numerics):
    /// the error those roundings alone cause, from which the bf16 limits are set. Needs
    /// `--backend reference`.
    #[arg(long, value_parser = ["f32", "bf16"], default_value = "f32")]
    numerics: String,
    /// Write prompts and results here (input of gpu/hf_compare.py).
    #[arg(long)]
    json: Option<PathBuf>,
    /// What B's KV cache stores: auto (bf16 on cuda, f32 elsewhere), bf16, f32 or fp8 (as `serve`).
    /// The side it is held against keeps its own default.
    #[arg(long, default_value = "auto", value_parser = crate::serve::parse_kv_cache_dtype)]
    kv_cache_dtype: crate::serve::KvCacheDtype,
}

/// One side's greedy run, reduced to what the comparison and the JSON need.
struct Run {
    ids: Vec<u32>,
    /// Per step: the five best `(id, logprob)`.
    top5: Vec<Vec<(u32, f64)>>,
    /// Per step: best logit minus the second best.
    gap: Vec<f64>,
    logits: Vec<Vec<f32>>,
    secs: f64,
}

/// How one prompt went.
struct Outcome {
    equal: usize,
    diverged_at: Option<usize>,
    nmse: Vec<f64>,
    max_abs: f64,
    max_logprob_err: f64,
    failure: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    if a.prompts == 0 || a.steps == 0 || a.chunk == 0 {
        bail!("--prompts, --steps and --chunk must be at least 1");
    }
    let prompts = make_prompts(&a.model, a.prompts, a.seed)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(1) + a.steps;
    let requests = if a.batch > 0 { make_requests(&prompts, a.batch, vocab_of(&a.model)?, a.seed) } else { vec![] };
    let need = |len: usize| (len + a.steps).div_ceil(BLOCK);
    let single = need(longest - a.steps) + 1;
    // A fifth of what the batch would hold without sharing: with the prefix cache sharing the
    // repeats, that still preempts (8 preemptions on the tiny model at 32 requests).
    let kv_blocks =
        a.kv_blocks.unwrap_or_else(|| single.max(requests.iter().map(|r| need(r.len())).sum::<usize>() / 5));
    if kv_blocks < single {
        bail!("--kv-blocks {kv_blocks} is below the {single} blocks one {longest}-token sequence needs");
    }

    let t = Instant::now();
    let opts = |max_seqs: usize, blocks: usize| LoadOptions {
        max_batch_tokens: a.chunk,
        max_seqs,
        num_kv_blocks: blocks,
        block_size: BLOCK,
        ..Default::default()
    };
    let under_opts = LoadOptions { kv_dtype: a.kv_cache_dtype.0, ..opts(a.batch.max(1), kv_blocks) };
    let mut under: Box<dyn ModelRunner> = if a.numerics == "bf16" {
        if a.backend != BackendKind::Reference {
            bail!(
                "--numerics bf16 wraps the reference backend; use it with --backend reference (got {})",
                a.backend.name()
            );
        }
        Box::new(
            Model::load(Bf16Numerics::new(), &a.model, under_opts)
                .with_context(|| format!("loading {} on the bf16-rounding reference", a.model.display()))?,
        )
    } else {
        backends::load(a.backend, &a.model, under_opts)
            .with_context(|| format!("loading {} on {}", a.model.display(), a.backend.name()))?
    };
    let mut refr = backends::load(a.against, &a.model, opts(1, single))
        .with_context(|| format!("loading {} on {}", a.model.display(), a.against.name()))?;
    let cfg = under.config().clone();
    let kv_dtype = under.kv_dtype();
    let rounds = a.numerics == "bf16" || under.matmul_operand() != DType::F32 || kv_dtype != KvDtype::F32;
    let limits = Limits::for_numerics(rounds);
    let (nmse_limit, logprob_tol) = (a.nmse_limit.unwrap_or(limits.nmse), a.logprob_tol.unwrap_or(limits.logprob));
    println!(
        "limits: NMSE {nmse_limit:.0e}, |dlogprob| {logprob_tol:.0e} ({})",
        if a.nmse_limit.is_some() || a.logprob_tol.is_some() {
            "given"
        } else if rounds {
            "16-bit numerics: projection inputs or K/V rounded"
        } else {
            "f32 numerics"
        }
    );
    println!(
        "compare: {} ({} KV cache) against {} on {} ({} layers, hidden {}, vocab {}), {} prompts of {:?} tokens, {} steps, chunk {}, seed {}, loaded in {:.1} s",
        a.backend.name(),
        kv_dtype.name(),
        a.against.name(),
        a.model.display(),
        cfg.num_hidden_layers,
        cfg.hidden_size,
        cfg.vocab_size,
        prompts.len(),
        prompts.iter().map(Vec::len).collect::<Vec<_>>(),
        a.steps,
        a.chunk,
        a.seed,
        t.elapsed().as_secs_f64()
    );

    let (mut passed, mut failed) = (0usize, 0usize);
    let mut json_prompts = vec![];
    let mut alone: Vec<Option<Vec<u32>>> = vec![];
    for (i, p) in prompts.iter().enumerate() {
        let ours = greedy_run(under.as_mut(), p, a.steps);
        let theirs = greedy_run(refr.as_mut(), p, a.steps);
        let o = match (&ours, &theirs) {
            (Ok(u), Ok(r)) => judge(u, r, nmse_limit, logprob_tol),
            (Err(e), _) => Outcome::failed(format!("{}: {e}", a.backend.name())),
            (_, Err(e)) => Outcome::failed(format!("{}: {e}", a.against.name())),
        };
        print_outcome(i, p.len(), a.steps, &o, ours.as_ref().ok(), theirs.as_ref().ok());
        if o.failure.is_none() {
            passed += 1;
        } else {
            failed += 1;
        }
        alone.push(ours.as_ref().ok().map(|r| r.ids.clone()));
        json_prompts.push(json!({
            "prompt_ids": p,
            "backend": ours.as_ref().ok().map(run_json),
            "reference": theirs.as_ref().ok().map(run_json),
            "equal_steps": o.equal,
            "diverged_at": o.diverged_at,
            "nmse": o.nmse,
            "max_abs": o.max_abs,
            "max_logprob_err": o.max_logprob_err,
            "failure": o.failure,
        }));
    }
    drop(refr);

    let mut batch_json = serde_json::Value::Null;
    if a.batch > 0 {
        let (ok, j) = batch_invariance(under, &requests, &prompts, &alone, &a);
        batch_json = j;
        if ok {
            passed += 1;
        } else {
            failed += 1;
        }
    }

    if let Some(path) = &a.json {
        let doc = json!({
            "model": a.model.display().to_string(),
            "backend": a.backend.name(),
            "against": a.against.name(),
            "kv_cache_dtype": kv_dtype.name(),
            "seed": a.seed,
            "steps": a.steps,
            "chunk": a.chunk,
            "numerics": if rounds { "16-bit" } else { "f32" },
            "nmse_limit": nmse_limit,
            "logprob_tol": logprob_tol,
            "prompts": json_prompts,
            "batch": batch_json,
            "passed": passed,
            "failed": failed,
        });
        let text = serde_json::to_string(&doc)? + "\n";
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    println!("compare: {passed} passed, {failed} failed");
    if failed > 0 {
        bail!("compare: {failed} check(s) failed on {}", a.backend.name());
    }
    Ok(())
}

fn vocab_of(dir: &Path) -> Result<usize> {
    Ok(tandem_core::ModelConfig::from_file(&dir.join("config.json"))?.vocab_size)
}

/// `k` prompts of random ids; the same (model, k, seed) always gives the same prompts.
fn make_prompts(dir: &Path, k: usize, seed: u64) -> Result<Vec<Vec<u32>>> {
    let vocab = vocab_of(dir)?;
    let mut rng = Rng::new(seed);
    Ok((0..k)
        .map(|i| (0..LENGTHS[i % LENGTHS.len()] + i / LENGTHS.len()).map(|_| rng.below(vocab) as u32).collect())
        .collect())
}

/// `n` prompts from the base ones: first the prompts themselves, then exact repeats (whole
/// prompts found in the prefix cache), then copies with the last token changed and a few
/// tokens added (a shared prefix, a different tail).
fn make_requests(prompts: &[Vec<u32>], n: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let k = prompts.len();
    let mut rng = Rng::new(seed ^ 0x5eed_ba7c);
    (0..n)
        .map(|i| {
            let mut p = prompts[i % k].clone();
            if i >= 2 * k {
                let last = p.len() - 1;
                p[last] = (p[last] + 1 + rng.below(vocab - 1) as u32) % vocab as u32;
                p.extend((0..i % 5).map(|_| rng.below(vocab) as u32));
            }
            p
        })
        .collect()
}

fn greedy_run(runner: &mut dyn ModelRunner, prompt: &[u32], steps: usize) -> Result<Run> {
    let t = Instant::now();
    let out: Vec<Step> = greedy::generate(runner, prompt, steps, &[], true, |_| {})?;
    let secs = t.elapsed().as_secs_f64();
    let mut run = Run { ids: vec![], top5: vec![], gap: vec![], logits: vec![], secs };
    for s in out {
        let lp = log_softmax(&s.logits);
        let best = top_k(&s.logits, 5);
        run.gap.push(
            best.get(1).map_or(f64::INFINITY, |&b| s.logits[best[0] as usize] as f64 - s.logits[b as usize] as f64),
        );
        run.top5.push(best.iter().map(|&id| (id, lp[id as usize])).collect());
        run.ids.push(s.id);
        run.logits.push(s.logits);
    }
    Ok(run)
}

fn run_json(r: &Run) -> serde_json::Value {
    json!({ "greedy": r.ids, "top5": r.top5, "gap": r.gap, "seconds": r.secs })
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// Ids of the `k` largest values, largest first, lowest id on ties (as `argmax_row`).
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let k = k.min(idx.len());
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k, cmp);
        idx.truncate(k);
    }
    idx.sort_by(cmp);
    idx
}

impl Outcome {
    fn failed(why: String) -> Outcome {
        Outcome {
            equal: 0,
            diverged_at: None,
            nmse: vec![],
            max_abs: f64::NAN,
            max_logprob_err: f64::NAN,
            failure: Some(why),
        }
    }
}

/// Applies the rule of the module doc to one prompt's two runs.
fn judge(ours: &Run, theirs: &Run, nmse_limit: f64, logprob_tol: f64) -> Outcome {
    let mut o =
        Outcome { equal: 0, diverged_at: None, nmse: vec![], max_abs: 0.0, max_logprob_err: 0.0, failure: None };
    let steps = ours.ids.len().min(theirs.ids.len());
    if ours.ids.len() != theirs.ids.len() {
        o.failure = Some(format!("{} steps against {}", ours.ids.len(), theirs.ids.len()));
    }
    for i in 0..steps {
        // The logits of step i come from the same context on both sides, even at a divergence.
        let (u, r) = (&ours.logits[i], &theirs.logits[i]);
        if let Some(j) = u.iter().position(|x| !x.is_finite()) {
            o.failure = Some(format!("step {i}: logit {j} is {}", u[j]));
            return o;
        }
        let e = tandem_conformance::compare::nmse(u, r);
        o.nmse.push(e);
        o.max_abs = u.iter().zip(r).fold(o.max_abs, |m, (a, b)| m.max((a - b).abs() as f64));
        if e > nmse_limit && o.failure.is_none() {
            o.failure = Some(format!("step {i}: logits NMSE {e:.2e} > {nmse_limit:.0e}"));
        }
        if ours.ids[i] != theirs.ids[i] {
            o.diverged_at = Some(i);
            let our_top: Vec<u32> = ours.top5[i].iter().map(|p| p.0).collect();
            let their_top: Vec<u32> = theirs.top5[i].iter().map(|p| p.0).collect();
            if (!their_top.contains(&ours.ids[i]) || !our_top.contains(&theirs.ids[i])) && o.failure.is_none() {
                o.failure = Some(format!(
                    "step {i}: chose {} (reference top-5 {their_top:?}), reference chose {} (our top-5 {our_top:?}); reference gap {:.2e}",
                    ours.ids[i], theirs.ids[i], theirs.gap[i]
                ));
            }
            break;
        }
        o.equal += 1;
        let lp = log_softmax(u);
        for &(id, want) in &theirs.top5[i] {
            let err = (lp[id as usize] - want).abs();
            o.max_logprob_err = o.max_logprob_err.max(err);
            if err > logprob_tol && o.failure.is_none() {
                o.failure = Some(format!(
                    "step {i}: token {id}: logprob {:.6} against {want:.6} (|diff| {err:.2e} > {logprob_tol:.0e})",
                    lp[id as usize]
                ));
            }
        }
    }
    o
}

fn print_outcome(i: usize, len: usize, steps: usize, o: &Outcome, ours: Option<&Run>, theirs: Option<&Run>) {
    let worst = o.nmse.iter().cloned().fold(0.0f64, f64::max);
    let secs = |r: Option<&Run>| r.map_or("-".to_string(), |r| format!("{:.2}", r.secs));
    println!(
        "prompt {i} ({len} tokens): ids equal {}/{steps}, first divergence {}, logits nmse max {worst:.2e}, max |dlogit| {:.2e}, max |dlogprob| {:.2e}, {} s / {} s  {}",
        o.equal,
        o.diverged_at.map_or("-".to_string(), |d| d.to_string()),
        o.max_abs,
        o.max_logprob_err,
        secs(ours),
        secs(theirs),
        match &o.failure {
            None => "ok".to_string(),
            Some(why) => format!("FAIL  {why}"),
        }
    );
    let per_step: Vec<String> = o.nmse.iter().map(|e| format!("{e:.1e}")).collect();
    println!("  nmse per step: {}", per_step.join(" "));
}

/// The requests together through the engine on B; each must give the ids it gave alone.
/// Returns (passed, JSON summary).
fn batch_invariance(
    runner: Box<dyn ModelRunner>,
    reqs: &[Vec<u32>],
    prompts: &[Vec<u32>],
    alone: &[Option<Vec<u32>>],
    a: &Args,
) -> (bool, serde_json::Value) {
    match batch_invariance_inner(runner, reqs, prompts, alone, a) {
        Ok(v) => v,
        Err(e) => {
            println!("batch invariance ({} requests): FAIL  {e:#}", reqs.len());
            (false, json!({ "requests": reqs.len(), "failure": format!("{e:#}") }))
        }
    }
}

fn batch_invariance_inner(
    mut runner: Box<dyn ModelRunner>,
    reqs: &[Vec<u32>],
    prompts: &[Vec<u32>],
    alone: &[Option<Vec<u32>>],
    a: &Args,
) -> Result<(bool, serde_json::Value)> {
    let t = Instant::now();
    // Alone: one sequence at a time on the same loaded model (greedy::generate uses blocks
    // 0.. in order; the engine below owns the pool afterwards and overwrites it).
    let mut want = Vec::with_capacity(reqs.len());
    for r in reqs {
        let known = prompts.iter().position(|p| p == r).and_then(|j| alone[j].clone());
        let ids = match known {
            Some(ids) => ids,
            None => greedy::generate(runner.as_mut(), r, a.steps, &[], false, |_| {})?.iter().map(|s| s.id).collect(),
        };
        want.push(ids);
    }
    let alone_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let kv_blocks = runner.kv_geometry().num_blocks;
    let mixed = Arc::new(AtomicU64::new(0));
    let runner: Box<dyn ModelRunner> = Box::new(MixCounter { inner: runner, mixed: mixed.clone() });
    let cfg = EngineConfig {
        max_num_batched_tokens: Some(a.chunk),
        max_num_seqs: Some(reqs.len()),
        enable_prefix_caching: true,
        ..Default::default()
    };
    let decode: tandem_engine::DecodeFn =
        std::sync::Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect());
    let mut engine = Engine::new(runner, decode, cfg).map_err(|e| anyhow::anyhow!("engine: {e}"))?;
    let mut streams = Vec::with_capacity(reqs.len());
    for r in reqs {
        let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(a.steps) };
        streams.push(
            engine
                .add_request(Request { prompt: r.clone(), params, priority: 0 })
                .map_err(|e| anyhow::anyhow!("add_request: {e:?}"))?,
        );
    }
    while engine.has_work() {
        engine.step();
    }
    let st = engine.stats();
    let crowd_secs = t.elapsed().as_secs_f64();
    let mut bad = vec![];
    let mut first_bad = None;
    for (i, s) in streams.iter_mut().enumerate() {
        let mut got = vec![];
        let mut error = None;
        while let Some(o) = s.try_recv() {
            if let Some(FinishReason::Error(e)) = &o.finish_reason {
                error = Some(e.clone());
            }
            got.extend(o.token_ids);
        }
        if error.is_some() || got != want[i] {
            bad.push(i);
            if first_bad.is_none() {
                let pos = got.iter().zip(&want[i]).position(|(g, w)| g != w);
                first_bad = Some(format!(
                    "request {i} ({} prompt tokens): {} alone {:?}, in the batch {:?} (first difference at {pos:?})",
                    reqs[i].len(),
                    error.map_or(String::new(), |e| format!("error {e}; ")),
                    want[i],
                    got
                ));
            }
        }
    }
    let ok = bad.is_empty() && st.forward_errors_total == 0;
    let mixed_steps = mixed.load(Ordering::Relaxed);
    println!(
        "batch invariance ({} requests, budget {} tokens/step, {kv_blocks} KV blocks): {} equal, {} differ, {} preemptions, {mixed_steps} steps mixing prefill chunks with decodes, prefix-cache hits {} of {} tokens, {} steps, alone {alone_secs:.2} s, together {crowd_secs:.2} s  {}",
        reqs.len(),
        a.chunk,
        reqs.len() - bad.len(),
        bad.len(),
        st.preemptions_total,
        st.prefix_cache_hits_total,
        st.prefix_cache_queries_total,
        st.steps_total,
        if ok {
            "ok".to_string()
        } else {
            format!("FAIL  {}", first_bad.unwrap_or_else(|| format!("{} forward errors", st.forward_errors_total)))
        }
    );
    if st.preemptions_total == 0 {
        println!("  note: no preemption happened (pool of {kv_blocks} blocks was large enough)");
    }
    let j = json!({
        "requests": reqs.len(),
        "passed": ok,
        "differ": bad,
        "forward_errors": st.forward_errors_total,
        "preemptions": st.preemptions_total,
        "mixed_steps": mixed_steps,
        "prefix_cache_hits": st.prefix_cache_hits_total,
        "steps": st.steps_total,
        "alone_seconds": alone_secs,
        "together_seconds": crowd_secs,
    });
    Ok((ok, j))
}

/// Counts the forwards that carry a prefill chunk (a sequence of two or more tokens) beside a
/// decode (a sequence of one token), so the batch check can show it exercised that mix
/// (gpu/summarize.py's `batch_invariant` needs it). A one-token prompt tail also counts as
/// "one token"; the engine's chunking makes that rare, and it is still a mixed step for the
/// kernels. Everything else goes straight to the wrapped runner.
struct MixCounter {
    inner: Box<dyn ModelRunner>,
    mixed: Arc<AtomicU64>,
}

impl MixCounter {
    fn count(&self, b: &tandem_core::ForwardBatch) {
        let mut per_seq = vec![0u32; b.num_seqs()];
        for &s in &b.token_seq {
            if let Some(n) = per_seq.get_mut(s as usize) {
                *n += 1;
            }
        }
        if per_seq.contains(&1) && per_seq.iter().any(|&n| n >= 2) {
            self.mixed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl ModelRunner for MixCounter {
    fn config(&self) -> &tandem_core::ModelConfig {
        self.inner.config()
    }
    fn backend_name(&self) -> &'static str {
        self.inner.backend_name()
    }
    fn kv_geometry(&self) -> tandem_core::backend::KvGeometry {
        self.inner.kv_geometry()
    }
    fn kv_dtype(&self) -> tandem_core::backend::KvDtype {
        self.inner.kv_dtype()
    }
    fn activation_dtypes(&self) -> tandem_core::model::ActDtypes {
        self.inner.activation_dtypes()
    }
    fn max_batch_tokens(&self) -> usize {
        self.inner.max_batch_tokens()
    }
    fn max_seqs(&self) -> usize {
        self.inner.max_seqs()
    }
    fn max_logit_rows(&self) -> usize {
        self.inner.max_logit_rows()
    }
    fn forward(&mut self, b: &tandem_core::ForwardBatch) -> tandem_core::Result<Vec<f32>> {
        self.count(b);
        self.inner.forward(b)
    }
    fn forward_sampled(
        &mut self,
        b: &tandem_core::ForwardBatch,
        specs: &[tandem_core::sampling::SampleSpec],
    ) -> tandem_core::Result<Vec<u32>> {
        self.count(b);
        self.inner.forward_sampled(b, specs)
    }
    fn forward_sampled_masked(
        &mut self,
        b: &tandem_core::ForwardBatch,
        specs: &[tandem_core::sampling::SampleSpec],
        masks: &mut dyn FnMut() -> tandem_core::Result<tandem_core::sampling::RowMasks>,
    ) -> tandem_core::Result<Vec<u32>> {
        self.count(b);
        self.inner.forward_sampled_masked(b, specs, masks)
    }
    fn forward_sampled_logprobs(
        &mut self,
        b: &tandem_core::ForwardBatch,
        specs: &[tandem_core::sampling::SampleSpec],
        masks: &mut dyn FnMut() -> tandem_core::Result<tandem_core::sampling::RowMasks>,
        top_n: &[Option<usize>],
    ) -> tandem_core::Result<(Vec<u32>, Vec<Option<tandem_core::sampling::TokenLogprobs>>)> {
        self.count(b);
        self.inner.forward_sampled_logprobs(b, specs, masks, top_n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(ids: Vec<u32>, logits: Vec<Vec<f32>>) -> Run {
        let mut r = Run { ids, top5: vec![], gap: vec![], logits: vec![], secs: 0.0 };
        for l in logits {
            let lp = log_softmax(&l);
            let best = top_k(&l, 5);
            r.gap.push(l[best[0] as usize] as f64 - l[best[1] as usize] as f64);
            r.top5.push(best.iter().map(|&id| (id, lp[id as usize])).collect());
            r.logits.push(l);
        }
        r
    }

    fn row(best: usize, second: usize, gap: f32) -> Vec<f32> {
        let mut l: Vec<f32> = (0..10).map(|i| i as f32 * 0.01).collect();
        l[best] = 5.0;
        l[second] = 5.0 - gap;
        l
    }

    #[test]
    fn top_k_is_largest_first_lowest_id_on_ties() {
        assert_eq!(top_k(&[1.0, 3.0, 3.0, 2.0, 0.5, 2.0], 4), vec![1, 2, 3, 5]);
        assert_eq!(top_k(&[1.0, 2.0], 5), vec![1, 0]);
    }

    #[test]
    fn equal_runs_pass_and_a_wrong_token_outside_top5_fails() {
        let r = run_of(vec![3, 4], vec![row(3, 4, 1.0), row(4, 3, 1.0)]);
        let same = run_of(vec![3, 4], vec![row(3, 4, 1.0), row(4, 3, 1.0)]);
        let o = judge(&same, &r, 1e-5, 1e-3);
        assert!(o.failure.is_none(), "{:?}", o.failure);
        assert_eq!((o.equal, o.diverged_at), (2, None));

        // Chose 9 at step 0 while the reference's top-5 (3, 4, 9, 8, 7) ... 9 is in it, but
        // the logits differ wildly: NMSE fails even where containment holds.
        let mut far = row(9, 3, 1.0);
        far[4] = -50.0;
        let o = judge(&run_of(vec![9, 4], vec![far, row(4, 3, 1.0)]), &r, 1e-5, 1e-3);
        assert_eq!(o.diverged_at, Some(0));
        assert!(o.failure.as_deref().unwrap_or("").contains("NMSE"), "{:?}", o.failure);
    }

    #[test]
    fn a_near_tie_divergence_passes_and_a_logprob_error_fails() {
        let r = run_of(vec![3, 4], vec![row(3, 4, 1e-4), row(4, 3, 1.0)]);
        // Swapped near-tie at step 0: each side's token is in the other's top-5.
        let o = judge(&run_of(vec![4, 1], vec![row(4, 3, 1e-4), row(1, 2, 1.0)]), &r, 1e-5, 1e-3);
        assert!(o.failure.is_none(), "{:?}", o.failure);
        assert_eq!((o.equal, o.diverged_at), (0, Some(0)));

        // Same argmax, but the second token's logit off by 0.05: NMSE is tiny at this scale
        // with a loose limit, the logprob check still catches it.
        let mut off = row(3, 4, 1.0);
        off[4] += 0.05;
        let o = judge(&run_of(vec![3, 4], vec![off, row(4, 3, 1.0)]), &r, 1.0, 1e-3);
        assert!(o.failure.as_deref().unwrap_or("").contains("logprob"), "{:?}", o.failure);
    }

    #[test]
    fn nan_logits_fail() {
        let r = run_of(vec![3], vec![row(3, 4, 1.0)]);
        let mut bad = row(3, 4, 1.0);
        bad[7] = f32::NAN;
        let o = judge(&run_of(vec![3], vec![bad]), &r, 1.0, 1.0);
        assert!(o.failure.as_deref().unwrap_or("").contains("NaN"), "{:?}", o.failure);
    }

    /// Wraps a runner and moves one logit whenever a forward holds more than one sequence: a
    /// backend whose results depend on the batch.
    struct BatchVariant(Box<dyn ModelRunner>);

    impl ModelRunner for BatchVariant {
        fn config(&self) -> &tandem_core::ModelConfig {
            self.0.config()
        }
        fn backend_name(&self) -> &'static str {
            "batch-variant"
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
            let mut logits = self.0.forward(b)?;
            if b.num_seqs() > 1 {
                let vocab = self.config().vocab_size;
                logits.chunks_mut(vocab).for_each(|row| row[7] += 100.0);
            }
            Ok(logits)
        }
    }

    fn tiny_args(dir: &Path) -> Args {
        Args {
            backend: BackendKind::Reference,
            model: dir.to_path_buf(),
            against: BackendKind::Reference,
            prompts: 3,
            steps: 6,
            seed: 4,
            chunk: 32,
            batch: 12,
            kv_blocks: None,
            nmse_limit: Some(1e-5),
            logprob_tol: Some(1e-3),
            numerics: "f32".into(),
            json: None,
            kv_cache_dtype: crate::serve::KvCacheDtype(None),
        }
    }

    #[test]
    fn batch_invariance_passes_on_the_reference_and_fails_on_a_batch_variant_runner() {
        let dir = std::env::temp_dir().join(format!("tandem-compare-test-{}", std::process::id()));
        tandem_model_files::write_random_model(&dir, tandem_model_files::Shape::Tiny, 1, tandem_core::DType::F32)
            .unwrap();
        let a = tiny_args(&dir);
        let prompts = make_prompts(&dir, a.prompts, a.seed).unwrap();
        let reqs = make_requests(&prompts, a.batch, 384, a.seed);
        let load = || {
            backends::load(
                BackendKind::Reference,
                &dir,
                LoadOptions {
                    max_batch_tokens: a.chunk,
                    max_seqs: a.batch,
                    num_kv_blocks: 8,
                    block_size: BLOCK,
                    ..Default::default()
                },
            )
            .unwrap()
        };
        let none = vec![None; prompts.len()];
        let (ok, j) = batch_invariance(load(), &reqs, &prompts, &none, &a);
        assert!(ok, "{j}");
        // What summarize.py's `batch_invariant` reads: the verdict, and proof that the check
        // preempted and mixed prefill chunks with decodes (a pool of 8 blocks for 12 requests: the
        // longest needs 5).
        assert_eq!(j["passed"], true, "{j}");
        assert!(j["preemptions"].as_u64().unwrap() > 0, "{j}");
        assert!(j["mixed_steps"].as_u64().unwrap() > 0, "{j}");
        let (ok, j) = batch_invariance(Box::new(BatchVariant(load())), &reqs, &prompts, &none, &a);
        assert!(!ok, "a runner that changes logits in a batch must fail: {j}");
        assert_eq!(j["passed"], false, "{j}");
        assert!(!j["differ"].as_array().unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The reference rounding where CUDA rounds (`--numerics bf16`) errs beyond the f32 limit
    /// (so a bf16 backend needs its own) and well inside the bf16 limits (so the margin holds).
    #[test]
    fn bf16_numerics_need_the_bf16_limits_and_stay_well_inside_them() {
        let dir = std::env::temp_dir().join(format!("tandem-compare-bf16-{}", std::process::id()));
        tandem_model_files::write_random_model(&dir, tandem_model_files::Shape::Tiny, 1, tandem_core::DType::BF16)
            .unwrap();
        let json = dir.join("compare.json");
        let a = Args {
            numerics: "bf16".into(),
            nmse_limit: None,
            logprob_tol: None,
            batch: 0,
            prompts: 8,
            steps: 16,
            seed: 1,
            chunk: 64,
            json: Some(json.clone()),
            ..tiny_args(&dir)
        };
        run(a).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(
            (doc["numerics"].as_str(), doc["nmse_limit"].as_f64(), doc["logprob_tol"].as_f64()),
            (Some("16-bit"), Some(BF16_NMSE_LIMIT), Some(BF16_LOGPROB_TOL))
        );
        let worst = |field: &str| {
            doc["prompts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    if field == "nmse" {
                        p[field].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).fold(0.0, f64::max)
                    } else {
                        p[field].as_f64().unwrap()
                    }
                })
                .fold(0.0, f64::max)
        };
        let (nmse, lp) = (worst("nmse"), worst("max_logprob_err"));
        assert!(nmse > 1e-5, "the roundings must show: NMSE {nmse:.2e} is within the f32 limit");
        assert!(
            nmse * 5.0 < BF16_NMSE_LIMIT && lp * 4.0 < BF16_LOGPROB_TOL,
            "NMSE {nmse:.2e}, |dlogprob| {lp:.2e} against limits {BF16_NMSE_LIMIT:.0e} and {BF16_LOGPROB_TOL}"
        );
        let e = run(Args { numerics: "bf16".into(), backend: BackendKind::Wgpu, json: None, ..tiny_args(&dir) })
            .expect_err("bf16 numerics wrap the reference only");
        assert!(e.to_string().contains("--backend reference"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn requests_repeat_then_perturb_the_prompts() {
        let prompts = vec![vec![1u32], vec![5, 6, 7]];
        let reqs = make_requests(&prompts, 7, 50, 3);
        assert_eq!(reqs[0], prompts[0]);
        assert_eq!(reqs[3], prompts[1]);
        // From 2k on: same prefix, a different last token, i % 5 tokens more.
        assert_eq!(reqs[5].len(), 3);
        assert_eq!(&reqs[5][..2], &[5, 6]);
        assert_ne!(reqs[5][2], 7);
        assert_eq!(reqs[6].len(), 1 + 1);
        assert_ne!(reqs[6][0], 1);
        assert!(reqs.iter().flatten().all(|&t| t < 50));
    }
}
