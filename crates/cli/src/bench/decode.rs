//! `tandem bench decode --backend B --model DIR`: the model runner alone (no engine, no
//! scheduler), greedy, random prompt ids. Measures
//!
//! - prefill tokens/s: one P-token prompt, one sequence, to its first token's logits;
//! - decode tokens/s at each `--batch-sizes` B: B sequences with their own P-token prompts,
//!   prefilled beforehand (untimed), then `max_tokens - 1` timed steps in which ONE forward
//!   carries one new token for each of the B sequences (B * steps / seconds).
//!
//! One warm-up first (every prompt prefilled, a few steps at each batch size), then the timed
//! runs. `--hf-baseline` runs `bench/hf_decode.py`, which measures the same three things the
//! same way with HF transformers, and puts its figures and the ratios beside ours.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::{json, Map, Value};
use tandem_core::backend::argmax_row;
use tandem_core::model::{LoadOptions, ModelRunner};
use tandem_core::sampling::SampleSpec;
use tandem_core::ForwardBatch;

use super::hf_baseline::{self, DecodeSpec};
use super::latency::percentile;
use super::model_source::{self, RandomModelArgs};
use super::report::{self, markdown_table};
use super::workload::SplitMix64;
use super::OutputArgs;
use crate::backends::BackendKind;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value_t = BackendKind::Wgpu)]
    backend: BackendKind,
    /// A Hugging Face model directory (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    random: RandomModelArgs,
    /// Prompt tokens per sequence (random ids).
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Tokens per sequence after the prompt; the first comes out of the prefill, so
    /// `max_tokens - 1` decode steps are timed.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Decode batch sizes, comma list: each timed step is one forward with one new token for
    /// each of B sequences.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch_sizes: Vec<usize>,
    /// Timed runs.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Prefill chunk: most tokens per forward.
    #[arg(long, default_value_t = 512)]
    max_num_batched_tokens: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run every step eagerly: no CUDA graphs (vLLM's `--enforce-eager`; other backends are
    /// always eager).
    #[arg(long)]
    enforce_eager: bool,
    /// What the KV cache stores: auto (bf16 on cuda, f32 elsewhere), bf16, f32 or fp8 (as `serve`).
    #[arg(long, default_value = "auto", value_parser = crate::serve::parse_kv_cache_dtype)]
    kv_cache_dtype: crate::serve::KvCacheDtype,
    /// Also run bench/hf_decode.py (HF transformers, the same measurements) on the same model
    /// and report our figures over its.
    #[arg(long)]
    hf_baseline: bool,
    /// The baseline script.
    #[arg(long, default_value = "bench/hf_decode.py")]
    hf_script: PathBuf,
    /// Python with torch and transformers.
    #[arg(long, env = "TANDEM_PYTHON", default_value = "python3")]
    python: String,
    /// torch CPU threads for the baseline (default: this machine's logical cores, the ones
    /// the tandem side ran on).
    #[arg(long)]
    hf_threads: Option<usize>,
    /// Extra arguments for the baseline script, e.g. `--hf-args=--device=cpu`.
    #[arg(long, allow_hyphen_values = true)]
    hf_args: Vec<String>,
    #[command(flatten)]
    out: OutputArgs,
}

/// One sequence: its prompt and its own contiguous KV blocks.
struct Seq {
    prompt: Vec<u32>,
    table: Vec<u32>,
}

/// One timed run: the prefill, and the decode steps at each batch size (in `batch_sizes` order).
struct Run {
    prefill_s: f64,
    decode_s: Vec<f64>,
}

/// Median and best (highest) of rates.
#[derive(Clone, Copy)]
struct Rate {
    median: f64,
    best: f64,
}

impl Rate {
    fn of(mut v: Vec<f64>) -> Rate {
        v.sort_by(|a, b| a.total_cmp(b));
        Rate { median: percentile(&v, 50.0), best: v[v.len() - 1] }
    }
    fn to_json(self) -> Value {
        json!({"median": self.median, "best": self.best})
    }
}

