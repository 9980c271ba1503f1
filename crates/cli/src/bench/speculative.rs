//! `tandem bench speculative`: what speculative decoding buys, on a copy-heavy workload (the
//! model asked to repeat a piece of code with one change, where drafts from the prompt should
//! be accepted) and a free-text one (short answers to open questions, where they mostly
//! should not), each run without speculation and with each config given, in one engine load
//! per run. Greedy, so every run produces the same tokens; what differs is how many forwards
//! they take and how long.
//!
//! Reported per workload and config: output tokens per forward (a request's forwards that
//! gave it tokens: each gives one token and the drafts it accepted, so this is output tokens
//! over output tokens less accepted drafts; prefill chunks that sample nothing are not
//! counted), output tokens/s, drafts verified, draft tokens and how many were accepted, and
//! the speed-up in tokens/s over the run without speculation. The JSON also has the engine's
//! steps.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tandem_core::tokenizer::Tokenizer;
use tandem_engine::speculative::SpeculativeConfig;

use super::measured::measure;
use super::model_source::{self, RandomModelArgs};
use super::report::{self, markdown_table};
use super::workload::Prompt;
use super::OutputArgs;
use crate::serve::EngineArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    random: RandomModelArgs,
    #[command(flatten)]
    out: OutputArgs,
    /// A speculative config to compare with none (vLLM's JSON; repeat for several; the
    /// `--speculative-config` given, if any, comes first). Default: n-gram with 4 drafts,
    /// n-grams of 2 to 4 tokens; and suffix decoding with vLLM's defaults.
    #[arg(long = "compare-config", value_parser = SpeculativeConfig::from_json)]
    configs: Vec<SpeculativeConfig>,
    /// Output tokens per request (the copy is about this long; greedy, EOS ignored).
    #[arg(long, default_value_t = 160)]
    output_len: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
}

/// The code the copy-heavy prompts ask the model to repeat with one change.
const CODE: &str = r#"def parse_row(line, sep=","):
    fields = line.strip().split(sep)
    if len(fields) < 3:
        raise ValueError("expected 3 fields, got %d" % len(fields))
    name, age, city = fields[0], int(fields[1]), fields[2]
    return {"name": name, "age": age, "city": city}


def load_rows(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(parse_row(line))
    return rows
"#;

/// The copy-heavy requests: the code above, to be repeated with one change each.
const COPY_TASKS: [&str; 4] = [
    "Repeat this code exactly, but rename the function `parse_row` to `parse_line`.",
    "Repeat this code exactly, but change the default separator from \",\" to \";\".",
    "Repeat this code exactly, but rename the variable `rows` to `records`.",
    "Repeat this code exactly, but make `load_rows` skip lines that start with \"#\".",
];

/// The free-text requests.
const FREE_TASKS: [&str; 4] = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me three ideas for a weekend trip and say why each is fun.",
    "Describe your ideal breakfast and how to make it.",
];

/// The prompts of one workload, through the model's chat template.
fn prompts(tok: &Tokenizer, tasks: &[String], output_len: usize) -> Result<Vec<Prompt>> {
    let tmpl = tok.chat_template().context("the model has no chat template (the workloads are chat requests)")?;
    tasks
        .iter()
        .map(|t| {
            let text = tmpl.render(&[json!({"role": "user", "content": t})], true)?;
            Ok(Prompt { ids: tok.encode(&text, false)?, output_len })
        })
        .collect()
}

/// One run's figures.
struct Run {
    workload: &'static str,
    config: String,
    output_tokens: usize,
    /// Engine steps that ran something (prefill chunks included).
    steps: u64,
    wall_s: f64,
    drafts: u64,
    draft_tokens: u64,
    accepted: u64,
}

