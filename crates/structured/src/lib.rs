//! Structured output: what a request asks the text to be ([`GuideSpec`]: a JSON schema, any
//! JSON object, a regex, one of a list of strings, or a Lark grammar) compiled by llguidance
//! against the model's tokenizer into a [`tandem_engine::Guided`], whose per-completion
//! constraint gives the engine the allowed-token mask before each sample.
//!
//! [`Structured`] is built once per model from `tokenizer.json` (the token trie: each token's
//! bytes; special tokens are marked so that no grammar matches them as text, and the model's
//! EOS ids are what a finished grammar allows). [`Structured::compile`] checks the spec and
//! builds its parser once: an invalid schema, regex or grammar, or a JSON-schema feature
//! llguidance does not support, is a [`GuideError`] naming the problem, which the server turns
//! into a 400. Each completion then starts from a copy of that parser.

use std::path::Path;
use std::sync::{Arc, Mutex};

pub mod gbnf;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use tandem_engine::{Constraint, ConstraintFactory, Guided};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// What the output must be.
#[derive(Debug, Clone, PartialEq)]
pub enum GuideSpec {
    /// Any JSON object (OpenAI's `{"type": "json_object"}`).
    JsonObject,
    /// JSON valid against this schema.
    JsonSchema(serde_json::Value),
    /// Text matching this regex as a whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A Lark grammar (llguidance's dialect, as vLLM's `guided_grammar`), or a GBNF one
    /// (`root ::= ...`, what vLLM's default xgrammar backend takes), converted by [`gbnf`].
    Lark(String),
}

impl GuideSpec {
    /// The name requests use for this form.
    pub fn kind(&self) -> &'static str {
        match self {
            GuideSpec::JsonObject => "json_object",
            GuideSpec::JsonSchema(_) => "json_schema",
            GuideSpec::Regex(_) => "regex",
            GuideSpec::Choice(_) => "choice",
            GuideSpec::Lark(_) => "grammar",
        }
    }

    fn grammar(&self) -> Result<TopLevelGrammar, GuideError> {
        Ok(match self {
            GuideSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(bounded_whitespace(serde_json::json!({"type": "object"})))
            }
            GuideSpec::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(GuideError::new(self.kind(), "a JSON schema must be an object or a boolean".into()));
                }
                TopLevelGrammar::from_json_schema(bounded_whitespace(schema.clone()))
            }
            GuideSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GuideSpec::Choice(choices) => {
                if choices.is_empty() {
                    return Err(GuideError::new(self.kind(), "the list of choices is empty".into()));
                }
                // Lark string literals take JSON's escapes, so any choice is quoted exactly.
                let alts: Vec<String> =
                    choices.iter().map(|c| serde_json::to_string(c).expect("a string serialises")).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
            // vLLM's default backend (xgrammar) takes GBNF; llguidance takes Lark.
            GuideSpec::Lark(g) if gbnf::looks_like_gbnf(g) => TopLevelGrammar::from_lark(
                gbnf::to_lark(g).map_err(|e| GuideError::new(self.kind(), format!("GBNF: {e}")))?,
            ),
            GuideSpec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        })
    }
}

/// Whitespace allowed between two JSON tokens: any mix of space, tab and newlines, at most
/// [`MAX_JSON_WHITESPACE`] characters. Unbounded (llguidance's default) lets a model that likes
/// whitespace fill `max_tokens` with it and never close the object, a failure vLLM users know;
/// the bound still admits pretty-printed JSON nested several levels deep. A schema's own
/// `x-guidance` options are kept as they are.
pub const MAX_JSON_WHITESPACE: usize = 20;

fn bounded_whitespace(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_pattern": format!("[\\x20\\x0A\\x0D\\x09]{{1,{MAX_JSON_WHITESPACE}}}")}),
        );
    }
    schema
}

/// A spec that cannot be compiled: `kind` is the form ("json_schema", "regex", ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuideError {
    pub kind: &'static str,
    pub message: String,
}

impl GuideError {
    fn new(kind: &'static str, message: String) -> Self {
        GuideError { kind, message }
    }
}

