//! OpenAI's stream chunks: completions', chat completions' and `/generate`'s server-sent events.

use std::fmt::Write;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tandem_core::tokenizer::Tokenizer;

use super::logprobs::{chat_logprob_entries, completion_logprobs, echo_logprobs, vllm_prompt_logprobs};
use super::response::{stop_reason, usage, ResponseMeta};
use crate::answer::{AnswerReader, Event};
use crate::engine_client::{EngineUpdate, FinishReason, TokenLogprob};
use crate::error::ApiError;
use crate::job::{Job, ToolOutput};
use crate::params::Api;
use crate::run::Run;
use crate::structured;

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

/// A streamed chat choice whose text is read as it comes ([`AnswerReader`]): reasoning is sent
/// as `reasoning_content` as soon as it is certain; calls' arguments as they are sampled;
/// content as far as it is certainly not a call; at the end the rest is calls or, when it holds
/// none, content. Logprobs of a choice with tools come in its last chunk.
#[derive(Debug, Clone)]
struct ReadChoice {
    reader: AnswerReader,
    /// The ids of the calls announced.
    ids: Vec<String>,
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
        let num_choices = job.prompts.len() * job.p.params.sampling.n;
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
            stop_ids: job.p.params.sampling.stop_token_ids.clone(),
            want_logprobs: job.p.params.sampling.logprobs.is_some(),
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
                vec![ReadChoice { reader: AnswerReader::new(job), ids: Vec::new(), lps: Vec::new() }; num_choices]
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
        let mut reasoning = String::new();
        let mut content = String::new();
        // The tool_calls entries, one per chunk; consecutive pieces of one call's arguments merged.
        let mut entries: Vec<Value> = Vec::new();
        for e in rc.reader.push(&d.text, done) {
            match e {
                Event::Thinking(t) => reasoning.push_str(&t),
                Event::Text(t) => content.push_str(&t),
                Event::CallStart { index: k, name } => {
                    let id = structured::tool_call_id();
                    rc.ids.push(id.clone());
                    entries.push(
                        json!({"index": k, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}),
                    );
                }
                Event::CallArgs { index: k, piece } => match entries.last_mut() {
                    Some(last) if last["index"] == k && last.get("id").is_none() => {
                        let joined = format!("{}{piece}", last["function"]["arguments"].as_str().unwrap_or_default());
                        last["function"]["arguments"] = json!(joined);
                    }
                    _ => entries.push(json!({"index": k, "function": {"arguments": piece}})),
                },
            }
        }
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
            let end = rc.reader.finish(f.as_str());
            let (said, calls, mut fin) = (end.content, end.calls, end.finish);
            let streamed = rc.ids.len();
            if streamed == 0 {
                // A forced answer cut before its first call's name is nothing, not its text.
                if calls.is_empty() && said.is_some() {
                    content.push_str(&end.text[end.sent..]);
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
