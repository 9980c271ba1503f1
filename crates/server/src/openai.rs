//! The wire formats: OpenAI's `/v1/completions` and `/v1/chat/completions` (requests, whole
//! responses and stream chunks) and the plain `/generate`.
//!
//! `/generate` takes `{"prompt": "..."}` or `{"prompts": [...]}` plus the same sampling fields
//! and answers `{"text": ...}` or `{"texts": [...]}`; streamed, each event is
//! `{"index": i, "text": delta}` (plus `finish_reason` on a prompt's last), then `[DONE]`.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tandem_core::tokenizer::Tokenizer;

use crate::engine_client::{EngineUpdate, FinishReason, GenerateRequest, TokenLogprob};
use crate::error::ApiError;
use crate::params::{parse_params, Api, Fields, ParsedParams};
use crate::reasoning::{ReasoningParser, ReasoningStream};
use crate::run::Run;
use crate::server::AppState;
use crate::structured::{self, GuideRequest, ToolCall, ToolChoice};
use crate::tool_parser::ToolParser;
use crate::tool_stream::{CallEvent, CallStream};

/// A parsed, tokenized request, ready to submit.
#[derive(Debug)]
pub struct Job {
    pub api: Api,
    pub prompts: Vec<Vec<u32>>,
    pub p: ParsedParams,
    /// `/generate` with `prompts`: answer `texts`.
    pub multi: bool,
    /// Completions with `echo`: each prompt's text, as given (or decoded from its ids).
    pub echo_texts: Vec<String>,
    /// The structured-output form asked for; [`Job::compile_guide`] turns it into
    /// `p.params.guided`.
    pub guide: Option<GuideRequest>,
    /// Chat with tools: how the answer's text is read for tool calls.
    pub tool_output: Option<ToolOutput>,
    /// Chat with `--reasoning-parser`: the answer's thinking is split out of its content.
    pub reasoning: Option<ReasoningParser>,
}

/// How a chat answer's text becomes tool calls.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutput {
    /// `tool_choice: "required"`: a JSON array of `{"name", "parameters"}`.
    Required,
    /// A named function: the text is its arguments.
    Named(String),
    /// `tool_choice: "auto"` read by `--tool-call-parser` (without one: Hermes, when the
    /// template writes `<tool_call>` blocks).
    Auto(ToolParser),
}

/// A chat choice's message: content, tool calls, and the finish reason to report.
pub fn tool_message(out: Option<&ToolOutput>, text: &str, finish: &str) -> (Option<String>, Vec<ToolCall>, String) {
    let plain = (Some(text.to_string()), Vec::new(), finish.to_string());
    match out {
        None => plain,
        // vLLM reports the engine's finish for a named function ("stop"), as OpenAI does for a
        // forced call; the arguments are the text whatever it is (cut short by `length`, say).
        Some(ToolOutput::Named(name)) => {
            (None, vec![ToolCall { name: name.clone(), arguments: text.to_string() }], finish.to_string())
        }
        Some(ToolOutput::Required) if finish == "stop" => match structured::parse_required(text) {
            Some(calls) => (None, calls, "tool_calls".into()),
            None => plain,
        },
        // Cut short (`max_tokens`): the calls as far as they were written, not the array's text.
        Some(ToolOutput::Required) => (None, crate::tool_stream::partial_calls(text), finish.to_string()),
        Some(ToolOutput::Auto(p)) => match p.parse(text) {
            Some((content, calls)) if !calls.is_empty() => {
                (content, calls, if finish == "stop" { "tool_calls".into() } else { finish.to_string() })
            }
            _ => plain,
        },
    }
}

pub(crate) fn parse_json(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::bad_request("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
    }
}

/// A request's `model`, when given, must be a name the server answers to (`--served-model-name
/// a b`, and the model directory's base name).
pub(crate) fn check_served(f: &Fields, state: &AppState) -> Result<(), ApiError> {
    match f.str("model")? {
        Some(m) if !state.serves(m) => Err(ApiError::unknown_model(m, &state.model_name)),
        _ => Ok(()),
    }
}

/// Fields whose meaning we do not implement: refusing them beats silently ignoring them.
/// `tools` are read on chat only.
fn refuse_unsupported(f: &Fields, api: Api) -> Result<(), ApiError> {
    let nonempty = |name: &str| match f.get(name) {
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
        None => false,
    };
    for name in ["tools", "tool_choice", "functions", "suffix"] {
        if nonempty(name) && !(api == Api::Chat && name.starts_with("tool")) {
            let why = if name.starts_with("tool") { " (tools are read on chat completions only)" } else { "" };
            return Err(ApiError::invalid(name, format!("`{name}` is not supported by this server{why}")));
        }
    }
    Ok(())
}

