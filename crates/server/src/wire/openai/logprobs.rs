//! OpenAI's and vLLM's logprobs objects: completions' token lists with text offsets (echoed
//! prompts included), chat's entries with bytes, and vLLM's `prompt_logprobs`.

use serde_json::{json, Map, Value};
use tandem_core::tokenizer::Tokenizer;

use crate::engine_client::TokenLogprob;

pub(super) fn token_text(tok: &Tokenizer, id: u32) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Completions' logprobs object for some tokens; `offset` is the text offset of the first.
pub(super) fn completion_logprobs(tok: &Tokenizer, lps: &[TokenLogprob], offset: &mut usize) -> Value {
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
pub(super) fn echo_logprobs(
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
pub(super) fn top_map(tok: &Tokenizer, lp: &TokenLogprob, text: &str) -> Value {
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
pub(super) fn vllm_prompt_logprobs(tok: &Tokenizer, lps: &[Option<TokenLogprob>]) -> Value {
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

pub(super) fn chat_logprob_entries(tok: &Tokenizer, lps: &[TokenLogprob]) -> Vec<Value> {
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
