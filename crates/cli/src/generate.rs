//! `tandem generate`: prompts through the library's engine (`tandem::Llm`).
//!
//! One `--prompt` or `--chat` streams its completion's text to stdout. `--prompts-file FILE`
//! (one prompt a line, or JSONL whose objects carry a `prompt` string or token-id list, or a
//! `messages` list)
//! submits every prompt at once, so the engine batches them, and writes one JSON line per
//! prompt, in the file's order; `--jsonl` does the same for a single prompt. `--json-schema`,
//! `--json-object`, `--regex`, `--choice` or `--grammar` constrain every completion (structured
//! output, as the server's `response_format` and `guided_*` do).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tandem::{FinishReason, GuideSpec, LlmBuilder, Message, Output, Prompt, SamplingParams};

use crate::backends::{self, BackendKind};

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory, or a GGUF file (served kept quantized) (default: the
    /// default model, fetched when absent).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text, sent as is.
    #[arg(long, conflicts_with_all = ["chat", "prompts_file"])]
    prompt: Option<String>,
    /// One user message, rendered with the model's chat template.
    #[arg(long, conflicts_with = "prompts_file")]
    chat: Option<String>,
    /// Many prompts: one a line, or JSONL with a `prompt` or `messages` field per line.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Write JSON lines even for a single prompt.
    #[arg(long)]
    jsonl: bool,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 is no limit.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long)]
    seed: Option<u64>,
    /// A stop string (repeat for several); it is not part of the output.
    #[arg(long)]
    stop: Vec<String>,
    /// Completions per prompt.
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    n: usize,
    /// Top-N logprobs per generated token, in the JSON lines.
    #[arg(long)]
    logprobs: Option<usize>,
    #[arg(long)]
    ignore_eos: bool,
    #[arg(long, value_enum, default_value_t = BackendKind::Reference)]
    backend: BackendKind,
    /// Most sequences in one engine step.
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Token budget of one engine step.
    #[arg(long, default_value_t = 512)]
    max_num_batched_tokens: usize,
    /// KV blocks in the pool (default: sized from free device memory).
    #[arg(long)]
    num_kv_blocks: Option<usize>,
    /// Structured output: JSON valid against this schema (inline JSON, or @FILE).
    #[arg(long, group = "guide")]
    json_schema: Option<String>,
    /// Structured output: any JSON object.
    #[arg(long, group = "guide")]
    json_object: bool,
    /// Structured output: text matching this regex.
    #[arg(long, group = "guide")]
    regex: Option<String>,
    /// Structured output: exactly one of these strings (repeat the flag).
    #[arg(long, group = "guide")]
    choice: Vec<String>,
    /// Structured output: a Lark grammar file (llguidance's dialect, as vLLM's guided_grammar).
    #[arg(long, group = "guide")]
    grammar: Option<PathBuf>,
}

impl Args {
    fn params(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            n: self.n,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: self.seed,
            stop: self.stop.clone(),
            max_tokens: Some(self.max_tokens),
            logprobs: self.logprobs,
            ignore_eos: self.ignore_eos,
            ..Default::default()
        };
        // Checked before the model loads: a typo should not cost a load.
        p.validate().map_err(|e| anyhow::anyhow!("--{}: {}", e.field.replace('_', "-"), e.message))?;
        Ok(p)
    }
}

impl Args {
    /// The structured-output flag given, read and parsed; errors name the flag or the file.
    fn guide_spec(&self) -> Result<Option<GuideSpec>> {
        if let Some(s) = &self.json_schema {
            let (text, from) = match s.strip_prefix('@') {
                Some(f) => {
                    (std::fs::read_to_string(f).with_context(|| format!("--json-schema: reading {f}"))?, f.to_string())
                }
                None => (s.clone(), "--json-schema".to_string()),
            };
            let v: Value = serde_json::from_str(&text).with_context(|| format!("{from}: not valid JSON"))?;
            return Ok(Some(GuideSpec::JsonSchema(v)));
        }
        if self.json_object {
            return Ok(Some(GuideSpec::JsonObject));
        }
        if let Some(r) = &self.regex {
            return Ok(Some(GuideSpec::Regex(r.clone())));
        }
        if !self.choice.is_empty() {
            return Ok(Some(GuideSpec::Choice(self.choice.clone())));
        }
        if let Some(f) = &self.grammar {
            let g = std::fs::read_to_string(f).with_context(|| format!("--grammar: reading {}", f.display()))?;
            return Ok(Some(GuideSpec::Lark(g)));
        }
        Ok(None)
    }
}

