//! Continuous-batching engine: scheduler, block manager with prefix caching, sequences,
//! sampling. Pure CPU; knows no GPU API and no HTTP.
//!
//! - [`engine`]: `step()` = schedule, forward, postprocess; the engine thread and its handle.
//! - [`scheduler`]: waiting and running queues, one token budget per step, preemption.
//! - [`block_manager`]: ref-counted KV blocks and the prefix cache.
//! - [`sequence`]: one prompt and its output, with its block table and timings.
//! - [`sampler`], [`sampling_params`]: logits to tokens.
//! - [`constraint`]: structured output as the engine sees it (a mask per constrained row).
//! - [`detokenize`]: streamed text and stop strings.
//! - [`metrics`]: counters for the server and per-request timings.
//! - [`worker`]: the model worker thread that runs overlapped steps (async scheduling).
//! - [`fake_model`]: a deterministic `ModelRunner` for tests and benchmarks.
//!
//! Architecture invariant: the model is reached only through `tandem_core::ModelRunner`, and
//! only with a `ForwardBatch`; the scheduler's insides never leave this crate.

pub mod block_manager;
pub mod constraint;
pub mod detokenize;
pub mod engine;
pub mod fake_model;
pub mod metrics;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod worker;

pub use constraint::{Constraint, ConstraintFactory, Guided};
pub use detokenize::{tokenizer_decode_fn, DecodeFn};
pub use engine::{
    Engine, EngineConfig, EngineError, EngineHandle, Request, RequestOutput, RequestStream, SubmitError, Usage,
};
pub use metrics::{RequestMetrics, Stats};
pub use sampling_params::{InvalidParam, SamplingParams};
pub use scheduler::{BatchMode, Policy};
pub use sequence::{FinishReason, RequestId};
