//! OpenAI's whole (non-streamed) responses: completions, chat completions and `/generate`.

use serde_json::{json, Value};
use tandem_core::tokenizer::Tokenizer;

use super::logprobs::{chat_logprob_entries, completion_logprobs, echo_logprobs, vllm_prompt_logprobs};
use crate::answer::tool_message;
use crate::engine_client::FinishReason;
use crate::job::Job;
use crate::params::Api;
use crate::pipeline::ChoiceAcc;
use crate::run::Run;
use crate::structured;

/// What identifies a response: its id, creation time and model.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub(super) fn usage(run: &Run) -> Value {
    usage_of(run.prompt_tokens, run.completion_tokens)
}

pub(super) fn usage_of(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

/// vLLM's `stop_reason`: the stop string or stop token id that ended a choice; null for
/// anything else (EOS, a complete grammar, `length`).
pub(super) fn stop_reason(
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

/// The whole JSON response of a finished run.
pub fn response(job: &Job, meta: &ResponseMeta, run: &Run, choices: Vec<ChoiceAcc>, tok: &Tokenizer) -> Value {
    let want_lp = job.p.params.sampling.logprobs.is_some();
    let finish = |c: &ChoiceAcc| c.finish.as_ref().map_or("stop", FinishReason::as_str);
    let stop_ids = &job.p.params.sampling.stop_token_ids;
    let stop_reason = |c: &ChoiceAcc| stop_reason(c.finish.as_ref(), c.stop_string.as_deref(), c.last_token, stop_ids);
    // `best_of`: the best `n` of each prompt's choices, and only theirs counted.
    let (choices, n, usage) = match job.p.best_of {
        Some(b) => {
            let kept = best_of(choices, b, job.p.params.sampling.n);
            let completion = kept.iter().map(|c| c.tokens).sum();
            (kept, job.p.params.sampling.n, usage_of(run.prompt_tokens, completion))
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
                    // vLLM's null keys: `prompt_logprobs` unless the prompt was scored (asked,
                    // or `echo` with `logprobs`), `token_ids`.
                    let mut choice = json!({"index": i, "text": text, "logprobs": lp, "finish_reason": finish(c), "stop_reason": stop_reason(c), "prompt_logprobs": null, "token_ids": null});
                    if job.p.explicit_prompt_logprobs || (job.p.echo && want_lp) {
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
                    job.count_tool_parse(false, !calls.is_empty());
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