fn check_ids(ids: Vec<u32>, vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
    if ids.is_empty() {
        return Err(ApiError::invalid(param, format!("`{param}` must not be empty")));
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` holds token id {bad}, outside the vocabulary [0, {vocab})"),
        ));
    }
    Ok(ids)
}

fn token_ids(v: &Value) -> Option<Vec<u32>> {
    v.as_array()?.iter().map(|t| t.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32)).collect()
}

/// A completions prompt: a string, a list of strings, token ids, or a list of token-id lists.
fn parse_prompts(v: Option<&Value>, param: &str, tok: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u32>>, ApiError> {
    let shape = || {
        ApiError::invalid(
            param,
            format!(
                "`{param}` must be a string, a list of strings, a list of token ids, or a list of lists of token ids"
            ),
        )
    };
    let encode =
        |s: &str| tok.encode(s, true).map_err(|e| ApiError::invalid(param, format!("cannot tokenize `{param}`: {e}")));
    let prompts = match v {
        None => return Err(ApiError::invalid(param, format!("`{param}` is required"))),
        Some(Value::String(s)) => vec![encode(s)?],
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid(param, format!("`{param}` must not be an empty list")))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| encode(s.as_str().unwrap_or_default())).collect::<Result<_, _>>()?
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => {
            vec![token_ids(v.unwrap_or(&Value::Null)).ok_or_else(shape)?]
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => {
            a.iter().map(|p| token_ids(p).ok_or_else(shape)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(shape()),
    };
    prompts.into_iter().map(|p| check_ids(p, vocab, param)).collect()
}

/// The text `echo` repeats: a string prompt as given, token ids decoded (special tokens kept).
fn echo_texts(v: Option<&Value>, prompts: &[Vec<u32>], tok: &Tokenizer) -> Vec<String> {
    match v {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| s.as_str().unwrap_or_default().to_string()).collect()
        }
        _ => prompts.iter().map(|p| tok.decode(p, false).unwrap_or_default()).collect(),
    }
}

/// Message contents as plain strings (a list of text parts is joined) for the template.
pub(crate) fn normalize_messages(v: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    let msgs = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid("messages", "`messages` must not be empty")),
        None => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(_) => return Err(ApiError::invalid("messages", "`messages` must be a list of message objects")),
    };
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid(&format!("messages[{i}]"), format!("`messages[{i}]` must be an object")));
        };
        if !obj.get("role").is_some_and(Value::is_string) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("`messages[{i}].role` must be a string"),
            ));
        }
        let mut obj = obj.clone();
        let content = match obj.get("content") {
            None | Some(Value::Null) => Value::String(String::new()),
            Some(Value::String(s)) => Value::String(s.clone()),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content"),
                                "only text content parts (`{\"type\": \"text\", \"text\": ...}`) are supported",
                            ))
                        }
                    }
                }
                Value::String(text)
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].content"),
                    format!("`messages[{i}].content` must be a string or a list of text parts"),
                ))
            }
        };
        obj.insert("content".into(), content);
        // transformers' templates read a call's arguments as a mapping; OpenAI sends a JSON
        // string (vLLM turns it into a dict for the template the same way).
        if let Some(Value::Array(calls)) = obj.get_mut("tool_calls") {
            for c in calls.iter_mut() {
                if let Some(a) = c.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                    if let Some(v) =
                        a.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()).filter(Value::is_object)
                    {
                        *a = v;
                    }
                }
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// The prompt's ids of a chat: messages (and tools, and `chat_template_kwargs`) through the
/// model's chat template.
pub(crate) fn render_chat(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<Vec<u32>, ApiError> {
    render_chat_continued(state, msgs, tools, add_gen, false, kwargs)
}

/// [`render_chat`], with the last message left open when `continue_final` (vLLM's
/// `continue_final_message`).
pub(crate) fn render_chat_continued(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    continue_final: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<Vec<u32>, ApiError> {
    let text = chat_text(state, msgs, tools, add_gen, continue_final, kwargs)?;
    // The template writes the BOS itself.
    state
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid("messages", format!("cannot tokenize the rendered chat: {e}")))
}

/// The rendered chat text. With `continue_final`, what follows the last message's content is
/// cut off (its end-of-turn markup), as transformers' `continue_final_message` cuts it: after
/// the last place the content, stripped, appears.
pub(crate) fn chat_text(
    state: &AppState,
    msgs: &[Value],
    tools: Option<&structured::Tools>,
    add_gen: bool,
    continue_final: bool,
    kwargs: Option<&Map<String, Value>>,
) -> Result<String, ApiError> {
    if continue_final && add_gen {
        return Err(ApiError::invalid(
            "continue_final_message",
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let text = state
        .tokenizer
        .apply_chat_template_with_kwargs(msgs, tools.map(|t| t.list.as_slice()), add_gen, kwargs)
        .map_err(|e| ApiError::invalid("messages", format!("cannot apply the chat template: {e}")))?;
    if !continue_final {
        return Ok(text);
    }
    let last = msgs.last().and_then(|m| m.get("content")).and_then(Value::as_str).unwrap_or_default();
    let Some(at) = text.rfind(last.trim()) else {
        return Err(ApiError::invalid("continue_final_message", "`continue_final_message` is set but the final message does not appear in the chat after applying the chat template"));
    };
    // The content kept whole (trailing whitespace too) when it has no leading whitespace.
    let end = if last.trim_start().len() == last.len() && text[at..].starts_with(last) {
        at + last.len()
    } else {
        at + last.trim().len()
    };
    Ok(text[..end].to_string())
}

impl Job {
    pub fn completions(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
        let o = parse_json(body)?;
        let f = Fields(&o);
        check_served(&f, state)?;
        refuse_unsupported(&f, Api::Completions)?;
        let vocab = state.config.vocab_size;
        let p = parse_params(&f, Api::Completions, vocab, &state.config.sampling_defaults)?;
        let guide = structured::parse_guide(&f)?;
        let prompts = parse_prompts(f.get("prompt"), "prompt", &state.tokenizer, vocab)?;
        let echo_texts = if p.echo { echo_texts(f.get("prompt"), &prompts, &state.tokenizer) } else { Vec::new() };
        Ok(Job {
            api: Api::Completions,
            prompts,
            p,
            multi: false,
            echo_texts,
            guide,
            tool_output: None,
            reasoning: None,
        })
    }

    pub fn chat(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
        let o = parse_json(body)?;
        let f = Fields(&o);
        check_served(&f, state)?;
        refuse_unsupported(&f, Api::Chat)?;
        if f.bool("echo")? == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported on chat completions"));
        }
        let vocab = state.config.vocab_size;
        let p = parse_params(&f, Api::Chat, vocab, &state.config.sampling_defaults)?;
        let guide = structured::parse_guide(&f)?;
        let tools = structured::parse_tools(&f)?;
        let msgs = normalize_messages(f.get("messages"))?;
        // vLLM: the assistant turn is opened unless the last message is continued; asking for
        // both is a 400 (in `chat_text`).
        let add_gen = f.bool("add_generation_prompt")?.unwrap_or(!p.continue_final_message);
        // vLLM's extra template variables (Qwen3's `enable_thinking`, ...).
        let kwargs = match f.get("chat_template_kwargs") {
            None => None,
            Some(Value::Object(o)) => Some(o),
            Some(v) => {
                return Err(ApiError::invalid(
                    "chat_template_kwargs",
                    format!("`chat_template_kwargs` must be an object, got {}", crate::params::type_name(v)),
                ))
            }
        };
        Job::chat_from(state, p, guide, tools.as_ref(), &msgs, add_gen, kwargs)
    }

    /// A chat job from messages already in the template's shape (string contents, calls'
    /// arguments as mappings), its tools and structured-output form: what chat completions and
    /// the Anthropic Messages API share. A forced tool choice becomes the constraint, and says
    /// how the answer's text is read for calls.
    pub(crate) fn chat_from(
        state: &AppState,
        p: ParsedParams,
        mut guide: Option<GuideRequest>,
        tools: Option<&structured::Tools>,
        msgs: &[Value],
        add_gen: bool,
        kwargs: Option<&Map<String, Value>>,
    ) -> Result<Job, ApiError> {
        let mut tool_output = None;
        if let Some(t) = tools {
            if let Some(g) = t.guide() {
                if let Some(other) = &guide {
                    let choice = match &t.choice {
                        ToolChoice::Named(n) => format!("naming {n:?}"),
                        _ => "\"required\"".to_string(),
                    };
                    return Err(ApiError::invalid(
                        &other.param,
                        format!(
                            "`tool_choice` {choice} constrains the answer already; `{}` cannot be given with it",
                            other.param
                        ),
                    ));
                }
                guide = Some(g);
            }
            let markup =
                state.tokenizer.chat_template().is_some_and(|c| structured::template_has_tool_calls(c.source()));
            tool_output = match &t.choice {
                ToolChoice::Required => Some(ToolOutput::Required),
                ToolChoice::Named(n) => Some(ToolOutput::Named(n.clone())),
                ToolChoice::Auto => match state.config.tool_call_parser {
                    Some(p) => Some(ToolOutput::Auto(p)),
                    None if markup => Some(ToolOutput::Auto(ToolParser::Hermes)),
                    None => None,
                },
                ToolChoice::None => None,
            };
        }
        let ids = render_chat_continued(state, msgs, tools, add_gen, p.continue_final_message, kwargs)?;
        // A forced call's text is the constrained JSON from its first token: nothing to split.
        let reasoning = state.config.reasoning_parser.filter(|_| guide.is_none()).map(|r| {
            let tail = state.tokenizer.decode(&ids[ids.len().saturating_sub(8)..], false).unwrap_or_default();
            r.for_prompt(&tail)
        });
        Ok(Job {
            api: Api::Chat,
            prompts: vec![check_ids(ids, state.config.vocab_size, "messages")?],
            p,
            multi: false,
            echo_texts: Vec::new(),
            guide,
            tool_output,
            reasoning,
        })
    }

    pub fn generate(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
        let o = parse_json(body)?;
        let f = Fields(&o);
        refuse_unsupported(&f, Api::Generate)?;
        if f.bool("echo")? == Some(true) {
            return Err(ApiError::invalid("echo", "`echo` is not supported on /generate; use /v1/completions"));
        }
        let vocab = state.config.vocab_size;
        let p = parse_params(&f, Api::Generate, vocab, &state.config.sampling_defaults)?;
        let guide = structured::parse_guide(&f)?;
        if p.params.n != 1 {
            return Err(ApiError::invalid(
                "n",
                "`/generate` answers one text per prompt; use /v1/completions for n > 1",
            ));
        }
        let (prompts, multi) = match (f.get("prompt"), f.get("prompts")) {
            (Some(_), Some(_)) => return Err(ApiError::invalid("prompts", "give `prompt` or `prompts`, not both")),
            (Some(v @ Value::String(_)), None) => (parse_prompts(Some(v), "prompt", &state.tokenizer, vocab)?, false),
            (Some(v), None) if token_ids(v).is_some() => {
                (parse_prompts(Some(v), "prompt", &state.tokenizer, vocab)?, false)
            }
            (Some(_), None) => {
                return Err(ApiError::invalid(
                    "prompt",
                    "`prompt` must be a string or a list of token ids; use `prompts` for several",
                ))
            }
            (None, Some(v @ Value::Array(_))) => (parse_prompts(Some(v), "prompts", &state.tokenizer, vocab)?, true),
            (None, Some(_)) => {
                return Err(ApiError::invalid("prompts", "`prompts` must be a list of strings or of token-id lists"))
            }
            (None, None) => return Err(ApiError::invalid("prompt", "`prompt` (or `prompts`) is required")),
        };
        Ok(Job {
            api: Api::Generate,
            prompts,
            p,
            multi,
            echo_texts: Vec::new(),
            guide,
            tool_output: None,
            reasoning: None,
        })
    }

    /// Compiles the structured-output form into the engine's constraint: a 400 naming its
    /// field when it does not compile or when the server has no compiler for this model.
    /// Compiling a large schema can take milliseconds: the router runs this on the blocking pool.
    pub fn compile_guide(&mut self, state: &AppState) -> Result<(), ApiError> {
        let Some(g) = &self.guide else { return Ok(()) };
        let s = state
            .structured()
            .map_err(|why| ApiError::invalid(&g.param, format!("structured output is not available: {why}")))?;
        let guided = s.compile(&g.spec).map_err(|e| ApiError::invalid(&g.param, format!("`{}`: {e}", g.param)))?;
        self.p.params.guided = Some(guided);
        Ok(())
    }

    /// The request field that holds the prompt.
    pub fn prompt_param(&self) -> &'static str {
        match self.api {
            Api::Chat => "messages",
            _ if self.multi => "prompts",
            _ => "prompt",
        }
    }

    /// One engine request per prompt, with `max_tokens` fitted to the context: as vLLM 0.32
    /// (`get_max_tokens`), a `max_tokens` larger than the room the prompt leaves is trimmed to
    /// it (the output ends with `length`); a prompt that leaves no room is refused.
    pub fn requests(&self, state: &AppState) -> Result<Vec<GenerateRequest>, ApiError> {
        let ctx = state.max_model_len();
        let param = self.prompt_param();
        self.prompts
            .iter()
            .map(|prompt| {
                let len = prompt.len();
                if len >= ctx {
                    return Err(ApiError::context_overflow(param, ctx, len, self.p.max_tokens.unwrap_or(1).max(1)));
                }
                let room = ctx - len;
                let max_tokens = match self.p.max_tokens {
                    Some(m) => m.min(room),
                    None => match state.config.sampling_defaults.max_tokens {
                        Some(m) => m.min(room),
                        None if self.api == Api::Chat => room,
                        None => state.config.default_max_tokens.min(room),
                    },
                };
                if self.p.params.min_tokens > max_tokens {
                    return Err(ApiError::invalid(
                        "min_tokens",
                        format!(
                            "`min_tokens` ({}) exceeds the {max_tokens} output tokens the context leaves",
                            self.p.params.min_tokens
                        ),
                    ));
                }
                let mut params = self.p.params.clone();
                params.max_tokens = max_tokens;
                if let Some(b) = self.p.best_of {
                    // Ranked by cumulative logprob: the sampled tokens' logprobs are needed.
                    params.n = b;
                    params.logprobs.get_or_insert(0);
                }
                Ok(GenerateRequest { prompt: prompt.clone(), params, priority: self.p.priority })
            })
            .collect()
    }
}

/// What identifies a response: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Completions' logprobs object for some tokens; `offset` is the text offset of the first.
fn completion_logprobs(tok: &Tokenizer, lps: &[TokenLogprob], offset: &mut usize) -> Value {
    let mut tokens = Vec::with_capacity(lps.len());
    let mut token_logprobs = Vec::with_capacity(lps.len());
    let mut top = Vec::with_capacity(lps.len());
    let mut offsets = Vec::with_capacity(lps.len());
    for lp in lps {
        let t = token_text(tok, lp.token);
        offsets.push(*offset);
        *offset += t.len();
        let mut m = Map::new();
        for &(id, l) in &lp.top {
            m.insert(token_text(tok, id), json!(l));
        }
        // vLLM's convention: the sampled token is always among the top entries.
        m.entry(t.clone()).or_insert(json!(lp.logprob));
        tokens.push(Value::String(t));
        token_logprobs.push(json!(lp.logprob));
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// Completions' logprobs for an echoed prompt followed by the generated tokens: the prompt's
/// first token has no logprob (null), as in OpenAI's legacy API that lm-evaluation-harness reads.
fn echo_logprobs(
    tok: &Tokenizer,
    prompt: &[u32],
    prompt_lps: Option<&[Option<TokenLogprob>]>,
    lps: &[TokenLogprob],
    offset: &mut usize,
) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for (i, &id) in prompt.iter().enumerate() {
        let t = token_text(tok, id);
        offsets.push(json!(*offset));
        *offset += t.len();
        match prompt_lps.and_then(|l| l.get(i)).and_then(Option::as_ref) {
            Some(lp) => {
                token_logprobs.push(json!(lp.logprob));
                top.push(top_map(tok, lp, &t));
            }
            None => {
                token_logprobs.push(Value::Null);
                top.push(Value::Null);
            }
        }
        tokens.push(Value::String(t));
    }
    let gen = completion_logprobs(tok, lps, offset);
    for (key, list) in [
        ("tokens", &mut tokens),
        ("token_logprobs", &mut token_logprobs),
        ("top_logprobs", &mut top),
        ("text_offset", &mut offsets),
    ] {
        if let Some(a) = gen.get(key).and_then(Value::as_array) {
            list.extend(a.iter().cloned());
        }
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// `{token text: logprob}` of the top entries, the token itself always among them.
fn top_map(tok: &Tokenizer, lp: &TokenLogprob, text: &str) -> Value {
    let mut m = Map::new();
    for &(id, l) in &lp.top {
        m.insert(token_text(tok, id), json!(l));
    }
    m.entry(text.to_string()).or_insert(json!(lp.logprob));
    Value::Object(m)
}

/// vLLM's `prompt_logprobs`: per prompt position null (the first) or `{token id: {logprob,
/// rank, decoded_token}}` holding the prompt's own token and the top N (ranked 1..N, the
/// prompt's token by the engine's count, else by its place among the top).
fn vllm_prompt_logprobs(tok: &Tokenizer, lps: &[Option<TokenLogprob>]) -> Value {
    let entry =
        |id: u32, l: f32, rank: Option<u32>| json!({"logprob": l, "rank": rank, "decoded_token": token_text(tok, id)});
    Value::Array(
        lps.iter()
            .map(|lp| match lp {
                None => Value::Null,
                Some(lp) => {
                    let mut m = Map::new();
                    let in_top = lp.top.iter().position(|&(id, _)| id == lp.token).map(|i| i as u32 + 1);
                    m.insert(lp.token.to_string(), entry(lp.token, lp.logprob, lp.rank.or(in_top)));
                    for (i, &(id, l)) in lp.top.iter().enumerate() {
                        m.entry(id.to_string()).or_insert_with(|| entry(id, l, Some(i as u32 + 1)));
                    }
                    Value::Object(m)
                }
            })
            .collect(),
    )
}

fn chat_logprob_entries(tok: &Tokenizer, lps: &[TokenLogprob]) -> Vec<Value> {
    let entry = |id: u32, l: f32| {
        let t = token_text(tok, id);
        let bytes: Vec<u8> = t.as_bytes().to_vec();
        (t, bytes, l)
    };
    lps.iter()
        .map(|lp| {
            let (t, bytes, l) = entry(lp.token, lp.logprob);
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(id, l)| {
                    let (t, b, l) = entry(id, l);
                    json!({"token": t, "logprob": l, "bytes": b})
                })
                .collect();
            json!({"token": t, "logprob": l, "bytes": bytes, "top_logprobs": top})
        })
        .collect()
}

fn usage(run: &Run) -> Value {
    usage_of(run.prompt_tokens, run.completion_tokens)
}

fn usage_of(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// One choice of a whole (non-streamed) response.
#[derive(Debug, Default, Clone)]
pub struct ChoiceAcc {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
    /// Its prompt's logprobs (shared by the prompt's completions).
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    pub finish: Option<FinishReason>,
    /// The stop string that ended the text, when one did.
    pub stop_string: Option<String>,
    /// Its last token (the stop token, when one ended it) and how many it has.
    pub last_token: Option<u32>,
    pub tokens: usize,
    /// The sum of its tokens' logprobs (when logprobs were computed).
    pub cum_logprob: f64,
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice; null for
/// anything else (EOS, a complete grammar, `length`).
fn stop_reason(
    finish: Option<&FinishReason>,
    stop_string: Option<&str>,
    last_token: Option<u32>,
    stop_ids: &[u32],
) -> Value {
    match (finish, stop_string) {
        (Some(FinishReason::Stop), Some(s)) => json!(s),
        (Some(FinishReason::Stop), None) => {
            last_token.filter(|t| stop_ids.contains(t)).map_or(Value::Null, |t| json!(t))
        }
        _ => Value::Null,
    }
}

/// `best_of`: of each prompt's `best_of` choices, the `n` of highest cumulative logprob,
/// best first (vLLM's order).
fn best_of(choices: Vec<ChoiceAcc>, best_of: usize, n: usize) -> Vec<ChoiceAcc> {
    let mut out = Vec::with_capacity(choices.len() / best_of.max(1) * n);
    let mut it = choices.into_iter();
    loop {
        let mut group: Vec<ChoiceAcc> = it.by_ref().take(best_of).collect();
        if group.is_empty() {
            return out;
        }
        group.sort_by(|a, b| b.cum_logprob.total_cmp(&a.cum_logprob));
        out.extend(group.into_iter().take(n));
    }
}

/// Waits for the whole run and gathers each choice's text. Engine failures become 500, a
/// shutdown's aborts 503, and a time bound that passed before any token 408.
pub async fn collect(run: &mut Run) -> Result<Vec<ChoiceAcc>, ApiError> {
    let mut acc = vec![ChoiceAcc::default(); run.finishes.len()];
    while let Some((p, upd)) = run.next_update().await {
        for d in upd.deltas {
            if let Some(pl) = &d.prompt_logprobs {
                for c in acc.iter_mut().skip(p * run.n).take(run.n) {
                    c.prompt_logprobs = Some(pl.clone());
                }
            }
            let Some(c) = acc.get_mut(p * run.n + d.index) else { continue };
            c.text.push_str(&d.text);
            c.tokens += d.token_ids.len();
            c.last_token = d.token_ids.last().copied().or(c.last_token);
            c.cum_logprob += d.logprobs.iter().map(|l| l.logprob as f64).sum::<f64>();
            c.logprobs.extend(d.logprobs);
            if d.finish.is_some() {
                c.finish = d.finish;
                c.stop_string = d.stop_string;
            }
        }
    }
    if let Some(e) = run.error() {
        return Err(ApiError::internal(format!("the engine failed this request: {e}")));
    }
    // Past its time bound a request answers what it has, as vLLM answers an aborted one; with
    // nothing to show, 408 says why.
    if run.timed_out() && run.completion_tokens == 0 {
        return Err(ApiError::timeout("the request ran past the server's request timeout before producing any token"));
    }
    if run.aborted() && !run.timed_out() {
        return Err(ApiError::unavailable("the request was aborted: the server is shutting down"));
    }
    Ok(acc)
}

/// The whole JSON response of a finished run.
pub fn response(job: &Job, meta: &ResponseMeta, run: &Run, choices: Vec<ChoiceAcc>, tok: &Tokenizer) -> Value {
    let want_lp = job.p.params.logprobs.is_some();
    let finish = |c: &ChoiceAcc| c.finish.as_ref().map_or("stop", FinishReason::as_str);
    let stop_ids = &job.p.params.stop_token_ids;
    let stop_reason = |c: &ChoiceAcc| stop_reason(c.finish.as_ref(), c.stop_string.as_deref(), c.last_token, stop_ids);
    // `best_of`: the best `n` of each prompt's choices, and only theirs counted.
    let (choices, n, usage) = match job.p.best_of {
        Some(b) => {
            let kept = best_of(choices, b, job.p.params.n);
            let completion = kept.iter().map(|c| c.tokens).sum();
            (kept, job.p.params.n, usage_of(run.prompt_tokens, completion))
        }
        None => (choices, run.n, usage(run)),
    };
    match job.api {
        Api::Completions => {
            let choices: Vec<Value> = choices
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let p = i / n.max(1);
                    let (text, lp) = match job.echo_texts.get(p) {
                        Some(echo) => {
                            let lp = if want_lp { echo_logprobs(tok, &job.prompts[p], c.prompt_logprobs.as_deref(), &c.logprobs, &mut 0) } else { Value::Null };
                            (format!("{echo}{}", c.text), lp)
                        }
                        None => (c.text.clone(), if want_lp { completion_logprobs(tok, &c.logprobs, &mut 0) } else { Value::Null }),
                    };
                    // vLLM's null keys: `prompt_logprobs` unless asked, `token_ids`.
                    let mut choice = json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish(c), "stop_reason": stop_reason(c), "prompt_logprobs": null, "token_ids": null});
                    if job.p.explicit_prompt_logprobs {
                        choice["prompt_logprobs"] = c.prompt_logprobs.as_deref().map_or(Value::Null, |l| vllm_prompt_logprobs(tok, l));
                    }
                    choice
                })
                .collect();
            json!({"id": meta.id, "object": "text_completion", "created": meta.created, "model": meta.model, "choices": choices, "usage": usage})
        }
        Api::Chat => {
            let prompt_lps = choices.first().and_then(|c| c.prompt_logprobs.clone());
            let choices: Vec<Value> = choices
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let lp = if want_lp { json!({"content": chat_logprob_entries(tok, &c.logprobs)}) } else { Value::Null };
                    let (reasoning, text) = match job.reasoning {
                        Some(r) => r.split(&c.text),
                        None => (None, c.text.clone()),
                    };
                    let (content, calls, finish) = tool_message(job.tool_output.as_ref(), &text, finish(c));
                    // vLLM: an answer that was all thinking has null content.
                    let content = content.filter(|c| !(job.reasoning.is_some() && c.is_empty()));
                    // vLLM's null keys: `refusal`, and `reasoning` without a reasoning parser.
                    let mut message = json!({"role": "assistant", "content": content, "refusal": null, "reasoning": null});
                    if job.reasoning.is_some() {
                        message["reasoning_content"] = json!(reasoning);
                        message["reasoning"] = json!(reasoning);
                    }
                    if !calls.is_empty() {
                        message["tool_calls"] = calls.iter().map(|t| structured::tool_call_json(t, &structured::tool_call_id(), None)).collect();
                    }
                    json!({"index": i, "message": message, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason(c), "token_ids": null})
                })
                .collect();
            let mut v = json!({"id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model, "choices": choices, "usage": usage, "prompt_logprobs": null});
            if job.p.explicit_prompt_logprobs {
                v["prompt_logprobs"] = prompt_lps.as_deref().map_or(Value::Null, |l| vllm_prompt_logprobs(tok, l));
            }
            v
        }
        Api::Generate if job.multi => {
            json!({"texts": choices.iter().map(|c| c.text.clone()).collect::<Vec<_>>(), "usage": usage})
        }
        Api::Generate => json!({"text": choices.first().map(|c| c.text.clone()).unwrap_or_default(), "usage": usage}),
    }
}

/// Turns engine updates into server-sent events of one API's chunk format.
///
/// Per-token work is kept small: the envelope of a chunk (id, object, created, model) is
/// rendered once, and a choice without logprobs is written straight into the output.
pub struct StreamFormatter {
    api: Api,
    meta: ResponseMeta,
    tok: Arc<Tokenizer>,
    num_choices: usize,
    include_usage: bool,
    /// `continuous_usage_stats`: every chunk's usage so far (prompt, completion tokens), else null.
    continuous_usage: bool,
    usage_now: (usize, usize),
    stop_ids: Vec<u32>,
    want_logprobs: bool,
    /// Completions: text offset of each choice's next token.
    offsets: Vec<usize>,
    /// `data: {"id":…,"model":…,"choices":[`
    envelope: String,
    /// One error event per request, however many choices the failure ends.
    error_sent: bool,
    /// Completions with `echo`: per prompt its text and ids; per choice whether it was sent.
    echo_texts: Vec<String>,
    prompts: Vec<Vec<u32>>,
    echoed: Vec<bool>,
    /// Per prompt, its logprobs once completion 0 brought them.
    prompt_lps: Vec<Option<Vec<Option<TokenLogprob>>>>,
    explicit_prompt_lps: bool,
    /// Chat with tool calls or reasoning to read: per choice, what of its text was sent (see
    /// [`ReadChoice`]).
    tool_output: Option<ToolOutput>,
    read: Vec<ReadChoice>,
}

/// A streamed chat choice whose text is read as it comes: reasoning is sent as
/// `reasoning_content` as soon as it is certain; a forced call's arguments as they are sampled
/// ([`CallStream`]); otherwise content as far as the tool parser says it is certainly not a
/// call (all of it without tools); at the end the rest is calls or, when it holds none,
/// content. Logprobs of a choice with tools come in its last chunk.
#[derive(Debug, Clone, Default)]
struct ReadChoice {
    reasoning: Option<ReasoningStream>,
    /// A forced call (named or "required"), read as it is sampled; the ids of its calls.
    calls: Option<CallStream>,
    ids: Vec<String>,
    content: String,
    sent: usize,
    lps: Vec<TokenLogprob>,
}

impl crate::body::EventFormat for StreamFormatter {
    fn head(&mut self) -> String {
        StreamFormatter::head(self)
    }
    fn update(&mut self, out: &mut String, run: &Run, prompt: usize, upd: &EngineUpdate) {
        StreamFormatter::update(self, out, run, prompt, upd)
    }
    fn tail(&mut self, out: &mut String, run: &Run) {
        StreamFormatter::tail(self, out, run)
    }
}

fn push_event(out: &mut String, v: &Value) {
    out.push_str("data: ");
    // Writing a Value into a String cannot fail.
    let _ = write!(out, "{v}");
    out.push_str("\n\n");
}

/// A JSON string literal.
fn push_json_str(out: &mut String, s: &str) {
    let _ = write!(out, "{}", Value::from(s));
}

impl StreamFormatter {
    pub fn new(job: &Job, meta: ResponseMeta, tok: Arc<Tokenizer>) -> Self {
        let num_choices = job.prompts.len() * job.p.params.n;
        let object = if job.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut envelope = format!(
            "data: {{\"id\":{},\"object\":\"{object}\",\"created\":{},\"model\":",
            Value::from(meta.id.as_str()),
            meta.created
        );
        push_json_str(&mut envelope, &meta.model);
        envelope.push_str(",\"choices\":[");
        StreamFormatter {
            api: job.api,
            meta,
            tok,
            num_choices,
            include_usage: job.p.include_usage,
            continuous_usage: job.p.continuous_usage,
            usage_now: (job.prompts.iter().map(Vec::len).sum(), 0),
            stop_ids: job.p.params.stop_token_ids.clone(),
            want_logprobs: job.p.params.logprobs.is_some(),
            offsets: vec![0; num_choices],
            envelope,
            error_sent: false,
            echo_texts: job.echo_texts.clone(),
            prompts: if job.echo_texts.is_empty() { Vec::new() } else { job.prompts.clone() },
            echoed: vec![false; num_choices],
            prompt_lps: vec![None; job.prompts.len()],
            explicit_prompt_lps: job.p.explicit_prompt_logprobs,
            tool_output: job.tool_output.clone(),
            read: if job.api == Api::Chat && (job.tool_output.is_some() || job.reasoning.is_some()) {
                let calls = match &job.tool_output {
                    Some(ToolOutput::Named(n)) => Some(CallStream::new(Some(n.clone()))),
                    Some(ToolOutput::Required) => Some(CallStream::new(None)),
                    _ => None,
                };
                vec![
                    ReadChoice { reasoning: job.reasoning.map(ReasoningStream::new), calls, ..Default::default() };
                    num_choices
                ]
            } else {
                Vec::new()
            },
        }
    }

    /// Events sent before any token: chat announces the assistant role of every choice.
    pub fn head(&mut self) -> String {
        let mut out = String::new();
        if self.api == Api::Chat {
            out.push_str(&self.envelope);
            for i in 0..self.num_choices {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{{\"index\":{i},\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}}");
            }
            self.close_chunk(&mut out);
        }
        out
    }

    fn close_chunk(&self, out: &mut String) {
        out.push(']');
        if self.continuous_usage {
            let (p, c) = self.usage_now;
            let _ = write!(
                out,
                ",\"usage\":{{\"prompt_tokens\":{p},\"completion_tokens\":{c},\"total_tokens\":{}}}",
                p + c
            );
        } else if self.include_usage {
            out.push_str(",\"usage\":null");
        }
        out.push_str("}\n\n");
    }

    pub fn update(&mut self, out: &mut String, run: &Run, prompt: usize, upd: &EngineUpdate) {
        self.usage_now = (run.prompt_tokens, run.completion_tokens);
        let mut opened = false;
        for d in &upd.deltas {
            let index = prompt * run.n + d.index;
            if index >= self.num_choices {
                continue;
            }
            if let (Some(FinishReason::Error(e)), false) = (&d.finish, self.error_sent) {
                self.error_sent = true;
                if opened {
                    self.close_chunk(out);
                    opened = false;
                }
                push_event(out, &ApiError::internal(format!("the engine failed this request: {e}")).body());
            }
            if let Some(pl) = &d.prompt_logprobs {
                self.prompt_lps[prompt] = Some(pl.clone());
            }
            if !self.read.is_empty() {
                // A forced call's pieces may need several chunks (a call's first names it).
                for (k, v) in self.read_chunk(index, d, prompt).into_iter().enumerate() {
                    if opened && k > 0 {
                        self.close_chunk(out);
                        opened = false;
                    }
                    if opened {
                        out.push(',');
                    } else {
                        out.push_str(&self.envelope);
                        opened = true;
                    }
                    let _ = write!(out, "{v}");
                }
                continue;
            }
            // A choice's first event repeats its prompt (`echo`), or carries `prompt_logprobs`.
            let first = !self.echoed[index];
            let echo = first && !self.echo_texts.is_empty();
            let has_lp = self.want_logprobs && !d.logprobs.is_empty();
            if d.text.is_empty() && d.finish.is_none() && !has_lp && !echo {
                continue; // text held back (a possible stop string): nothing to say yet
            }
            self.echoed[index] = true;
            let text: std::borrow::Cow<str> =
                if echo { format!("{}{}", self.echo_texts[prompt], d.text).into() } else { d.text.as_str().into() };
            let finish = d.finish.as_ref().map(|f| f.as_str());
            if self.api == Api::Generate {
                let _ = write!(out, "data: {{\"index\":{index},\"text\":");
                push_json_str(out, &text);
                if let Some(f) = finish {
                    let _ = write!(out, ",\"finish_reason\":\"{f}\"");
                }
                out.push_str("}\n\n");
                continue;
            }
            if opened {
                out.push(',');
            } else {
                out.push_str(&self.envelope);
                opened = true;
            }
            let _ = write!(out, "{{\"index\":{index},");
            match self.api {
                Api::Chat if text.is_empty() => out.push_str("\"delta\":{}"),
                Api::Chat => {
                    out.push_str("\"delta\":{\"content\":");
                    push_json_str(out, &text);
                    out.push('}');
                }
                _ => {
                    out.push_str("\"text\":");
                    push_json_str(out, &text);
                }
            }
            out.push_str(",\"logprobs\":");
            if self.want_logprobs {
                let lp = match self.api {
                    Api::Chat => json!({"content": chat_logprob_entries(&self.tok, &d.logprobs)}),
                    _ if echo => echo_logprobs(
                        &self.tok,
                        &self.prompts[prompt],
                        self.prompt_lps[prompt].as_deref(),
                        &d.logprobs,
                        &mut self.offsets[index],
                    ),
                    _ => completion_logprobs(&self.tok, &d.logprobs, &mut self.offsets[index]),
                };
                let _ = write!(out, "{lp}");
            } else {
                out.push_str("null");
            }
            if first && self.explicit_prompt_lps {
                let pl = self.prompt_lps[prompt].as_deref().map_or(Value::Null, |l| vllm_prompt_logprobs(&self.tok, l));
                let _ = write!(out, ",\"prompt_logprobs\":{pl}");
            }
            // vLLM: the first echo chunk carries the prompt's ids.
            if echo {
                let _ = write!(out, ",\"prompt_token_ids\":{}", json!(self.prompts[prompt]));
            }
            match finish {
                Some(f) => {
                    let sr = stop_reason(
                        d.finish.as_ref(),
                        d.stop_string.as_deref(),
                        d.token_ids.last().copied(),
                        &self.stop_ids,
                    );
                    let _ = write!(out, ",\"finish_reason\":\"{f}\",\"stop_reason\":{sr}}}");
                }
                None => out.push_str(",\"finish_reason\":null,\"stop_reason\":null}"),
            }
        }
        if opened {
            self.close_chunk(out);
        }
    }

    /// The next choice entries of a chat choice read as it streams ([`ReadChoice`]), each for
    /// a chunk of its own; none when there is nothing to say yet. A forced call streams in
    /// OpenAI's shape: a first entry with its index, id, type, name and empty arguments, then
    /// entries with the index and pieces of the arguments as they are sampled.
    fn read_chunk(&mut self, index: usize, d: &crate::engine_client::CompletionDelta, prompt: usize) -> Vec<Value> {
        let done = d.finish.is_some();
        let rc = &mut self.read[index];
        let (reasoning, piece) = match &mut rc.reasoning {
            Some(st) => st.push(&d.text, done),
            None => (String::new(), d.text.clone()),
        };
        rc.content.push_str(&piece);
        // The tool_calls entries, one per chunk; consecutive pieces of one call's arguments merged.
        let mut entries: Vec<Value> = Vec::new();
        // "auto": calls stream from where the parser is sure they begin.
        let mut feed = piece.as_str();
        if let (None, Some(ToolOutput::Auto(p))) = (&rc.calls, &self.tool_output) {
            match p.calls_start(&rc.content) {
                Some(start) => {
                    rc.calls = Some(CallStream::new(None));
                    feed = &rc.content[start..];
                }
                None => feed = "",
            }
        }
        if let Some(cs) = &mut rc.calls {
            for e in cs.push(feed) {
                match e {
                    CallEvent::Start { index: k, name } => {
                        let id = structured::tool_call_id();
                        rc.ids.push(id.clone());
                        entries.push(json!({"index": k, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}));
                    }
                    CallEvent::Args { index: k, piece } => match entries.last_mut() {
                        Some(last) if last["index"] == k && last.get("id").is_none() => {
                            let joined =
                                format!("{}{piece}", last["function"]["arguments"].as_str().unwrap_or_default());
                            last["function"]["arguments"] = json!(joined);
                        }
                        _ => entries.push(json!({"index": k, "function": {"arguments": piece}})),
                    },
                }
            }
        }
        let end = match &self.tool_output {
            None => rc.content.len(),
            Some(ToolOutput::Auto(p)) => p.content_len(&rc.content).max(rc.sent),
            Some(_) => rc.sent,
        };
        let mut content = rc.content[rc.sent..end].to_string();
        rc.sent = end;
        let lps = if self.tool_output.is_some() {
            rc.lps.extend(d.logprobs.iter().cloned());
            if done {
                std::mem::take(&mut rc.lps)
            } else {
                Vec::new()
            }
        } else {
            d.logprobs.clone()
        };
        let mut delta = Map::new();
        if !reasoning.is_empty() {
            delta.insert("reasoning_content".into(), json!(reasoning));
            delta.insert("reasoning".into(), json!(reasoning));
        }
        let mut finish = None;
        if let Some(f) = &d.finish {
            let text = std::mem::take(&mut rc.content);
            let (said, calls, mut fin) = tool_message(self.tool_output.as_ref(), &text, f.as_str());
            let streamed = rc.ids.len();
            if streamed == 0 {
                // A forced answer cut before its first call's name is nothing, not its text.
                if calls.is_empty() && said.is_some() {
                    content.push_str(&text[rc.sent..]);
                }
            } else if matches!(self.tool_output, Some(ToolOutput::Auto(_))) && *f == FinishReason::Stop {
                // Calls went out: the answer is calls, as vLLM's streamed parsers answer.
                fin = "tool_calls".into();
            }
            // Calls the stream did not follow (a format sent whole, or more than it saw).
            entries.extend(
                calls
                    .iter()
                    .enumerate()
                    .skip(streamed)
                    .map(|(k, t)| structured::tool_call_json(t, &structured::tool_call_id(), Some(k))),
            );
            finish = Some(fin);
        }
        if !content.is_empty() {
            delta.insert("content".into(), json!(content));
        }
        let has_lp = self.want_logprobs && !lps.is_empty();
        if delta.is_empty() && entries.is_empty() && finish.is_none() && !has_lp {
            return Vec::new();
        }
        // Content (and reasoning) first, then a chunk per call entry; the last carries the
        // finish and the logprobs.
        let mut deltas: Vec<Map<String, Value>> = Vec::new();
        if !delta.is_empty() || entries.is_empty() {
            deltas.push(delta);
        }
        deltas.extend(entries.into_iter().map(|e| Map::from_iter([("tool_calls".to_string(), json!([e]))])));
        let last = deltas.len() - 1;
        let mut out = Vec::with_capacity(deltas.len());
        for (k, delta) in deltas.into_iter().enumerate() {
            let first = !self.echoed[index];
            self.echoed[index] = true;
            let lp = match (self.want_logprobs, k == last) {
                (true, true) => json!({"content": chat_logprob_entries(&self.tok, &lps)}),
                (true, false) => json!({"content": []}),
                (false, _) => Value::Null,
            };
            let fin = if k == last { finish.clone() } else { None };
            // vLLM's stop_reason: the stop string or stop token id that ended the choice, on
            // the chunk that carries the finish; null elsewhere.
            let sr = if k == last {
                stop_reason(d.finish.as_ref(), d.stop_string.as_deref(), d.token_ids.last().copied(), &self.stop_ids)
            } else {
                Value::Null
            };
            let mut v =
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": fin, "stop_reason": sr});
            if first && self.explicit_prompt_lps {
                v["prompt_logprobs"] =
                    self.prompt_lps[prompt].as_deref().map_or(Value::Null, |l| vllm_prompt_logprobs(&self.tok, l));
            }
            out.push(v);
        }
        out
    }

    pub fn tail(&mut self, out: &mut String, run: &Run) {
        if self.include_usage && self.api != Api::Generate {
            let object = if self.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" };
            push_event(
                out,
                &json!({"id": self.meta.id, "object": object, "created": self.meta.created, "model": self.meta.model, "choices": [], "usage": usage(run)}),
            );
        }
        out.push_str("data: [DONE]\n\n");
    }
}
