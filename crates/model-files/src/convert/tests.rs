use super::*;
use crate::family::named;
use crate::family::{LLAMA, QWEN3};
use crate::gguf::{writer, Value};
use crate::gguf_tokenizer::tests::{tiny_gemma_tokenizer_meta, tiny_gguf_tokenizer_meta};
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
    let embd = q8_0_ramp(vocab * hidden);
    let gate = q4_1_ramp(ffn * hidden);
    let mut meta = tiny_llama_meta(hidden, ffn, heads, kv, 100000.0);
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

/// A one-layer llama's `llama.*` hyper-parameters (context 256, RMS eps 1e-5).
fn tiny_llama_meta(hidden: usize, ffn: usize, heads: usize, kv: usize, rope_theta: f32) -> Meta {
    arch_meta(
        "llama",
        vec![
            ("block_count", Value::U32(1)),
            ("context_length", Value::U32(256)),
            ("embedding_length", Value::U32(hidden as u32)),
            ("feed_forward_length", Value::U32(ffn as u32)),
            ("attention.head_count", Value::U32(heads as u32)),
            ("attention.head_count_kv", Value::U32(kv as u32)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
            ("rope.freq_base", Value::F32(rope_theta)),
        ],
    )
}

/// A Q8_0 tensor of `n` values: every block's scale 0.5, q = (i % 7) - 3.
fn q8_0_ramp(n: usize) -> Vec<u8> {
    let mut out = vec![];
    for b in 0..n / 32 {
        out.extend(half::f16::from_f32(0.5).to_le_bytes());
        out.extend((0..32).map(|i| (((b * 32 + i) % 7) as i8 - 3) as u8));
    }
    out
}

/// A Q4_1 tensor of `n` values: d = 0.125, m = -1, nibbles 0..15 (value (i % 16) / 8 - 1).
fn q4_1_ramp(n: usize) -> Vec<u8> {
    let mut out = vec![];
    for _ in 0..n / 32 {
        out.extend(half::f16::from_f32(0.125).to_le_bytes());
        out.extend(half::f16::from_f32(-1.0).to_le_bytes());
        out.extend((0..16u8).map(|j| (j << 4) | j));
    }
    out
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
        let r = convert(&p, &out);
        let msg = r.err().unwrap_or_else(|| panic!("{} converted", p.display())).to_string();
        assert!(msg.contains(&p.display().to_string()), "{msg}");
        assert!(t.elapsed().as_secs() < 5, "{} took {:?}", p.display(), t.elapsed());
        n += 1;
    }
    assert!(n > 0, "no inputs under {}", dir.display());
    let _ = std::fs::remove_dir_all(&out);
}

