//! GGUF (`general.architecture = llama`) to a Hugging Face model directory:
//! `model.safetensors` (bf16), `config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`.
//!
//! Two things differ between the layouts besides names:
//! - GGUF dims are innermost first; PyTorch shapes are the reverse.
//! - llama.cpp's exporter permutes the rows of the Q and K projections (per head, the two rotary
//!   halves are interleaved into pairs, matching its rope kernel). HF's rotate_half rope expects
//!   the halves, so the permutation is undone here; without that the model only answers `<|im_end|>`.
//!
//! The output is a pure function of the input file: tensors are sorted by name and every JSON
//! file is written with fixed key order, so converting twice gives identical bytes.

use std::io::BufWriter;
use std::path::Path;
use std::time::Instant;

use serde_json::json;
use tandem_core::{DType, Error, Result};

use crate::gguf::{GgufFile, TensorInfo};
use crate::gguf_tokenizer::GgufTokenizer;
use crate::safetensors_writer::{SafetensorsWriter, TensorSpec};

/// Files a converted directory holds.
pub const OUTPUT_FILES: &[&str] =
    &["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"];

/// What a conversion did, for the caller to report.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub tensors: usize,
    pub parameters: usize,
    pub tied: bool,
    pub seconds: f64,
}

/// Hyper-parameters read from `llama.*` metadata.
#[derive(Debug, Clone, PartialEq)]
struct LlamaParams {
    layers: usize,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    rms_eps: f32,
    rope_theta: f32,
    context: usize,
}

impl LlamaParams {
    fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(Error::config(&g.path, format!("general.architecture is `{arch}`; only `llama` can be converted")));
        }
        let u = |k: &str| g.get_u64(&format!("llama.{k}")).map(|v| v as usize);
        let heads = u("attention.head_count")?;
        let hidden = u("embedding_length")?;
        let kv_heads = if g.get("llama.attention.head_count_kv").is_some() { u("attention.head_count_kv")? } else { heads };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Error::config(&g.path, format!("llama.attention.head_count ({heads}) must be a positive multiple of head_count_kv ({kv_heads})")));
        }
        let head_dim = if g.get("llama.attention.key_length").is_some() { u("attention.key_length")? } else { hidden / heads };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(Error::config(&g.path, format!("head dimension {head_dim} must be positive and even")));
        }
        if let Some(kind) = g.get("llama.rope.scaling.type").and_then(|v| v.as_str()) {
            if kind != "none" {
                return Err(Error::config(&g.path, format!("llama.rope.scaling.type `{kind}` is not supported by this converter")));
            }
        }
        if g.tensor("rope_freqs.weight").is_some() {
            return Err(Error::config(&g.path, "tensor `rope_freqs.weight` (Llama 3.1 rope scaling) is not supported by this converter"));
        }
        // Every layer has nine tensors: a count the file cannot hold is refused before anything
        // is sized from it (found by fuzz/gguf: a huge block_count in a 6 KB file).
        let layers = u("block_count")?;
        if layers == 0 || layers > g.tensors.len() / 9 {
            return Err(Error::config(&g.path, format!("llama.block_count is {layers}, but the file's {} tensors hold at most {} layers of 9", g.tensors.len(), g.tensors.len() / 9)));
        }
        Ok(LlamaParams {
            layers,
            hidden,
            intermediate: u("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            rms_eps: g.get_f64("llama.attention.layer_norm_rms_epsilon")? as f32,
            rope_theta: if g.get("llama.rope.freq_base").is_some() { g.get_f64("llama.rope.freq_base")? as f32 } else { 10000.0 },
            context: u("context_length")?,
        })
    }
}