impl std::fmt::Display for GuideError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}: {}", self.kind, self.message)
    }
}

impl std::error::Error for GuideError {}

/// The model's tokenizer as llguidance sees it; compiles specs.
pub struct Structured {
    factory: Arc<ParserFactory>,
    /// Tokens the tokenizer knows (the model's vocabulary may be padded past them).
    tokens: usize,
}

impl Structured {
    /// From the text of a `tokenizer.json` (byte-level BPE or byte-fallback) and the ids that
    /// end generation.
    pub fn from_tokenizer_json(text: &str, eos_ids: &[u32]) -> Result<Self, String> {
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("tokenizer.json is not valid JSON: {e}"))?;
        let words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("cannot read the tokens of tokenizer.json: {e}"))?;
        let &eos =
            eos_ids.first().ok_or("the model names no EOS token: a finished grammar would have nothing to end with")?;
        if let Some(&bad) = eos_ids.iter().find(|&&t| t as usize >= words.len()) {
            return Err(format!("EOS id {bad} is outside the tokenizer's {} tokens", words.len()));
        }
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_ids);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("cannot build the token trie: {e}"))?;
        // Grammar warnings belong in the request's error, not on the server's stderr.
        factory.set_stderr_log_level(0);
        Ok(Structured { factory: Arc::new(factory), tokens: words.len() })
    }

    /// From `DIR/tokenizer.json`; the error names the file.
    pub fn from_model_dir(dir: &Path, eos_ids: &[u32]) -> tandem_core::Result<Self> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| tandem_core::Error::io(&path, e))?;
        Self::from_tokenizer_json(&text, eos_ids).map_err(|m| tandem_core::Error::config(&path, m))
    }

    /// Tokens the tokenizer knows.
    pub fn num_tokens(&self) -> usize {
        self.tokens
    }

    /// Checks a spec and builds its parser.
    pub fn compile(&self, spec: &GuideSpec) -> Result<Guided, GuideError> {
        let kind = spec.kind();
        let parser = self.factory.create_parser(spec.grammar()?).map_err(|e| GuideError::new(kind, e.to_string()))?;
        let mut proto = Matcher::new(Ok(parser));
        if let Some(e) = proto.get_error() {
            return Err(GuideError::new(kind, e));
        }
        // A grammar that admits nothing at its start would only ever end in an error.
        let first = proto.compute_mask().map_err(|e| GuideError::new(kind, e.to_string()))?;
        if first.num_set() == 0 {
            return Err(GuideError::new(kind, "it admits no text at all".into()));
        }
        Ok(Guided::new(Compiled { proto: Mutex::new(proto), kind }))
    }
}

/// A compiled spec: completions start from copies of its fresh matcher.
struct Compiled {
    proto: Mutex<Matcher>,
    kind: &'static str,
}

impl ConstraintFactory for Compiled {
    fn start(&self) -> Result<Box<dyn Constraint>, String> {
        let m = self.proto.lock().map_err(|_| "the compiled grammar is poisoned".to_string())?.deep_clone();
        Ok(Box::new(Live { m }))
    }
    fn kind(&self) -> &str {
        self.kind
    }
}

/// One completion's matcher.
struct Live {
    m: Matcher,
}

impl Constraint for Live {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        let allowed = self.m.compute_mask().map_err(|e| e.to_string())?;
        let words = allowed.as_slice();
        // The trie's vocabulary, rounded up to whole words, has its tail bits clear; words past
        // it (a padded model vocabulary) allow nothing.
        for (i, w) in mask.iter_mut().enumerate() {
            *w = words.get(i).copied().unwrap_or(0);
        }
        Ok(())
    }
    fn commit(&mut self, token: u32) -> Result<(), String> {
        self.m.consume_token(token).map_err(|e| e.to_string())
    }
    fn is_finished(&self) -> bool {
        self.m.is_stopped()
    }
    fn fork(&self) -> Option<Box<dyn Constraint>> {
        Some(Box::new(Live { m: self.m.deep_clone() }))
    }
}
