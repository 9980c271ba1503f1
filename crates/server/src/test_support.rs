//! Fixtures for tests, examples and benchmarks: a tiny word-level tokenizer written to disk.
//! Nothing here is used when serving a real model.

use std::path::Path;

use serde_json::{json, Value};

/// Special tokens, ids 0..5.
pub const SPECIALS: [&str; 5] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];

/// `vocab - 5` ordinary words after the special tokens: a few English ones, then `w0`, `w1`, …
pub fn words(vocab: usize) -> Vec<String> {
    let mut w: Vec<String> = ["hello", "world", "user", "assistant", "system", "the", "cat", "sat", "on", "mat"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    w.truncate(vocab.saturating_sub(SPECIALS.len()));
    let mut i = 0;
    while SPECIALS.len() + w.len() < vocab {
        w.push(format!("w{i}"));
        i += 1;
    }
    w
}

/// Writes `tokenizer.json` (WordLevel over [`words`], whitespace pre-tokenizer; decoding joins
/// words with spaces) and `tokenizer_config.json` (a ChatML template) into `dir`.
pub fn write_tiny_tokenizer(dir: &Path, vocab: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut ids = serde_json::Map::new();
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            ids.insert(s.to_string(), json!(i));
            json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    for (i, w) in words(vocab).iter().enumerate() {
        ids.insert(w.clone(), json!(SPECIALS.len() + i));
    }
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": ids, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tok.to_string())?;
    let template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let cfg = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string())
}
