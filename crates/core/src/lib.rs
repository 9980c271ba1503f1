//! tandem-core: what every other crate shares.
//!
//! - [`config`]: a Hugging Face `config.json`, parsed and validated.
//! - [`weights`]: safetensors files mapped with memmap2; tensors are views, never copies.
//! - [`quant_layout`]: the quantized weight layouts, and which backend runs each ([`quant_block`] decodes them).
//! - [`backend`]: the narrow interface every compute backend implements (one method per op).
//! - [`batch`]: the flattened batch the engine hands to a model (tokens, positions, slots, block tables).
//! - [`meta`]: a step's metadata (tokens, positions, slots, block tables...) in one staging layout.
//! - [`lora`]: LoRA adapters (PEFT's format) and the per-row update a forward adds with them.
//! - [`model`]: the Llama-family forward pass, written once against [`backend::Backend`].
//! - [`sampling`]: logits to token ids (Philox draws, f32 arithmetic a device kernel repeats bit for bit).
//! - [`memory`]: the KV pool's share of device memory (`--gpu-memory-utilization` of the total).
//! - [`tokenizer`], [`chat`], [`detokenizer`]: text in and out.
//!
//! Architecture invariant: this crate knows no GPU API, no HTTP and no scheduler.

pub mod backend;
pub mod batch;
pub mod chat;
pub mod config;
pub mod detokenizer;
pub mod device_head;
pub mod eagle3;
pub mod error;
pub mod fp8;
pub mod fp8_round;
pub mod greedy;
pub mod head_layer;
pub mod int4;
pub mod kv_dtype;
pub mod kv_scales;
pub mod lora;
pub mod memory;
pub mod meta;
pub mod model;
pub mod mtp;
pub mod quant_block;
pub mod quant_layout;
pub mod sampling;
pub mod skip;
pub mod tokenizer;
pub mod u32_group;
pub mod weights;

pub use backend::{Backend, DType, KvDtype, WorkspaceLimits};
pub use batch::ForwardBatch;
pub use config::{GenerationConfig, ModelConfig};
pub use error::{Error, Result};
pub use model::{Model, ModelRunner};