/// One entry of the prompts: what the engine gets, and what the JSON line echoes.
struct Entry {
    prompt: Prompt,
    echo: (&'static str, Value),
}

pub fn run(a: Args) -> Result<()> {
    let mut params = a.params()?;
    let spec = a.guide_spec()?;
    let entries = match (&a.prompt, &a.chat, &a.prompts_file) {
        (Some(p), None, None) => vec![Entry { prompt: Prompt::Text(p.clone()), echo: ("prompt", json!(p)) }],
        (None, Some(c), None) => vec![Entry {
            prompt: Prompt::Chat(vec![Message::user(c.clone())]),
            echo: ("messages", json!([{"role": "user", "content": c}])),
        }],
        (None, None, Some(f)) => read_prompts(f)?,
        _ => bail!("give exactly one of --prompt, --chat or --prompts-file"),
    };
    let jsonl = a.jsonl || a.prompts_file.is_some() || a.n > 1;
    let dir = backends::resolve_model(a.model.as_deref())?;
    let mut b = LlmBuilder::new(&dir)
        .backend(a.backend.into())
        .max_num_seqs(a.max_num_seqs)
        .max_num_batched_tokens(a.max_num_batched_tokens);
    if let Some(n) = a.num_kv_blocks {
        b = b.num_kv_blocks(n);
    }
    let t0 = std::time::Instant::now();
    let llm = b.build()?;
    if let Some(spec) = &spec {
        params.guided = Some(llm.guide(spec).map_err(|e| anyhow::anyhow!("--{}: {e}", flag_of(spec)))?);
    }
    tracing::info!(prompts = entries.len(), load_ms = t0.elapsed().as_millis() as u64, "engine ready");
    let mut out = std::io::stdout().lock();
    let t1 = std::time::Instant::now();
    let tokens = if jsonl {
        let (echoes, prompts): (Vec<_>, Vec<_>) = entries.into_iter().map(|e| (e.echo, e.prompt)).unzip();
        let outputs = llm.generate(prompts, &params)?;
        for (i, (echo, o)) in echoes.into_iter().zip(&outputs).enumerate() {
            writeln!(out, "{}", result_json(i, echo, o))?;
        }
        outputs.iter().map(|o| o.usage.completion_tokens).sum()
    } else {
        let prompt = entries.into_iter().next().map(|e| e.prompt).context("no prompt")?;
        let mut stream = llm.to_async().generate(prompt, &params)?;
        let mut tokens = 0;
        while let Some(o) = stream.blocking_next() {
            tokens += o.token_ids.len();
            out.write_all(o.text.as_bytes())?;
            out.flush()?;
            if let Some(FinishReason::Error(e)) = o.finish_reason {
                bail!("generation failed: {e}");
            }
        }
        writeln!(out)?;
        tokens
    };
    let secs = t1.elapsed().as_secs_f64();
    tracing::info!(tokens, seconds = format!("{secs:.2}"), tok_per_s = format!("{:.1}", tokens as f64 / secs), "done");
    Ok(())
}

/// The flag a spec came from, for its errors.
fn flag_of(spec: &GuideSpec) -> &'static str {
    match spec {
        GuideSpec::JsonSchema(_) => "json-schema",
        GuideSpec::JsonObject => "json-object",
        GuideSpec::Regex(_) => "regex",
        GuideSpec::Choice(_) => "choice",
        GuideSpec::Lark(_) => "grammar",
    }
}

/// The prompts of a file. A file whose first non-empty line is a JSON object is JSONL (each
/// line `{"prompt": "..."}`, `{"prompt": [token ids]}` or `{"messages": [{"role": ..., "content":
/// ...}, ...]}`); any other
/// file is one prompt a line. Empty lines are skipped.
fn read_prompts(path: &Path) -> Result<Vec<Entry>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<(usize, &str)> = text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).collect();
    let is_jsonl = lines.first().is_some_and(|(_, l)| serde_json::from_str::<Value>(l).is_ok_and(|v| v.is_object()));
    let entries = lines
        .into_iter()
        .map(|(i, line)| {
            let at = || format!("{}:{}", path.display(), i + 1);
            if !is_jsonl {
                return Ok(Entry { prompt: Prompt::Text(line.to_string()), echo: ("prompt", json!(line)) });
            }
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("{}: not JSON (the file's first line is, so every line must be)", at()))?;
            parse_entry(&v).with_context(at)
        })
        .collect::<Result<Vec<_>>>()?;
    if entries.is_empty() {
        bail!("{}: no prompts", path.display());
    }
    Ok(entries)
}

