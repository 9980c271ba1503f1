//! The arguments every in-process engine bench over a workload takes (`tandem bench
//! throughput`, `compare`, `sweep`, `lora`): the engine, the model (given or random), the workload, where the report
//! goes, the warm-up and the time limit of one run; and the model and prompts they resolve to.
//! One struct, so that the benches parse and describe them alike.

use anyhow::Result;

use super::model_source::{self, ModelInfo, RandomModelArgs};
use super::workload::{Prompt, WorkloadArgs};
use super::OutputArgs;
use crate::serve::EngineArgs;

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    #[command(flatten)]
    pub random: RandomModelArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub out: OutputArgs,
    /// Short warm-up requests before each timed run (shader compiles, first touches; under
    /// `bench lora`, every adapter gets one where there are more adapters).
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Give up on one run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub timeout_s: u64,
}

impl RunArgs {
    /// The model (`--model` or `--random-shape`) and the workload's prompts for it.
    pub fn model_and_prompts(&self) -> Result<(ModelInfo, Vec<Prompt>)> {
        let model = model_source::resolve(self.engine.model.as_deref(), &self.random)?;
        let prompts = self.workload.prompts(model.config.vocab_size, model.config.max_position_embeddings)?;
        Ok((model, prompts))
    }
}
