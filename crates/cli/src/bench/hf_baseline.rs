//! Runs `bench/hf_baseline.py` (HF transformers `generate`, static batches, greedy, outputs
//! forced to their length) on the same model directory and the same prompt ids, and returns
//! the JSON it prints as its last line.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::workload::Prompt;

pub fn run(python: &str, script: &Path, model_dir: &Path, prompts: &[Prompt], batch: usize, extra: &[String]) -> Result<Value> {
    if !script.exists() {
        bail!("{}: the baseline script is not there (run from the repository root, or give --hf-script)", script.display());
    }
    let file = std::env::temp_dir().join(format!("tandem-bench-prompts-{}.json", std::process::id()));
    let body = json!({"prompts": prompts.iter().map(|p| json!({"ids": p.ids, "output_len": p.output_len})).collect::<Vec<_>>()});
    std::fs::write(&file, body.to_string()).with_context(|| format!("writing {}", file.display()))?;
    eprintln!("running the HF baseline: {python} {} (batch {batch}) ...", script.display());
    let out = Command::new(python)
        .arg(script)
        .args(["--model", &model_dir.display().to_string(), "--prompts-file", &file.display().to_string(), "--batch-size", &batch.to_string()])
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {python}"));
    let _ = std::fs::remove_file(&file);
    let out = out?;
    if !out.status.success() {
        bail!("{} exited with {}", script.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().rev().find(|l| l.trim_start().starts_with('{')).with_context(|| format!("{} printed no JSON line", script.display()))?;
    let v: Value = serde_json::from_str(last).with_context(|| format!("{} printed invalid JSON: {last}", script.display()))?;
    if !v["output_tokens_per_s"].as_f64().is_some_and(|x| x > 0.0) {
        bail!("{} reported no positive output_tokens_per_s: {last}", script.display());
    }
    Ok(v)
}
