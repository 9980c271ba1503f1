//! Continuous-batching engine: scheduler, block manager with prefix caching, sequences,
//! sampling. Pure CPU; knows no GPU API and no HTTP.
//!
//! - [`engine`]: the [`Engine`]; `step()` = schedule, forward, postprocess; the overlapped
//!   (async-scheduling) pipeline; the engine thread.
//! - [`config`]: [`EngineConfig`], and the [`EngineError`] a bad setting gives.
//! - [`request`]: what a caller submits ([`Request`]) and what its stream carries back
//!   ([`RequestOutput`], [`Usage`]).
//! - [`adapters`]: the LoRA adapters served: slots, never-reused ids, unloading.
//! - [`admission`]: the checks a request passes before it is queued ([`SubmitError`]).
//! - [`handle`]: [`EngineHandle`], the cloneable handle to an engine thread.
//! - [`request_stream`]: [`RequestStream`], one request's outputs; dropping it aborts.
//! - [`scheduler`]: waiting and running queues, one token budget per step, preemption.
//! - [`block_manager`]: ref-counted KV blocks and the prefix cache.
//! - [`sequence`]: one prompt and its output, with its block table and timings.
//! - [`sampler`], [`sampling_params`]: logits to tokens.
//! - [`speculative`]: speculative decoding: draft proposers, who gets drafts, acceptance.
//! - [`constraint`]: structured output as the engine sees it (a mask per constrained row);
//!   `masks` computes a step's masks on helper threads while the forward runs.
//! - [`detokenize`]: streamed text and stop strings.
//! - [`metrics`]: counters for the server and per-request timings.
//! - [`worker`]: the model worker thread that runs overlapped steps (async scheduling).
//! - [`fake_model`]: a deterministic `ModelRunner` for tests and benchmarks.
//!
//! Architecture invariant: the model is reached only through `tandem_core::ModelRunner`, and
//! only with a `ForwardBatch`; the scheduler's insides never leave this crate.

pub mod adapters;
pub mod admission;
pub mod block_manager;
pub mod config;
pub mod constraint;
pub mod detokenize;
pub mod engine;
pub mod fake_model;
pub mod handle;
mod masks;
pub mod metrics;
pub mod request;
pub mod request_stream;
pub mod sampler;
pub mod sampling_params;
pub mod scheduler;
pub mod sequence;
pub mod speculative;
pub mod worker;

pub use admission::SubmitError;
pub use config::{EngineConfig, EngineError};
pub use constraint::{Constraint, ConstraintFactory, Guided};
pub use detokenize::{tokenizer_decode_fn, DecodeFn};
pub use engine::Engine;
pub use handle::EngineHandle;
pub use metrics::{RequestMetrics, Stats};
pub use request::{Request, RequestOutput, Usage};
pub use request_stream::RequestStream;
pub use sampling_params::{InvalidParam, SamplingParams};
pub use scheduler::{BatchMode, Policy};
pub use sequence::{FinishReason, RequestId};
pub use speculative::{SpeculativeConfig, SpeculativeMethod};
