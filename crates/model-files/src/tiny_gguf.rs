//! A tiny GGUF file for tests in other crates (the library, the CLI): a one-layer Llama with a
//! byte-level BPE tokenizer and a chat template, its matrices in Q8_0 with scales that are
//! powers of two and its norms of few bits, so that every value is exact in bf16 and the file
//! served kept quantized must give its converted bf16 directory's logits bit for bit.

use std::path::Path;

use tandem_core::{Error, Result};

use crate::gguf::{writer, Value};
use crate::tokenizer_json::byte_level_alphabet;

/// Hidden size, heads, KV heads, head size, MLP size and vocabulary of [`write_tiny_gguf`]'s model.
pub const TINY_GGUF_SHAPE: (usize, usize, usize, usize, usize, usize) = (64, 2, 1, 32, 96, 261);

/// Writes the tiny Q8_0 model to `path` (see the module doc); `salt` varies its weights.
pub fn write_tiny_gguf(path: &Path, salt: usize) -> Result<()> {
    let (hidden, heads, kv, hd, ffn, vocab) = TINY_GGUF_SHAPE;
    let q8 = |rows: usize, cols: usize, tag: usize| {
        let mut out = vec![];
        for b in 0..rows * cols / 32 {
            out.extend(half::f16::from_f32(1.0 / 1024.0).to_le_bytes());
            out.extend((0..32).map(|i| ((b * 32 + i) * 2654435761usize).wrapping_add((tag + 16 * salt) * 97) as u8));
        }
        out
    };
    let norm = |tag: usize| {
        (0..hidden).flat_map(|i| (1.0 + ((i + tag + salt) % 8) as f32 / 16.0).to_le_bytes()).collect::<Vec<u8>>()
    };
    let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    let tensors = vec![
        ("token_embd.weight", d(vocab, hidden), 8, q8(vocab, hidden, 1)),
        ("output.weight", d(vocab, hidden), 8, q8(vocab, hidden, 2)),
        ("output_norm.weight", vec![hidden as u64], 0, norm(3)),
        ("blk.0.attn_norm.weight", vec![hidden as u64], 0, norm(4)),
        ("blk.0.attn_q.weight", d(heads * hd, hidden), 8, q8(heads * hd, hidden, 5)),
        ("blk.0.attn_k.weight", d(kv * hd, hidden), 8, q8(kv * hd, hidden, 6)),
        ("blk.0.attn_v.weight", d(kv * hd, hidden), 8, q8(kv * hd, hidden, 7)),
        ("blk.0.attn_output.weight", d(hidden, heads * hd), 8, q8(hidden, heads * hd, 8)),
        ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, norm(9)),
        ("blk.0.ffn_gate.weight", d(ffn, hidden), 8, q8(ffn, hidden, 10)),
        ("blk.0.ffn_up.weight", d(ffn, hidden), 8, q8(ffn, hidden, 11)),
        ("blk.0.ffn_down.weight", d(hidden, ffn), 8, q8(hidden, ffn, 12)),
    ];
    let s = |x: &str| Value::String(x.into());
    let u = |x: usize| Value::U32(x as u32);
    let mut tokens = vec![s("<|endoftext|>"), s("<|im_start|>"), s("<|im_end|>")];
    tokens.extend(byte_level_alphabet().iter().map(|c| s(&c.to_string())));
    tokens.extend([s("Ġw"), s("Ġwo")]);
    let mut types = vec![Value::I32(3); 3];
    types.extend(vec![Value::I32(1); 258]);
    let meta = vec![
        ("general.architecture", s("llama")),
        ("general.file_type", Value::U32(7)), // LLAMA_FTYPE_MOSTLY_Q8_0
        ("llama.block_count", u(1)),
        ("llama.context_length", u(256)),
        ("llama.embedding_length", u(hidden)),
        ("llama.feed_forward_length", u(ffn)),
        ("llama.attention.head_count", u(heads)),
        ("llama.attention.head_count_kv", u(kv)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("smollm")),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(vec![s("Ġ w"), s("Ġw o")])),
        ("tokenizer.ggml.bos_token_id", u(1)),
        ("tokenizer.ggml.eos_token_id", u(2)),
        ("tokenizer.ggml.padding_token_id", u(2)),
        ("tokenizer.ggml.unknown_token_id", u(0)),
        ("tokenizer.chat_template", s("{% for m in messages %}{{ m['content'] }}{% endfor %}")),
    ];
    std::fs::write(path, writer::file(&meta, &tensors, 32)).map_err(|e| Error::io(path, e))
}
