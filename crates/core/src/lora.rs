//! LoRA adapters over one base model, as PEFT saves them and vLLM serves them: many adapters
//! loaded at once, each row of a forward using one of them or none.
//!
//! - [`config`]: `adapter_config.json` (rank, alpha, rsLoRA, target modules), with what this
//!   engine does not run refused by name.
//! - [`adapter`]: `adapter_model.safetensors` read through the memory-mapped weights loader, each
//!   target module mapped onto the model's projections (q, k, v, o, gate, up, down; a fused
//!   `qkv_proj` or `gate_up_proj` split by rows of B), shapes checked against the base model.
//! - [`segmented`]: the update as one op per projection, each row reading its own slot of the
//!   stacked factors (the backends' `lora` op and its host loop).
//! - [`slots`]: the adapter slots on the device and the per-row update a forward adds to each
//!   projection, `y += scale · (x Aᵀ) Bᵀ` for the rows of that adapter.
//!
//! An adapter changes a projection's output by a low-rank product: for a base weight `W`
//! `[out, in]`, PEFT's `lora_A` is `[r, in]` and `lora_B` `[out, r]`, and the layer computes
//! `x Wᵀ + scale · (x Aᵀ) Bᵀ` with `scale = alpha / r` (`alpha / √r` with rsLoRA).

pub mod adapter;
pub mod config;
pub mod segmented;
pub mod slots;

pub use adapter::{LoraAdapter, LoraPair, Proj};
pub use config::{AdapterConfig, Targets};
pub use segmented::{LoraArgs, NO_SLOT};
pub use slots::LoraLimits;
