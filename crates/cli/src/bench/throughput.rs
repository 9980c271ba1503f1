//! `tandem bench throughput`: the offline benchmark. Every prompt goes to the engine at once
//! (like vLLM's `benchmark_throughput`); reports requests/s, output and total tokens/s, the
//! KV pool's peak usage and preemptions. `--hf-baseline` runs HF transformers' `generate`
//! on the same model and prompts and prints the ratio.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use super::model_source::{self, RandomModelArgs};
use super::report::{self, markdown_table};
use super::workload::WorkloadArgs;
use super::{hf_baseline, offline, OutputArgs};
use crate::serve::EngineArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub random: RandomModelArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Short warm-up requests before the timed run (shader compiles, first touches).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_s: u64,
    /// Also run bench/hf_baseline.py (HF transformers `generate`, static batches) on the same
    /// model and prompts, and report our throughput over its.
    #[arg(long)]
    pub hf_baseline: bool,
    /// The baseline script.
    #[arg(long, default_value = "bench/hf_baseline.py")]
    pub hf_script: PathBuf,
    /// Python with torch and transformers.
    #[arg(long, env = "TANDEM_PYTHON", default_value = "python3")]
    pub python: String,
    /// The baseline's static batch size (default: --max-num-seqs).
    #[arg(long)]
    pub hf_batch_size: Option<usize>,
    /// Extra arguments for the baseline script, e.g. `--hf-args=--device=cpu`.
    #[arg(long, allow_hyphen_values = true)]
    pub hf_args: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let model = model_source::resolve(a.engine.model.as_deref(), &a.random)?;
    let prompts = a.workload.prompts(model.config.vocab_size, model.config.max_position_embeddings)?;
    let started = model_source::start_engine(&model, &a.engine)?;
    eprintln!("loaded {} on {} ({}) in {:.2} s", model.label, a.engine.backend.name(), started.device, started.load_s);
    offline::warm_up(&started.handle, &prompts, a.warmup)?;
    let res = offline::run(&started.handle, &prompts, usize::MAX, "throughput", Duration::from_secs(a.timeout_s))?;
    let f = res.figures();
    let mut results = res.to_json();

    let mut rows = vec![vec![
        format!("tandem ({})", a.engine.backend.name()),
        format!("{}/{}", f.completed, prompts.len()),
        format!("{:.2}", f.requests_per_s),
        format!("{:.1}", f.output_tokens_per_s),
        format!("{:.1}", f.total_tokens_per_s),
        res.kv_usage_peak.map_or("-".into(), |k| format!("{:.1}%", k * 100.0)),
        res.preemptions.map_or("-".into(), |p| p.to_string()),
    ]];
    if a.hf_baseline {
        let batch = a.hf_batch_size.unwrap_or(a.engine.max_num_seqs);
        match hf_baseline::run(&a.python, &a.hf_script, &model.dir, &prompts, batch, &a.hf_args) {
            Ok(hf) => {
                let hf_tps = hf["output_tokens_per_s"].as_f64().unwrap_or(0.0);
                let ratio = if hf_tps > 0.0 { f.output_tokens_per_s / hf_tps } else { f64::NAN };
                rows.push(vec![
                    format!("HF transformers ({}, batch {batch})", hf["device"].as_str().unwrap_or("?")),
                    format!("{}", hf["num_prompts"]),
                    format!("{:.2}", hf["requests_per_s"].as_f64().unwrap_or(0.0)),
                    format!("{hf_tps:.1}"),
                    format!("{:.1}", hf["total_tokens_per_s"].as_f64().unwrap_or(0.0)),
                    "-".into(),
                    "-".into(),
                ]);
                println!("tandem / HF output tokens/s: {ratio:.2}x");
                results["hf_baseline"] = hf;
                results["ratio_vs_hf"] = json!(ratio);
            }
            Err(e) => {
                eprintln!("HF baseline failed: {e:#}");
                results["hf_baseline"] = json!({"error": format!("{e:#}")});
            }
        }
    }

    let settings = json!({"engine": model_source::engine_json(&a.engine), "workload": a.workload.to_json(), "warmup": a.warmup});
    let rep = report::build("throughput", started.backend_json(a.engine.backend), model.to_json(&a.random), settings, results);
    let stem = format!("throughput-{}-{}", a.engine.backend.name(), model.label);
    report::write_json(&a.out, &stem, &rep)?;
    println!("### throughput: {} on {} ({})\n", model.label, a.engine.backend.name(), a.workload.describe());
    println!("{}", markdown_table(&["engine", "requests", "req/s", "output tok/s", "total tok/s", "KV peak", "preemptions"], &rows));
    println!("{}", latency_table(&f));
    if f.errors > 0 {
        anyhow::bail!("{} of {} requests failed; first: {}", f.errors, prompts.len(), res.records.iter().find_map(|r| r.error.clone()).unwrap_or_default());
    }
    Ok(())
}

/// TTFT / TPOT / ITL / E2E rows with mean, median, p90, p99.
pub fn latency_table(f: &offline::Figures) -> String {
    use super::latency::cell;
    let rows: Vec<Vec<String>> = [("TTFT", f.ttft), ("TPOT", f.tpot), ("ITL", f.itl), ("E2E", f.e2e)]
        .into_iter()
        .map(|(name, s)| vec![format!("{name} (ms)"), cell(s, |s| s.mean), cell(s, |s| s.median), cell(s, |s| s.p90), cell(s, |s| s.p99)])
        .collect();
    markdown_table(&["latency", "mean", "median", "p90", "p99"], &rows)
}