fn parse_entry(v: &Value) -> Result<Entry> {
    match (v.get("prompt"), v.get("messages")) {
        (Some(Value::String(p)), None) => {
            Ok(Entry { prompt: Prompt::Text(p.clone()), echo: ("prompt", v["prompt"].clone()) })
        }
        (None, Some(Value::Array(ms))) if !ms.is_empty() => {
            let msgs = ms
                .iter()
                .enumerate()
                .map(|(k, m)| match (m.get("role").and_then(Value::as_str), m.get("content").and_then(Value::as_str)) {
                    (Some(r), Some(c)) => Ok(Message::new(r, c)),
                    _ => bail!("messages[{k}] must be an object with string `role` and `content`"),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Entry { prompt: Prompt::Chat(msgs), echo: ("messages", v["messages"].clone()) })
        }
        // Token ids, sent as they are (vLLM's completions take a prompt this way too).
        (Some(Value::Array(ids)), None) if !ids.is_empty() => {
            let ids = ids
                .iter()
                .enumerate()
                .map(|(k, t)| match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                    Some(t) => Ok(t),
                    None => bail!("prompt[{k}] must be a token id (an integer in 0..2^32)"),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Entry { prompt: Prompt::Tokens(ids), echo: ("prompt", v["prompt"].clone()) })
        }
        (Some(_), Some(_)) => bail!("give `prompt` or `messages`, not both"),
        (Some(_), None) => bail!("`prompt` must be a string or a non-empty list of token ids"),
        (None, Some(_)) => bail!("`messages` must be a non-empty list"),
        (None, None) => bail!("each line needs a `prompt` string or a `messages` list"),
    }
}

fn finish_json(f: &FinishReason) -> Value {
    match f {
        FinishReason::Stop { .. } => json!("stop"),
        FinishReason::Length => json!("length"),
        FinishReason::Abort => json!("abort"),
        FinishReason::Error(_) => json!("error"),
    }
}

/// One JSON line: the prompt as given, then each completion.
fn result_json(index: usize, echo: (&str, Value), o: &Output) -> Value {
    let completions: Vec<Value> = o
        .completions
        .iter()
        .map(|c| {
            let mut v = json!({"index": c.index, "text": c.text, "token_ids": c.token_ids, "finish_reason": finish_json(&c.finish_reason)});
            if let FinishReason::Error(e) = &c.finish_reason {
                v["error"] = json!(e);
            }
            if let Some(lp) = &c.logprobs {
                v["logprobs"] = lp.iter().map(|l| json!({"token": l.token, "logprob": l.logprob, "top": l.top.iter().map(|(t, p)| json!([t, p])).collect::<Vec<_>>()})).collect();
            }
            v
        })
        .collect();
    let mut v = json!({"index": index});
    v[echo.0] = echo.1;
    v["text"] = json!(o.text());
    v["completions"] = json!(completions);
    v["usage"] = json!({"prompt_tokens": o.usage.prompt_tokens, "completion_tokens": o.usage.completion_tokens});
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, body: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!("tandem-generate-{}-{name}", std::process::id()));
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn plain_and_jsonl_prompt_files() {
        let plain = read_prompts(&file(
            "plain.txt",
            "first prompt\n\n{not json at the start? no: this file is plain}\nthird\n",
        ))
        .unwrap();
        let texts: Vec<_> = plain.iter().map(|e| e.prompt.clone()).collect();
        assert_eq!(
            texts,
            vec![
                Prompt::Text("first prompt".into()),
                Prompt::Text("{not json at the start? no: this file is plain}".into()),
                Prompt::Text("third".into())
            ]
        );
        let jsonl = read_prompts(&file(
            "a.jsonl",
            "{\"prompt\": \"hi\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"yo\"}], \"id\": 3}\n\
             {\"prompt\": [1, 42, 4294967295]}\n",
        ))
        .unwrap();
        assert_eq!(jsonl[0].prompt, Prompt::Text("hi".into()));
        assert_eq!(jsonl[2].prompt, Prompt::Tokens(vec![1, 42, u32::MAX]));
        assert_eq!(jsonl[1].prompt, Prompt::Chat(vec![Message::user("yo")]));
        assert_eq!(jsonl[1].echo.0, "messages");
    }

    #[test]
    fn bad_prompt_files_say_where() {
        for (body, msg) in [
            ("{\"prompt\": \"ok\"}\nplain text\n", ":2: not JSON"),
            ("{\"prompt\": 3}\n", ":1"),
            ("{\"prompt\": [1, -2]}\n", "prompt[1] must be a token id"),
            ("{\"prompt\": [4294967296]}\n", "prompt[0] must be a token id"),
            ("{\"prompt\": []}\n", "non-empty list of token ids"),
            ("{\"messages\": []}\n", "non-empty"),
            ("{\"messages\": [{\"role\": \"user\"}]}\n", "messages[0]"),
            ("{\"text\": \"x\"}\n", "`prompt` string"),
            ("\n\n", "no prompts"),
        ] {
            let e = read_prompts(&file("bad.jsonl", body)).err().expect(body);
            assert!(format!("{e:#}").contains(msg), "{body:?}: {e:#}");
        }
    }
}
