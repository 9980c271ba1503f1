//! `tandem bench lora`: what serving LoRA adapters costs. One workload (the same prompts and
//! output lengths every run) on the base model alone (LoRA off), then with 1, 4 and 16 adapters
//! (as many slots as adapters, requests spread evenly: request `i` under adapter `i % n`), each
//! run on a fresh engine in one invocation, so the ratios to the base run compare like with
//! like. The adapters are seeded random ones over every projection, of rank 8 and 16 in turn
//! (`tandem_model_files::random_adapter`), written once beside the report.
//!
//! Reported per run: requests/s, output and total tokens/s, the median time per output token,
//! and output tokens/s over the base run's.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use tandem_core::lora::LoraLimits;
use tandem_core::tokenizer::Tokenizer;
use tandem_engine::Engine;

use super::model_source::{self, ModelInfo, Started};
use super::offline::{self, Figures};
use super::report::{self, markdown_table};
use super::run_args::RunArgs;
use super::workload::Prompt;
use crate::serve::EngineArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    run: RunArgs,
    /// The adapter counts to run, 0 being the base model alone (LoRA off).
    #[arg(long, value_delimiter = ',', default_value = "0,1,4,16")]
    adapters: Vec<usize>,
    /// The adapters' ranks, in turn (adapter `i` has rank `ranks[i % len]`).
    #[arg(long, value_delimiter = ',', default_value = "8,16")]
    ranks: Vec<usize>,
}

/// One run's figures.
struct Run {
    adapters: usize,
    figures: Figures,
    result: Value,
}

/// Adapter `i` over `model`, written under `root` the first time.
fn adapter_dir(root: &Path, model: &ModelInfo, i: usize, rank: usize) -> Result<PathBuf> {
    let dir = root.join(format!("{}-a{i}-r{rank}", model.label));
    if !dir.join("adapter_config.json").exists() {
        tandem_model_files::random_adapter::write_random_adapter(&dir, &model.config, rank, i as u64 + 1)?;
    }
    Ok(dir)
}

/// The model with `dirs` in its slots (adapter `i` in slot `i`) and an engine over it.
fn start_with_adapters(model: &ModelInfo, ea: &EngineArgs, dirs: &[PathBuf], max_rank: usize) -> Result<Started> {
    let t = Instant::now();
    let mut tok = Tokenizer::from_dir(&model.dir)?;
    tok.add_eos_ids(&model.config.eos_token_ids);
    let modules = tandem::LoraModules {
        limits: LoraLimits { max_loras: dirs.len(), max_rank },
        max_cpu_loras: None,
        modules: dirs
            .iter()
            .enumerate()
            .map(|(i, d)| tandem::LoraModule { name: format!("a{i}"), path: d.clone(), base_model_name: None })
            .collect(),
    };
    let loaded = tandem::load_model_with_lora(ea.backend.into(), &model.dir, ea.load_options(), Some(&modules))?;
    let device = match loaded.backend {
        tandem::Backend::Reference => {
            format!("CPU reference ({})", report::machine()["cpu"].as_str().unwrap_or("unknown"))
        }
        _ => loaded.device,
    };
    let (geo, kv_dtype) = (loaded.runner.kv_geometry(), loaded.runner.kv_dtype());
    let mut cfg = ea.engine_config(None)?;
    cfg.lora_modules = modules.dirs();
    let decode = tandem_server::engine_adapter::decode_fn(Arc::new(tok));
    let handle = Engine::spawn(loaded.runner, decode, cfg).map_err(|e| anyhow!("{e}"))?;
    Ok(Started {
        handle,
        device,
        load_s: t.elapsed().as_secs_f64(),
        kv_blocks: geo.num_blocks,
        block_size: geo.block_size,
        kv_dtype,
    })
}

/// Request `i` under adapter `i % n` (none where `n` is 0).
fn spread(requests: usize, n: usize) -> Vec<Option<u32>> {
    (0..requests).map(|i| (n > 0).then(|| (i % n) as u32)).collect()
}