pub fn run(mut a: Args) -> Result<()> {
    a.batch_sizes.sort_unstable();
    a.batch_sizes.dedup();
    if a.prompt_len == 0 || a.max_tokens < 2 || a.runs == 0 || a.batch_sizes.is_empty() || a.batch_sizes[0] == 0 {
        bail!("need --prompt-len >= 1, --max-tokens >= 2, --runs >= 1 and positive --batch-sizes");
    }
    let model = model_source::resolve(a.model.as_deref(), &a.random)?;
    let total = a.prompt_len + a.max_tokens;
    if total > model.config.max_position_embeddings {
        bail!(
            "--prompt-len {} + --max-tokens {} exceeds the model's context of {}",
            a.prompt_len,
            a.max_tokens,
            model.config.max_position_embeddings
        );
    }
    let max_batch = *a.batch_sizes.last().expect("checked non-empty");
    let block_size = 16;
    let blocks_per_seq = total.div_ceil(block_size);
    let opts = LoadOptions {
        // A decode step carries one token per sequence, whatever the prefill chunk.
        max_batch_tokens: a.max_num_batched_tokens.max(max_batch),
        max_seqs: max_batch,
        num_kv_blocks: max_batch * blocks_per_seq,
        block_size,
        kv_dtype: a.kv_cache_dtype.0,
        graphs: !a.enforce_eager,
        ..Default::default()
    };
    let t = Instant::now();
    let (mut runner, device) = model_source::load_runner(a.backend, &model.dir, opts)?;
    let load_s = t.elapsed().as_secs_f64();
    let (kv, act) = (runner.kv_dtype(), runner.activation_dtypes().x);
    eprintln!(
        "loaded {} on {} ({device}) in {load_s:.2} s, {} KV cache, {} matmul inputs",
        model.label,
        a.backend.name(),
        kv.name(),
        act.name()
    );
    let seqs = sequences(a.seed, model.config.vocab_size, a.prompt_len, max_batch, blocks_per_seq);
    let steps = a.max_tokens - 1;

    // Warm-up, which also prefills every sequence once: decode steps rewrite only positions
    // >= prompt_len, and a token at position p attends to 0..=p, so every later run can start
    // its decode from these prompts' KV and first tokens.
    let t = Instant::now();
    let first = prefill(runner.as_mut(), &seqs)?;
    for &b in &a.batch_sizes {
        decode(runner.as_mut(), &seqs[..b], &first[..b], a.prompt_len, steps.min(3))?;
    }
    eprintln!(
        "warm-up: {max_batch} prompts prefilled, a few steps at each batch size, in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Kernels one decode step launches, where the backend counts them (the fused layers' aim).
    let mut launches = Map::new();
    for &b in &a.batch_sizes {
        let before = runner.launch_count();
        decode(runner.as_mut(), &seqs[..b], &first[..b], a.prompt_len, 1)?;
        if let (Some(x), Some(y)) = (before, runner.launch_count()) {
            launches.insert(b.to_string(), json!(y - x));
        }
    }
    if let Some(n) = launches.values().next().and_then(Value::as_u64) {
        eprintln!(
            "launches per decode step at batch {}: {n} ({:.1} per layer)",
            a.batch_sizes[0],
            n as f64 / model.config.num_hidden_layers.max(1) as f64
        );
    }

    // With the baseline, one HF run follows each of ours (a fresh process with the cores to
    // itself while it runs): this VM's speed drifts by 20-35% over minutes, and alternating
    // puts both sides under the same drift instead of ours in one stretch and HF's in the next.
    let mut hf_rounds: Vec<Value> = Vec::new();
    let mut hf_error: Option<String> = None;
    let mut runs = Vec::with_capacity(a.runs);
    for i in 0..a.runs {
        let t = Instant::now();
        prefill(runner.as_mut(), &seqs[..1])?;
        let prefill_s = t.elapsed().as_secs_f64();
        let decode_s = a
            .batch_sizes
            .iter()
            .map(|&b| Ok(decode(runner.as_mut(), &seqs[..b], &first[..b], a.prompt_len, steps)?.0))
            .collect::<Result<Vec<_>>>()?;
        let per_batch: Vec<String> = a
            .batch_sizes
            .iter()
            .zip(&decode_s)
            .map(|(b, s)| format!("batch {b} {:.1} tok/s", (b * steps) as f64 / s))
            .collect();
        eprintln!("run {}/{}: prefill {:.1} ms; decode {}", i + 1, a.runs, prefill_s * 1e3, per_batch.join(", "));
        runs.push(Run { prefill_s, decode_s });
        if a.hf_baseline && hf_error.is_none() {
            match hf_round(&a, &model.dir) {
                Ok(v) => hf_rounds.push(v),
                Err(e) => {
                    eprintln!("HF baseline failed: {e:#}");
                    hf_error = Some(format!("{e:#}"));
                }
            }
        }
    }
    drop(runner);

    let prefill_rate = Rate::of(runs.iter().map(|r| a.prompt_len as f64 / r.prefill_s).collect());
    let decode_rates: Vec<Rate> = a
        .batch_sizes
        .iter()
        .enumerate()
        .map(|(i, &b)| Rate::of(runs.iter().map(|r| (b * steps) as f64 / r.decode_s[i]).collect()))
        .collect();
    let mut results = json!({
        "prefill_tokens_per_s": prefill_rate.to_json(),
        // The smallest batch size (batch 1 by default), where earlier reports kept it.
        "decode_tokens_per_s": {"median": decode_rates[0].median, "best": decode_rates[0].best, "batch_size": a.batch_sizes[0]},
        "ms_per_decode_token_median": 1e3 / decode_rates[0].median,
        "decode_by_batch": by_batch(&a.batch_sizes, |i| decode_rates[i].to_json()),
        "decode_steps": steps,
        "runs": runs.iter().map(|r| json!({"prefill_ms": r.prefill_s * 1e3, "decode_s": by_batch(&a.batch_sizes, |i| json!(r.decode_s[i]))})).collect::<Vec<_>>(),
        "load_s": load_s,
    });
    if !launches.is_empty() {
        results["launches_per_decode_step"] = Value::Object(launches);
    }

    let hf = if a.hf_baseline { hf_figures(&a, hf_rounds, hf_error, &mut results) } else { None };
    let settings = json!({"prompt_len": a.prompt_len, "max_tokens": a.max_tokens, "batch_sizes": a.batch_sizes, "runs": a.runs, "max_num_batched_tokens": a.max_num_batched_tokens, "seed": a.seed, "hf_baseline": a.hf_baseline, "kv_cache_dtype": a.kv_cache_dtype.flag()});
    // What the cache stores, as the runner reports it: gpu/summarize.py counts KV bytes by it.
    let backend = json!({"name": a.backend.name(), "device": device, "kv_cache_dtype": kv.name(), "kv_elem_bytes": kv.size(), "activation_dtype": act.name()});
    let rep = report::build("decode", backend, model.to_json(&a.random), settings, results);
    report::write_json(&a.out, &format!("decode-{}-{}", a.backend.name(), model.label), &rep)?;

    println!("### decode: {} on {} ({device}), {} prompt + {} output tokens per sequence ({steps} timed decode steps), {} runs\n", model.label, a.backend.name(), a.prompt_len, a.max_tokens, a.runs);
    if let Some(hf) = &hf {
        println!(
            "HF: transformers {}, torch {}, {} on {}, {} threads\n",
            hf["transformers"].as_str().unwrap_or("?"),
            hf["torch"].as_str().unwrap_or("?"),
            hf["dtype"].as_str().unwrap_or("?"),
            hf["device"].as_str().unwrap_or("?"),
            hf["threads"]
        );
    }
    let mut rows =
        vec![row("prefill tok/s".into(), prefill_rate, hf.as_ref().and_then(|h| h["prefill_tokens_per_s"].as_f64()))];
    for (i, &b) in a.batch_sizes.iter().enumerate() {
        rows.push(row(
            format!("decode tok/s batch {b}"),
            decode_rates[i],
            hf.as_ref().and_then(|h| h["decode_tokens_per_s"][b.to_string()].as_f64()),
        ));
    }
    println!("{}", markdown_table(&["", "tandem median", "tandem best", "HF", "tandem/HF"], &rows));
    Ok(())
}

/// `max_batch` sequences with their own random prompts (the first is the prompt earlier
/// versions of this benchmark used) and disjoint block tables.
fn sequences(seed: u64, vocab: usize, prompt_len: usize, max_batch: usize, blocks_per_seq: usize) -> Vec<Seq> {
    let mut rng = SplitMix64(seed);
    (0..max_batch)
        .map(|i| {
            let prompt = (0..prompt_len).map(|_| (rng.next() % vocab as u64) as u32).collect();
            let first = (i * blocks_per_seq) as u32;
            Seq { prompt, table: (first..first + blocks_per_seq as u32).collect() }
        })
        .collect()
}

/// Runs every prompt of `seqs`, packing whole prompts (or chunks of one) into forwards of at
/// most `max_batch_tokens` tokens and `max_seqs` sequences; returns each sequence's greedy
/// first token.
fn prefill(runner: &mut dyn ModelRunner, seqs: &[Seq]) -> Result<Vec<u32>> {
    let (block_size, vocab) = (runner.kv_geometry().block_size, runner.config().vocab_size);
    let (chunk, max_seqs) = (runner.max_batch_tokens(), runner.max_seqs());
    let mut first = vec![0; seqs.len()];
    let (mut next, mut done) = (0, 0);
    while next < seqs.len() {
        let mut b = ForwardBatch { max_blocks: seqs[next].table.len(), ..Default::default() };
        let mut finished = vec![];
        while next < seqs.len() && b.num_tokens() < chunk && b.num_seqs() < max_seqs {
            let s = &seqs[next];
            let end = s.prompt.len().min(done + chunk - b.num_tokens());
            let last = end == s.prompt.len();
            b.push_seq(&s.prompt[done..end], done, &s.table, block_size, last);
            if last {
                finished.push(next);
                (next, done) = (next + 1, 0);
            } else {
                done = end;
            }
        }
        let logits = runner.forward(&b)?;
        for (row, &s) in finished.iter().enumerate() {
            first[s] = argmax_row(&logits[row * vocab..(row + 1) * vocab]);
        }
    }
    Ok(first)
}

/// `steps` greedy decode steps of every sequence in `seqs`, one forward per step carrying one
/// token per sequence, from `first` at position `start`; returns the seconds they took and
/// each sequence's last chosen token.
fn decode(
    runner: &mut dyn ModelRunner,
    seqs: &[Seq],
    first: &[u32],
    start: usize,
    steps: usize,
) -> Result<(f64, Vec<u32>)> {
    let block_size = runner.kv_geometry().block_size;
    let greedy = vec![SampleSpec::greedy(); seqs.len()];
    let mut next = first.to_vec();
    let t = Instant::now();
    for step in 0..steps {
        let mut b = ForwardBatch { max_blocks: seqs[0].table.len(), ..Default::default() };
        for (s, &id) in seqs.iter().zip(&next) {
            b.push_seq(&[id], start + step, &s.table, block_size, true);
        }
        // Greedy ids where the logits are, as the engine asks for them: only ids leave the device.
        next = runner.forward_sampled(&b, &greedy[..seqs.len()])?;
    }
    Ok((t.elapsed().as_secs_f64(), next))
}

/// `{"<batch size>": f(index)}` for each batch size.
fn by_batch(sizes: &[usize], f: impl Fn(usize) -> Value) -> Value {
    Value::Object(sizes.iter().enumerate().map(|(i, b)| (b.to_string(), f(i))).collect::<Map<_, _>>())
}

/// A table row: tandem median and best, HF, and tandem median over HF ("-" without HF).
fn row(name: String, ours: Rate, hf: Option<f64>) -> Vec<String> {
    let (hf_cell, ratio) = match hf {
        Some(h) if h > 0.0 => (format!("{h:.1}"), format!("{:.2}x", ours.median / h)),
        _ => ("-".into(), "-".into()),
    };
    vec![name, format!("{:.1}", ours.median), format!("{:.1}", ours.best), hf_cell, ratio]
}

/// One run of the HF baseline (its own warm-up, then one timed run).
fn hf_round(a: &Args, model_dir: &std::path::Path) -> Result<Value> {
    let threads = a.hf_threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let spec = DecodeSpec {
        prompt_len: a.prompt_len,
        max_tokens: a.max_tokens,
        batch_sizes: &a.batch_sizes,
        runs: 1,
        seed: a.seed,
        threads,
    };
    hf_baseline::run_decode(&a.python, &a.hf_script, model_dir, &spec, &a.hf_args)
}

/// Records the HF baseline's figures (medians over its rounds, one round after each of our
/// runs) and our ratios (median over median) in `results`; a failure is reported there, and
/// our figures still stand.
fn hf_figures(a: &Args, rounds: Vec<Value>, error: Option<String>, results: &mut Value) -> Option<Value> {
    if let Some(e) = error {
        results["hf_baseline"] = json!({"error": e, "rounds_done": rounds.len()});
        return None;
    }
    let first = rounds.first()?.clone();
    let median = |get: &dyn Fn(&Value) -> Option<f64>| -> Value {
        let mut v: Vec<f64> = rounds.iter().filter_map(get).collect();
        v.sort_by(|x, y| x.total_cmp(y));
        if v.is_empty() {
            Value::Null
        } else {
            json!(percentile(&v, 50.0))
        }
    };
    let mut hf = first;
    hf["prefill_tokens_per_s"] = median(&|r| r["prefill_tokens_per_s"].as_f64());
    hf["decode_tokens_per_s"] = by_batch(&a.batch_sizes, |i| {
        let b = a.batch_sizes[i].to_string();
        median(&|r| r["decode_tokens_per_s"][&b].as_f64())
    });
    hf["runs"] = json!(rounds.len());
    hf["interleaved"] = json!(true);
    hf["rounds"] = json!(rounds.iter().map(|r| json!({"prefill_tokens_per_s": r["prefill_tokens_per_s"], "decode_tokens_per_s": r["decode_tokens_per_s"]})).collect::<Vec<_>>());
    let ratio = |ours: &Value, theirs: &Value| json!(ours["median"].as_f64().zip(theirs.as_f64()).map(|(o, t)| o / t));
    results["ratio_vs_hf"] = json!({
        "prefill": ratio(&results["prefill_tokens_per_s"], &hf["prefill_tokens_per_s"]),
        "decode": by_batch(&a.batch_sizes, |i| {
            let b = a.batch_sizes[i].to_string();
            ratio(&results["decode_by_batch"][&b], &hf["decode_tokens_per_s"][&b])
        }),
    });
    results["hf_baseline"] = hf.clone();
    Some(hf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packed prefill (prompts split across forwards) and batched decode steps choose the
    /// tokens the one-sequence greedy driver chooses, for every sequence of the batch.
    #[test]
    fn batched_steps_choose_what_one_sequence_greedy_chooses() {
        let dir = std::env::temp_dir().join(format!("tandem-bench-decode-test-{}", std::process::id()));
        tandem_model_files::write_random_model(&dir, tandem_model_files::Shape::Tiny, 1, tandem_core::DType::F32)
            .unwrap();
        let (prompt_len, max_tokens, batch, block_size) = (11usize, 6, 3, 4);
        let per_seq = (prompt_len + max_tokens).div_ceil(block_size);
        let opts = LoadOptions {
            max_batch_tokens: 8,
            max_seqs: batch,
            num_kv_blocks: batch * per_seq,
            block_size,
            ..Default::default()
        };
        let (mut runner, _) = model_source::load_runner(BackendKind::Reference, &dir, opts).unwrap();
        let seqs = sequences(7, runner.config().vocab_size, prompt_len, batch, per_seq);
        let first = prefill(runner.as_mut(), &seqs).unwrap();
        let (_, last) = decode(runner.as_mut(), &seqs, &first, prompt_len, max_tokens - 1).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            let (mut one, _) = model_source::load_runner(BackendKind::Reference, &dir, opts).unwrap();
            let steps = tandem_core::greedy::generate(one.as_mut(), &s.prompt, max_tokens, &[], false, |_| {}).unwrap();
            assert_eq!(steps[0].id, first[i], "sequence {i}: first token");
            assert_eq!(steps[max_tokens - 1].id, last[i], "sequence {i}: last token");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
