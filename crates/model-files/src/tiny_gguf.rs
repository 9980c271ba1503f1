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

/// Hidden size, heads, KV heads, head size, MLP size and vocabulary of
/// [`write_tiny_kquant_gguf`]'s model (rows of whole 256-value super-blocks).
pub const TINY_KQUANT_GGUF_SHAPE: (usize, usize, usize, usize, usize, usize) = (256, 4, 2, 64, 512, 261);

/// A matrix's GGUF type id and bytes, from its rows, columns and tag (which varies its bytes).
type Matrix<'a> = &'a dyn Fn(usize, usize, usize) -> (u32, Vec<u8>);

/// Writes the tiny Q8_0 model to `path` (see the module doc); `salt` varies its weights.
pub fn write_tiny_gguf(path: &Path, salt: usize) -> Result<()> {
    let q8 = |rows: usize, cols: usize, tag: usize| {
        let mut out = vec![];
        for b in 0..rows * cols / 32 {
            out.extend(half::f16::from_f32(1.0 / 1024.0).to_le_bytes());
            out.extend((0..32).map(|i| ((b * 32 + i) * 2654435761usize).wrapping_add((tag + 16 * salt) * 97) as u8));
        }
        (8, out)
    };
    write_tiny(path, salt, TINY_GGUF_SHAPE, 7, &q8, &q8)
}

/// Writes a tiny model of K-quants to `path`: its embedding and projections Q4_K, the
/// output head Q6_K (as llama.cpp's Q4_K_M keeps it), pseudo-random blocks whose f16 scales are
/// small and finite; the shape is [`TINY_KQUANT_GGUF_SHAPE`]. Its values are not exact in
/// bf16: a test compares it on two backends that keep it quantized, not with a converted copy.
pub fn write_tiny_kquant_gguf(path: &Path, salt: usize) -> Result<()> {
    // (type id, block bytes, f16 fields, span of the quantized values): ggml's Q4_K and Q6_K.
    let kquant = |id: u32, rows: usize, cols: usize, tag: usize| {
        let (bb, fields, span): (usize, &[usize], f32) =
            if id == 12 { (144, &[0, 2], 32.0 * 63.0) } else { (210, &[208], 32.0 * 64.0) };
        let mut state = (tag as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt as u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut out: Vec<u8> = (0..rows * cols / 256 * bb).map(|_| next() as u8).collect();
        let scale = 1.0 / (span * (cols as f32).sqrt());
        for block in out.chunks_exact_mut(bb) {
            for &at in fields {
                let v = half::f16::from_f32(scale * (0.25 + (next() % 1000) as f32 / 1333.0));
                block[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        (id, out)
    };
    let q4k = |rows: usize, cols: usize, tag: usize| kquant(12, rows, cols, tag);
    let q6k = |rows: usize, cols: usize, tag: usize| kquant(14, rows, cols, tag);
    write_tiny(path, salt, TINY_KQUANT_GGUF_SHAPE, 15, &q4k, &q6k)
}

/// The tiny Llama: `matrix` makes every matrix but the output head, which `head` makes;
/// `file_type` is llama.cpp's LLAMA_FTYPE of the mix.
fn write_tiny(
    path: &Path,
    salt: usize,
    shape: (usize, usize, usize, usize, usize, usize),
    file_type: u32,
    matrix: Matrix<'_>,
    head: Matrix<'_>,
) -> Result<()> {
    let (hidden, heads, kv, hd, ffn, vocab) = shape;
    let q8 = |rows: usize, cols: usize, tag: usize| matrix(rows, cols, tag);
    let norm = |tag: usize| {
        (0..hidden).flat_map(|i| (1.0 + ((i + tag + salt) % 8) as f32 / 16.0).to_le_bytes()).collect::<Vec<u8>>()
    };
    let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    let t =
        |name: &'static str, rows: usize, cols: usize, (id, bytes): (u32, Vec<u8>)| (name, d(rows, cols), id, bytes);
    let tensors = vec![
        t("token_embd.weight", vocab, hidden, q8(vocab, hidden, 1)),
        t("output.weight", vocab, hidden, head(vocab, hidden, 2)),
        ("output_norm.weight", vec![hidden as u64], 0, norm(3)),
        ("blk.0.attn_norm.weight", vec![hidden as u64], 0, norm(4)),
        t("blk.0.attn_q.weight", heads * hd, hidden, q8(heads * hd, hidden, 5)),
        t("blk.0.attn_k.weight", kv * hd, hidden, q8(kv * hd, hidden, 6)),
        t("blk.0.attn_v.weight", kv * hd, hidden, q8(kv * hd, hidden, 7)),
        t("blk.0.attn_output.weight", hidden, heads * hd, q8(hidden, heads * hd, 8)),
        ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, norm(9)),
        t("blk.0.ffn_gate.weight", ffn, hidden, q8(ffn, hidden, 10)),
        t("blk.0.ffn_up.weight", ffn, hidden, q8(ffn, hidden, 11)),
        t("blk.0.ffn_down.weight", hidden, ffn, q8(hidden, ffn, 12)),
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
        ("general.file_type", Value::U32(file_type)),
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
