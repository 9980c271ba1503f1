//! The reference backend against HF transformers (tests/golden, made by tests/hf_golden.py).

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::DType;
use tandem_reference::RefBackend;

fn check(name: &str) {
    golden::assert_golden(RefBackend::new(), name, &golden::golden_model(name), 1e-3);
}

tandem_conformance::golden_tests!(check);

/// The Gemma 3 golden tells each of its own settings missing: the local rope, the score scale,
/// the window, the GeGLU (silu instead).
#[test]
fn gemma3_golden_catches_its_own_pieces_missing() {
    let dir = golden::golden_model("tiny-gemma3");
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-gemma3.json")).unwrap();
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let w = tandem_core::weights::Weights::open(&dir).unwrap();
    let told = |cfg: tandem_core::ModelConfig| match golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3) {
        Err(e) => Some(e),
        Ok(lines) => lines.iter().find(|l| !l.contains("diverged at None")).cloned(),
    };
    assert_eq!(told(cfg.clone()), None, "as written");
    type Edit = fn(&mut tandem_core::ModelConfig);
    let wrong: [(&str, Edit); 4] = [
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

/// A Gemma 3 multimodal checkpoint (`Gemma3ForConditionalGeneration`: its text model in
/// `text_config`, its weights under `language_model.model.`, a vision tower beside them) serves
/// its text model: tiny-gemma3 repackaged so passes tiny-gemma3's golden.
#[test]
fn gemma3_multimodal_layout_runs_its_text_model() {
    let dir = golden::golden_model("tiny-gemma3");
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-gemma3.json")).unwrap();
    let text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let wrapped = serde_json::json!({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model"}, "mm_tokens_per_image": 256});
    let cfg = tandem_core::ModelConfig::from_json(&wrapped.to_string()).unwrap();
    let plain = tandem_core::weights::Weights::open(&dir).unwrap();
    let mut w = tandem_core::weights::Weights::empty();
    for name in plain.names() {
        let t = plain.get(name, plain.shape(name).unwrap()).unwrap();
        let moved = name.replacen("model.", "language_model.model.", 1);
        w.replace(&moved, t.dtype, &t.shape.clone(), &t.to_f32()).unwrap();
    }
    w.replace("vision_tower.vision_model.embeddings.patch_embedding.weight", DType::F32, &[4, 3], &[0.5; 12]).unwrap();
    assert!(!w.names().any(|n| n.starts_with("model.")));
    let lines = golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).unwrap();
    assert!(lines.iter().all(|l| l.contains("diverged at None")), "{lines:?}");
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
    let dir = golden::golden_model("tiny-qwen3");
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-qwen3.json")).unwrap();
    let tok = tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(g.chat_render.len(), 6);
    assert!(
        g.chat_render.iter().any(|c| c.text.contains("<think>")),
        "enable_thinking false must write the empty think block"
    );
    for c in &g.chat_render {
        assert_eq!(
            tok.apply_chat_template_with_kwargs(&c.messages, None, true, c.kwargs.as_ref()).unwrap(),
            c.text,
            "kwargs {:?}",
            c.kwargs
        );
    }
}

/// The tiny Gemma 3's template (Gemma's constructs: system folded into the first turn, roles
/// alternating or `raise_exception`, `model` for the assistant, trimmed string or text-part
/// content) against HF's `apply_chat_template`; roles out of turn are refused with its message.
#[test]
fn tiny_gemma3_chat_template() {
    let dir = golden::golden_model("tiny-gemma3");
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-gemma3.json")).unwrap();
    let tok = tandem_core::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(g.chat_render.len(), 3);
    for c in &g.chat_render {
        assert_eq!(tok.apply_chat_template(&c.messages, true).unwrap(), c.text);
    }
    let twice: Vec<serde_json::Value> =
        serde_json::from_str(r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#).unwrap();
    let e = tok.apply_chat_template(&twice, true).unwrap_err().to_string();
    assert!(e.contains("must alternate"), "{e}");
}

#[test]
fn smollm2_135m() {
    let Some(dir) = golden::smollm2_dir() else { return };
    golden::assert_golden(RefBackend::new(), "smollm2-135m", &dir, 1e-3);
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
        for (p, heads, rows) in
            [("q", cfg.num_attention_heads, cfg.q_dim()), ("k", cfg.num_key_value_heads, cfg.kv_dim())]
        {
            let name = format!("model.layers.{l}.self_attn.{p}_proj.weight");
            let t = w.get(&name, &[rows, cfg.hidden_size]).unwrap();
            let permuted = tandem_model_files::convert::rope_permute(&t.to_f32(), heads, cfg.hidden_size);
            w.replace(&name, t.dtype, &t.shape.clone(), &permuted).unwrap();
        }
    }
    let e =
        golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).expect_err("Q/K in llama.cpp's order must fail");
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
    let told =
        |cfg: tandem_core::ModelConfig, w: &tandem_core::weights::Weights, g: &GoldenFile| match golden::check_weights(
            RefBackend::new(),
            cfg,
            w,
            g,
            1e-3,
        ) {
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
    println!(
        "qwen3, q/k norm weights 1: {}",
        told(cfg, &w, &g).expect("Qwen3 without its q/k norm weights must be told")
    );

    let (g, mut cfg, w) = load("tiny-qwen3-moe", 4);
    assert_eq!(told(cfg.clone(), &w, &g), None, "as written");
    cfg.moe.as_mut().unwrap().norm_topk_prob = false;
    println!(
        "qwen3-moe, norm_topk_prob false: {}",
        told(cfg, &w, &g).expect("Qwen3-MoE without renormalisation must be told")
    );

    let (g, mut cfg, w) = load("tiny-mixtral", 5);
    assert_eq!(told(cfg.clone(), &w, &g), None, "as written");
    cfg.moe.as_mut().unwrap().top_k = 1;
    println!("mixtral, top 1: {}", told(cfg, &w, &g).expect("Mixtral on one expert must be told"));
}

/// A Qwen3-MoE directory saved by transformers 5.25 itself (tests/save_with_transformers.py
/// over tiny-qwen3-moe: its config.json says `num_local_experts` where the released files say
/// `num_experts`, and `rope_parameters`) loads and passes tiny-qwen3-moe's golden.
#[test]
fn qwen3_moe_saved_by_transformers5_passes_its_golden() {
    let dir = golden::golden_dir().join("tiny-qwen3-moe-tf5");
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(text.contains("\"num_local_experts\"") && !text.contains("\"num_experts\""), "{text}");
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    assert_eq!(cfg.moe.as_ref().map(|m| m.num_experts), Some(8));
    let w = tandem_core::weights::Weights::open(&dir).unwrap();
    let g = GoldenFile::load(&golden::golden_dir().join("tiny-qwen3-moe.json")).unwrap();
    let lines = golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).unwrap();
    assert!(lines.iter().all(|l| l.contains("diverged at None")), "{lines:?}");
}