/// A 1-layer Qwen3-MoE GGUF as llama.cpp writes one (hidden 32, 2 heads of 16, 1 KV head,
/// per-head q/k norms, Q/K not permuted, 4 experts of width 32 stacked in `*_exps` tensors,
/// top 2, a `qwen2` pre-tokenizer): the converter names and slices each expert, keeps Q/K
/// as stored, and writes Qwen3-MoE's config.
#[test]
fn converts_a_tiny_qwen3_moe() {
    let root = scratch("qwen3moe");
    let (hidden, heads, kv, hd, ff, experts, vocab) = (32usize, 2usize, 1usize, 16usize, 32usize, 4usize, 261usize);
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let vals = |n: usize, salt: f32| (0..n).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect::<Vec<f32>>();
    let mut meta = arch_meta(
        "qwen3moe",
        vec![
            ("block_count", Value::U32(1)),
            ("context_length", Value::U32(256)),
            ("embedding_length", Value::U32(hidden as u32)),
            ("feed_forward_length", Value::U32(64)),
            ("expert_feed_forward_length", Value::U32(ff as u32)),
            ("expert_count", Value::U32(experts as u32)),
            ("expert_used_count", Value::U32(2)),
            ("attention.head_count", Value::U32(heads as u32)),
            ("attention.head_count_kv", Value::U32(kv as u32)),
            ("attention.key_length", Value::U32(hd as u32)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("rope.freq_base", Value::F32(1e6)),
        ],
    );
    meta.extend(tiny_gguf_tokenizer_meta().into_iter().map(|(k, v)| {
        if k == "tokenizer.ggml.pre" {
            (k, Value::String("qwen2".into()))
        } else {
            (k, v)
        }
    }));
    let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    let q = vals(heads * hd * hidden, 1.0);
    let gate = vals(experts * ff * hidden, 2.0);
    let down = vals(experts * hidden * ff, 3.0);
    let tensors = vec![
        ("token_embd.weight", d(vocab, hidden), 0, f32b(&vals(vocab * hidden, 4.0))),
        ("output_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 5.0))),
        ("blk.0.attn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 6.0))),
        ("blk.0.attn_q.weight", d(heads * hd, hidden), 0, f32b(&q)),
        ("blk.0.attn_k.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 7.0))),
        ("blk.0.attn_v.weight", d(kv * hd, hidden), 0, f32b(&vals(kv * hd * hidden, 8.0))),
        ("blk.0.attn_output.weight", d(hidden, heads * hd), 0, f32b(&vals(hidden * heads * hd, 9.0))),
        ("blk.0.attn_q_norm.weight", vec![hd as u64], 0, f32b(&vals(hd, 10.0))),
        ("blk.0.attn_k_norm.weight", vec![hd as u64], 0, f32b(&vals(hd, 11.0))),
        ("blk.0.ffn_norm.weight", vec![hidden as u64], 0, f32b(&vals(hidden, 12.0))),
        ("blk.0.ffn_gate_inp.weight", d(experts, hidden), 0, f32b(&vals(experts * hidden, 13.0))),
        ("blk.0.ffn_gate_exps.weight", vec![hidden as u64, ff as u64, experts as u64], 0, f32b(&gate)),
        (
            "blk.0.ffn_up_exps.weight",
            vec![hidden as u64, ff as u64, experts as u64],
            0,
            f32b(&vals(experts * ff * hidden, 14.0)),
        ),
        ("blk.0.ffn_down_exps.weight", vec![ff as u64, hidden as u64, experts as u64], 0, f32b(&down)),
    ];
    let gguf = root.join("tiny-qwen3moe.gguf");
    std::fs::write(&gguf, writer::file(&meta, &tensors, 32)).unwrap();
    let out = root.join("out");
    let s = convert(&gguf, &out).unwrap();
    assert_eq!(s.tensors, 14 - 3 + 3 * experts, "each merged expert tensor becomes one tensor per expert");
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["architectures"], json!(["Qwen3MoeForCausalLM"]));
    assert_eq!(
        (cfg["num_experts"].clone(), cfg["num_experts_per_tok"].clone(), cfg["moe_intermediate_size"].clone()),
        (json!(4), json!(2), json!(32))
    );
    assert_eq!(
        (cfg["head_dim"].clone(), cfg["norm_topk_prob"].clone(), cfg["mlp_only_layers"].clone()),
        (json!(16), json!(true), json!([]))
    );
    let w = Weights::open(&out).unwrap();
    // Q as stored (no permutation for Qwen), each expert its own slice.
    assert_eq!(w.get("model.layers.0.self_attn.q_proj.weight", &[32, 32]).unwrap().to_f32(), bf16_round(&q));
    assert!(w.get("model.layers.0.self_attn.q_norm.weight", &[16]).is_ok());
    assert!(w.get("model.layers.0.mlp.gate.weight", &[4, 32]).is_ok());
    for e in 0..experts {
        let g = w.get(&format!("model.layers.0.mlp.experts.{e}.gate_proj.weight"), &[ff, hidden]).unwrap().to_f32();
        assert_eq!(g, bf16_round(&gate[e * ff * hidden..(e + 1) * ff * hidden]), "expert {e}");
        let dn = w.get(&format!("model.layers.0.mlp.experts.{e}.down_proj.weight"), &[hidden, ff]).unwrap().to_f32();
        assert_eq!(dn, bf16_round(&down[e * hidden * ff..(e + 1) * hidden * ff]), "expert {e}");
    }
    // The qwen2 pre-tokenizer: Qwen2's split, NFC.
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer.json")).unwrap()).unwrap();
    assert_eq!(tok["normalizer"]["type"], "NFC");
    assert!(tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).is_ok());
    // Core reads it as the Qwen3-MoE family.
    let cfg = ModelConfig::from_file(&out.join("config.json")).unwrap();
    let moe = cfg.moe.as_ref().expect("a mixture of experts");
    assert_eq!(
        (cfg.architecture.as_str(), moe.num_experts, moe.top_k, moe.intermediate_size, moe.norm_topk_prob),
        ("Qwen3MoeForCausalLM", 4, 2, 32, true)
    );
    assert!(moe.dense_layers.is_empty());
    // Every tensor under the name the family's loader reads, at the shape it expects.
    let opts =
        tandem_core::model::LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    tandem_core::Model::load(tandem_reference::RefBackend::new(), &out, opts).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}

/// Deterministic K-quant blocks: pseudo-random bytes (every scale, min and value pattern)
/// with the f16 scale fields at `f16_at` set to small finite values.
fn kquant_blocks(ty: crate::quant::GgmlType, numel: usize, seed: u64, f16_at: &[usize]) -> Vec<u8> {
    let (per, size) = ty.block_layout().unwrap();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = vec![];
    for b in 0..numel / per as usize {
        let mut block: Vec<u8> = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        for (k, &o) in f16_at.iter().enumerate() {
            let v = 1e-3 * (1.0 + ((b + k) % 5) as f32) * if (b + k) % 3 == 0 { -1.0 } else { 1.0 };
            block[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
        out.extend(block);
    }
    out
}

/// A 1-layer llama GGUF quantised as llama.cpp's Q4_K_M mix: Q4_K for Q, K, O, gate and up,
/// Q6_K for V, down, the embedding and the output; norms F32. Hidden 256 (a K-quant row is
/// whole 256-value super-blocks), 2 heads of 128, 1 KV head, ffn 256. `replace` swaps one
/// tensor's type id (bytes kept), to test refusals.
pub(crate) fn tiny_q4_k_m_gguf(
    path: &Path,
    replace: Option<(&str, u32)>,
) -> std::collections::HashMap<&'static str, Vec<f32>> {
    use crate::quant::{dequantize, GgmlType};
    let (hidden, heads, kv, hd, ffn, vocab) = (256usize, 2usize, 1usize, 128usize, 256usize, 261usize);
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let norm =
        |n: usize, salt: f32| f32b(&(0..n).map(|i| 1.0 + (i as f32 * 0.37 + salt).sin() * 0.1).collect::<Vec<f32>>());
    let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    let parts: [(&'static str, usize, usize, GgmlType); 10] = [
        ("token_embd.weight", vocab, hidden, GgmlType::Q6K),
        ("output.weight", vocab, hidden, GgmlType::Q6K),
        ("blk.0.attn_q.weight", heads * hd, hidden, GgmlType::Q4K),
        ("blk.0.attn_k.weight", kv * hd, hidden, GgmlType::Q4K),
        ("blk.0.attn_v.weight", kv * hd, hidden, GgmlType::Q6K),
        ("blk.0.attn_output.weight", hidden, heads * hd, GgmlType::Q4K),
        ("blk.0.ffn_gate.weight", ffn, hidden, GgmlType::Q4K),
        ("blk.0.ffn_up.weight", ffn, hidden, GgmlType::Q4K),
        ("blk.0.ffn_down.weight", hidden, ffn, GgmlType::Q6K),
        ("output_norm.weight", 0, hidden, GgmlType::F32),
    ];
    let mut values = std::collections::HashMap::new();
    let mut tensors = vec![];
    for (i, (name, rows, cols, ty)) in parts.into_iter().enumerate() {
        let (dims, id, bytes) = match ty {
            GgmlType::F32 => (vec![cols as u64], 0, norm(cols, i as f32)),
            GgmlType::Q4K => (d(rows, cols), 12, kquant_blocks(ty, rows * cols, i as u64, &[0, 2])),
            _ => (d(rows, cols), 14, kquant_blocks(ty, rows * cols, i as u64, &[208])),
        };
        values.insert(name, dequantize(ty, &bytes, dims.iter().product::<u64>() as usize).unwrap());
        let id = match replace {
            Some((r, new)) if r == name => new,
            _ => id,
        };
        tensors.push((name, dims, id, bytes));
    }
    tensors.push(("blk.0.attn_norm.weight", vec![hidden as u64], 0, norm(hidden, 20.0)));
    tensors.push(("blk.0.ffn_norm.weight", vec![hidden as u64], 0, norm(hidden, 21.0)));
    let mut meta = tiny_llama_meta(hidden, ffn, heads, kv, 10000.0);
    meta.insert(1, ("general.file_type", Value::U32(15))); // LLAMA_FTYPE_MOSTLY_Q4_K_M
    meta.extend(tiny_gguf_tokenizer_meta());
    std::fs::write(path, writer::file(&meta, &tensors, 32)).unwrap();
    values
}

/// A Q4_K_M-style file (Q4_K and Q6_K weights) converts: every tensor is our dequantisation
/// (checked bitwise against the gguf package by tests/quant_fixtures.rs) rounded to bf16, Q/K
/// un-permuted, and core loads the result on the reference backend.
#[test]
fn converts_a_q4_k_m_llama_and_core_loads_it() {
    let root = scratch("kquant");
    let gguf = root.join("tiny-q4_k_m.gguf");
    let v = tiny_q4_k_m_gguf(&gguf, None);
    let out = root.join("out");
    let s = convert(&gguf, &out).unwrap();
    assert_eq!(s.tensors, 12);
    assert!(!s.tied);
    let cfg = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(
        (
            cfg.vocab_size,
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim
        ),
        (261, 256, 256, 2, 1, 128)
    );
    let w = Weights::open(&out).unwrap();
    let get = |n: &str, shape: &[usize]| w.get(n, shape).unwrap().to_f32();
    assert_eq!(get("model.embed_tokens.weight", &[261, 256]), bf16_round(&v["token_embd.weight"]));
    assert_eq!(get("lm_head.weight", &[261, 256]), bf16_round(&v["output.weight"]));
    assert_eq!(
        get("model.layers.0.self_attn.q_proj.weight", &[256, 256]),
        bf16_round(&rope_unpermute(&v["blk.0.attn_q.weight"], 2, 256))
    );
    assert_eq!(
        get("model.layers.0.self_attn.k_proj.weight", &[128, 256]),
        bf16_round(&rope_unpermute(&v["blk.0.attn_k.weight"], 1, 256))
    );
    assert_eq!(get("model.layers.0.self_attn.v_proj.weight", &[128, 256]), bf16_round(&v["blk.0.attn_v.weight"]));
    assert_eq!(get("model.layers.0.mlp.gate_proj.weight", &[256, 256]), bf16_round(&v["blk.0.ffn_gate.weight"]));
    assert_eq!(get("model.layers.0.mlp.down_proj.weight", &[256, 256]), bf16_round(&v["blk.0.ffn_down.weight"]));
    // Not trivial: the weights vary and have both signs.
    let e = &v["token_embd.weight"];
    assert!(e.iter().any(|x| *x > 0.01) && e.iter().any(|x| *x < -0.01), "embedding values are degenerate");
    let opts =
        tandem_core::model::LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    tandem_core::Model::load(tandem_reference::RefBackend::new(), &out, opts).unwrap();

    // The same file with an IQ4_XS down projection: refused before anything is written,
    // naming the tensor, the type and what is supported.
    let iq = root.join("iq4_xs.gguf");
    tiny_q4_k_m_gguf(&iq, Some(("blk.0.ffn_down.weight", 23)));
    let out_iq = root.join("out-iq");
    let e = convert(&iq, &out_iq).unwrap_err().to_string();
    assert!(e.contains("blk.0.ffn_down.weight") && e.contains("IQ4_XS") && e.contains(crate::quant::SUPPORTED), "{e}");
    assert!(!out_iq.exists(), "nothing is written for a refused file");
    // A K-quant tensor cut short (the file truncated mid-tensor) is an error naming it.
    let bytes = std::fs::read(&gguf).unwrap();
    let cut = root.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let e = convert(&cut, &root.join("out-cut")).unwrap_err().to_string();
    assert!(e.contains("truncated") && e.contains(".weight"), "{e}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn converts_a_tiny_llama_and_core_loads_it() {
    let root = scratch("llama");
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
    assert_eq!(
        (cfg.vocab_size, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim),
        (261, 32, 2, 1, 16)
    );
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
    let tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(tc["eos_token"], "<|im_end|>");
    assert_eq!(tc["bos_token"], "<|im_start|>");
    assert_eq!(tc["unk_token"], "<|endoftext|>");
    assert_eq!(tc["add_bos_token"], false);
    assert!(tc["chat_template"].as_str().unwrap().contains("messages"));
    tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();

    // Deterministic: a second conversion gives identical bytes in every file.
    let out2 = root.join("out2");
    convert(&gguf, &out2).unwrap();
    for f in OUTPUT_FILES {
        assert_eq!(std::fs::read(out.join(f)).unwrap(), std::fs::read(out2.join(f)).unwrap(), "{f} differs");
    }

    let gguf_untied = root.join("untied.gguf");
    tiny_llama_gguf(&gguf_untied, false, None);
    let out3 = root.join("out3");
    assert!(!convert(&gguf_untied, &out3).unwrap().tied);
    assert!(Weights::open(&out3).unwrap().get("lm_head.weight", &[261, 32]).is_ok());
    assert!(!ModelConfig::from_file(&out3.join("config.json")).unwrap().tie_word_embeddings);
}

#[test]
fn unknown_tensors_and_architectures_are_named() {
    let root = scratch("bad");
    let p = root.join("gpt.gguf");
    std::fs::write(&p, writer::file(&[("general.architecture", Value::String("gpt2".into()))], &[], 32)).unwrap();
    let e = convert(&p, &root.join("o")).unwrap_err().to_string();
    assert!(e.contains("`gpt2`") && e.contains("gpt.gguf"), "{e}");
    let p2 = root.join("no-up.gguf");
    tiny_llama_gguf(&p2, true, Some("blk.0.ffn_up.weight"));
    let e = convert(&p2, &root.join("o2")).unwrap_err().to_string();
    assert!(e.contains("`blk.0.ffn_up.weight`") && e.contains("missing"), "{e}");
    let params = LlamaParams {
        family: named(LLAMA),
        layers: 1,
        hidden: 8,
        intermediate: 8,
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
        rms_eps: 1e-5,
        rope_theta: 1e4,
        context: 8,
        moe: None,
        gemma: None,
    };
    assert!(hf_names("blk.0.attn_qkv.weight", &params).is_none());
    // Qwen3's q/k norms are no Llama tensors.
    assert!(hf_names("blk.0.attn_q_norm.weight", &params).is_none());
    assert!(hf_names("blk.0.attn_q_norm.weight", &LlamaParams { family: named(QWEN3), ..params.clone() }).is_some());
    // Gemma's sandwich norms are no Llama tensors; Gemma's ffn_norm is its pre-feedforward norm.
    assert!(hf_names("blk.0.post_ffw_norm.weight", &params).is_none());
    let gemma = LlamaParams { family: named(GEMMA3), ..params.clone() };
    assert_eq!(
        hf_names("blk.0.ffn_norm.weight", &gemma),
        Some(vec![("model.layers.0.pre_feedforward_layernorm.weight".into(), Take::MinusOne)])
    );
    assert_eq!(
        hf_names("blk.0.ffn_norm.weight", &params),
        Some(vec![("model.layers.0.post_attention_layernorm.weight".into(), Take::Whole)])
    );
}

type Meta = Vec<(&'static str, Value)>;

/// An empty scratch folder for one test, by tag and process.
pub(crate) fn scratch(tag: &str) -> std::path::PathBuf {
    let root = std::env::temp_dir().join(format!("tandem-convert-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    root
}

/// `convert_gguf` without progress reports.
pub(crate) fn convert(gguf: &Path, out: &Path) -> Result<ConvertSummary> {
    convert_gguf(gguf, out, &mut |_, _, _| {})
}

/// A tiny file's hyper-parameters: `general.architecture` = `arch`, then each `(key, value)`
/// under `{arch}.key`, in order (the names leaked: a test file's few keys).
fn arch_meta(arch: &'static str, keys: Vec<(&str, Value)>) -> Meta {
    let mut meta = vec![("general.architecture", Value::String(arch.into()))];
    meta.extend(keys.into_iter().map(|(k, v)| (&*Box::leak(format!("{arch}.{k}").into_boxed_str()), v)));
    meta
}

/// A Gemma 3 GGUF as llama.cpp's exporter writes one: `gemma3.*` keys, every norm stored as
/// `1 + w`, the sandwich norms (`post_attention_norm`, `ffn_norm` as the pre-feedforward norm,
/// `post_ffw_norm`), per-head q/k norms, Q/K unpermuted, no `output.weight`, linear rope
/// scaling on the global layers, Gemma's SentencePiece vocabulary (280 tokens). 7 layers
/// (hidden 32, 2 heads of 16, 1 KV head, ffn 64), so layer 5 is the one global layer of
/// llama.cpp's pattern of 6. The embedding is Q8_0 and layer 0's gate Q4_1; the rest F32.
fn tiny_gemma3_gguf(path: &Path, meta_edit: &dyn Fn(&mut Meta)) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (layers, hidden, heads, kv, hd, ffn, vocab) = (7usize, 32usize, 2usize, 1usize, 16usize, 64usize, 280usize);
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    // Weights as HF holds them (bf16), and norms about 0 (HF's Gemma norm weights are offsets from 1).
    let vals =
        |n: usize, salt: f32| bf16_round(&(0..n).map(|i| (i as f32 * 0.37 + salt).sin() * 0.5).collect::<Vec<f32>>());
    let mut meta = arch_meta(
        "gemma3",
        vec![
            ("block_count", Value::U32(layers as u32)),
            ("context_length", Value::U32(512)),
            ("embedding_length", Value::U32(hidden as u32)),
            ("feed_forward_length", Value::U32(ffn as u32)),
            ("attention.head_count", Value::U32(heads as u32)),
            ("attention.head_count_kv", Value::U32(kv as u32)),
            ("attention.key_length", Value::U32(hd as u32)),
            ("attention.value_length", Value::U32(hd as u32)),
            ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
            ("attention.sliding_window", Value::U32(16)),
            ("rope.freq_base", Value::F32(1e6)),
            ("rope.scaling.type", Value::String("linear".into())),
            ("rope.scaling.factor", Value::F32(8.0)),
        ],
    );
    meta.extend(tiny_gemma_tokenizer_meta().into_iter().filter(|(k, _)| *k != "general.architecture"));
    meta_edit(&mut meta);
    let d = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    // (GGUF name, GGUF dims, type, bytes) and what HF's checkpoint has: (name, shape, values).
    let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = vec![];
    let mut expect: Vec<(String, Vec<usize>, Vec<f32>)> = vec![];
    let mut salt = 0.0;
    let mut dense = |gguf: &str,
                     hf: &str,
                     rows: usize,
                     cols: usize,
                     tensors: &mut Vec<(String, Vec<u64>, u32, Vec<u8>)>,
                     expect: &mut Vec<(String, Vec<usize>, Vec<f32>)>| {
        salt += 1.0;
        let w = vals(rows * cols, salt);
        tensors.push((gguf.to_string(), d(rows, cols), 0, f32b(&w)));
        expect.push((hf.to_string(), vec![rows, cols], w));
    };
    let norm = |gguf: &str,
                hf: &str,
                n: usize,
                tensors: &mut Vec<(String, Vec<u64>, u32, Vec<u8>)>,
                expect: &mut Vec<(String, Vec<usize>, Vec<f32>)>| {
        let w = vals(n, 100.0 + tensors.len() as f32);
        tensors.push((gguf.to_string(), vec![n as u64], 0, f32b(&w.iter().map(|x| x + 1.0).collect::<Vec<f32>>())));
        expect.push((hf.to_string(), vec![n], w));
    };
    let embd = q8_0_ramp(vocab * hidden);
    tensors.push(("token_embd.weight".into(), d(vocab, hidden), 8, embd));
    expect.push((
        "model.embed_tokens.weight".into(),
        vec![vocab, hidden],
        (0..vocab * hidden).map(|i| ((i % 7) as f32 - 3.0) * 0.5).collect(),
    ));
    norm("output_norm.weight", "model.norm.weight", hidden, &mut tensors, &mut expect);
    for l in 0..layers {
        let g = |s: &str| format!("blk.{l}.{s}.weight");
        let h = |s: &str| format!("model.layers.{l}.{s}.weight");
        norm(&g("attn_norm"), &h("input_layernorm"), hidden, &mut tensors, &mut expect);
        norm(&g("attn_q_norm"), &h("self_attn.q_norm"), hd, &mut tensors, &mut expect);
        norm(&g("attn_k_norm"), &h("self_attn.k_norm"), hd, &mut tensors, &mut expect);
        norm(&g("post_attention_norm"), &h("post_attention_layernorm"), hidden, &mut tensors, &mut expect);
        norm(&g("ffn_norm"), &h("pre_feedforward_layernorm"), hidden, &mut tensors, &mut expect);
        norm(&g("post_ffw_norm"), &h("post_feedforward_layernorm"), hidden, &mut tensors, &mut expect);
        dense(&g("attn_q"), &h("self_attn.q_proj"), heads * hd, hidden, &mut tensors, &mut expect);
        dense(&g("attn_k"), &h("self_attn.k_proj"), kv * hd, hidden, &mut tensors, &mut expect);
        dense(&g("attn_v"), &h("self_attn.v_proj"), kv * hd, hidden, &mut tensors, &mut expect);
        dense(&g("attn_output"), &h("self_attn.o_proj"), hidden, heads * hd, &mut tensors, &mut expect);
        dense(&g("ffn_up"), &h("mlp.up_proj"), ffn, hidden, &mut tensors, &mut expect);
        dense(&g("ffn_down"), &h("mlp.down_proj"), hidden, ffn, &mut tensors, &mut expect);
        if l == 0 {
            let gate = q4_1_ramp(ffn * hidden);
            tensors.push((g("ffn_gate"), d(ffn, hidden), 3, gate));
            expect.push((
                h("mlp.gate_proj"),
                vec![ffn, hidden],
                (0..ffn * hidden).map(|i| (i % 16) as f32 * 0.125 - 1.0).collect(),
            ));
        } else {
            dense(&g("ffn_gate"), &h("mlp.gate_proj"), ffn, hidden, &mut tensors, &mut expect);
        }
    }
    let refs: Vec<(&str, Vec<u64>, u32, Vec<u8>)> =
        tensors.iter().map(|(n, d, t, b)| (n.as_str(), d.clone(), *t, b.clone())).collect();
    std::fs::write(path, writer::file(&meta, &refs, 32)).unwrap();
    expect
}

#[test]
fn converts_a_tiny_gemma3() {
    let root = scratch("gemma3");
    let gguf = root.join("tiny-gemma3.gguf");
    let expect = tiny_gemma3_gguf(&gguf, &|_| {});
    let out = root.join("out");
    let s = convert(&gguf, &out).unwrap();
    assert_eq!(s.tensors, 2 + 7 * 13);
    assert!(s.tied, "no output.weight: the embedding is the head");

    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    let f = |k: &str| cfg[k].clone();
    assert_eq!((f("architectures"), f("model_type")), (json!(["Gemma3ForCausalLM"]), json!("gemma3_text")));
    assert_eq!(
        [
            f("vocab_size"),
            f("hidden_size"),
            f("intermediate_size"),
            f("num_hidden_layers"),
            f("num_attention_heads"),
            f("num_key_value_heads"),
            f("head_dim")
        ],
        [json!(280), json!(32), json!(64), json!(7), json!(2), json!(1), json!(16)]
    );
    assert_eq!(
        (f("rms_norm_eps"), f("max_position_embeddings"), f("query_pre_attn_scalar")),
        (json!(1e-6), json!(512), json!(16))
    );
    assert_eq!(
        (f("sliding_window"), f("hidden_activation"), f("tie_word_embeddings")),
        (json!(16), json!("gelu_pytorch_tanh"), json!(true))
    );
    let s_ = "sliding_attention";
    assert_eq!(f("layer_types"), json!([s_, s_, s_, s_, s_, "full_attention", s_]));
    assert_eq!((f("rope_theta"), f("rope_local_base_freq")), (json!(1000000.0), json!(10000.0)));
    assert_eq!(f("rope_scaling"), json!({ "rope_type": "linear", "factor": 8.0 }));
    assert_eq!(
        f("rope_parameters")["full_attention"],
        json!({ "rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0 })
    );
    assert_eq!(f("rope_parameters")["sliding_attention"], json!({ "rope_type": "default", "rope_theta": 10000.0 }));
    assert_eq!((f("final_logit_softcapping"), f("attn_logit_softcapping")), (json!(null), json!(null)));
    assert_eq!(
        (f("bos_token_id"), f("eos_token_id"), f("pad_token_id")),
        (json!(2), json!([1, 5]), json!(0)),
        "EOS and <end_of_turn>"
    );
    let gen: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("generation_config.json")).unwrap()).unwrap();
    assert_eq!(gen["eos_token_id"], json!([1, 5]));
    // Core reads it as Gemma 3: windows on all but layer 5, the global layers' scaling.
    let mc = ModelConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(
        (mc.architecture.as_str(), mc.eos_token_ids.clone(), mc.bos_token_id),
        ("Gemma3ForCausalLM", vec![1, 5], Some(2))
    );
    assert_eq!(mc.attn_scale(), 0.25, "1/sqrt(head_dim 16)");
    assert_eq!(mc.layer_windows, [16, 16, 16, 16, 16, 0, 16]);
    let local = mc.local_rope.as_ref().expect("the sliding layers' rope");
    assert_eq!((local.theta, mc.rope_theta), (10000.0, 1e6));
    assert_eq!(local.layers, [true, true, true, true, true, false, true]);
    assert_eq!(local.scaling, tandem_core::config::RopeScaling::None);
    assert_eq!(mc.rope_scaling, tandem_core::config::RopeScaling::Linear { factor: 8.0 }, "on the global layers");
    let opts =
        tandem_core::model::LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
    tandem_core::Model::load(tandem_reference::RefBackend::new(), &out, opts).unwrap();
    let tc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("tokenizer_config.json")).unwrap()).unwrap();
    assert_eq!(
        (tc["tokenizer_class"].clone(), tc["add_bos_token"].clone(), tc["bos_token"].clone()),
        (json!("GemmaTokenizer"), json!(true), json!("<bos>"))
    );
    let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    assert_eq!(tok.encode("hello world", true).unwrap().get_ids(), &[2, 273, 278]);

    // Every tensor under HF's name, at HF's shape, with HF's values (norms less llama.cpp's 1).
    let w = Weights::open(&out).unwrap();
    assert!(!w.contains("lm_head.weight"));
    for (name, shape, values) in &expect {
        let got = w.get(name, shape).unwrap_or_else(|e| panic!("{name}: {e}")).to_f32();
        assert_eq!(&got, &bf16_round(values), "{name}");
    }
    assert_eq!(expect.len(), s.tensors, "no tensor beyond those checked");
    let n = w.get("model.layers.3.post_feedforward_layernorm.weight", &[32]).unwrap().to_f32();
    assert!(n.iter().all(|x| x.abs() <= 0.5), "norms come back near 0, not near 1: {n:?}");

    // Without scaling (Gemma 3 1B) the rope fields say so; a missing window is an error.
    let g2 = root.join("noscale.gguf");
    tiny_gemma3_gguf(&g2, &|m| m.retain(|(k, _)| !k.starts_with("gemma3.rope.scaling")));
    convert(&g2, &root.join("out2")).unwrap();
    let cfg2: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("out2/config.json")).unwrap()).unwrap();
    assert_eq!(cfg2["rope_scaling"], json!(null));
    assert_eq!(cfg2["rope_parameters"]["full_attention"], json!({ "rope_type": "default", "rope_theta": 1000000.0 }));
    let g3 = root.join("nowindow.gguf");
    tiny_gemma3_gguf(&g3, &|m| m.retain(|(k, _)| *k != "gemma3.attention.sliding_window"));
    let e = convert(&g3, &root.join("out3")).unwrap_err().to_string();
    assert!(e.contains("gemma3.attention.sliding_window") && e.contains("nowindow.gguf"), "{e}");
    let g4 = root.join("yarn.gguf");
    tiny_gemma3_gguf(&g4, &|m| {
        for (k, v) in m.iter_mut() {
            if *k == "gemma3.rope.scaling.type" {
                *v = Value::String("yarn".into());
            }
        }
    });
    let e = convert(&g4, &root.join("out4")).unwrap_err().to_string();
    assert!(e.contains("`yarn`"), "{e}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn gemma3_layer_types_follow_llama_cpp_pattern_of_six() {
    let t = GemmaParams::layer_types(26); // Gemma 3 1B
    let full: Vec<usize> = (0..26).filter(|&i| t[i] == "full_attention").collect();
    assert_eq!(full, vec![5, 11, 17, 23]);
}

/// End to end: a Gemma 3 HF directory, written out in llama.cpp's GGUF layout as its exporter
/// does (names, norms plus 1, `gemma3.*` keys), converted back, gives the same logits as the
/// directory it came from, run on the reference backend. The directory is the seeded
/// tiny-gemma3 (bf16) grown to 6 layers (layer i's weights from layer i % 2), so that layer 5
/// is global under llama.cpp's fixed pattern, with `query_pre_attn_scalar` = head_dim: GGUF
/// has no key for either, and llama.cpp implies both.
#[test]
fn gemma3_through_llama_cpp_layout_gives_the_same_logits() {
    use crate::random_model::{write_random_model, Shape};
    use tandem_core::greedy;
    let root = std::env::temp_dir().join(format!("tandem-convert-gemma3-e2e-{}", std::process::id()));
    let (src, hf, conv) = (root.join("src"), root.join("hf"), root.join("conv"));
    write_random_model(&src, Shape::TinyGemma3, 3, DType::BF16).unwrap();
    let layers = 6;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let c = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("{k}")) as u32;
    let (hidden, heads, kv, hd, ffn, vocab, window) = (
        c("hidden_size"),
        c("num_attention_heads"),
        c("num_key_value_heads"),
        c("head_dim"),
        c("intermediate_size"),
        c("vocab_size"),
        c("sliding_window"),
    );
    let context = c("max_position_embeddings");
    assert_eq!(cfg["rope_scaling"]["factor"], json!(8.0), "the global layers' scaling is exercised");
    cfg["num_hidden_layers"] = json!(layers);
    let s_ = "sliding_attention";
    cfg["layer_types"] = json!([s_, s_, s_, s_, s_, "full_attention"]);
    cfg["query_pre_attn_scalar"] = json!(hd);

    // The 6-layer HF directory, and its tensors under llama.cpp's names.
    let w = Weights::open(&src).unwrap();
    let mut hf_tensors: Vec<(String, Vec<usize>, Vec<f32>)> = vec![];
    for name in w.names() {
        let shape = w.shape(name).unwrap().to_vec();
        let values = w.get(name, &shape).unwrap().to_f32();
        match name.strip_prefix("model.layers.") {
            Some(rest) => {
                let (l, tail) = rest.split_once('.').unwrap();
                for i in (0..layers).filter(|i| i % 2 == l.parse::<usize>().unwrap()) {
                    hf_tensors.push((format!("model.layers.{i}.{tail}"), shape.clone(), values.clone()));
                }
            }
            None => hf_tensors.push((name.to_string(), shape, values)),
        }
    }
    std::fs::create_dir_all(&hf).unwrap();
    write_json(&hf.join("config.json"), &cfg).unwrap();
    let st = hf.join("model.safetensors");
    let specs = hf_tensors.iter().map(|(n, s, _)| TensorSpec::new(n.clone(), DType::BF16, s)).collect();
    let mut sw = SafetensorsWriter::new(std::fs::File::create(&st).unwrap(), &st, specs).unwrap();
    let order: Vec<String> = sw.specs().iter().map(|s| s.name.clone()).collect();
    for n in &order {
        sw.push(&hf_tensors.iter().find(|t| &t.0 == n).unwrap().2).unwrap();
    }
    sw.finish().unwrap();

    let gguf_name = |hf: &str| -> String {
        let top = [("model.embed_tokens.weight", "token_embd.weight"), ("model.norm.weight", "output_norm.weight")];
        if let Some((_, g)) = top.iter().find(|(h, _)| *h == hf) {
            return g.to_string();
        }
        let rest = hf.strip_prefix("model.layers.").unwrap();
        let (l, part) = rest.split_once('.').unwrap();
        let g = match part.strip_suffix(".weight").unwrap() {
            "input_layernorm" => "attn_norm",
            "self_attn.q_norm" => "attn_q_norm",
            "self_attn.k_norm" => "attn_k_norm",
            "post_attention_layernorm" => "post_attention_norm",
            "pre_feedforward_layernorm" => "ffn_norm",
            "post_feedforward_layernorm" => "post_ffw_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            other => panic!("unexpected HF tensor {other}"),
        };
        format!("blk.{l}.{g}.weight")
    };
    let tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = hf_tensors
        .iter()
        .map(|(n, shape, v)| {
            // convert_hf_to_gguf.py: Gemma3Model.norm_shift adds 1 to every `*norm.weight`.
            let v: Vec<f32> = if n.ends_with("norm.weight") { v.iter().map(|x| x + 1.0).collect() } else { v.clone() };
            (
                gguf_name(n),
                shape.iter().rev().map(|&d| d as u64).collect(),
                0,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            )
        })
        .collect();
    let mut meta = arch_meta(
        "gemma3",
        vec![
            ("block_count", Value::U32(layers as u32)),
            ("context_length", Value::U32(context)),
            ("embedding_length", Value::U32(hidden)),
            ("feed_forward_length", Value::U32(ffn)),
            ("attention.head_count", Value::U32(heads)),
            ("attention.head_count_kv", Value::U32(kv)),
            ("attention.key_length", Value::U32(hd)),
            ("attention.value_length", Value::U32(hd)),
            ("attention.layer_norm_rms_epsilon", Value::F32(cfg["rms_norm_eps"].as_f64().unwrap() as f32)),
            ("attention.sliding_window", Value::U32(window)),
            ("rope.freq_base", Value::F32(cfg["rope_theta"].as_f64().unwrap() as f32)),
            ("rope.scaling.type", Value::String("linear".into())),
            ("rope.scaling.factor", Value::F32(8.0)),
        ],
    );
    // A SentencePiece vocabulary of the model's size (the logits below need no text).
    let mut toks: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"].map(String::from).to_vec();
    toks.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    toks.extend((toks.len()..vocab as usize).map(|i| format!("p{i}")));
    meta.extend([
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", Value::Array(toks.iter().map(|t| Value::String(t.clone())).collect())),
        ("tokenizer.ggml.bos_token_id", Value::U32(2)),
        ("tokenizer.ggml.eos_token_id", Value::U32(1)),
    ]);
    let gguf = root.join("tiny-gemma3-6l.gguf");
    let refs: Vec<(&str, Vec<u64>, u32, Vec<u8>)> =
        tensors.iter().map(|(n, d, t, b)| (n.as_str(), d.clone(), *t, b.clone())).collect();
    std::fs::write(&gguf, writer::file(&meta, &refs, 32)).unwrap();
    convert(&gguf, &conv).unwrap();

    let opts = || tandem_core::model::LoadOptions {
        max_batch_tokens: 64,
        max_seqs: 2,
        num_kv_blocks: 16,
        ..Default::default()
    };
    let mut a = tandem_core::Model::load(tandem_reference::RefBackend::new(), &hf, opts()).unwrap();
    let mut b = tandem_core::Model::load(tandem_reference::RefBackend::new(), &conv, opts()).unwrap();
    let mut worst = 0f32;
    // Prompts past the window (16), so the sliding layers slide.
    for (k, len) in [1usize, 17, 40].into_iter().enumerate() {
        let prompt: Vec<u32> = (0..len).map(|i| ((i * 37 + k * 11 + 5) % vocab as usize) as u32).collect();
        let x = greedy::generate(&mut a, &prompt, 4, &[], true, |_| {}).unwrap();
        let y = greedy::generate(&mut b, &prompt, 4, &[], true, |_| {}).unwrap();
        assert_eq!(
            x.iter().map(|s| s.id).collect::<Vec<_>>(),
            y.iter().map(|s| s.id).collect::<Vec<_>>(),
            "prompt of {len}"
        );
        for (s, t) in x.iter().zip(&y) {
            worst = s.logits.iter().zip(&t.logits).map(|(p, q)| (p - q).abs()).fold(worst, f32::max);
        }
    }
    eprintln!("gemma3 round trip: max |logit difference| {worst:e}");
    assert_eq!(worst, 0.0, "the converted directory computes what the original does");
    std::fs::remove_dir_all(&root).unwrap();
}
