//! Builds a Hugging Face `tokenizer.json` for a byte-level BPE tokenizer (GPT-2 family), from a
//! vocabulary, merges and added tokens. Used for GGUF conversion and for random models.

use std::collections::HashMap;

use serde_json::{json, Value as Json};

/// A token the tokenizer matches before BPE (chat markers, end of text).
#[derive(Debug, Clone, PartialEq)]
pub struct AddedToken {
    pub id: u32,
    pub content: String,
    /// Special tokens are skipped when decoding with `skip_special_tokens`.
    pub special: bool,
}

/// How text is split before the byte-level BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2's regex only.
    ByteLevel,
    /// SmolLM: every digit on its own (`\p{N}`, isolated), then GPT-2's regex.
    DigitsThenByteLevel,
    /// Qwen2 / Qwen3 (llama.cpp's `qwen2` pre-tokenizer): text NFC-normalised, split by Qwen2's
    /// regex (single digits, letter runs with one leading non-letter, punctuation runs with
    /// their newlines), then byte-level without GPT-2's regex.
    Qwen2,
}

/// Qwen2's split pattern, as its tokenizer.json gives it.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The 256 printable characters GPT-2's byte-level BPE uses for bytes 0..=255, in byte order.
/// Printable Latin-1 bytes stand for themselves; the others are shifted to U+0100 and up.
pub fn byte_level_alphabet() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("Latin-1 is valid")
            } else {
                let c = char::from_u32(next).expect("U+0100.. is valid");
                next += 1;
                c
            }
        })
        .collect()
}

/// Text to its byte-level form (each UTF-8 byte to its alphabet character).
pub fn to_byte_level(text: &str) -> String {
    let alphabet = byte_level_alphabet();
    text.bytes().map(|b| alphabet[b as usize]).collect()
}

/// `tokenizer.json` as a JSON value. `vocab[i]` is the token with id `i`. The caller has checked
/// that tokens are unique and that every merge's parts and result are in the vocabulary
/// ([`check_bpe`]).
pub fn bpe_tokenizer_json(
    vocab: &[String],
    merges: &[(String, String)],
    added: &[AddedToken],
    pre: PreTokenizer,
) -> Json {
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    let pre_tokenizer = match pre {
        PreTokenizer::ByteLevel => byte_level,
        PreTokenizer::DigitsThenByteLevel => json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Split", "pattern": { "Regex": "\\p{N}" }, "behavior": "Isolated", "invert": false },
                byte_level,
            ],
        }),
        PreTokenizer::Qwen2 => json!({
            "type": "Sequence",
            "pretokenizers": [
                { "type": "Split", "pattern": { "Regex": QWEN2_PATTERN }, "behavior": "Isolated", "invert": false },
                { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false },
            ],
        }),
    };
    let normalizer = if pre == PreTokenizer::Qwen2 { json!({ "type": "NFC" }) } else { Json::Null };
    let mut vocab_map = serde_json::Map::with_capacity(vocab.len());
    for (id, tok) in vocab.iter().enumerate() {
        vocab_map.insert(tok.clone(), json!(id));
    }
    let added: Vec<Json> = added
        .iter()
        .map(|t| {
            json!({
                "id": t.id, "content": t.content, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": t.special,
            })
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true },
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true },
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab_map,
            // Pairs rather than "a b" strings: unambiguous even if a token held a space.
            "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>(),
        },
    })
}

/// `tokenizer.json` for Gemma's SentencePiece vocabulary, laid out as transformers'
/// `GemmaTokenizer` builds it: BPE with byte fallback (`<0x0A>` tokens for bytes the vocabulary
/// lacks), spaces normalised to `▁` with no prefix space, and a post-processor that puts `bos`
/// first where the tokenizer adds one. Same preconditions as [`bpe_tokenizer_json`].
pub fn gemma_tokenizer_json(
    vocab: &[String],
    merges: &[(String, String)],
    added: &[AddedToken],
    unk: Option<&str>,
    bos: Option<(&str, u32)>,
) -> Json {
    let mut json = bpe_tokenizer_json(vocab, merges, added, PreTokenizer::ByteLevel);
    json["normalizer"] = json!({ "type": "Replace", "pattern": { "String": " " }, "content": "\u{2581}" });
    json["pre_tokenizer"] =
        json!({ "type": "Split", "pattern": { "String": " " }, "behavior": "MergedWithPrevious", "invert": false });
    json["decoder"] = json!({
        "type": "Sequence",
        "decoders": [
            { "type": "Replace", "pattern": { "String": "\u{2581}" }, "content": " " },
            { "type": "ByteFallback" },
            { "type": "Fuse" },
        ],
    });
    json["post_processor"] = match bos {
        Some((b, id)) => {
            let special = |type_id: u32| json!({ "SpecialToken": { "id": b, "type_id": type_id } });
            let seq = |s: &str, type_id: u32| json!({ "Sequence": { "id": s, "type_id": type_id } });
            json!({
                "type": "TemplateProcessing",
                "single": [special(0), seq("A", 0)],
                "pair": [special(0), seq("A", 0), special(1), seq("B", 1)],
                "special_tokens": { b: { "id": b, "ids": [id], "tokens": [b] } },
            })
        }
        None => Json::Null,
    };
    let model = &mut json["model"];
    model["unk_token"] = json!(unk);
    model["fuse_unk"] = json!(true);
    model["byte_fallback"] = json!(true);
    json
}

