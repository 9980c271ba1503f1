//! The reference backend against HF transformers (tests/golden, made by tests/hf_golden.py).

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::DType;
use tandem_reference::RefBackend;

fn check(name: &str, dir: &std::path::Path, tol: f64) {
    let g = GoldenFile::load(&golden::golden_dir().join(format!("{name}.json"))).unwrap();
    match golden::check_model(RefBackend::new(), dir, &g, tol) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn tiny_untied_gqa2_f32() {
    check("tiny", &golden::random_model("tiny", 1, DType::F32), 1e-3);
}

#[test]
fn tiny_tied_bf16() {
    check("tiny-tied", &golden::random_model("tiny-tied", 2, DType::BF16), 1e-3);
}

#[test]
fn smollm2_135m() {
    let Some(dir) = golden::smollm2_dir() else { return };
    check("smollm2-135m", &dir, 5e-3);
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
