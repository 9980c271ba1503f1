//! Sizes fixed at load time ([`LoadOptions`]) and their defaults.

use crate::backend::KvDtype;

/// Sizes fixed at load time.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub max_batch_tokens: usize,
    pub max_seqs: usize,
    /// KV blocks in the pool; 0 sizes the pool from the backend's memory (see
    /// `gpu_memory_utilization`), or, where the backend cannot tell, to [`crate::memory::AUTO_KV_BYTES`].
    pub num_kv_blocks: usize,
    pub block_size: usize,
    /// Fraction of the device's TOTAL memory for weights, activations, step workspace and KV
    /// together (vLLM's meaning) when `num_kv_blocks` is 0; see [`crate::memory`].
    pub gpu_memory_utilization: f32,
    /// The context limit (prompt + output); None: the model's `max_position_embeddings`.
    /// Sizes block tables and the attention workspace, and the KV pool must hold one sequence
    /// this long.
    pub max_model_len: Option<usize>,
    /// Logit rows beyond `max_seqs` one forward can return, for requests that score their
    /// prompt (prompt logprobs): `[max_seqs + prompt_logit_rows, vocab]` f32 of scratch.
    pub prompt_logit_rows: usize,
    /// The KV cache's element type; None: the backend's default (`Storage::kv_dtypes()[0]`:
    /// bf16 on CUDA, f32 elsewhere). A type the backend does not store fails the load.
    pub kv_dtype: Option<KvDtype>,
    /// Capture each decode bucket once at load and replay it ([`crate::backend::Device::supports_graphs`]:
    /// CUDA graphs); false runs every step eagerly (`--enforce-eager`). With graphs, decode
    /// steps are padded to their bucket (`pad_decode`). Backends that do not capture ignore it.
    pub graphs: bool,
    /// Pad decode steps to a bucket even without graphs (tests: padded decode must give the
    /// same ids as unpadded on every backend). Graphs imply it.
    pub pad_decode: bool,
    /// The longest context a padded (graph) decode step serves; a step with a longer one
    /// runs eagerly. It fixes the block-table stride and the attention's partition count of
    /// the captured steps, so it bounds what each step uploads and launches for nothing.
    pub graph_max_context: usize,
}

/// Extra logit rows by default: a 128-token slice of a scored prompt per step.
pub const DEFAULT_PROMPT_LOGIT_ROWS: usize = 128;

/// Context bound of padded decode steps by default (vLLM's `max_seq_len_to_capture`).
pub const DEFAULT_GRAPH_MAX_CONTEXT: usize = 8192;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_batch_tokens: 512,
            max_seqs: 64,
            num_kv_blocks: 256,
            block_size: 16,
            gpu_memory_utilization: 0.9,
            max_model_len: None,
            prompt_logit_rows: DEFAULT_PROMPT_LOGIT_ROWS,
            kv_dtype: None,
            graphs: true,
            pad_decode: false,
            graph_max_context: DEFAULT_GRAPH_MAX_CONTEXT,
        }
    }
}