/// The HF name of a GGUF tensor, and for Q/K the head count whose rope permutation to undo.
fn hf_name(gguf: &str, p: &LlamaParams) -> Option<(String, Option<usize>)> {
    let top = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(t) = top {
        return Some((t.to_string(), None));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= p.layers {
        return None;
    }
    let (part, kind) = rest.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let (hf, heads) = match part {
        "attn_norm" => ("input_layernorm", None),
        "attn_q" => ("self_attn.q_proj", Some(p.heads)),
        "attn_k" => ("self_attn.k_proj", Some(p.kv_heads)),
        "attn_v" => ("self_attn.v_proj", None),
        "attn_output" => ("self_attn.o_proj", None),
        "ffn_norm" => ("post_attention_layernorm", None),
        "ffn_gate" => ("mlp.gate_proj", None),
        "ffn_up" => ("mlp.up_proj", None),
        "ffn_down" => ("mlp.down_proj", None),
        _ => return None,
    };
    Some((format!("model.layers.{layer}.{hf}.{kind}"), heads))
}

/// llama.cpp's exporter permutation of Q/K rows, `[n_head * head_dim, cols]` row-major:
/// `reshape(n_head, 2, head_dim/2, cols).swapaxes(1, 2)`. Row `h*hd + 2i + j` of the result is
/// row `h*hd + j*hd/2 + i` of the input. Kept for the round-trip test and for fixtures.
pub fn rope_permute(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / n_head;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + 2 * i + j;
                let src = h * hd + j * hd / 2 + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// The inverse of [`rope_permute`]: `reshape(n_head, head_dim/2, 2, cols).swapaxes(1, 2)`.
pub fn rope_unpermute(w: &[f32], n_head: usize, cols: usize) -> Vec<f32> {
    let hd = w.len() / cols / n_head;
    let mut out = vec![0f32; w.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + j * hd / 2 + i;
                let src = h * hd + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// f32 as the shortest decimal that reads back to it, so config.json says 1e-05, not
/// 9.999999747378752e-06.
fn f32_json(v: f32) -> serde_json::Value {
    let shortest: f64 = v.to_string().parse().unwrap_or(v as f64);
    json!(shortest)
}

/// Converts `gguf_path` into `out_dir` (created if needed). `progress(done, total, name)` is
/// called after each tensor.
pub fn convert_gguf(gguf_path: &Path, out_dir: &Path, progress: &mut dyn FnMut(usize, usize, &str)) -> Result<ConvertSummary> {
    let start = Instant::now();
    let g = GgufFile::open(gguf_path)?;
    let p = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let vocab = tok.vocab.len();

    let mut plan: Vec<(String, &TensorInfo, Option<usize>)> = Vec::with_capacity(g.tensors.len());
    for t in &g.tensors {
        let Some((name, heads)) = hf_name(&t.name, &p) else {
            return Err(Error::tensor(&g.path, &t.name, "is not a Llama tensor this converter knows"));
        };
        if let Some(n) = heads {
            let shape = t.torch_shape();
            if Some(shape[0]) != n.checked_mul(p.head_dim) {
                return Err(Error::tensor(&g.path, &t.name, format!("has {} rows, expected {n} heads x {} = {}", shape[0], p.head_dim, n.saturating_mul(p.head_dim))));
            }
        }
        plan.push((name, t, heads));
    }
    let embed = g.tensor("token_embd.weight").ok_or_else(|| Error::tensor(&g.path, "token_embd.weight", "missing"))?;
    if embed.torch_shape() != [vocab, p.hidden] {
        return Err(Error::tensor(&g.path, "token_embd.weight", format!("has shape {:?}, expected [{vocab}, {}] (vocab from the token list, hidden)", embed.torch_shape(), p.hidden)));
    }
    let tied = g.tensor("output.weight").is_none();
    // Catch a missing tensor here, with its GGUF name, rather than when a backend loads the result.
    let mut required = vec!["output_norm.weight".to_string()];
    for i in 0..p.layers {
        for part in ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"] {
            required.push(format!("blk.{i}.{part}.weight"));
        }
    }
    if let Some(missing) = required.iter().find(|n| g.tensor(n).is_none()) {
        return Err(Error::tensor(&g.path, missing, format!("missing (llama.block_count is {})", p.layers)));
    }

    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let st_path = out_dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|e| Error::io(&st_path, e))?;
    let specs = plan.iter().map(|(name, t, _)| TensorSpec::new(name.clone(), DType::BF16, &t.torch_shape())).collect();
    let mut w = SafetensorsWriter::new(BufWriter::with_capacity(1 << 20, file), &st_path, specs)?;
    let order: Vec<String> = w.specs().iter().map(|s| s.name.clone()).collect();
    let mut parameters = 0;
    for (k, name) in order.iter().enumerate() {
        let (_, t, heads) = plan.iter().find(|(n, _, _)| n == name).expect("every spec comes from the plan");
        let mut values = g.tensor_f32(t)?;
        if let Some(n) = heads {
            let cols = if t.dims.len() == 1 { 1 } else { t.dims[0] as usize };
            values = rope_unpermute(&values, *n, cols);
        }
        parameters += values.len();
        w.push(&values)?;
        progress(k + 1, order.len(), name);
    }
    w.finish()?;

    write_json(&out_dir.join("config.json"), &config_json(&p, &tok, tied))?;
    write_json(&out_dir.join("tokenizer.json"), &tok.tokenizer_json())?;
    write_json(&out_dir.join("tokenizer_config.json"), &tokenizer_config_json(&tok, p.context))?;
    let mut gen = serde_json::Map::new();
    gen.insert("bos_token_id".into(), json!(tok.bos_id));
    gen.insert("eos_token_id".into(), json!(tok.eos_id));
    if let Some(pad) = tok.pad_id {
        gen.insert("pad_token_id".into(), json!(pad));
    }
    write_json(&out_dir.join("generation_config.json"), &serde_json::Value::Object(gen))?;
    Ok(ConvertSummary { tensors: order.len(), parameters, tied, seconds: start.elapsed().as_secs_f64() })
}

fn config_json(p: &LlamaParams, tok: &GgufTokenizer, tied: bool) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.vocab.len(),
        "hidden_size": p.hidden,
        "intermediate_size": p.intermediate,
        "num_hidden_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_key_value_heads": p.kv_heads,
        "head_dim": p.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": f32_json(p.rms_eps),
        "rope_theta": f32_json(p.rope_theta),
        "rope_scaling": null,
        "max_position_embeddings": p.context,
        "tie_word_embeddings": tied,
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": true,
        "bos_token_id": tok.bos_id,
        "eos_token_id": tok.eos_id,
        "pad_token_id": tok.pad_id,
        "torch_dtype": "bfloat16",
    })
}

