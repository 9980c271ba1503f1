//! Runs the HF transformers baselines in `bench/` on the same model directory and returns the
//! JSON each prints as its last line: `hf_baseline.py` (`generate`, static batches, greedy,
//! outputs forced to their length, the same prompt ids) for `bench throughput`, and
//! `hf_decode.py` (prefill and greedy decode steps timed apart) for `bench decode`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::workload::Prompt;

/// `bench throughput`'s baseline: `script` over `prompts` (written to a temporary file) in
/// static batches of `batch`.
pub fn run(
    python: &str,
    script: &Path,
    model_dir: &Path,
    prompts: &[Prompt],
    batch: usize,
    extra: &[String],
) -> Result<Value> {
    check_script(script)?;
    let file = std::env::temp_dir().join(format!("tandem-bench-prompts-{}.json", std::process::id()));
    write_prompts(&file, prompts)?;
    eprintln!("running the HF baseline: {python} {} (batch {batch}) ...", script.display());
    let args = [
        "--model".to_string(),
        model_dir.display().to_string(),
        "--prompts-file".into(),
        file.display().to_string(),
        "--batch-size".into(),
        batch.to_string(),
    ];
    let out = run_script(python, script, &args, extra);
    let _ = std::fs::remove_file(&file);
    let v = out?;
    if !v["output_tokens_per_s"].as_f64().is_some_and(|x| x > 0.0) {
        bail!("{} reported no positive output_tokens_per_s: {v}", script.display());
    }
    Ok(v)
}

/// The prompts file `hf_baseline.py --prompts-file` reads: `{"prompts": [{"ids", "output_len"}]}`.
pub fn write_prompts(path: &Path, prompts: &[Prompt]) -> Result<()> {
    let body = json!({"prompts": prompts.iter().map(|p| json!({"ids": p.ids, "output_len": p.output_len})).collect::<Vec<_>>()});
    std::fs::write(path, body.to_string()).with_context(|| format!("writing {}", path.display()))
}

/// What `bench decode` measures, for the HF side.
pub struct DecodeSpec<'a> {
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub batch_sizes: &'a [usize],
    pub runs: usize,
    pub seed: u64,
    /// torch CPU threads; the same cores the tandem side ran on.
    pub threads: usize,
}

/// `bench decode`'s baseline: checks that it reported a positive prefill rate and a positive
/// decode rate for every batch size.
pub fn run_decode(python: &str, script: &Path, model_dir: &Path, spec: &DecodeSpec, extra: &[String]) -> Result<Value> {
    check_script(script)?;
    let sizes = spec.batch_sizes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
    eprintln!(
        "running the HF baseline: {python} {} (batch sizes {sizes}, {} threads) ...",
        script.display(),
        spec.threads
    );
    let args = [
        ("--model", model_dir.display().to_string()),
        ("--prompt-len", spec.prompt_len.to_string()),
        ("--max-tokens", spec.max_tokens.to_string()),
        ("--batch-sizes", sizes),
        ("--runs", spec.runs.to_string()),
        ("--seed", spec.seed.to_string()),
        ("--threads", spec.threads.to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect::<Vec<_>>();
    let v = run_script(python, script, &args, extra)?;
    let positive = |x: &Value| x.as_f64().is_some_and(|x| x > 0.0);
    if !positive(&v["prefill_tokens_per_s"]) {
        bail!("{} reported no positive prefill_tokens_per_s: {v}", script.display());
    }
    if let Some(b) = spec.batch_sizes.iter().find(|b| !positive(&v["decode_tokens_per_s"][b.to_string()])) {
        bail!("{} reported no positive decode_tokens_per_s for batch {b}: {v}", script.display());
    }
    Ok(v)
}

fn check_script(script: &Path) -> Result<()> {
    if !script.exists() {
        bail!(
            "{}: the baseline script is not there (run from the repository root, or give --hf-script)",
            script.display()
        );
    }
    Ok(())
}

/// Runs `python script args extra` (stderr passed through) and parses the last stdout line
/// that looks like a JSON object.
fn run_script(python: &str, script: &Path, args: &[String], extra: &[String]) -> Result<Value> {
    let out = Command::new(python)
        .arg(script)
        .args(args)
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {python}"))?;
    if !out.status.success() {
        bail!("{} exited with {}", script.display(), out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("{} printed no JSON line", script.display()))?;
    serde_json::from_str(last).with_context(|| format!("{} printed invalid JSON: {last}", script.display()))
}
