//! `tandem bench compare`: static against continuous batching on the same workload, at a few
//! concurrencies (50, 100, 200 by default). At concurrency C the client keeps C requests in
//! flight and the engine runs at most C sequences (`max_num_seqs = C`); static mode fills a
//! batch of C and runs it to its longest output, continuous mode refills as requests end.
//! The default workload is `mixed`: with equal lengths the two modes would do the same work.

use anyhow::{bail, Result};
use serde_json::json;

use super::latency::cell;
use super::measured::{measure, with_max_num_seqs};
use super::model_source;
use super::offline::{self, RunResult};
use super::plot::{self, Panel, Series};
use super::report::{self, markdown_table};
use super::run_args::RunArgs;
use super::workload::WorkloadKind;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// Requests kept in flight (and `max_num_seqs`), one run per value and mode.
    #[arg(long, value_delimiter = ',', default_value = "50,100,200")]
    concurrency: Vec<usize>,
}

pub fn run(mut a: Args) -> Result<()> {
    if a.concurrency.is_empty() || a.concurrency.contains(&0) {
        bail!("--concurrency needs positive values");
    }
    // `mixed` unless the user picked a workload explicitly.
    if !std::env::args().any(|x| x == "--workload" || x.starts_with("--workload=")) {
        a.run.workload.workload = WorkloadKind::Mixed;
    }
    let (model, prompts) = a.run.model_and_prompts()?;
    let mut runs: Vec<(usize, &str, RunResult)> = vec![];
    let mut backend = serde_json::Value::Null;
    for &c in &a.concurrency {
        for mode in ["static", "continuous"] {
            let ea = with_max_num_seqs(&a.run.engine, c, mode);
            let m = measure(&model, &ea, &prompts, a.run.warmup, c, &format!("{mode} C={c}"), a.run.timeout_s)?;
            backend = m.backend;
            runs.push((c, mode, m.result));
        }
    }

    let fig = |c: usize, mode: &str| {
        runs.iter().find(|(rc, m, _)| *rc == c && *m == mode).map(|(_, _, r)| r.figures()).expect("every run was made")
    };
    let mut rows = vec![];
    let mut table = vec![];
    for &c in &a.concurrency {
        let (s, k) = (fig(c, "static"), fig(c, "continuous"));
        let ratio = if s.output_tokens_per_s > 0.0 { k.output_tokens_per_s / s.output_tokens_per_s } else { f64::NAN };
        rows.push(vec![
            c.to_string(),
            format!("{:.1}", s.output_tokens_per_s),
            format!("{:.1}", k.output_tokens_per_s),
            format!("{ratio:.2}x"),
            cell(s.e2e, |x| x.median),
            cell(k.e2e, |x| x.median),
            cell(s.ttft, |x| x.median),
            cell(k.ttft, |x| x.median),
            cell(s.tpot, |x| x.median),
            cell(k.tpot, |x| x.median),
        ]);
        table.push(json!({"concurrency": c, "continuous_over_static": ratio}));
    }
    let results = json!({
        "runs": runs.iter().map(|(c, m, r)| json!({"concurrency": c, "scheduler": m, "result": r.to_json()})).collect::<Vec<_>>(),
        "ratios": table,
    });
    let settings = json!({"engine": model_source::engine_json(&a.run.engine), "workload": a.run.workload.to_json(), "concurrency": a.concurrency, "warmup": a.run.warmup, "max_num_seqs": "= concurrency"});
    let rep = report::build("compare", backend, model.to_json(&a.run.random), settings, results);
    let stem = format!("compare-{}-{}", a.run.engine.backend.name(), model.label);
    report::write_json(&a.run.out, &stem, &rep)?;

    let series = |mode: &str, pick: &dyn Fn(&offline::Figures) -> f64| Series {
        name: mode.into(),
        points: a.concurrency.iter().map(|&c| (c as f64, pick(&fig(c, mode)))).collect(),
        point_labels: vec![],
    };
    let tput = Panel {
        title: format!("{} on {}: throughput", model.label, a.run.engine.backend.name()),
        x_label: "concurrency (requests in flight = max_num_seqs)".into(),
        y_label: "output tokens/s".into(),
        series: vec![series("static", &|f| f.output_tokens_per_s), series("continuous", &|f| f.output_tokens_per_s)],
    };
    let lat = Panel {
        title: "median end-to-end latency".into(),
        x_label: "concurrency".into(),
        y_label: "ms".into(),
        series: vec![
            series("static", &|f| f.e2e.map_or(f64::NAN, |s| s.median)),
            series("continuous", &|f| f.e2e.map_or(f64::NAN, |s| s.median)),
        ],
    };
    if let Err(e) = plot::draw(&report::out_path(&a.run.out, &stem, "png")?, &[tput, lat]) {
        eprintln!("no plot: {e:#}");
    }

    println!(
        "### static vs continuous batching: {} on {} ({})\n",
        model.label,
        a.run.engine.backend.name(),
        a.run.workload.describe()
    );
    let header = [
        "C",
        "static tok/s",
        "continuous tok/s",
        "ratio",
        "static E2E p50 (ms)",
        "cont. E2E p50 (ms)",
        "static TTFT p50 (ms)",
        "cont. TTFT p50 (ms)",
        "static TPOT p50 (ms)",
        "cont. TPOT p50 (ms)",
    ];
    println!("{}", markdown_table(&header, &rows));
    let errors: usize = runs.iter().map(|(_, _, r)| r.figures().errors).sum();
    if errors > 0 {
        bail!("{errors} requests failed across the runs (see first_error in the JSON)");
    }
    Ok(())
}