pub fn run(a: Args) -> Result<()> {
    if a.ranks.is_empty() || a.ranks.contains(&0) {
        bail!("--ranks must name positive ranks");
    }
    let (model, prompts) = a.run.model_and_prompts()?;
    let most = a.adapters.iter().copied().max().unwrap_or(0);
    let root = a.run.out.output_dir.join("lora-adapters");
    let ranks: Vec<usize> = (0..most).map(|i| a.ranks[i % a.ranks.len()]).collect();
    let dirs: Vec<PathBuf> =
        ranks.iter().enumerate().map(|(i, &r)| adapter_dir(&root, &model, i, r)).collect::<Result<_>>()?;
    let max_rank = ranks.iter().copied().max().unwrap_or(1);

    let mut runs: Vec<Run> = vec![];
    let mut backend = Value::Null;
    for &n in &a.adapters {
        let started = match n {
            0 => model_source::start_engine(&model, &a.run.engine)?,
            n => start_with_adapters(&model, &a.run.engine, &dirs[..n], max_rank)?,
        };
        backend = started.backend_json(a.run.engine.backend);
        eprintln!("{n} adapters: loaded {} on {} in {:.2} s", model.label, started.device, started.load_s);
        // Warm-up: the first prompts reversed (no prefix hits left behind), 4 tokens each,
        // every adapter at least once.
        let warm: Vec<Prompt> = prompts
            .iter()
            .cycle()
            .take(a.run.warmup.max(n).min(a.run.warmup.max(1) * prompts.len()))
            .map(|p| Prompt { ids: p.ids.iter().rev().copied().collect(), output_len: p.output_len.min(4) })
            .collect();
        let timeout = Duration::from_secs(a.run.timeout_s);
        let w = offline::run_adapters(&started.handle, &warm, &spread(warm.len(), n), usize::MAX, "warm-up", timeout)?;
        if w.figures().errors > 0 {
            bail!(
                "{n} adapters: warm-up failed: {}",
                w.records.iter().find_map(|r| r.error.clone()).unwrap_or_default()
            );
        }
        let label = format!("{n} adapters");
        let res =
            offline::run_adapters(&started.handle, &prompts, &spread(prompts.len(), n), usize::MAX, &label, timeout)?;
        let figures = res.figures();
        if figures.errors > 0 {
            let first = res.records.iter().find_map(|r| r.error.clone()).unwrap_or_default();
            bail!("{label}: {} of {} requests failed: {first}", figures.errors, prompts.len());
        }
        runs.push(Run { adapters: n, figures, result: res.to_json() });
    }

    let base = runs.iter().find(|r| r.adapters == 0).map(|r| r.figures.output_tokens_per_s);
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            let f = &r.figures;
            let rk: Vec<String> = ranks[..r.adapters]
                .iter()
                .map(|r| r.to_string())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            vec![
                if r.adapters == 0 { "0 (base, LoRA off)".into() } else { r.adapters.to_string() },
                if rk.is_empty() { "-".into() } else { rk.join(", ") },
                format!("{:.2}", f.requests_per_s),
                format!("{:.1}", f.output_tokens_per_s),
                format!("{:.1}", f.total_tokens_per_s),
                f.tpot.map_or("-".into(), |s| format!("{:.1}", s.median)),
                base.map_or("-".into(), |b| format!("{:.2}x", f.output_tokens_per_s / b)),
            ]
        })
        .collect();
    let settings = json!({"engine": model_source::engine_json(&a.run.engine), "workload": a.run.workload.to_json(),
        "adapters": a.adapters, "ranks": a.ranks, "warmup": a.run.warmup,
        "adapter_targets": "q, k, v, o, gate, up, down (attention only over a mixture of experts)",
        "spread": "request i under adapter i % n"});
    let results = json!({"runs": runs.iter().map(|r| {
        let mut v = r.result.clone();
        v["adapters"] = json!(r.adapters);
        v["ranks"] = json!(&ranks[..r.adapters]);
        v["output_tokens_per_s_vs_base"] = json!(base.map(|b| r.figures.output_tokens_per_s / b));
        v
    }).collect::<Vec<_>>()});
    let rep = report::build("lora", backend, model.to_json(&a.run.random), settings, results);
    report::write_json(&a.run.out, &format!("lora-{}-{}", a.run.engine.backend.name(), model.label), &rep)?;
    println!("### LoRA adapters: {} on {} ({})\n", model.label, a.run.engine.backend.name(), a.run.workload.describe());
    let header = ["adapters", "ranks", "req/s", "output tok/s", "total tok/s", "TPOT median (ms)", "vs base"];
    println!("{}", markdown_table(&header, &rows));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn requests_spread_evenly_over_the_adapters() {
        assert_eq!(spread(3, 0), vec![None, None, None]);
        assert_eq!(spread(5, 2), vec![Some(0), Some(1), Some(0), Some(1), Some(0)]);
    }
}
