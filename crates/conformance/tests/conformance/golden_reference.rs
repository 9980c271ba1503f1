//! The reference backend against HF transformers (tests/golden, made by tests/hf_golden.py).

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::DType;
use tandem_reference::RefBackend;

fn check(name: &str, dir: &std::path::Path, tol: f64) {
    golden::assert_golden(RefBackend::new(), name, dir, tol);
}

#[test]
fn tiny_untied_gqa2_f32() {
    check("tiny", &golden::random_model("tiny", 1, DType::F32), 1e-3);
}

#[test]
fn tiny_tied_bf16() {
    check("tiny-tied", &golden::random_model("tiny-tied", 2, DType::BF16), 1e-3);
}

/// Qwen3: per-head q/k norms, head_dim 32 with hidden 64 and 4 heads, tied, eps 1e-6.
#[test]
fn tiny_qwen3_f32() {
    check("tiny-qwen3", &golden::random_model("tiny-qwen3", 3, DType::F32), 1e-3);
}

/// Qwen3-MoE: 8 experts of width 48, top 2, norm_topk_prob; Qwen3's attention.
#[test]
fn tiny_qwen3_moe_f32() {
    check("tiny-qwen3-moe", &golden::random_model("tiny-qwen3-moe", 4, DType::F32), 1e-3);
}

/// Mixtral: 4 experts (block_sparse_moe, w1/w3/w2) of width 96, top 2, renormalised.
#[test]
fn tiny_mixtral_f32() {
    check("tiny-mixtral", &golden::random_model("tiny-mixtral", 5, DType::F32), 1e-3);
}

/// Mistral with a sliding window of 16 keys on every layer, shorter than the golden prompts
/// (up to 40 tokens and 12 more generated): HF's sliding-window mask.
#[test]
fn tiny_mistral_window_f32() {
    check("tiny-mistral", &golden::random_model("tiny-mistral", 6, DType::F32), 1e-3);
}

/// Qwen2: q/k/v biases, tied; `use_sliding_window` with `max_window_layers` 1: layer 0 full,
/// layer 1 windowed (16 keys).
#[test]
fn tiny_qwen2_window_f32() {
    check("tiny-qwen2", &golden::random_model("tiny-qwen2", 7, DType::F32), 1e-3);
}

/// Gemma 3: a sliding layer (16 keys, rope base 1e4) and a global one (1e6, linear 8), GeGLU,
/// sandwich norms of 1 + w, the scaled embedding, `query_pre_attn_scalar` 24, tied.
#[test]
fn tiny_gemma3_f32() {
    check("tiny-gemma3", &golden::random_model("tiny-gemma3", 8, DType::F32), 1e-3);
}

/// The Gemma 3 golden tells each of its own settings missing: the local rope, the score scale,
/// the window, the GeGLU (silu instead).
#[test]
fn gemma3_golden_catches_its_own_pieces_missing() {
    let dir = golden::random_model("tiny-gemma3", 8, DType::F32);
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-gemma3.json")).unwrap();
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = tandem_core::weights::Weights::open(&dir).unwrap();
    let told = |cfg: tandem_core::ModelConfig| match golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3) {
        Err(e) => Some(e),
        Ok(lines) => lines.iter().find(|l| !l.contains("diverged at None")).cloned(),
    };
    assert_eq!(told(cfg.clone()), None, "as written");
    let wrong: [(&str, fn(&mut tandem_core::ModelConfig)); 4] = [
        ("no local rope", |c| c.local_rope = None),
        ("scale head_dim^-1/2", |c| c.query_pre_attn_scalar = None),
        ("no window", |c| c.layer_windows.iter_mut().for_each(|w| *w = 0)),
        ("silu", |c| c.activation = tandem_core::config::Activation::Silu),
    ];
    for (what, edit) in wrong {
        let mut c = cfg.clone();
        edit(&mut c);
        println!("gemma3, {what}: {}", told(c).unwrap_or_else(|| panic!("Gemma 3 with {what} must be told")));
    }
}