impl Run {
    fn tokens_per_forward(&self) -> f64 {
        let forwards = (self.output_tokens as u64).saturating_sub(self.accepted).max(1);
        self.output_tokens as f64 / forwards as f64
    }
    fn tokens_per_s(&self) -> f64 {
        self.output_tokens as f64 / self.wall_s
    }
    fn to_json(&self) -> Value {
        json!({"workload": self.workload, "speculative_config": self.config, "output_tokens": self.output_tokens,
            "engine_steps": self.steps, "wall_s": self.wall_s, "tokens_per_forward": self.tokens_per_forward(),
            "output_tokens_per_s": self.tokens_per_s(), "drafts": self.drafts, "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted})
    }
}

/// A config as the table names it.
fn describe(c: &Option<SpeculativeConfig>) -> String {
    match c {
        None => "off".into(),
        Some(c) => format!("{} k={}", c.method.as_str(), c.num_speculative_tokens),
    }
}

pub fn run(mut a: Args) -> Result<()> {
    if a.concurrency == 0 || a.output_len == 0 {
        bail!("--concurrency and --output-len must be positive");
    }
    if let Some(c) = a.engine.speculative_config.take() {
        a.configs.insert(0, c);
    }
    if a.configs.is_empty() {
        a.configs = vec![
            SpeculativeConfig { prompt_lookup_min: 2, prompt_lookup_max: 4, ..SpeculativeConfig::ngram(4) },
            SpeculativeConfig::from_json(r#"{"method": "suffix"}"#).map_err(anyhow::Error::msg)?,
        ];
    }
    let model = model_source::resolve(a.engine.model.as_deref(), &a.random)?;
    let tok = Tokenizer::from_dir(&model.dir)?;
    let copy: Vec<String> = COPY_TASKS.iter().map(|t| format!("{t}\n\n```python\n{CODE}```")).collect();
    let free: Vec<String> = FREE_TASKS.iter().map(|t| t.to_string()).collect();
    let workloads = [("copy", prompts(&tok, &copy, a.output_len)?), ("free text", prompts(&tok, &free, a.output_len)?)];
    let configs: Vec<Option<SpeculativeConfig>> =
        std::iter::once(None).chain(a.configs.iter().cloned().map(Some)).collect();

    let mut runs: Vec<Run> = vec![];
    let mut backend = Value::Null;
    for (workload, ps) in &workloads {
        for c in &configs {
            let ea = EngineArgs { speculative_config: c.clone(), ..a.engine.clone() };
            let label = format!("{workload}, {}", describe(c));
            // One warm-up request (a prompt reversed), so first touches stay out of the run.
            let m = measure(&model, &ea, ps, 1, a.concurrency, &label, a.timeout_s)?;
            backend = m.backend;
            let f = m.result.figures();
            if f.errors > 0 {
                let first = m.result.records.iter().find_map(|r| r.error.clone()).unwrap_or_default();
                bail!("{label}: {} requests failed: {first}", f.errors);
            }
            let d = |x: fn(&tandem_engine::Stats) -> u64| x(&m.after) - x(&m.before);
            runs.push(Run {
                workload,
                config: describe(c),
                output_tokens: f.output_tokens,
                steps: d(|s| s.sync_steps_total + s.async_steps_total),
                wall_s: m.result.wall_s,
                drafts: d(|s| s.spec_decode_num_drafts_total),
                draft_tokens: d(|s| s.spec_decode_num_draft_tokens_total),
                accepted: d(|s| s.spec_decode_num_accepted_tokens_total),
            });
        }
    }

    let mut rows = vec![];
    for r in &runs {
        let base = runs.iter().find(|b| b.workload == r.workload && b.config == "off").expect("the off run is first");
        rows.push(vec![
            r.workload.to_string(),
            r.config.clone(),
            format!("{:.2}", r.tokens_per_forward()),
            format!("{:.1}", r.tokens_per_s()),
            format!("{:.2}x", r.tokens_per_s() / base.tokens_per_s()),
            r.drafts.to_string(),
            r.draft_tokens.to_string(),
            r.accepted.to_string(),
        ]);
    }
    let settings = json!({"engine": model_source::engine_json(&a.engine), "output_len": a.output_len,
        "concurrency": a.concurrency, "requests_per_workload": COPY_TASKS.len(),
        "configs": configs.iter().map(describe).collect::<Vec<_>>()});
    let results = json!({"runs": runs.iter().map(Run::to_json).collect::<Vec<_>>()});
    let rep = report::build("speculative", backend, model.to_json(&a.random), settings, results);
    report::write_json(&a.out, &format!("speculative-{}-{}", a.engine.backend.name(), model.label), &rep)?;
    println!(
        "### speculative decoding: {} on {}, {} requests a workload, {} tokens each, concurrency {}\n",
        model.label,
        a.engine.backend.name(),
        COPY_TASKS.len(),
        a.output_len,
        a.concurrency
    );
    let header =
        ["workload", "speculation", "tokens/forward", "tokens/s", "vs off", "drafts", "draft tokens", "accepted"];
    println!("{}", markdown_table(&header, &rows));
    Ok(())
}
