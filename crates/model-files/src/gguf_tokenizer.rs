//! The tokenizer stored in a GGUF file (`tokenizer.ggml.*`), turned into Hugging Face form.
//!
//! `tokenizer.ggml.model = gpt2` (byte-level BPE) is supported for every architecture, and
//! `llama` (SentencePiece) for `gemma3`, as transformers' GemmaTokenizer lays it out (see
//! [`GgufTokenizer::sentencepiece`]). Token types follow
//! llama.cpp: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte. Control and
//! unknown tokens become special added tokens; user-defined ones become non-special added tokens.

use tandem_core::{Error, Result};

use crate::gguf::GgufFile;
use crate::tokenizer_json::{bpe_tokenizer_json, check_bpe, gemma_tokenizer_json, AddedToken, PreTokenizer};

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
    /// `tokenizer.ggml.eot_token_id`: the end of a chat turn, where the file names one.
    pub eot_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub chat_template: Option<String>,
    /// Gemma's SentencePiece vocabulary (`tokenizer.ggml.model = llama` in a `gemma3` file):
    /// BPE with byte fallback over `▁`-spelled text, merges recovered from the vocabulary.
    pub sentencepiece: bool,
}

impl GgufTokenizer {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let err = |msg: String| Error::config(&g.path, msg);
        let model = g.get_str("tokenizer.ggml.model")?;
        let arch = g.get("general.architecture").and_then(|v| v.as_str()).unwrap_or("");
        let sentencepiece = model == "llama" && arch == "gemma3";
        if model != "gpt2" && !sentencepiece {
            return Err(err(format!("tokenizer.ggml.model is `{model}`; supported: `gpt2` (byte-level BPE), and `llama` (SentencePiece) in a gemma3 file")));
        }
        let mut vocab = strings(g, "tokenizer.ggml.tokens")?;
        if sentencepiece {
            // As transformers' GGUF reader does for Gemma: llama.cpp's file spells a token of
            // spaces with real spaces, where the normalised text has `▁`.
            for t in vocab.iter_mut().filter(|t| !t.is_empty() && t.chars().all(|c| c == ' ')) {
                *t = "\u{2581}".repeat(t.chars().count());
            }
        }
        let merges = if sentencepiece && g.get("tokenizer.ggml.merges").is_none() {
            sentencepiece_merges(&vocab)
        } else {
            Self::merges(g)?
        };
        let types: Vec<i64> = match g.get("tokenizer.ggml.token_type") {
            None => vec![1; vocab.len()],
            Some(_) => g
                .get_array("tokenizer.ggml.token_type")?
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    v.as_f64()
                        .map(|x| x as i64)
                        .ok_or_else(|| err(format!("tokenizer.ggml.token_type[{i}] is not an integer")))
                })
                .collect::<Result<_>>()?,
        };
        if types.len() != vocab.len() {
            return Err(err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                vocab.len()
            )));
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
            eot_id: id("tokenizer.ggml.eot_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            unk_id: id("tokenizer.ggml.unknown_token_id")?,
            // llama.cpp's default is not to add BOS for gpt2 vocabularies, and to add it for
            // SentencePiece ones.
            add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(sentencepiece),
            add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
            chat_template: g.get("tokenizer.chat_template").and_then(|v| v.as_str()).map(String::from),
            vocab,
            merges,
            added,
            pre,
            sentencepiece,
        })
    }

    fn merges(g: &GgufFile) -> Result<Vec<(String, String)>> {
        strings(g, "tokenizer.ggml.merges")?
            .into_iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
                _ => Err(Error::config(
                    &g.path,
                    format!("tokenizer.ggml.merges[{i}] is {m:?}, expected two tokens separated by one space"),
                )),
            })
            .collect()
    }

    /// The ids that end generation, as llama.cpp's vocabulary collects them (`special_eog_ids`):
    /// EOS, the file's EOT, and `<end_of_turn>` (Gemma's turn end, which llama.cpp recognises
    /// by its text). HF's Gemma 3 configs list the same (`eos_token_id: [1, 106]`).
    pub fn end_ids(&self) -> Vec<u32> {
        let by_text = self.vocab.iter().position(|t| t == "<end_of_turn>").map(|i| i as u32);
        let mut ids: Vec<u32> = vec![];
        for id in [self.eos_id, self.eot_id, by_text].into_iter().flatten() {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    pub fn token(&self, id: Option<u32>) -> Option<&str> {
        id.and_then(|i| self.vocab.get(i as usize)).map(|s| s.as_str())
    }

    /// `tokenizer.json`. With `add_bos`, a TemplateProcessing post-processor would be needed;
    /// the byte-level one here never adds tokens, and the config says so with `add_bos_token`.
    pub fn tokenizer_json(&self) -> serde_json::Value {
        if self.sentencepiece {
            let bos = if self.add_bos { self.bos_id.map(|id| (self.vocab[id as usize].as_str(), id)) } else { None };
            return gemma_tokenizer_json(&self.vocab, &self.merges, &self.added, self.token(self.unk_id), bos);
        }
        bpe_tokenizer_json(&self.vocab, &self.merges, &self.added, self.pre)
    }
}

/// The merges a SentencePiece vocabulary implies, as transformers recovers them for Gemma
/// (`generate_merges` with each token's position as its score): every split of a token into
/// two tokens of the vocabulary, best first by the merged token's id (Gemma's scores do not
/// follow its merge order; its token order does), and for one token the longer left part first.
pub fn sentencepiece_merges(vocab: &[String]) -> Vec<(String, String)> {
    let ids: std::collections::HashSet<&str> = vocab.iter().map(|s| s.as_str()).collect();
    let mut merges = vec![];
    for tok in vocab {
        let cuts: Vec<usize> = tok.char_indices().map(|(i, _)| i).skip(1).collect();
        for &i in cuts.iter().rev() {
            let (l, r) = tok.split_at(i);
            if ids.contains(l) && ids.contains(r) {
                merges.push((l.to_string(), r.to_string()));
            }
        }
    }
    merges
}

fn strings(g: &GgufFile, key: &str) -> Result<Vec<String>> {
    g.get_array(key)?
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str()
                .map(String::from)
                .ok_or_else(|| Error::config(&g.path, format!("{key}[{i}] is a {}, expected a string", v.type_name())))
        })
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

    /// Gemma's layout in llama.cpp's file: a SentencePiece vocabulary (`llama`) with no merges,
    /// specials first (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3, two turn markers), the 256
    /// byte tokens `<0x00>`.. (ids 6..=261), then pieces: `hello` is 273, `▁world` 278, and a
    /// token of two spaces, spelled with real spaces as llama.cpp writes it, 279.
    pub(crate) fn tiny_gemma_tokenizer_meta() -> Vec<(&'static str, Value)> {
        let mut tokens: Vec<String> =
            ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"].map(String::from).to_vec();
        tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
        let pieces = [
            "\u{2581}",
            "h",
            "e",
            "l",
            "o",
            "w",
            "r",
            "d",
            "he",
            "ll",
            "hell",
            "hello",
            "\u{2581}w",
            "or",
            "ld",
            "\u{2581}wor",
            "\u{2581}world",
            "  ",
        ];
        tokens.extend(pieces.map(String::from));
        let types: Vec<Value> = (0..tokens.len())
            .map(|i| {
                Value::I32(match i {
                    3 => 2,
                    0..=5 => 3,
                    6..=261 => 6,
                    _ => 1,
                })
            })
            .collect();
        vec![
            ("general.architecture", s("gemma3")),
            ("tokenizer.ggml.model", s("llama")),
            ("tokenizer.ggml.pre", s("default")),
            ("tokenizer.ggml.tokens", Value::Array(tokens.iter().map(|t| s(t)).collect())),
            ("tokenizer.ggml.scores", Value::Array((0..tokens.len()).map(|i| Value::F32(-(i as f32))).collect())),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.bos_token_id", Value::U32(2)),
            ("tokenizer.ggml.eos_token_id", Value::U32(1)),
            ("tokenizer.ggml.unknown_token_id", Value::U32(3)),
            ("tokenizer.ggml.padding_token_id", Value::U32(0)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            ("tokenizer.ggml.add_eos_token", Value::Bool(false)),
            ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ("tokenizer.chat_template", s("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}")),
        ]
    }

    #[test]
    fn gemma_sentencepiece_vocabulary_becomes_hf_gemma_tokenizer() {
        let g = open(&tiny_gemma_tokenizer_meta(), "gemma-tok.gguf").unwrap();
        let t = GgufTokenizer::from_gguf(&g).unwrap();
        assert!(t.sentencepiece && t.add_bos);
        assert_eq!(t.end_ids(), [1, 5], "EOS, then <end_of_turn> by its text");
        assert_eq!(t.vocab[279], "\u{2581}\u{2581}", "spaces respelled");
        // Merges by the merged token's id: he, ll, hell, hello, ▁w, or, ld, ▁wor, ▁world, ▁▁.
        let m: Vec<String> = t.merges.iter().map(|(a, b)| format!("{a} {b}")).collect();
        assert_eq!(
            m,
            [
                "h e",
                "l l",
                "he ll",
                "hell o",
                "\u{2581} w",
                "o r",
                "l d",
                "\u{2581}w or",
                "\u{2581}wor ld",
                "\u{2581} \u{2581}"
            ]
        );
        let tok = tokenizers::Tokenizer::from_bytes(t.tokenizer_json().to_string().as_bytes()).unwrap();
        let ids = |text: &str, special: bool| tok.encode(text, special).unwrap().get_ids().to_vec();
        assert_eq!(ids("hello world", false), [273, 278]);
        assert_eq!(ids("hello world", true), [2, 273, 278], "BOS from the post-processor");
        // Bytes the vocabulary lacks fall back to <0xNN> (id 6 + byte).
        assert_eq!(ids("hi\n", false), [263, 6 + b'i' as u32, 6 + b'\n' as u32]);
        assert_eq!(ids("<start_of_turn>hello", false), [4, 273]);
        assert_eq!(ids("  ", false), [279]);
        assert_eq!(tok.decode(&[2, 273, 278, 16], true).unwrap(), "hello world\n");
        // A SentencePiece vocabulary in another architecture is still refused.
        let mut meta = tiny_gemma_tokenizer_meta();
        meta[0].1 = s("llama");
        let e = GgufTokenizer::from_gguf(&open(&meta, "llama-spm.gguf").unwrap()).unwrap_err().to_string();
        assert!(e.contains("`llama`") && e.contains("gemma3"), "{e}");
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
