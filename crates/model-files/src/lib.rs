//! tandem-model-files: where model directories come from.
//!
//! - [`gguf`]: GGUF files (llama.cpp's format), mapped and parsed; [`quant`]: ggml types to f32.
//! - [`convert`]: a GGUF (llama, qwen2, qwen3, qwen3moe, gemma3) to a Hugging Face directory
//!   (bf16 safetensors, config, tokenizer); [`gguf_tokenizer`] and [`tokenizer_json`] build the
//!   `tokenizer.json`.
//! - [`family`]: the HF families written (names, q/k norms, expert names) and the GGUF
//!   architectures that map onto them.
//! - [`catalog`]: `models/catalog.toml`, the models the tool knows; [`fetch`]: download, verify,
//!   convert and install the default model, once.
//! - [`random_model`]: seeded random models of real shapes, for tests and benchmarks;
//!   [`random_adapter`]: seeded random LoRA adapters over them (PEFT's format); [`fp8`]:
//!   their projections rewritten in FP8 (the layout of Qwen3-*-FP8), for the FP8 loader.
//!
//! Architecture invariant: this crate writes model directories and knows nothing of backends,
//! the engine or HTTP. What it writes is read back with `tandem_core`'s own loaders.

pub mod catalog;
pub mod convert;
pub mod family;
pub mod fetch;
pub mod fp8;
pub mod gguf;
pub mod gguf_tokenizer;
pub mod quant;
pub mod random_adapter;
pub mod random_model;
pub mod safetensors_writer;
pub mod tiny_gguf;
pub mod tokenizer_json;

pub use convert::convert_gguf;
pub use fetch::fetch_default;
pub use random_model::{write_random_model, Shape};
