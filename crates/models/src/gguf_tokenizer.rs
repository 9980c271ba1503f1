//! The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), turned into Hugging Face form.
//!
//! Only `tokenizer.ggml.model = gpt2` (byte-level BPE) is supported. Token types follow
//! llama.cpp: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte. Control and
//! unknown tokens become special added tokens; user-defined ones become non-special added tokens.

use tandem_core::{Error, Result};

use crate::gguf::GgufFile;
use crate::tokenizer_json::{bpe_tokenizer_json, check_bpe, AddedToken, PreTokenizer};

/// Everything the converter needs to write `tokenizer.json` and the special-token settings.
#[derive(Debug, Clone)]
pub struct GgufTokenizer {
    /// `vocab[id]`, in the byte-level alphabet.
    pub vocab: Vec<String>,
    pub merges: Vec<(String, String)>,
    pub added: Vec<AddedToken>,
    pub pre: PreTokenizer,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
}

impl GgufTokenizer {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let err = |msg: String| Error::config(&g.path, msg);
        let model = g.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(err(format!("tokenizer.ggml.model is `{model}`; only `gpt2` (byte-level BPE) is supported")));
        }
        let vocab = strings(g, "tokenizer.ggml.tokens")?;
        let merges = strings(g, "tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
                _ => Err(err(format!("tokenizer.ggml.merges[{i}] is {m:?}, expected two tokens separated by one space"))),
            })
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
            None => vec![1; vocab.len()],
            Some(_) => g
                .get_array("tokenizer.ggml.token_type")?
                .iter()
                .enumerate()
                .map(|(i, v)| v.as_f64().map(|x| x as i64).ok_or_else(|| err(format!("tokenizer.ggml.token_type[{i}] is not an integer"))))
                .collect::<Result<_>>()?,
        };
        if types.len() != vocab.len() {
            return Err(err(format!("tokenizer.ggml.token_type has {} entries for {} tokens", types.len(), vocab.len())));
        }
        let added: Vec<AddedToken> = types
            .iter()
            .enumerate()
            .filter(|(_, &t)| matches!(t, 2..=4))
            .map(|(id, &t)| AddedToken { id: id as u32, content: vocab[id].clone(), special: t != 4 })
            .collect();
        let pre_name = g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).unwrap_or("default");
        let pre = match pre_name {
            "smollm" => PreTokenizer::DigitsThenByteLevel,
            "qwen2" => PreTokenizer::Qwen2,
            other => {
                tracing::warn!(
                    "{}: tokenizer.ggml.pre is `{other}`; using plain byte-level pre-tokenization (GPT-2 regex), which may split text differently from the original",
                    g.path.display()
                );
                PreTokenizer::ByteLevel
            }
        };
        check_bpe(&vocab, &merges, &added).map_err(|m| err(format!("tokenizer: {m}")))?;
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get(key) {
                None => Ok(None),
                Some(v) => match v.as_u64() {
                    Some(x) if (x as usize) < vocab.len() => Ok(Some(x as u32)),
                    _ => Err(err(format!("{key} is {v:?}, not a token id below {}", vocab.len()))),
                },
            }
        };
        let flag = |key: &str| g.get(key).and_then(|v| v.as_bool());
        Ok(GgufTokenizer {
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp's default for gpt2 vocabularies is not to add BOS.
            add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(false),
            add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
            chat_template: g.get("tokenizer.chat_template").and_then(|v| v.as_str()).map(String::from),
            vocab,
            merges,
            added,
            pre,
        })
    }

    pub fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.vocab.get(i as usize)).map(|s| s.as_str())
    }

    /// `tokenizer.json`. With `add_bos`, a TemplateProcessing post-processor would be needed;
    /// the byte-level one here never adds tokens, and the config says so with `add_bos_token`.
    pub fn tokenizer_json(&self) -> serde_json::Value {
        bpe_tokenizer_json(&self.vocab, &self.merges, &self.added, self.pre)
    }
}

