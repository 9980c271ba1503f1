//! `tandem bench load --model DIR`: time to open a model without computing anything: parse
//! config.json, load tokenizer.json, parse the safetensors headers and map the files. Run
//! warm (the page cache already holds the files after the first run); min and median in ms.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use serde_json::json;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::weights::Weights;
use tandem_core::ModelConfig;

use super::latency::percentile;
use super::model_source::{self, RandomModelArgs};
use super::report::{self, markdown_table};
use super::OutputArgs;

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (default: the default model).
    #[arg(long)]
    model: Option<PathBuf>,
    #[command(flatten)]
    random: RandomModelArgs,
    /// Timed runs (after one untimed run that warms the page cache).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// The target for the median, in ms (issue 2: under 50 ms for SmolLM2-135M).
    #[arg(long, default_value_t = 50.0)]
    target_ms: f64,
    #[command(flatten)]
    out: OutputArgs,
}

/// Milliseconds of each part of one open.
struct Parts {
    config: f64,
    tokenizer: f64,
    weights: f64,
    total: f64,
    tensors: usize,
}

/// A part's name and how to read its time from a run.
type Part = (&'static str, fn(&Parts) -> f64);

fn open_once(dir: &std::path::Path) -> Result<Parts> {
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    let cfg = ModelConfig::from_file(&dir.join("config.json"))?;
    let config = ms(t0);
    let t1 = Instant::now();
    let tok = Tokenizer::from_dir(dir)?;
    let tokenizer = ms(t1);
    let t2 = Instant::now();
    let w = Weights::open(dir)?;
    let weights = ms(t2);
    let total = ms(t0);
    // Keep every result alive until the clock stops, so no drop is timed and nothing is elided.
    let tensors = w.names().count();
    drop((cfg, tok, w));
    Ok(Parts { config, tokenizer, weights, total, tensors })
}

pub fn run(a: Args) -> Result<()> {
    if a.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let model = model_source::resolve(a.model.as_deref(), &a.random)?;
    open_once(&model.dir)?;
    let mut runs = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        runs.push(open_once(&model.dir)?);
    }
    let stat = |f: fn(&Parts) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        (v[0], percentile(&v, 50.0))
    };
    let parts: [Part; 4] = [
        ("config.json", |p| p.config),
        ("tokenizer.json", |p| p.tokenizer),
        ("safetensors headers + mmap", |p| p.weights),
        ("total", |p| p.total),
    ];
    let mut rows = vec![];
    let mut results = serde_json::Map::new();
    for (name, f) in parts {
        let (min, med) = stat(f);
        rows.push(vec![name.to_string(), format!("{min:.2}"), format!("{med:.2}")]);
        results.insert(name.to_string(), json!({"min_ms": min, "median_ms": med}));
    }
    let (min, med) = stat(|p| p.total);
    results.insert("runs_total_ms".into(), json!(runs.iter().map(|p| p.total).collect::<Vec<_>>()));
    results.insert("tensors".into(), json!(runs[0].tensors));
    results.insert("target_ms".into(), json!(a.target_ms));
    results.insert("meets_target".into(), json!(med < a.target_ms));
    let bytes: u64 = std::fs::read_dir(&model.dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "safetensors"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    results.insert("safetensors_bytes".into(), json!(bytes));

    let settings = json!({"runs": a.runs, "warm": true});
    let rep = report::build(
        "load",
        json!({"name": "none", "device": "none (no compute)"}),
        model.to_json(&a.random),
        settings,
        results.into(),
    );
    report::write_json(&a.out, &format!("load-{}", model.label), &rep)?;
    println!(
        "### load: {} ({:.1} MB of safetensors, {} tensors), warm, {} runs\n",
        model.label,
        bytes as f64 / 1e6,
        runs[0].tensors,
        a.runs
    );
    println!("{}", markdown_table(&["part", "min (ms)", "median (ms)"], &rows));
    println!(
        "total: min {min:.2} ms, median {med:.2} ms (target < {} ms: {})",
        a.target_ms,
        if med < a.target_ms { "met" } else { "NOT met" }
    );
    Ok(())
}
