//! tokenizer.json and tokenizer_config.json of a model directory: loading (our fast BPE path
//! and the tokenizers crate), the chat template's compile, then encoding and decoding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const CONFIG: &str = r#"{"bos_token":"<s>","eos_token":"</s>","chat_template":"{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"}"#;

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    static VALID: OnceLock<Vec<u8>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        // libFuzzer's panic hook aborts on every panic, caught or not; `Tokenizer::from_dir`
        // catches the tokenizers crate's own panics on malformed files (an error, not a crash),
        // so this target installs a silent hook instead. A panic nobody catches still aborts the
        // run (libfuzzer-sys aborts when the target unwinds); replay its input to see it.
        std::panic::set_hook(Box::new(|_| {}));
        tandem_fuzz::scratch_dir("tokenizer")
    });
    let valid = VALID.get_or_init(|| {
        let d = tandem_fuzz::scratch_dir("tokenizer-valid");
        tandem_server::test_support::write_tiny_tokenizer(&d, 32).expect("tiny tokenizer");
        std::fs::read(d.join("tokenizer.json")).expect("tiny tokenizer.json")
    });
    // The first byte picks which file the rest is: tokenizer.json, or tokenizer_config.json
    // beside a valid tokenizer.json.
    let (which, rest) = data.split_first().unwrap_or((&0, &[]));
    if which & 1 == 0 {
        tandem_fuzz::write(dir, "tokenizer.json", rest);
        tandem_fuzz::write(dir, "tokenizer_config.json", CONFIG.as_bytes());
    } else {
        tandem_fuzz::write(dir, "tokenizer.json", valid);
        tandem_fuzz::write(dir, "tokenizer_config.json", rest);
    }
    if let Ok(tok) = tandem_core::tokenizer::Tokenizer::from_dir(dir) {
        if let Ok(ids) = tok.encode("Hello, world! 12 日本 🦀 <s> \n\t", true) {
            let _ = tok.decode(&ids, false);
            let _ = tok.decode(&ids, true);
        }
        let n = tok.vocab_size() as u32;
        let _ = tok.decode(&[0, n.saturating_sub(1), n, n + 7, u32::MAX], false);
        let _ = tok.apply_chat_template(&[serde_json::json!({"role": "user", "content": "hi"})], true);
    }
});
