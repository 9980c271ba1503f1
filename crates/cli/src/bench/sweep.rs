//! `tandem bench sweep`: `max_num_seqs` over 16, 32, 64, 128, 256 with continuous batching and
//! every prompt submitted at once; throughput against per-token latency (TPOT), one point per
//! setting. A larger batch buys throughput with latency until the device is saturated.

use anyhow::{bail, Result};
use serde_json::json;

use super::latency::cell;
use super::measured::{measure, with_max_num_seqs};
use super::model_source;
use super::offline::{self, RunResult};
use super::plot::{self, Panel, Series};
use super::report::{self, markdown_table};
use super::run_args::RunArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// The `max_num_seqs` values, one run each.
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,128,256")]
    max_num_seqs_values: Vec<usize>,
}

pub fn run(a: Args) -> Result<()> {
    if a.max_num_seqs_values.is_empty() || a.max_num_seqs_values.contains(&0) {
        bail!("--max-num-seqs-values needs positive values");
    }
    let (model, prompts) = a.run.model_and_prompts()?;
    let mut runs: Vec<(usize, RunResult)> = vec![];
    let mut backend = serde_json::Value::Null;
    for &m in &a.max_num_seqs_values {
        let ea = with_max_num_seqs(&a.run.engine, m, "continuous");
        let r =
            measure(&model, &ea, &prompts, a.run.warmup, usize::MAX, &format!("max_num_seqs={m}"), a.run.timeout_s)?;
        backend = r.backend;
        runs.push((m, r.result));
    }

    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|(m, r)| {
            let f = r.figures();
            vec![
                m.to_string(),
                format!("{:.1}", f.output_tokens_per_s),
                format!("{:.2}", f.requests_per_s),
                cell(f.tpot, |s| s.median),
                cell(f.tpot, |s| s.p99),
                cell(f.ttft, |s| s.median),
                cell(f.e2e, |s| s.median),
                r.kv_usage_peak.map_or("-".into(), |k| format!("{:.1}%", k * 100.0)),
                r.preemptions.map_or("-".into(), |p| p.to_string()),
            ]
        })
        .collect();
    let results = json!({"runs": runs.iter().map(|(m, r)| json!({"max_num_seqs": m, "result": r.to_json()})).collect::<Vec<_>>()});
    let settings = json!({"engine": model_source::engine_json(&a.run.engine), "workload": a.run.workload.to_json(), "max_num_seqs_values": a.max_num_seqs_values, "warmup": a.run.warmup, "scheduler": "continuous"});
    let rep = report::build("sweep", backend, model.to_json(&a.run.random), settings, results);
    let stem = format!("sweep-{}-{}", a.run.engine.backend.name(), model.label);
    report::write_json(&a.run.out, &stem, &rep)?;

    let point = |pick: &dyn Fn(&offline::Figures) -> f64| Series {
        name: "continuous".into(),
        points: runs
            .iter()
            .map(|(_, r)| r.figures())
            .map(|f| (f.tpot.map_or(f64::NAN, |s| s.median), pick(&f)))
            .collect(),
        point_labels: runs.iter().map(|(m, _)| format!(" {m}")).collect(),
    };
    let panel = Panel {
        title: format!("{} on {}: max_num_seqs sweep", model.label, a.run.engine.backend.name()),
        x_label: "median time per output token (ms)".into(),
        y_label: "output tokens/s".into(),
        series: vec![point(&|f| f.output_tokens_per_s)],
    };
    if let Err(e) = plot::draw(&report::out_path(&a.run.out, &stem, "png")?, &[panel]) {
        eprintln!("no plot: {e:#}");
    }

    println!(
        "### max_num_seqs sweep: {} on {} ({})\n",
        model.label,
        a.run.engine.backend.name(),
        a.run.workload.describe()
    );
    let header = [
        "max_num_seqs",
        "output tok/s",
        "req/s",
        "TPOT p50 (ms)",
        "TPOT p99 (ms)",
        "TTFT p50 (ms)",
        "E2E p50 (ms)",
        "KV peak",
        "preemptions",
    ];
    println!("{}", markdown_table(&header, &rows));
    let errors: usize = runs.iter().map(|(_, r)| r.figures().errors).sum();
    if errors > 0 {
        bail!("{errors} requests failed across the runs (see first_error in the JSON)");
    }
    Ok(())
}