/// Checks what the `tokenizers` crate would otherwise reject (or silently get wrong) at load
/// time: duplicate tokens, merges over unknown tokens, added tokens with out-of-range ids.
pub fn check_bpe(vocab: &[String], merges: &[(String, String)], added: &[AddedToken]) -> Result<(), String> {
    let mut ids: HashMap<&str, usize> = HashMap::with_capacity(vocab.len());
    for (id, tok) in vocab.iter().enumerate() {
        if let Some(first) = ids.insert(tok, id) {
            return Err(format!("token {tok:?} appears twice (ids {first} and {id})"));
        }
    }
    for (i, (a, b)) in merges.iter().enumerate() {
        for part in [a.as_str(), b.as_str(), &format!("{a}{b}")] {
            if !ids.contains_key(part) {
                return Err(format!("merge #{i} ({a:?} {b:?}) uses {part:?}, which is not in the vocabulary"));
            }
        }
    }
    for t in added {
        if vocab.get(t.id as usize) != Some(&t.content) {
            return Err(format!(
                "added token {:?} has id {}, where the vocabulary holds {:?}",
                t.content,
                t.id,
                vocab.get(t.id as usize)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_matches_gpt2() {
        let a = byte_level_alphabet();
        assert_eq!(a.len(), 256);
        assert_eq!(a[b' ' as usize], 'Ġ');
        assert_eq!(a[b'\n' as usize], 'Ċ');
        assert_eq!(a[b'A' as usize], 'A');
        assert_eq!(a[0], 'Ā');
        let mut sorted = a.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256, "characters are distinct");
        assert_eq!(to_byte_level("a b\n"), "aĠbĊ");
    }

    #[test]
    fn builds_a_tokenizer_the_tokenizers_crate_loads() {
        let mut vocab: Vec<String> = byte_level_alphabet().iter().map(|c| c.to_string()).collect();
        vocab.extend(["Ġw", "Ġwo", "<|im_end|>"].map(String::from));
        let merges = vec![("Ġ".to_string(), "w".to_string()), ("Ġw".to_string(), "o".to_string())];
        let added = vec![AddedToken { id: 258, content: "<|im_end|>".into(), special: true }];
        check_bpe(&vocab, &merges, &added).unwrap();
        let json = bpe_tokenizer_json(&vocab, &merges, &added, PreTokenizer::DigitsThenByteLevel).to_string();
        let tok = tokenizers::Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let enc = tok.encode(" wo42<|im_end|>", false).unwrap();
        // " wo" merges twice; "4" and "2" are split individually; the special token is one id.
        assert_eq!(enc.get_ids(), &[257, b'4' as u32, b'2' as u32, 258]);
        assert_eq!(tok.decode(&[257, 52, 50, 258], true).unwrap(), " wo42");
    }

    #[test]
    fn check_bpe_names_the_problem() {
        let v: Vec<String> = ["a", "b", "a"].map(String::from).to_vec();
        assert!(check_bpe(&v, &[], &[]).unwrap_err().contains("twice"));
        let v: Vec<String> = ["a", "b"].map(String::from).to_vec();
        let e = check_bpe(&v, &[("a".into(), "b".into())], &[]).unwrap_err();
        assert!(e.contains("\"ab\""), "{e}");
        let e = check_bpe(&v, &[], &[AddedToken { id: 5, content: "x".into(), special: true }]).unwrap_err();
        assert!(e.contains("id 5"), "{e}");
    }
}
