//! Sampling fields of a JSON request body, type- and range-checked, each error naming its field.
//!
//! `null` counts as absent (clients send it for "default"). Unknown fields are ignored, as
//! OpenAI's own server does for fields it has dropped.

use serde_json::Value;
use tandem_engine::SamplingParams;

use crate::config::SamplingDefaults;
use crate::engine_client::RequestParams;
use crate::error::ApiError;
use crate::fields::{type_name, Fields};

/// The ranges are the engine's: [`tandem_engine::SamplingParams::validate`] checks them.
pub use tandem_engine::sampling_params::{MAX_LOGPROBS, MAX_N};

/// Which API's conventions the body follows (they differ in `max_tokens` and `logprobs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    Generate,
}

/// Everything about a request but its prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedParams {
    pub params: RequestParams,
    /// As asked; the server fills in what the context leaves when absent.
    pub max_tokens: Option<usize>,
    pub priority: i32,
    pub stream: bool,
    pub include_usage: bool,
    /// Completions: the prompt is repeated before each choice's text (and its logprobs before
    /// the choice's, when logprobs are asked for).
    pub echo: bool,
    /// The client sent vLLM's `prompt_logprobs` (answered in that field), as opposed to
    /// prompt logprobs implied by `echo` with `logprobs`.
    pub explicit_prompt_logprobs: bool,
    /// Chat: vLLM's `continue_final_message`: the last message is left open for the model to
    /// continue (assistant prefill) instead of closed.
    pub continue_final_message: bool,
    /// vLLM's `stream_options.continuous_usage_stats`: every streamed chunk carries `usage`.
    pub continuous_usage: bool,
    /// Completions' `best_of` above `n`: this many are generated, the `n` of highest
    /// cumulative logprob answered.
    pub best_of: Option<usize>,
}

