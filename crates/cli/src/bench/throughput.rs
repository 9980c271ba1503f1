//! `tandem bench throughput`: the offline benchmark. Every prompt goes to the engine at once
//! (like vLLM's `benchmark_throughput`); reports requests/s, output and total tokens/s, the
//! KV pool's peak usage and preemptions. `--hf-baseline` runs HF transformers' `generate`
//! on the same model and prompts and prints the ratio (or `--write-prompts` leaves the prompts
//! for the baseline to run apart). `--guided-fraction` constrains that
//! share of the requests by a JSON schema and reports the mask's cost (p50, p99 per token).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde_json::json;

use super::model_source;
use super::report::{self, markdown_table};
use super::run_args::RunArgs;
use super::{hf_baseline, offline};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub run: RunArgs,
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
    /// Also write the prompts (ids and output lengths) here, in the format
    /// `bench/hf_baseline.py --prompts-file` reads, so a baseline can run as its own step
    /// on exactly these requests (gpu/check.sh does).
    #[arg(long)]
    pub write_prompts: Option<PathBuf>,
    /// Fraction of the requests (spread evenly) constrained by a JSON schema (an open-ended
    /// array of objects, so they still run to their output length): structured output's cost.
    #[arg(long, default_value_t = 0.0)]
    pub guided_fraction: f64,
}

