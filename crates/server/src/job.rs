//! A parsed, tokenized chat or completion request, ready to submit: its prompts, sampling
//! parameters, structured-output form and how its answer is read (tool calls, reasoning). Every
//! wire format reads its request into a [`Job`]; the pipeline compiles its guide, fits its
//! `max_tokens` to the context and submits it.

use serde_json::{Map, Value};

use crate::chat::render_chat_continued;
use crate::engine_client::GenerateRequest;
use crate::error::ApiError;
use crate::metrics::{ToolParseTally, ToolRequestType};
use crate::params::{Api, ParsedParams};
use crate::reasoning::ReasoningParser;
use crate::state::AppState;
use crate::structured::{self, GuideRequest, ToolChoice};
use crate::tool_parser::ToolParser;

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
    /// `p.params.sampling.guided`.
    pub guide: Option<GuideRequest>,
    /// Chat with tools: how the answer's text is read for tool calls.
    pub tool_output: Option<ToolOutput>,
    /// Chat with `--reasoning-parser`: the answer's thinking is split out of its content.
    pub reasoning: Option<ReasoningParser>,
    /// With [`ToolOutput::Auto`]: where the tool parser's reads of the answer are counted.
    pub tool_parses: Option<ToolParseTally>,
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

pub(crate) fn check_ids(ids: Vec<u32>, vocab: usize, param: &str) -> Result<Vec<u32>, ApiError> {
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

impl Job {
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
            tool_parses: matches!(tool_output, Some(ToolOutput::Auto(_)))
                .then(|| state.metrics.tool_parse_tally(ToolRequestType::ChatCompletions)),
            tool_output,
            reasoning,
        })
    }

    /// Counts one read of an answer by the tool-call parser (with `tool_choice: "auto"`).
    pub fn count_tool_parse(&self, streaming: bool, found_call: bool) {
        if let Some(t) = &self.tool_parses {
            t.count(streaming, found_call);
        }
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
        self.p.params.sampling.guided = Some(guided);
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
                if self.p.params.sampling.min_tokens > max_tokens {
                    return Err(ApiError::invalid(
                        "min_tokens",
                        format!(
                            "`min_tokens` ({}) exceeds the {max_tokens} output tokens the context leaves",
                            self.p.params.sampling.min_tokens
                        ),
                    ));
                }
                let mut params = self.p.params.clone();
                params.sampling.max_tokens = Some(max_tokens);
                if let Some(b) = self.p.best_of {
                    // Ranked by cumulative logprob: the sampled tokens' logprobs are needed.
                    params.sampling.n = b;
                    params.sampling.logprobs.get_or_insert(0);
                }
                Ok(GenerateRequest { prompt: prompt.clone(), params, priority: self.p.priority })
            })
            .collect()
    }
}
