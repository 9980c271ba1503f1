//! Tandem as a library: load a model on a backend, then generate offline in batches
//! ([`Llm`]) or stream one request at a time from async code ([`AsyncLlm`]).
//!
//! Underneath is the same continuous-batching engine `tandem serve` runs: the prompts of one
//! [`Llm::generate`] call, and concurrent streams, share its steps. Sampling takes the same
//! [`SamplingParams`] as the server, checked by the same [`SamplingParams::validate`]: a bad
//! value is an [`Error::InvalidParam`] naming the field, never a panic.
//!
//! ```
//! use tandem::{Backend, LlmBuilder, Message, SamplingParams};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("tandem-doctest-{}", std::process::id()));
//! # tandem_model_files::random_model::write_random_model(&dir, tandem_model_files::random_model::Shape::Tiny, 1, tandem_core::DType::F32)?;
//! // `dir` holds a Hugging Face model: config.json, safetensors, tokenizer (here a tiny random one).
//! let llm = LlmBuilder::new(&dir).backend(Backend::Reference).max_num_seqs(8).num_kv_blocks(64).build()?;
//! let params = SamplingParams { temperature: 0.8, seed: Some(7), max_tokens: Some(8), ..Default::default() };
//! let outputs = llm.generate(["The capital of France is", "1, 2, 3,"], &params)?;
//! assert_eq!(outputs.len(), 2);
//! for o in &outputs {
//!     println!("{:?} ({} tokens, {:?})", o.text(), o.usage.completion_tokens, o.completions[0].finish_reason);
//! }
//! let chats = llm.chat([vec![Message::user("Hello!")]], &SamplingParams::greedy(8))?;
//! assert!(!chats[0].completions[0].token_ids.is_empty());
//!
//! // A bad value is an error naming the field.
//! let err = llm.generate(["x"], &SamplingParams { top_p: 0.0, ..Default::default() }).unwrap_err();
//! assert_eq!(err.field(), Some("top_p"));
//! # drop(llm);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! Streaming, from tokio (any executor works):
//!
//! ```no_run
//! use futures_util::StreamExt;
//! # async fn demo() -> Result<(), tandem::Error> {
//! let llm = tandem::LlmBuilder::new("models/SmolLM2-135M-Instruct").build_async()?;
//! let mut stream = llm.generate("Once upon a time", &tandem::SamplingParams::greedy(64))?;
//! while let Some(delta) = stream.next().await {
//!     print!("{}", delta.text);
//! }
//! // Dropping a stream before its end aborts the request and frees its KV blocks.
//! # Ok(())
//! # }
//! ```
//!
//! - [`backend`]: [`Backend`] (`auto`, `reference`, `wgpu`, `cuda`) and [`load_model`], the one
//!   wiring from a model directory to a loaded model (the CLI and the server load through it).
//! - [`builder`]: [`LlmBuilder`], the engine's settings.
//! - [`lora_modules`]: [`LoraModules`], the LoRA adapters served with the model (vLLM's flags).
//! - [`llm`]: [`Llm`], [`AsyncLlm`], [`OutputStream`].
//! - [`output`]: [`Prompt`], [`Message`], [`Output`], [`Completion`].

pub mod backend;
pub mod builder;
pub mod error;
pub mod llm;
pub mod lora_modules;
pub mod output;

pub use backend::{is_gguf_dir, load_model, load_model_with_lora, model_dir, Backend, LoadedModel};
pub use builder::{KvMemory, LlmBuilder, Scheduler};
pub use error::{Error, Result};
pub use llm::{AsyncLlm, ChatOptions, Llm, OutputStream};
pub use lora_modules::{LoraModule, LoraModules};
pub use output::{Completion, Message, Output, Prompt};

pub use tandem_core::model::{LoadOptions, ModelRunner};
pub use tandem_core::KvDtype;
pub use tandem_engine::sampler::TokenLogprobs;
pub use tandem_engine::{
    FinishReason, Guided, InvalidParam, Policy, RequestOutput, SamplingParams, SpeculativeConfig, Stats, SubmitError,
    Usage,
};

/// The crates underneath, for what this API does not cover.
pub use tandem_core as core;
pub use tandem_engine as engine;
pub use tandem_structured::{GuideError, GuideSpec};