/// The schema `--guided-fraction` constrains with: at least 256 objects (thousands of tokens)
/// before it can complete, so a constrained request writes as many tokens as an unconstrained
/// one and the two compare token for token.
fn bench_schema() -> serde_json::Value {
    json!({"type": "array", "minItems": 256, "items": {"type": "object", "properties": {"name": {"type": "string"}, "id": {"type": "integer"}, "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}}, "required": ["name", "id", "tags"], "additionalProperties": false}})
}

/// One constraint per prompt for the chosen fraction (request `i` is constrained when the
/// running count `floor((i + 1) * f)` steps up), all compiled from one spec.
fn guides(
    model_dir: &std::path::Path,
    eos: &[u32],
    n: usize,
    fraction: f64,
) -> Result<Vec<Option<tandem_engine::Guided>>> {
    if !(0.0..=1.0).contains(&fraction) {
        anyhow::bail!("--guided-fraction must be in [0, 1], got {fraction}");
    }
    if fraction == 0.0 {
        return Ok(vec![]);
    }
    let s = tandem_structured::Structured::from_model_dir(model_dir, eos)?;
    let spec = tandem_structured::GuideSpec::JsonSchema(bench_schema());
    (0..n)
        .map(|i| {
            let on = ((i + 1) as f64 * fraction).floor() > (i as f64 * fraction).floor();
            on.then(|| s.compile(&spec).map_err(|e| anyhow::anyhow!("{e}"))).transpose()
        })
        .collect()
}

/// p50 and p99 of the newest `count` mask times, in microseconds.
fn mask_percentiles(st: &tandem_engine::Stats, count: usize) -> Option<(f64, f64)> {
    let mut v: Vec<f64> = st.guided_mask_seconds.iter().rev().take(count).copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize] * 1e6;
    Some((at(0.5), at(0.99)))
}

pub fn run(a: Args) -> Result<()> {
    let (model, prompts) = a.run.model_and_prompts()?;
    if let Some(path) = &a.write_prompts {
        hf_baseline::write_prompts(path, &prompts)?;
        eprintln!("wrote {} prompts to {}", prompts.len(), path.display());
    }
    let started = model_source::start_engine(&model, &a.run.engine)?;
    eprintln!(
        "loaded {} on {} ({}) in {:.2} s",
        model.label,
        a.run.engine.backend.name(),
        started.device,
        started.load_s
    );
    offline::warm_up(&started.handle, &prompts, a.run.warmup)?;
    let guides = guides(&model.dir, &model.config.eos_token_ids, prompts.len(), a.guided_fraction)?;
    let before = started.handle.stats();
    let res = offline::run_guided(
        &started.handle,
        &prompts,
        &guides,
        usize::MAX,
        "throughput",
        Duration::from_secs(a.run.timeout_s),
    )?;
    let f = res.figures();
    let mut results = res.to_json();
    let after = started.handle.stats();
    let masks = (after.guided_masks_total - before.guided_masks_total) as usize;
    if a.guided_fraction > 0.0 {
        let constrained = guides.iter().filter(|g| g.is_some()).count();
        let pct = mask_percentiles(&after, masks);
        let secs = after.guided_mask_seconds_total - before.guided_mask_seconds_total;
        results["guided"] = json!({
            "fraction": a.guided_fraction,
            "requests": constrained,
            "schema": bench_schema(),
            "masks": masks,
            "mask_seconds_total": secs,
            "mask_us_p50": pct.map(|p| p.0),
            "mask_us_p99": pct.map(|p| p.1),
            "mask_share_of_wall": secs / res.wall_s,
        });
        match pct {
            Some((p50, p99)) => println!("guided: {constrained} of {} requests, {masks} masks, p50 {p50:.0} us, p99 {p99:.0} us, {:.1}% of the wall time on the mask thread", prompts.len(), 100.0 * secs / res.wall_s),
            None => println!("guided: {constrained} of {} requests, no mask computed", prompts.len()),
        }
    }

    let mut rows = vec![vec![
        format!("tandem ({})", a.run.engine.backend.name()),
        format!("{}/{}", f.completed, prompts.len()),
        format!("{:.2}", f.requests_per_s),
        format!("{:.1}", f.output_tokens_per_s),
        format!("{:.1}", f.total_tokens_per_s),
        res.kv_usage_peak.map_or("-".into(), |k| format!("{:.1}%", k * 100.0)),
        res.preemptions.map_or("-".into(), |p| p.to_string()),
    ]];
    if a.hf_baseline {
        let batch = a.hf_batch_size.unwrap_or(a.run.engine.max_num_seqs);
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

    let settings = json!({"engine": model_source::engine_json(&a.run.engine), "workload": a.run.workload.to_json(), "warmup": a.run.warmup, "guided_fraction": a.guided_fraction});
    let rep = report::build(
        "throughput",
        started.backend_json(a.run.engine.backend),
        model.to_json(&a.run.random),
        settings,
        results,
    );
    let stem = format!("throughput-{}-{}", a.run.engine.backend.name(), model.label);
    report::write_json(&a.run.out, &stem, &rep)?;
    println!("### throughput: {} on {} ({})\n", model.label, a.run.engine.backend.name(), a.run.workload.describe());
    println!(
        "{}",
        markdown_table(
            &["engine", "requests", "req/s", "output tok/s", "total tok/s", "KV peak", "preemptions"],
            &rows
        )
    );
    println!("{}", latency_table(&f));
    if f.errors > 0 {
        anyhow::bail!(
            "{} of {} requests failed; first: {}",
            f.errors,
            prompts.len(),
            res.records.iter().find_map(|r| r.error.clone()).unwrap_or_default()
        );
    }
    Ok(())
}

/// TTFT / TPOT / ITL / E2E rows with mean, median, p90, p99.
pub fn latency_table(f: &offline::Figures) -> String {
    use super::latency::cell;
    let rows: Vec<Vec<String>> = [("TTFT", f.ttft), ("TPOT", f.tpot), ("ITL", f.itl), ("E2E", f.e2e)]
        .into_iter()
        .map(|(name, s)| {
            vec![
                format!("{name} (ms)"),
                cell(s, |s| s.mean),
                cell(s, |s| s.median),
                cell(s, |s| s.p90),
                cell(s, |s| s.p99),
            ]
        })
        .collect();
    markdown_table(&["latency", "mean", "median", "p90", "p99"], &rows)
}
