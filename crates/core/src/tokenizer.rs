//! The model's tokenizer: `tokenizer.json` through the `tokenizers` crate, plus what
//! `tokenizer_config.json` says (special tokens, BOS policy, chat template).

use std::path::Path;

use crate::chat::ChatTemplate;
use crate::error::{Error, Result};

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Ids that end generation: the config's eos ids plus the tokenizer's eos token.
    pub eos_ids: Vec<u32>,
    chat: Option<ChatTemplate>,
}

/// A special token in tokenizer_config.json is either a string or an AddedToken object.
fn token_str(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(String::from),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when present, `tokenizer_config.json` from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        // The tokenizers crate panics on some malformed files (an `unwrap` in its decoder's
        // deserialiser, found by fuzz/tokenizer_json): a bad file is an error naming it, never a
        // crash of the server reading it.
        let parsed = std::panic::catch_unwind(|| match fast_bpe(&text) {
            Some(t) => Ok(t),
            None => text.parse::<tokenizers::Tokenizer>().map_err(|e| format!("cannot load tokenizer: {e}")),
        });
        let inner = match parsed {
            Ok(r) => r.map_err(|e| Error::config(&path, e))?,
            Err(p) => {
                let why = p
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| p.downcast_ref::<&str>().copied())
                    .unwrap_or("no message");
                return Err(Error::config(
                    &path,
                    format!("cannot load tokenizer: the tokenizers library failed on this file ({why})"),
                ));
            }
        };
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.exists() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
            serde_json::from_str(&text).map_err(|e| Error::config(&cfg_path, format!("not valid JSON: {e}")))?
        } else {
            serde_json::Value::Null
        };
        let bos_token = token_str(cfg.get("bos_token"));
        let eos_token = token_str(cfg.get("eos_token"));
        let chat = match cfg.get("chat_template") {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(|t| t.as_str())
                .map(String::from),
            _ => None,
        };
        let chat = match chat {
            Some(src) => Some(
                ChatTemplate::new(&src, bos_token.clone(), eos_token.clone())
                    .map_err(|e| Error::config(&cfg_path, e.to_string()))?,
            ),
            None => None,
        };
        let mut eos_ids = vec![];
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            eos_ids.push(id);
        }
        Ok(Tokenizer { inner, bos_token, eos_token, eos_ids, chat })
    }

    /// Adds the model config's eos ids (generation may stop on any of them).
    pub fn add_eos_ids(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_ids.contains(&id) {
                self.eos_ids.push(id);
            }
        }
    }

    /// Text to ids. `add_special_tokens` applies the tokenizer's post-processor (e.g. a BOS);
    /// chat prompts, whose template writes the BOS itself, pass false.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_ref()
    }

    /// Renders `messages` (OpenAI-style objects with `role` and `content`) with the model's
    /// chat template, exactly as transformers' `apply_chat_template` would.
    pub fn apply_chat_template(&self, messages: &[serde_json::Value], add_generation_prompt: bool) -> Result<String> {
        let t = self
            .chat
            .as_ref()
            .ok_or_else(|| Error::Template("this model's tokenizer_config.json has no chat_template".into()))?;
        t.render(messages, add_generation_prompt)
    }

    /// The same, with OpenAI-style `tools` given to the template as transformers gives them.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let t = self
            .chat
            .as_ref()
            .ok_or_else(|| Error::Template("this model's tokenizer_config.json has no chat_template".into()))?;
        t.render_with_tools(messages, tools, add_generation_prompt)
    }

    /// The same, with extra template variables (`chat_template_kwargs`).
    pub fn apply_chat_template_with_kwargs(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String> {
        let t = self
            .chat
            .as_ref()
            .ok_or_else(|| Error::Template("this model's tokenizer_config.json has no chat_template".into()))?;
        t.render_with_kwargs(messages, tools, add_generation_prompt, kwargs)
    }
}