/// Reads the sampling fields shared by every endpoint. `vocab` bounds `stop_token_ids`;
/// `defaults` fill what the request leaves out.
pub fn parse_params(f: &Fields, api: Api, vocab: usize, defaults: &SamplingDefaults) -> Result<ParsedParams, ApiError> {
    let mut p = SamplingParams::default();
    let d = defaults;
    p.temperature = d.temperature.unwrap_or(p.temperature);
    p.top_p = d.top_p.unwrap_or(p.top_p);
    p.top_k = d.top_k.unwrap_or(p.top_k);
    p.min_p = d.min_p.unwrap_or(p.min_p);
    p.repetition_penalty = d.repetition_penalty.unwrap_or(p.repetition_penalty);
    if let Some(n) = f.int_in("n", 1, MAX_N as i64)? {
        p.n = n as usize;
    }
    if let Some(t) = f.f32("temperature")? {
        p.temperature = t;
    }
    if let Some(t) = f.f32("top_p")? {
        p.top_p = t;
    }
    // vLLM's convention: -1 (or 0) disables top-k.
    if let Some(k) = f.int_in("top_k", -1, i32::MAX as i64)? {
        p.top_k = k.max(0) as usize;
    }
    if let Some(m) = f.f32("min_p")? {
        p.min_p = m;
    }
    if let Some(r) = f.f32("repetition_penalty")? {
        p.repetition_penalty = r;
    }
    if let Some(x) = f.f32("presence_penalty")? {
        p.presence_penalty = x;
    }
    if let Some(x) = f.f32("frequency_penalty")? {
        p.frequency_penalty = x;
    }
    p.seed = match f.get("seed") {
        None => None,
        // Negative seeds are accepted as their two's-complement bits, like numpy's.
        Some(Value::Number(n)) if n.as_u64().is_some() || n.as_i64().is_some() => {
            Some(n.as_u64().unwrap_or_else(|| n.as_i64().unwrap_or(0) as u64))
        }
        Some(_) => return Err(ApiError::invalid("seed", "`seed` must be an integer")),
    };
    p.stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(String::from).ok_or_else(|| {
                    ApiError::invalid(
                        "stop",
                        format!("`stop` must be a string or a list of strings, found {}", type_name(v)),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` must be a string or a list of strings, got {}", type_name(v)),
            ))
        }
    };
    p.stop_token_ids = match f.get("stop_token_ids") {
        None => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| match v.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                _ => Err(ApiError::invalid(
                    "stop_token_ids",
                    format!("`stop_token_ids` holds {v}, not a token id of the vocabulary [0, {vocab})"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!("`stop_token_ids` must be a list of integers, got {}", type_name(v)),
            ))
        }
    };
    p.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);

    // Chat's newer name wins over the deprecated one.
    let max_name = if api == Api::Chat && f.get("max_completion_tokens").is_some() {
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    // 0 is allowed where the prompt alone is the answer: completions with `echo` (scoring).
    let echo = api == Api::Completions && f.bool("echo")?.unwrap_or(false);
    let max_tokens = f.int_in(max_name, 0, i64::MAX)?.map(|m| m as usize);
    if max_tokens == Some(0) && !echo {
        return Err(ApiError::invalid(
            max_name,
            format!("`{max_name}` must be at least 1 (0 is allowed only with `echo`), got 0"),
        ));
    }
    if let Some(m) = f.int_in("min_tokens", 0, i64::MAX)? {
        p.min_tokens = m as usize;
        if let Some(max) = max_tokens.filter(|&max| max < p.min_tokens) {
            return Err(ApiError::invalid(
                "min_tokens",
                format!("`min_tokens` ({m}) must not exceed `{max_name}` ({max})"),
            ));
        }
    }
    p.logprobs = match api {
        Api::Completions | Api::Generate => f.int_in("logprobs", 0, MAX_LOGPROBS as i64)?.map(|k| k as usize),
        Api::Chat => {
            let top = f.int_in("top_logprobs", 0, MAX_LOGPROBS as i64)?;
            match (f.bool("logprobs")?.unwrap_or(false), top) {
                (true, top) => Some(top.unwrap_or(0) as usize),
                (false, Some(_)) => {
                    return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
                }
                (false, None) => None,
            }
        }
    };
    // vLLM's field; with `echo`, completions' `logprobs` asks the same of the prompt.
    p.prompt_logprobs = f.int_in("prompt_logprobs", 0, MAX_LOGPROBS as i64)?.map(|k| k as usize);
    let explicit_prompt_logprobs = p.prompt_logprobs.is_some();
    if echo && p.logprobs.is_some() && p.prompt_logprobs.is_none() {
        p.prompt_logprobs = p.logprobs;
    }
    if echo && max_tokens == Some(0) && p.prompt_logprobs.is_none() {
        // Nothing is generated and nothing is scored: the prompt alone, as text.
        p.prompt_logprobs = Some(0);
    }
    p.logit_bias = match f.object("logit_bias")? {
        None => Vec::new(),
        Some(o) => {
            o.0.iter()
                .map(|(k, v)| {
                    let id = k.parse::<u32>().ok().filter(|&id| (id as usize) < vocab).ok_or_else(|| {
                        ApiError::invalid(
                            "logit_bias",
                            format!("`logit_bias` key {k:?} is not a token id of the vocabulary [0, {vocab})"),
                        )
                    })?;
                    match v.as_f64() {
                        Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                        _ => Err(ApiError::invalid(
                            "logit_bias",
                            format!("`logit_bias` of token {id} must be a number in [-100, 100], got {v}"),
                        )),
                    }
                })
                .collect::<Result<_, _>>()?
        }
    };
    p.include_stop_str_in_output = f.bool("include_stop_str_in_output")?.unwrap_or(false);
    // The ranges: the engine's own check, so that what the server accepts the engine accepts.
    // `max_tokens` is left out here: the context fills it in later.
    let mut check = p.clone();
    check.max_tokens = None;
    check.validate().map_err(|e| ApiError::invalid(e.field, e.message))?;
    let priority = f.int_in("priority", i32::MIN as i64, i32::MAX as i64)?.unwrap_or(0) as i32;
    let stream = f.bool("stream")?.unwrap_or(false);
    let (include_usage, continuous_usage) = match f.object("stream_options")? {
        Some(o) => {
            let flag = |name: &str| {
                o.bool(name)
                    .map_err(|e| ApiError { param: Some(format!("stream_options.{name}")), ..e })
                    .map(|b| b.unwrap_or(false))
            };
            let include = flag("include_usage")?;
            // vLLM: continuous usage only together with `include_usage`.
            (include, include && flag("continuous_usage_stats")?)
        }
        None => (false, false),
    };
    let continue_final_message = api == Api::Chat && f.bool("continue_final_message")?.unwrap_or(false);
    let best_of = match f.int_in("best_of", 1, MAX_N as i64)?.map(|b| b as usize) {
        Some(b) if b < p.n => {
            return Err(ApiError::invalid("best_of", format!("`best_of` ({b}) must be at least `n` ({})", p.n)))
        }
        Some(b) if b > p.n && stream => {
            return Err(ApiError::invalid(
                "best_of",
                "`best_of` > `n` cannot be streamed (the best are known only at the end)",
            ))
        }
        Some(b) if b > p.n && api != Api::Completions => {
            return Err(ApiError::invalid("best_of", "`best_of` is read on completions only"))
        }
        Some(b) if b > p.n => Some(b),
        _ => None,
    };
    Ok(ParsedParams {
        params: RequestParams { sampling: p, adapter: None },
        max_tokens,
        priority,
        stream,
        include_usage,
        echo,
        explicit_prompt_logprobs,
        continue_final_message,
        continuous_usage,
        best_of,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value, api: Api) -> Result<ParsedParams, ApiError> {
        parse_params(&Fields(v.as_object().unwrap()), api, 100, &SamplingDefaults::default())
    }

    #[test]
    fn generation_config_defaults_sit_under_the_request() {
        let d = SamplingDefaults {
            temperature: Some(0.6),
            top_p: Some(0.9),
            top_k: Some(20),
            min_p: None,
            repetition_penalty: Some(1.1),
            max_tokens: Some(64),
        };
        let f = |v: Value| parse_params(&Fields(v.as_object().unwrap()), Api::Chat, 100, &d).unwrap();
        let p = f(json!({}));
        assert_eq!(
            (
                p.params.sampling.temperature,
                p.params.sampling.top_p,
                p.params.sampling.top_k,
                p.params.sampling.min_p,
                p.params.sampling.repetition_penalty
            ),
            (0.6, 0.9, 20, 0.0, 1.1)
        );
        let p = f(json!({"temperature": 0, "top_k": -1, "top_p": null}));
        assert_eq!(
            (p.params.sampling.temperature, p.params.sampling.top_k, p.params.sampling.top_p),
            (0.0, 0, 0.9),
            "the request's own values win; null is absent"
        );
    }

    #[test]
    fn defaults_and_values() {
        let p = parse(json!({}), Api::Completions).unwrap();
        assert_eq!(p.params, RequestParams::default());
        assert_eq!(p.max_tokens, None);
        let p = parse(
            json!({"n": 3, "temperature": 0, "top_k": -1, "seed": -1, "stop": "x", "stop_token_ids": [5], "max_tokens": 7,
                   "min_tokens": 2, "logprobs": 4, "priority": -5, "stream": true, "stream_options": {"include_usage": true}, "top_p": null}),
            Api::Completions,
        )
        .unwrap();
        assert_eq!(
            (p.params.sampling.n, p.params.sampling.temperature, p.params.sampling.top_k, p.params.sampling.seed),
            (3, 0.0, 0, Some(u64::MAX))
        );
        assert_eq!(
            (p.params.sampling.stop.clone(), p.params.sampling.stop_token_ids.clone()),
            (vec!["x".to_string()], vec![5])
        );
        assert_eq!(
            (p.max_tokens, p.params.sampling.min_tokens, p.params.sampling.logprobs, p.priority),
            (Some(7), 2, Some(4), -5)
        );
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn chat_names() {
        let p =
            parse(json!({"max_tokens": 3, "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2}), Api::Chat)
                .unwrap();
        assert_eq!((p.max_tokens, p.params.sampling.logprobs), (Some(9), Some(2)));
        let p = parse(json!({"logprobs": true}), Api::Chat).unwrap();
        assert_eq!(p.params.sampling.logprobs, Some(0));
        assert_eq!(parse(json!({"top_logprobs": 2}), Api::Chat).unwrap_err().param.as_deref(), Some("top_logprobs"));
        assert_eq!(parse(json!({"logprobs": 2}), Api::Chat).unwrap_err().param.as_deref(), Some("logprobs"));
    }

    #[test]
    fn echo_scoring_and_logit_bias() {
        let p = parse(json!({"echo": true, "max_tokens": 0, "logprobs": 3}), Api::Completions).unwrap();
        assert_eq!(
            (p.echo, p.max_tokens, p.params.sampling.logprobs, p.params.sampling.prompt_logprobs),
            (true, Some(0), Some(3), Some(3))
        );
        let p = parse(json!({"echo": true, "max_tokens": 0}), Api::Completions).unwrap();
        assert_eq!(p.params.sampling.prompt_logprobs, Some(0));
        let p = parse(json!({"echo": true, "max_tokens": 2}), Api::Completions).unwrap();
        assert_eq!(p.params.sampling.prompt_logprobs, None, "echo without logprobs needs no scoring");
        let p = parse(
            json!({"prompt_logprobs": 2, "logit_bias": {"7": -100, "3": 2.5}, "include_stop_str_in_output": true}),
            Api::Chat,
        )
        .unwrap();
        let mut bias = p.params.sampling.logit_bias.clone();
        bias.sort_by_key(|b| b.0);
        assert_eq!(
            (p.params.sampling.prompt_logprobs, bias, p.params.sampling.include_stop_str_in_output),
            (Some(2), vec![(3, 2.5), (7, -100.0)], true)
        );
        assert_eq!(
            parse(json!({"echo": true, "max_tokens": 0}), Api::Chat).unwrap_err().param.as_deref(),
            Some("max_tokens"),
            "chat has no echo"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (json!({"temperature": "hot"}), "temperature", "must be a number"),
            (json!({"temperature": 2.5}), "temperature", "[0, 2]"),
            (json!({"top_p": 0}), "top_p", "(0, 1]"),
            (json!({"top_k": -2}), "top_k", "[-1"),
            (json!({"min_p": 1.5}), "min_p", "[0, 1]"),
            (json!({"repetition_penalty": 0}), "repetition_penalty", "(0, 10]"),
            (json!({"presence_penalty": 3}), "presence_penalty", "[-2, 2]"),
            (json!({"frequency_penalty": -3}), "frequency_penalty", "[-2, 2]"),
            (json!({"n": 0}), "n", "[1, 128]"),
            (json!({"n": 1.5}), "n", "must be an integer"),
            (json!({"max_tokens": 0}), "max_tokens", "only with `echo`"),
            (json!({"prompt_logprobs": 21}), "prompt_logprobs", "[0, 20]"),
            (json!({"logit_bias": {"x": 1}}), "logit_bias", "not a token id"),
            (json!({"logit_bias": {"100": 1}}), "logit_bias", "[0, 100)"),
            (json!({"logit_bias": {"5": 101}}), "logit_bias", "[-100, 100]"),
            (json!({"logit_bias": [1]}), "logit_bias", "must be an object"),
            (json!({"include_stop_str_in_output": 1}), "include_stop_str_in_output", "boolean"),
            (json!({"max_tokens": 2, "min_tokens": 3}), "min_tokens", "must not exceed"),
            (json!({"stop": [1]}), "stop", "list of strings"),
            (json!({"stop": ""}), "stop", "must not be empty"),
            (json!({"stop_token_ids": [100]}), "stop_token_ids", "[0, 100)"),
            (json!({"logprobs": 21}), "logprobs", "[0, 20]"),
            (json!({"ignore_eos": 1}), "ignore_eos", "boolean"),
            (json!({"priority": 1e10}), "priority", "integer"),
            (json!({"seed": "x"}), "seed", "integer"),
            (json!({"stream": "yes"}), "stream", "boolean"),
            (json!({"stream_options": {"include_usage": 1}}), "stream_options.include_usage", "boolean"),
        ];
        for (body, field, msg) in cases {
            let e = parse(body.clone(), Api::Completions).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
            assert!(e.message.contains(msg), "{body}: {}", e.message);
        }
    }
}