/// The windowed goldens tell a model that ignores the window (every layer full attention).
#[test]
fn window_goldens_catch_a_missing_window() {
    for (name, seed) in [("tiny-mistral", 6), ("tiny-qwen2", 7)] {
        let dir = golden::random_model(name, seed, DType::F32);
        let g = GoldenFile::load(&golden::golden_dir().join(format!("{name}.json"))).unwrap();
        let mut cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
        assert!(cfg.layer_windows.contains(&16), "{name}: {:?}", cfg.layer_windows);
        let w = tandem_core::weights::Weights::open(&dir).unwrap();
        cfg.layer_windows = vec![0; cfg.num_hidden_layers];
        let told = match golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3) {
            Err(e) => Some(e),
            Ok(lines) => lines.iter().find(|l| !l.contains("diverged at None")).cloned(),
        };
        println!("{name} without its window: {}", told.expect("a model without its sliding window must be told"));
    }
}

/// The tiny Qwen3's chat template against HF's `apply_chat_template`, with and without
/// `enable_thinking` (the variable `chat_template_kwargs` carries).
#[test]
fn tiny_qwen3_chat_template_enable_thinking() {
    let dir = golden::random_model("tiny-qwen3", 3, DType::F32);
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-qwen3.json")).unwrap();
    let tok = tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(g.chat_render.len(), 6);
    assert!(g.chat_render.iter().any(|c| c.text.contains("<think>")), "enable_thinking false must write the empty think block");
    for c in &g.chat_render {
        assert_eq!(tok.apply_chat_template_with_kwargs(&c.messages, None, true, c.kwargs.as_ref()).unwrap(), c.text, "kwargs {:?}", c.kwargs);
    }
}

/// The tiny Gemma 3's template (Gemma's constructs: system folded into the first turn, roles
/// alternating or `raise_exception`, `model` for the assistant, trimmed string or text-part
/// content) against HF's `apply_chat_template`; roles out of turn are refused with its message.
#[test]
fn tiny_gemma3_chat_template() {
    let dir = golden::random_model("tiny-gemma3", 8, DType::F32);
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-gemma3.json")).unwrap();
    let tok = tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(g.chat_render.len(), 3);
    for c in &g.chat_render {
        assert_eq!(tok.apply_chat_template(&c.messages, true).unwrap(), c.text);
    }
    let twice: Vec<serde_json::Value> = serde_json::from_str(r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#).unwrap();
    let e = tok.apply_chat_template(&twice, true).unwrap_err().to_string();
    assert!(e.contains("must alternate"), "{e}");
}

#[test]
fn smollm2_135m() {
    let Some(dir) = golden::smollm2_dir() else { return };
    check("smollm2-135m", &dir, 1e-3);
}

/// Our converted tokenizer.json against transformers' own GGUF tokenizer, and our chat
/// template rendering against transformers' `apply_chat_template`.
#[test]
fn smollm2_tokenizer_and_chat_template() {
    let Some(dir) = golden::smollm2_dir() else { return };
    let g = GoldenFile::load(&golden::golden_dir().join("smollm2-135m.json")).unwrap();
    let tok = tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    assert!(g.tokenize.len() >= 8 && g.chat_render.len() >= 2);
    for c in &g.tokenize {
        assert_eq!(tok.encode(&c.text, false).unwrap(), c.ids, "ids of {:?}", c.text);
    }
    for c in &g.chat_render {
        assert_eq!(tok.apply_chat_template(&c.messages, true).unwrap(), c.text);
    }
    for c in g.cases.iter().filter(|c| c.kind == "chat") {
        let text = tok.apply_chat_template(c.messages.as_ref().unwrap(), true).unwrap();
        assert_eq!(tok.encode(&text, false).unwrap(), c.prompt_ids, "chat prompt ids (no double BOS)");
    }
    for c in g.cases.iter().filter(|c| c.kind == "plain") {
        assert_eq!(tok.encode(c.prompt.as_ref().unwrap(), true).unwrap(), c.prompt_ids, "plain prompt ids");
    }
}

/// The golden check is only worth something if it fails on a model that is slightly wrong:
/// a norm weight off by 2%, or Q/K rows left in llama.cpp's rope order (the converter's
/// un-permutation skipped).
#[test]
fn smollm2_golden_catches_broken_weights() {
    let Some(dir) = golden::smollm2_dir() else { return };
    let g = GoldenFile::load(&golden::golden_dir().join("smollm2-135m.json")).unwrap();
    let g = GoldenFile { cases: g.cases[..1].to_vec(), ..g };
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let open = || tandem_core::weights::Weights::open(&dir).unwrap();

    let mut w = open();
    let name = "model.layers.5.post_attention_layernorm.weight";
    let t = w.get(name, &[cfg.hidden_size]).unwrap();
    let scaled: Vec<f32> = t.to_f32().iter().map(|x| x * 1.02).collect();
    w.replace(name, t.dtype, &t.shape.clone(), &scaled).unwrap();
    let e = golden::check_weights(RefBackend::new(), cfg.clone(), &w, &g, 1e-3).expect_err("a 2% norm error must fail");
    println!("norm scaled by 1.02: {e}");

    let mut w = open();
    for l in 0..cfg.num_hidden_layers {
        for (p, heads, rows) in [("q", cfg.num_attention_heads, cfg.q_dim()), ("k", cfg.num_key_value_heads, cfg.kv_dim())] {
            let name = format!("model.layers.{l}.self_attn.{p}_proj.weight");
            let t = w.get(&name, &[rows, cfg.hidden_size]).unwrap();
            let permuted = tandem_models::convert::rope_permute(&t.to_f32(), heads, cfg.hidden_size);
            w.replace(&name, t.dtype, &t.shape.clone(), &permuted).unwrap();
        }
    }
    let e = golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).expect_err("Q/K in llama.cpp's order must fail");
    println!("Q/K not un-permuted: {e}");
}

