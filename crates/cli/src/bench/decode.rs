//! `tandem bench decode --backend B --model DIR`: one sequence, greedy, through
//! `tandem_core::greedy` (no engine, no scheduler): prefill tokens/s over the prompt and decode
//! tokens/s over the tokens after the first. One warm-up run first, then the timed runs.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use tandem_core::model::LoadOptions;

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
    /// Prompt tokens (random ids).
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Tokens decoded after the prompt.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Timed runs.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Prefill chunk: most tokens per forward.
    #[arg(long, default_value_t = 512)]
    max_num_batched_tokens: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    out: OutputArgs,
}

struct Run {
    prefill_s: f64,
    decode_s: f64,
    tokens: usize,
}

pub fn run(a: Args) -> Result<()> {
    if a.prompt_len == 0 || a.max_tokens < 2 || a.runs == 0 {
        bail!("need --prompt-len >= 1, --max-tokens >= 2 and --runs >= 1");
    }
    let model = model_source::resolve(a.model.as_deref(), &a.random)?;
    let total = a.prompt_len + a.max_tokens;
    if total > model.config.max_position_embeddings {
        bail!("--prompt-len {} + --max-tokens {} exceeds the model's context of {}", a.prompt_len, a.max_tokens, model.config.max_position_embeddings);
    }
    let block_size = 16;
    let opts = LoadOptions { max_batch_tokens: a.max_num_batched_tokens, max_seqs: 1, num_kv_blocks: total.div_ceil(block_size), block_size, ..Default::default() };
    let t = Instant::now();
    let (mut runner, device) = model_source::load_runner(a.backend, &model.dir, opts)?;
    let load_s = t.elapsed().as_secs_f64();
    eprintln!("loaded {} on {} ({device}) in {load_s:.2} s", model.label, a.backend.name());
    let mut rng = SplitMix64(a.seed);
    let vocab = model.config.vocab_size as u64;
    let prompt: Vec<u32> = (0..a.prompt_len).map(|_| (rng.next() % vocab) as u32).collect();

    let mut once = |max_tokens: usize| -> Result<Run> {
        let t0 = Instant::now();
        let mut first = None;
        let steps = tandem_core::greedy::generate(runner.as_mut(), &prompt, max_tokens, &[], false, |_| {
            first.get_or_insert_with(Instant::now);
        })?;
        let end = Instant::now();
        let first = first.unwrap_or(end);
        Ok(Run { prefill_s: (first - t0).as_secs_f64(), decode_s: (end - first).as_secs_f64(), tokens: steps.len() })
    };
    once(a.max_tokens.min(4))?;
    let mut runs = Vec::with_capacity(a.runs);
    for i in 0..a.runs {
        let r = once(a.max_tokens)?;
        eprintln!("run {}/{}: prefill {:.1} ms, {} tokens in {:.2} s", i + 1, a.runs, r.prefill_s * 1e3, r.tokens, r.decode_s + r.prefill_s);
        runs.push(r);
    }
    let med = |f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        (percentile(&v, 50.0), v[v.len() - 1])
    };
    // The first token comes out of the prefill forward; decode rate counts the ones after it.
    let (prefill_med, prefill_best) = med(&|r| a.prompt_len as f64 / r.prefill_s);
    let (decode_med, decode_best) = med(&|r| (r.tokens - 1) as f64 / r.decode_s);
    let results = json!({
        "prefill_tokens_per_s": {"median": prefill_med, "best": prefill_best},
        "decode_tokens_per_s": {"median": decode_med, "best": decode_best},
        "ms_per_decode_token_median": 1e3 / decode_med,
        "runs": runs.iter().map(|r| json!({"prefill_ms": r.prefill_s * 1e3, "decode_s": r.decode_s, "tokens": r.tokens})).collect::<Vec<_>>(),
        "load_s": load_s,
    });
    let settings = json!({"prompt_len": a.prompt_len, "max_tokens": a.max_tokens, "runs": a.runs, "max_num_batched_tokens": a.max_num_batched_tokens, "seed": a.seed});
    let rep = report::build("decode", json!({"name": a.backend.name(), "device": device}), model.to_json(&a.random), settings, results);
    report::write_json(&a.out, &format!("decode-{}-{}", a.backend.name(), model.label), &rep)?;
    println!("### decode: {} on {} ({device}), 1 sequence, {} prompt + {} output tokens, {} runs\n", model.label, a.backend.name(), a.prompt_len, a.max_tokens, a.runs);
    let rows = vec![
        vec!["prefill tok/s".into(), format!("{prefill_med:.1}"), format!("{prefill_best:.1}")],
        vec!["decode tok/s".into(), format!("{decode_med:.1}"), format!("{decode_best:.1}")],
        vec!["ms / decode token".into(), format!("{:.2}", 1e3 / decode_med), format!("{:.2}", 1e3 / decode_best)],
    ];
    println!("{}", markdown_table(&["", "median", "best"], &rows));
    Ok(())
}
