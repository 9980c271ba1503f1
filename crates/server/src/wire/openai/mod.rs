//! OpenAI's `/v1/completions` and `/v1/chat/completions` requests, and the plain `/generate`,
//! read into a [`Job`].
//!
//! `/generate` takes `{"prompt": "..."}` or `{"prompts": [...]}` plus the same sampling fields
//! and answers `{"text": ...}` or `{"texts": [...]}`; streamed, each event is
//! `{"index": i, "text": delta}` (plus `finish_reason` on a prompt's last), then `[DONE]`.

mod logprobs;
mod response;
mod stream;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;
use tandem_core::tokenizer::Tokenizer;

use crate::body::EventFormat;
use crate::chat::normalize_messages;
use crate::error::ApiError;
use crate::fields::Fields;
use crate::job::{check_ids, Job};
use crate::params::{parse_params, Api};
use crate::pipeline::{ChoiceAcc, WireRequest};
use crate::run::Run;
use crate::state::AppState;
use crate::structured;
use crate::wire::common::{check_served, now_secs, parse_json};
use response::{response, ResponseMeta};
use stream::StreamFormatter;

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

/// A `/v1/completions` body as a job.
fn completions(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    let adapter = check_served(&f, state)?;
    refuse_unsupported(&f, Api::Completions)?;
    let vocab = state.config.vocab_size;
    let mut p = parse_params(&f, Api::Completions, vocab, &state.config.sampling_defaults)?;
    p.params.adapter = adapter;
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
        tool_parses: None,
    })
}

/// A `/v1/chat/completions` body as a job.
fn chat(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    let adapter = check_served(&f, state)?;
    refuse_unsupported(&f, Api::Chat)?;
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::invalid("echo", "`echo` is not supported on chat completions"));
    }
    let vocab = state.config.vocab_size;
    let mut p = parse_params(&f, Api::Chat, vocab, &state.config.sampling_defaults)?;
    p.params.adapter = adapter;
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
                format!("`chat_template_kwargs` must be an object, got {}", crate::fields::type_name(v)),
            ))
        }
    };
    Job::chat_from(state, p, guide, tools.as_ref(), &msgs, add_gen, kwargs)
}

/// A `/generate` body as a job.
fn generate(state: &AppState, body: &[u8]) -> Result<Job, ApiError> {
    let o = parse_json(body)?;
    let f = Fields(&o);
    refuse_unsupported(&f, Api::Generate)?;
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::invalid("echo", "`echo` is not supported on /generate; use /v1/completions"));
    }
    let vocab = state.config.vocab_size;
    let p = parse_params(&f, Api::Generate, vocab, &state.config.sampling_defaults)?;
    let guide = structured::parse_guide(&f)?;
    if p.params.sampling.n != 1 {
        return Err(ApiError::invalid("n", "`/generate` answers one text per prompt; use /v1/completions for n > 1"));
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
        tool_parses: None,
    })
}

/// An OpenAI request (completions, chat completions, `/generate`) as the pipeline runs it.
pub(crate) struct OpenAi {
    job: Job,
    /// Named once the job is ready to start.
    meta: Option<ResponseMeta>,
}

impl OpenAi {
    /// `/v1/completions`.
    pub(crate) fn completions(state: &AppState, body: &[u8]) -> Result<OpenAi, ApiError> {
        Ok(OpenAi { job: completions(state, body)?, meta: None })
    }

    /// `/v1/chat/completions`.
    pub(crate) fn chat(state: &AppState, body: &[u8]) -> Result<OpenAi, ApiError> {
        Ok(OpenAi { job: chat(state, body)?, meta: None })
    }

    /// `/generate`.
    pub(crate) fn generate(state: &AppState, body: &[u8]) -> Result<OpenAi, ApiError> {
        Ok(OpenAi { job: generate(state, body)?, meta: None })
    }

    fn meta(&mut self) -> ResponseMeta {
        self.meta.take().unwrap_or_else(|| ResponseMeta { id: String::new(), created: 0, model: String::new() })
    }
}

impl WireRequest for OpenAi {
    fn job(&self) -> &Job {
        &self.job
    }

    fn job_mut(&mut self) -> &mut Job {
        &mut self.job
    }

    fn id(&mut self, state: &AppState) -> String {
        let n = state.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match self.job.api {
            Api::Completions => "cmpl",
            Api::Chat => "chatcmpl",
            Api::Generate => "gen",
        };
        let meta = ResponseMeta {
            id: format!("{prefix}-{n:016x}"),
            created: now_secs(),
            model: state.answer_model(self.job.p.params.adapter),
        };
        let id = meta.id.clone();
        self.meta = Some(meta);
        id
    }

    fn prompt_param(&self) -> &'static str {
        self.job.prompt_param()
    }

    fn stream(mut self, state: &Arc<AppState>) -> Box<dyn EventFormat> {
        let meta = self.meta();
        Box::new(StreamFormatter::new(&self.job, meta, state.tokenizer.clone()))
    }

    fn whole(mut self, state: &AppState, run: &Run, choices: Vec<ChoiceAcc>) -> Value {
        let meta = self.meta();
        response(&self.job, &meta, run, choices, &state.tokenizer)
    }
}