/// The new families' golden data tell a model slightly wrong in what is their own: Qwen3
/// without its q/k norms (weights set to 1), Qwen3-MoE without the top-k renormalisation,
/// Mixtral routed to its top 1 instead of 2. "Tell": the check fails, or greedy diverges from
/// HF's (which vLLM's rule alone lets pass when both tokens are in the other's top 5; the
/// correct model diverges nowhere).
#[test]
fn new_family_goldens_catch_their_own_pieces_missing() {
    let load = |name: &str, seed: u64| {
        let dir = golden::random_model(name, seed, DType::F32);
        let g = GoldenFile::load(&golden::golden_dir().join(format!("{name}.json"))).unwrap();
        let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let w = tandem_core::weights::Weights::open(&dir).unwrap();
        (g, cfg, w)
    };
    let told = |cfg: tandem_core::ModelConfig, w: &tandem_core::weights::Weights, g: &GoldenFile| match golden::check_weights(RefBackend::new(), cfg, w, g, 1e-3) {
        Err(e) => Some(e),
        Ok(lines) => lines.iter().find(|l| !l.contains("diverged at None")).cloned(),
    };
    let (g, cfg, mut w) = load("tiny-qwen3", 3);
    assert_eq!(told(cfg.clone(), &w, &g), None, "as written");
    for l in 0..cfg.num_hidden_layers {
        for p in ["q", "k"] {
            let name = format!("model.layers.{l}.self_attn.{p}_norm.weight");
            let t = w.get(&name, &[cfg.head_dim]).unwrap();
            w.replace(&name, t.dtype, &t.shape.clone(), &vec![1.0; cfg.head_dim]).unwrap();
        }
    }
    println!("qwen3, q/k norm weights 1: {}", told(cfg, &w, &g).expect("Qwen3 without its q/k norm weights must be told"));

    let (g, mut cfg, w) = load("tiny-qwen3-moe", 4);
    assert_eq!(told(cfg.clone(), &w, &g), None, "as written");
    cfg.moe.as_mut().unwrap().norm_topk_prob = false;
    println!("qwen3-moe, norm_topk_prob false: {}", told(cfg, &w, &g).expect("Qwen3-MoE without renormalisation must be told"));

    let (g, mut cfg, w) = load("tiny-mixtral", 5);
    assert_eq!(told(cfg.clone(), &w, &g), None, "as written");
    cfg.moe.as_mut().unwrap().top_k = 1;
    println!("mixtral, top 1: {}", told(cfg, &w, &g).expect("Mixtral on one expert must be told"));
}