fn tokenizer_config_json(tok: &GgufTokenizer, context: usize) -> serde_json::Value {
    let mut decoder = serde_json::Map::new();
    for a in &tok.added {
        decoder.insert(
            a.id.to_string(),
            json!({ "content": a.content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": a.special }),
        );
    }
    json!({
        "add_bos_token": tok.add_bos,
        "add_eos_token": tok.add_eos,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": tok.token(tok.bos_id),
        "chat_template": tok.chat_template,
        "clean_up_tokenization_spaces": false,
        "eos_token": tok.token(tok.eos_id),
        "model_max_length": context,
        "pad_token": tok.token(tok.pad_id),
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": tok.token(tok.unk_id),
        "vocab_size": tok.vocab.len(),
    })
}

pub(crate) fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v).map_err(|e| Error::config(path, format!("cannot serialise: {e}")))?;
    text.push('\n');
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::{writer, Value};
    use crate::gguf_tokenizer::tests::tiny_gguf_tokenizer_meta;
    use tandem_core::weights::Weights;
    use tandem_core::ModelConfig;

    #[test]
    fn permute_then_unpermute_is_identity_and_not_trivial() {
        let (n_head, hd, cols) = (3, 4, 5);
        let w: Vec<f32> = (0..n_head * hd * cols).map(|i| i as f32).collect();
        let p = rope_permute(&w, n_head, cols);
        assert_ne!(p, w, "the permutation moves rows");
        // Head 0, head_dim 4: the halves [r0 r1 | r2 r3] interleave to [r0 r2 r1 r3].
        let row = |m: &[f32], r: usize| m[r * cols];
        assert_eq!([row(&p, 0), row(&p, 1), row(&p, 2), row(&p, 3)], [0.0, 10.0, 5.0, 15.0]);
        assert_eq!(rope_unpermute(&p, n_head, cols), w);
        assert_eq!(rope_permute(&rope_unpermute(&w, n_head, cols), n_head, cols), w);
    }

    #[test]
    fn shortest_float_in_json() {
        assert_eq!(f32_json(1e-5).as_f64(), Some(1e-5));
        assert_ne!((1e-5f32) as f64, 1e-5, "the naive widening is what this avoids");
        assert_eq!(f32_json(100000.0).to_string(), "100000.0");
    }

    /// A 1-layer llama GGUF: hidden 32, 2 heads of 16, 1 KV head, ffn 64, tokenizer of 261 tokens.
    /// Q and K are stored permuted, as llama.cpp's exporter does; everything else is F32 except
    /// the embedding (Q8_0) and gate (Q4_1).
    pub(crate) fn tiny_llama_gguf(path: &Path, tied: bool, skip: Option<&str>) -> (Vec<f32>, Vec<f32>) {
        let (hidden, heads, kv, hd, ffn, vocab) = (32usize, 2usize, 1usize, 16usize, 64usize, 261usize);
        let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let vals = |n: usize, salt: f32| (0..n).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect::<Vec<f32>>();
        let q = vals(heads * hd * hidden, 1.0); // HF layout [q_dim, hidden]
        let k = vals(kv * hd * hidden, 2.0);
        // Q8_0 embedding: every block scale 0.5, q = (i % 7) - 3.
        let mut embd = vec![];
        for b in 0..vocab * hidden / 32 {
            embd.extend(half::f16::from_f32(0.5).to_le_bytes());
            embd.extend((0..32).map(|i| (((b * 32 + i) % 7) as i8 - 3) as u8));
        }
        // Q4_1 gate: d = 0.125, m = -1, nibbles 0..15.
        let mut gate = vec![];
        for _ in 0..ffn * hidden / 32 {
            gate.extend(half::f16::from_f32(0.125).to_le_bytes());
            gate.extend(half::f16::from_f32(-1.0).to_le_bytes());
            gate.extend((0..16u8).map(|j| (j << 4) | j));
        }
        let mut meta = vec![
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(1)),
            ("llama.context_length", Value::U32(256)),
            ("llama.embedding_length", Value::U32(hidden as u32)),
            ("llama.feed_forward_length", Value::U32(ffn as u32)),
            ("llama.attention.head_count", Value::U32(heads as u32)),
            ("llama.attention.head_count_kv", Value::U32(kv as u32)),
            ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("llama.rope.freq_base", Value::F32(100000.0)),
        ];
        meta.extend(tiny_gguf_tokenizer_meta());
        let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
        let mut tensors = vec![
            ("token_embd.weight", d(vocab, hidden), 8, embd),
            ("output_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 3.0))),
            ("blk.0.attn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 4.0))),
            ("blk.0.attn_q.weight", d(heads * hd, hidden), 0, f32b(&rope_permute(&q, heads, hidden))),
            ("blk.0.attn_k.weight", d(kv * hd, hidden), 0, f32b(&rope_permute(&k, kv, hidden))),
            ("blk.0.attn_v.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 5.0))),
            ("blk.0.attn_output.weight", d(hidden, heads * hd), 0, f32b(&vals(hidden * heads * hd, 6.0))),
            ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 7.0))),
            ("blk.0.ffn_gate.weight", d(ffn, hidden), 3, gate),
            ("blk.0.ffn_up.weight", d(ffn, hidden), 0, f32b(&vals(ffn * hidden, 8.0))),
            ("blk.0.ffn_down.weight", d(hidden, ffn), 0, f32b(&vals(hidden * ffn, 9.0))),
        ];
        if !tied {
            tensors.push(("output.weight", d(vocab, hidden), 0, f32b(&vals(vocab * hidden, 10.0))));
        }
        tensors.retain(|t| Some(t.0) != skip);
        std::fs::write(path, writer::file(&meta, &tensors, 32)).unwrap();
        (q, k)
    }

    fn bf16_round(v: &[f32]) -> Vec<f32> {
        v.iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect()
    }

    /// The GGUF fuzz target's findings (fuzz/regressions/gguf, each fixed), replayed here on the
    /// stable toolchain: every one converts to an error naming the file, quickly.
    #[test]
    fn fuzz_findings_are_errors() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/regressions/gguf");
        let out = std::env::temp_dir().join(format!("tandem-convert-fuzz-{}", std::process::id()));
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let t = std::time::Instant::now();
            let r = convert_gguf(&p, &out, &mut |_, _, _| {});
            let msg = r.err().unwrap_or_else(|| panic!("{} converted", p.display())).to_string();
            assert!(msg.contains(&p.display().to_string()), "{msg}");
            assert!(t.elapsed().as_secs() < 5, "{} took {:?}", p.display(), t.elapsed());
            n += 1;
        }
        assert!(n > 0, "no inputs under {}", dir.display());
        let _ = std::fs::remove_dir_all(&out);
    }

    #[test]
    fn converts_a_tiny_llama_and_core_loads_it() {
        let root = std::env::temp_dir().join(format!("tandem-convert-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let gguf = root.join("tiny.gguf");
        let (q, k) = tiny_llama_gguf(&gguf, true, None);
        let out = root.join("out");
        let mut seen = 0;
        let s = convert_gguf(&gguf, &out, &mut |done, total, _| {
            seen = done;
            assert_eq!(total, 11);
        })
        .unwrap();
        assert_eq!((s.tensors, seen), (11, 11));
        assert!(s.tied);
        let cfg = ModelConfig::from_file(&out.join("config.json")).unwrap();
        assert_eq!((cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim), (261, 32, 2, 1, 16));
        assert!(cfg.tie_word_embeddings);
        assert_eq!((cfg.rms_norm_eps, cfg.rope_theta), (1e-5, 100000.0));
        assert_eq!((cfg.bos_token_id, cfg.eos_token_ids.clone()), (Some(1), vec![2]));
        let w = Weights::open(&out).unwrap();
        assert!(!w.contains("lm_head.weight"));
        // Q and K come back in HF order (bf16-rounded), not in llama.cpp's.
        assert_eq!(w.get("model.layers.0.self_attn.q_proj.weight", &[32, 32]).unwrap().to_f32(), bf16_round(&q));
        assert_eq!(w.get("model.layers.0.self_attn.k_proj.weight", &[16, 32]).unwrap().to_f32(), bf16_round(&k));
        let e = w.get("model.embed_tokens.weight", &[261, 32]).unwrap().to_f32();
        assert_eq!(&e[..8], &[-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, -1.5]);
        let gate = w.get("model.layers.0.mlp.gate_proj.weight", &[64, 32]).unwrap().to_f32();
        assert_eq!((gate[0], gate[15], gate[16], gate[31]), (-1.0, 0.875, -1.0, 0.875));
        let tc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
        assert_eq!(tc["eos_token"], "<|im_end|>");
        assert_eq!(tc["bos_token"], "<|im_start|>");
        assert_eq!(tc["unk_token"], "<|endoftext|>");
        assert_eq!(tc["add_bos_token"], false);
        assert!(tc["chat_template"].as_str().unwrap().contains("messages"));
        tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();

        // Deterministic: a second conversion gives identical bytes in every file.
        let out2 = root.join("out2");
        convert_gguf(&gguf, &out2, &mut |_, _, _| {}).unwrap();
        for f in OUTPUT_FILES {
            assert_eq!(std::fs::read(out.join(f)).unwrap(), std::fs::read(out2.join(f)).unwrap(), "{f} differs");
        }

        let gguf_untied = root.join("untied.gguf");
        tiny_llama_gguf(&gguf_untied, false, None);
        let out3 = root.join("out3");
        assert!(!convert_gguf(&gguf_untied, &out3, &mut |_, _, _| {}).unwrap().tied);
        assert!(Weights::open(&out3).unwrap().get("lm_head.weight", &[261, 32]).is_ok());
        assert!(!ModelConfig::from_file(&out3.join("config.json")).unwrap().tie_word_embeddings);
    }

    #[test]
    fn unknown_tensors_and_architectures_are_named() {
        let root = std::env::temp_dir().join(format!("tandem-convert-bad-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let p = root.join("gpt.gguf");
        std::fs::write(&p, writer::file(&[("general.architecture", Value::String("gpt2".into()))], &[], 32)).unwrap();
        let e = convert_gguf(&p, &root.join("o"), &mut |_, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("`gpt2`") && e.contains("gpt.gguf"), "{e}");
        let p2 = root.join("no-up.gguf");
        tiny_llama_gguf(&p2, true, Some("blk.0.ffn_up.weight"));
        let e = convert_gguf(&p2, &root.join("o2"), &mut |_, _, _| {}).unwrap_err().to_string();
        assert!(e.contains("`blk.0.ffn_up.weight`") && e.contains("missing"), "{e}");
        assert!(hf_name("blk.0.attn_qkv.weight", &LlamaParams {
            layers: 1, hidden: 8, intermediate: 8, heads: 2, kv_heads: 1, head_dim: 4, rms_eps: 1e-5, rope_theta: 1e4, context: 8
        }).is_none());
    }
}
