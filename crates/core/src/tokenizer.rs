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
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::config(&path, format!("cannot load tokenizer: {e}")))?;
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
            Some(src) => Some(ChatTemplate::new(&src, bos_token.clone(), eos_token.clone()).map_err(|e| Error::config(&cfg_path, e.to_string()))?),
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
        let t = self.chat.as_ref().ok_or_else(|| Error::Template("this model's tokenizer_config.json has no chat_template".into()))?;
        t.render(messages, add_generation_prompt)
    }
}