/// A BPE `tokenizer.json` built the quick way. `tokenizers`' own parser reads the model through
/// an untagged enum, which makes serde buffer the whole vocabulary and merge list before
/// deciding what it is; that is most of the ~100 ms SmolLM2's tokenizer takes to open. Here
/// the vocabulary and merges are read typed and handed to the BPE builder; the small parts
/// (normalizer, pre-tokenizer, post-processor, decoder) go through `tokenizers`' own types.
/// Anything unusual (another model type, merges as strings, padding or truncation, an added
/// token that does not land on its id) returns None and the caller takes the slow path.
fn fast_bpe(text: &str) -> Option<tokenizers::Tokenizer> {
    use std::collections::HashMap;

    use serde::Deserialize;
    use serde_json::Value;
    use tokenizers::models::bpe::BPE;
    use tokenizers::AddedToken;

    #[derive(Deserialize)]
    struct Raw {
        model: RawBpe,
        #[serde(default)]
        normalizer: Value,
        #[serde(default)]
        pre_tokenizer: Value,
        #[serde(default)]
        post_processor: Value,
        #[serde(default)]
        decoder: Value,
        #[serde(default)]
        added_tokens: Vec<RawAdded>,
        #[serde(default)]
        truncation: Value,
        #[serde(default)]
        padding: Value,
    }
    #[derive(Deserialize)]
    struct RawBpe {
        #[serde(rename = "type")]
        kind: Option<String>,
        vocab: HashMap<String, u32>,
        merges: Vec<(String, String)>,
        dropout: Option<f32>,
        unk_token: Option<String>,
        continuing_subword_prefix: Option<String>,
        end_of_word_suffix: Option<String>,
        #[serde(default)]
        fuse_unk: bool,
        #[serde(default)]
        byte_fallback: bool,
        #[serde(default)]
        ignore_merges: bool,
    }
    #[derive(Deserialize)]
    struct RawAdded {
        id: u32,
        content: String,
        #[serde(default)]
        single_word: bool,
        #[serde(default)]
        lstrip: bool,
        #[serde(default)]
        rstrip: bool,
        #[serde(default)]
        normalized: bool,
        #[serde(default)]
        special: bool,
    }

    let raw: Raw = serde_json::from_str(text).ok()?;
    let m = raw.model;
    if m.kind.as_deref() != Some("BPE") || !raw.truncation.is_null() || !raw.padding.is_null() {
        return None;
    }
    let mut b = BPE::builder()
        .vocab_and_merges(m.vocab.into_iter().collect::<tokenizers::models::bpe::Vocab>(), m.merges)
        .fuse_unk(m.fuse_unk)
        .byte_fallback(m.byte_fallback)
        .ignore_merges(m.ignore_merges);
    if let Some(d) = m.dropout {
        b = b.dropout(d);
    }
    if let Some(u) = m.unk_token {
        b = b.unk_token(u);
    }
    if let Some(p) = m.continuing_subword_prefix {
        b = b.continuing_subword_prefix(p);
    }
    if let Some(x) = m.end_of_word_suffix {
        b = b.end_of_word_suffix(x);
    }
    let mut t = tokenizers::Tokenizer::new(b.build().ok()?);
    if !raw.normalizer.is_null() {
        t.with_normalizer(Some(serde_json::from_value::<tokenizers::NormalizerWrapper>(raw.normalizer).ok()?)).ok()?;
    }
    if !raw.pre_tokenizer.is_null() {
        t.with_pre_tokenizer(Some(serde_json::from_value::<tokenizers::PreTokenizerWrapper>(raw.pre_tokenizer).ok()?));
    }
    if !raw.post_processor.is_null() {
        t.with_post_processor(Some(
            serde_json::from_value::<tokenizers::PostProcessorWrapper>(raw.post_processor).ok()?,
        ));
    }
    if !raw.decoder.is_null() {
        t.with_decoder(Some(serde_json::from_value::<tokenizers::DecoderWrapper>(raw.decoder).ok()?));
    }
    for a in &raw.added_tokens {
        let tok = AddedToken::from(a.content.clone(), a.special)
            .single_word(a.single_word)
            .lstrip(a.lstrip)
            .rstrip(a.rstrip)
            .normalized(a.normalized);
        if a.special {
            t.add_special_tokens(vec![tok]).ok()?;
        } else {
            t.add_tokens(vec![tok]).ok()?;
        }
        if t.token_to_id(&a.content) != Some(a.id) {
            return None;
        }
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::fast_bpe;

    /// A small byte-level BPE in HF's format: the quick loader must give the same tokenizer as
    /// `tokenizers`' own parser, and step aside for what it does not handle.
    const JSON: &str = r#"{"version":"1.0","truncation":null,"padding":null,
      "added_tokens":[{"id":7,"content":"<|end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
      "normalizer":null,
      "pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\p{N}"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}]},
      "post_processor":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":false,"use_regex":true},
      "decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},
      "model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":false,
        "vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"Ġab":4,"1":5,"2":6,"<|end|>":7,"c":8},
        "merges":[["a","b"],["Ġ","ab"]]}}"#;

    #[test]
    fn quick_loader_matches_the_library_parser() {
        let fast = fast_bpe(JSON).expect("a plain BPE takes the quick path");
        let slow: tokenizers::Tokenizer = JSON.parse().unwrap();
        for text in ["ab ab", "abc12<|end|>ab", "c", " ab1"] {
            let (f, s) = (fast.encode(text, true).unwrap(), slow.encode(text, true).unwrap());
            assert_eq!(f.get_ids(), s.get_ids(), "{text:?}");
            assert_eq!(fast.decode(f.get_ids(), true).unwrap(), slow.decode(s.get_ids(), true).unwrap());
        }
        assert_eq!(fast.encode("abab", false).unwrap().get_ids(), &[2, 2]);
        // Not handled: merges written as strings, padding, another model type.
        assert!(fast_bpe(&JSON.replace(r#"[["a","b"],["Ġ","ab"]]"#, r#"["a b","Ġ ab"]"#)).is_none());
        assert!(fast_bpe(&JSON.replace(r#""padding":null"#, r#""padding":{}"#)).is_none());
        assert!(fast_bpe(&JSON.replace(r#""type":"BPE""#, r#""type":"WordPiece""#)).is_none());
    }

    /// Found by fuzz/tokenizer_json: a decoder whose fields are not JSON made the tokenizers
    /// crate panic (an `unwrap` in its deserialiser); loading such a file is an error naming it.
    #[test]
    fn a_file_the_tokenizers_crate_panics_on_is_an_error() {
        let dir = std::env::temp_dir().join(format!("tandem-tok-panic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = JSON.replace(
            r#""decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true"#,
            r#""decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":tr=e"#,
        );
        assert_ne!(bad, JSON);
        std::fs::write(dir.join("tokenizer.json"), bad).unwrap();
        let e = super::Tokenizer::from_dir(&dir).err().expect("a malformed tokenizer.json is refused");
        let msg = e.to_string();
        assert!(msg.contains("tokenizer.json") && msg.contains("cannot load tokenizer"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
