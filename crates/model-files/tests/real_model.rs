//! Checks on the real default model, once `cargo xtask fetch-model` has installed it under
//! models/. Without it, each test says SKIPPED and why (it needs a 93 MB download).
//!
//! Expected ids and the rendered chat text were taken from Hugging Face transformers 5.24 on the
//! same GGUF (xtask/scripts/check_convert_hf.py), with SmolLM's digit-isolating pre-tokenizer.

use std::path::PathBuf;

use tandem_core::tokenizer::Tokenizer;
use tandem_core::weights::Weights;
use tandem_core::ModelConfig;

fn installed() -> Option<PathBuf> {
    tandem_model_files::fetch::installed_default(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

#[test]
fn smollm2_shapes_load_in_core() {
    let Some(dir) = installed() else { return };
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    assert_eq!(cfg.architecture, "LlamaForCausalLM");
    assert_eq!(
        (
            cfg.num_hidden_layers,
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.vocab_size,
            cfg.head_dim
        ),
        (30, 576, 9, 3, 49152, 64)
    );
    assert_eq!(cfg.intermediate_size, 1536);
    assert!(cfg.tie_word_embeddings);
    assert_eq!((cfg.rms_norm_eps, cfg.rope_theta), (1e-5, 100000.0));
    assert_eq!((cfg.bos_token_id, cfg.eos_token_ids.clone()), (Some(1), vec![2]));
    let w = Weights::open(&dir).unwrap();
    assert_eq!(w.names().count(), 272);
    assert!(!w.contains("lm_head.weight"));
    let (d, q, kv, f) = (576, 576, 192, 1536);
    for i in [0, 29] {
        let p = format!("model.layers.{i}");
        w.get(&format!("{p}.self_attn.q_proj.weight"), &[q, d]).unwrap();
        w.get(&format!("{p}.self_attn.k_proj.weight"), &[kv, d]).unwrap();
        w.get(&format!("{p}.self_attn.o_proj.weight"), &[d, q]).unwrap();
        w.get(&format!("{p}.mlp.down_proj.weight"), &[d, f]).unwrap();
    }
    let norm = w.get("model.norm.weight", &[d]).unwrap().to_f32();
    assert!(norm.iter().all(|x| x.is_finite()) && norm.iter().any(|x| *x != 0.0));
}

#[test]
fn smollm2_tokenizer_and_chat_template() {
    let Some(dir) = installed() else { return };
    let tok = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(tok.vocab_size(), 49152);
    // Digits one by one (33..=37 are "1".."5"); no BOS is added.
    assert_eq!(tok.encode("Hello, world! 12345", true).unwrap(), [19556, 28, 905, 17, 216, 33, 34, 35, 36, 37]);
    assert_eq!(tok.encode("3.14 ½", false).unwrap(), [35, 30, 33, 36, 216, 16738]);
    assert_eq!(tok.encode("<|im_start|>user\nHi<|im_end|>\n", false).unwrap(), [1, 4093, 198, 26843, 2, 198]);
    assert_eq!(tok.decode(&[19556, 28, 905, 17, 216, 33, 34, 35, 36, 37], true).unwrap(), "Hello, world! 12345");
    let msgs = [serde_json::json!({"role": "user", "content": "What is the capital of France?"})];
    assert_eq!(
        tok.apply_chat_template(&msgs, true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    );
}
