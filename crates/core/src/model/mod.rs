//! The model layer: decoder layers each family composes from shared pieces ([`layers`]), and
//! the forward pass over them written once against [`Backend`] ([`forward`]). One call runs a
//! flattened batch: prefill chunks and decode tokens of many sequences, each with its own
//! positions and block table.
//!
//! A family is one file: its [`Family`] (`FAMILY`: HF's names, model-wide traits, config
//! rules and config-key aliases) and its layer builder (`layer`, built from
//! [`layers::Loader`]'s pieces through [`layers::Layer::new`]). The one list of families is
//! the `family_list!` line below. Adding a family: its file, its line there, a seeded shape in
//! `tandem-model-files`' random_model.rs, and golden data from HF transformers
//! (tests/make_golden.sh).
//!
//! The rest, one noun a file: [`runner`] (what the engine needs of a loaded model), [`load`]
//! (the [`Model`] and its load), [`load_options`], [`forward`], [`graphs`] (decode buckets and
//! their captured graphs); the KV pool's size is `crate::memory`'s.

mod family;
mod forward;
mod graphs;
mod layers;
mod load;
mod load_options;
mod runner;

use crate::backend::Backend;

pub use crate::memory::{kv_block_bytes, kv_pool_blocks, AUTO_KV_BYTES};
pub use family::{families, family_named, family_of, Family};
pub use load::Model;
pub use load_options::{LoadOptions, DEFAULT_GRAPH_MAX_CONTEXT, DEFAULT_PROMPT_LOGIT_ROWS};
pub use runner::{ActDtypes, ModelRunner};

/// Declares the family files and the one list of their families: each file exports its
/// `FAMILY` and its layer builder `layer`.
macro_rules! family_list {
    ($($file:ident),* $(,)?) => {
        $(mod $file;)*

        /// Every family this build runs, in the order a config is matched against them.
        static FAMILIES: &[&Family] = &[$(&$file::FAMILY),*];

        /// The layer builder of `FAMILIES[i]`.
        fn layer_builder<B: Backend>(i: usize) -> Option<layers::LayerFn<B>> {
            [$($file::layer::<B> as layers::LayerFn<B>),*].get(i).copied()
        }
    };
}

family_list!(llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, gemma3, phi3);