fn strings(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    g.get_array(key)?
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_str().map(String::from).ok_or_else(|| Error::config(&g.path, format!("{key}[{i}] is a {}, expected a string", v.type_name()))))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::gguf::{writer, Value};
    use crate::tokenizer_json::byte_level_alphabet;

    fn s(x: &str) -> Value {
        Value::String(x.into())
    }

    /// A GGUF with a 256-byte alphabet, two merges and three control tokens.
    pub(crate) fn tiny_gguf_tokenizer_meta() -> Vec<(&'static str, Value)> {
        let mut tokens = vec![s("<|endoftext|>"), s("<|im_start|>"), s("<|im_end|>")];
        tokens.extend(byte_level_alphabet().iter().map(|c| s(&c.to_string())));
        tokens.extend([s("Ġw"), s("Ġwo")]);
        let mut types = vec![Value::I32(3); 3];
        types.extend(vec![Value::I32(1); 258]);
        vec![
            ("tokenizer.ggml.model", s("gpt2")),
            ("tokenizer.ggml.pre", s("smollm")),
            ("tokenizer.ggml.tokens", Value::Array(tokens)),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.merges", Value::Array(vec![s("Ġ w"), s("Ġw o")])),
            ("tokenizer.ggml.bos_token_id", Value::U32(1)),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
            ("tokenizer.ggml.padding_token_id", Value::U32(2)),
            ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
            ("tokenizer.chat_template", s("{% for m in messages %}{{ m['content'] }}{% endfor %}")),
        ]
    }

    fn open(meta: &[(&str, Value)], name: &str) -> Result<GgufFile> {
        let dir = std::env::temp_dir().join(format!("tandem-gguf-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, writer::file(meta, &[], 32)).unwrap();
        GgufFile::open(&p)
    }

    #[test]
    fn tokenizer_from_gguf_loads_and_encodes() {
        let g = open(&tiny_gguf_tokenizer_meta(), "tok.gguf").unwrap();
        let t = GgufTokenizer::from_gguf(&g).unwrap();
        assert_eq!((t.bos_id, t.eos_id, t.pad_id, t.unk_id), (Some(1), Some(2), Some(2), Some(0)));
        assert_eq!(t.added.len(), 3);
        assert!(t.added.iter().all(|a| a.special));
        assert!(!t.add_bos);
        let dir = g.path.parent().unwrap().join("tok-out");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tokenizer.json");
        std::fs::write(&path, serde_json::to_string_pretty(&t.tokenizer_json()).unwrap()).unwrap();
        let tok = tokenizers::Tokenizer::from_file(&path).unwrap();
        let enc = tok.encode("<|im_start|> wo12", false).unwrap();
        // Byte b has id b + 3; " wo" is the second merge (id 260); digits one by one.
        assert_eq!(enc.get_ids(), &[1, 260, 3 + b'1' as u32, 3 + b'2' as u32]);
        assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), " wo12");
    }

    #[test]
    fn unknown_pre_falls_back_to_plain_byte_level() {
        let mut meta = tiny_gguf_tokenizer_meta();
        meta[1].1 = s("llama-bpe");
        let t = GgufTokenizer::from_gguf(&open(&meta, "pre.gguf").unwrap()).unwrap();
        assert_eq!(t.pre, PreTokenizer::ByteLevel);
        let tok = tokenizers::Tokenizer::from_bytes(t.tokenizer_json().to_string().as_bytes()).unwrap();
        // Without the digit split, GPT-2's regex keeps "12" together (then BPE has no merge for it).
        let pieces = tok.get_pre_tokenizer().unwrap();
        use tokenizers::PreTokenizer as _;
        let mut pre = tokenizers::PreTokenizedString::from(" 12");
        pieces.pre_tokenize(&mut pre).unwrap();
        assert_eq!(pre.get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte).len(), 1);
    }

    #[test]
    fn rejects_other_models_and_bad_merges() {
        let mut meta = tiny_gguf_tokenizer_meta();
        meta[0].1 = s("llama");
        let e = GgufTokenizer::from_gguf(&open(&meta, "spm.gguf").unwrap()).unwrap_err().to_string();
        assert!(e.contains("`llama`") && e.contains("spm.gguf"), "{e}");
        let mut meta = tiny_gguf_tokenizer_meta();
        meta[4].1 = Value::Array(vec![s("Ġ x")]);
        let e = GgufTokenizer::from_gguf(&open(&meta, "merge.gguf").unwrap()).unwrap_err().to_string();
        assert!(e.contains("merge #0"), "{e}");
        let mut meta = tiny_gguf_tokenizer_meta();
        meta[4].1 = Value::Array(vec![s("Ġw")]);
        let e = GgufTokenizer::from_gguf(&open(&meta, "merge2.gguf").unwrap()).unwrap_err().to_string();
        assert!(e.contains("merges[0]"), "{e}");
    }
}
