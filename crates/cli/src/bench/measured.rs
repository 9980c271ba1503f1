//! One measured run of the benches that compare engine settings (`compare`, `sweep`,
//! `speculative`): an engine started with the run's settings, warmed up, then the workload
//! through it, with the engine's counters over the run alone. Each of those benches starts a
//! fresh engine per setting, so this is where that set-up lives.

use std::time::Duration;

use anyhow::Result;
use serde_json::Value;
use tandem_engine::Stats;

use super::model_source::{self, ModelInfo};
use super::offline::{self, RunResult};
use super::workload::Prompt;
use crate::serve::EngineArgs;

/// A run, the backend it ran on (as the report records it), and the engine's counters just
/// before and just after it (warm-up left out).
pub struct Measured {
    pub result: RunResult,
    pub backend: Value,
    pub before: Stats,
    pub after: Stats,
}

/// Starts an engine with `ea` over `model`, warms it up with `warmup` requests (see
/// [`offline::warm_up`]), then runs `prompts` with `concurrency` in flight, giving up after
/// `timeout_s` seconds; the engine is shut down when this returns.
pub fn measure(
    model: &ModelInfo,
    ea: &EngineArgs,
    prompts: &[Prompt],
    warmup: usize,
    concurrency: usize,
    label: &str,
    timeout_s: u64,
) -> Result<Measured> {
    let started = model_source::start_engine(model, ea)?;
    let backend = started.backend_json(ea.backend);
    offline::warm_up(&started.handle, prompts, warmup)?;
    let before = started.handle.stats();
    let result = offline::run(&started.handle, prompts, concurrency, label, Duration::from_secs(timeout_s))?;
    let after = started.handle.stats();
    Ok(Measured { result, backend, before, after })
}

/// `ea` with at most `max_num_seqs` sequences a step under `scheduler`, and a token budget of
/// at least one token a sequence (512 unless `ea` names one).
pub fn with_max_num_seqs(ea: &EngineArgs, max_num_seqs: usize, scheduler: &str) -> EngineArgs {
    EngineArgs {
        max_num_seqs,
        max_num_batched_tokens: Some(ea.max_num_batched_tokens.unwrap_or(512).max(max_num_seqs)),
        scheduler: scheduler.into(),
        ..ea.clone()
    }
}
