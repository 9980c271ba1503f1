//! [`Llm`] (offline: prompts in, outputs out, in order) and [`AsyncLlm`] (one request, a
//! `Stream` of its incremental outputs). Both sit on the same engine thread: the prompts of a
//! call are all submitted at once, so the engine batches them continuously.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tandem_core::backend::KvDtype;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::GenerationConfig;
use tandem_engine::{EngineHandle, Guided, Request, RequestOutput, RequestStream, SamplingParams, Stats};

use tandem_structured::{GuideSpec, Structured};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::output::{Accumulator, Message, Output, Prompt};

/// How a conversation is rendered (vLLM's `LLM.chat` options). The default opens the
/// assistant's turn, as [`Llm::chat`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatOptions {
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions { add_generation_prompt: true, continue_final_message: false }
    }
}

/// The accessors [`Llm`] and [`AsyncLlm`] share, written once: each reads the `core` both hold.
macro_rules! core_accessors {
    () => {
        /// Compiles a structured-output spec for [`SamplingParams::guided`]: the outputs of a
        /// request carrying it are JSON valid against the schema, match the regex, ... (see
        /// [`tandem_structured`]). A spec that does not compile is [`Error::Guide`] naming the
        /// problem.
        pub fn guide(&self, spec: &GuideSpec) -> Result<Guided> {
            self.core.guide(spec)
        }
        pub fn tokenizer(&self) -> &Tokenizer {
            &self.core.tok
        }
        /// The engine's counters and gauges (KV usage, running and waiting requests, ...).
        pub fn stats(&self) -> Stats {
            self.core.handle.stats()
        }
        /// The backend that runs the model (what [`Backend::Auto`] chose).
        pub fn backend(&self) -> Backend {
            self.core.backend
        }
        /// The device's name: the GPU's or adapter's, or "CPU".
        pub fn device(&self) -> &str {
            &self.core.device
        }
        /// What a caller who has no sampling parameters of their own should pass: the defaults
        /// under the model's generation_config.json (vLLM's `get_default_sampling_params`).
        /// Calls are never changed behind the caller's back: `generate` uses exactly the
        /// params given.
        pub fn default_sampling_params(&self) -> SamplingParams {
            self.core.defaults.clone()
        }
        /// The element type the KV cache stores (bf16 by default on CUDA, f32 elsewhere).
        pub fn kv_cache_dtype(&self) -> KvDtype {
            self.core.kv_dtype
        }
        /// Blocks in the KV pool.
        pub fn num_kv_blocks(&self) -> usize {
            self.core.kv_blocks
        }
        /// The engine's handle, for what this API does not cover (token-id requests with a
        /// priority, aborting by id).
        pub fn engine(&self) -> &EngineHandle {
            &self.core.handle
        }
    };
}

/// The loaded engine both faces share; dropping the last of them stops the engine thread.
pub(crate) struct Core {
    pub handle: EngineHandle,
    pub tok: Arc<Tokenizer>,
    pub backend: Backend,
    pub device: String,
    pub kv_blocks: usize,
    pub kv_dtype: KvDtype,
    /// `SamplingParams::default()` under the model's generation_config.json.
    pub defaults: SamplingParams,
    pub model_dir: std::path::PathBuf,
    /// Built at the first structured-output request (it reads tokenizer.json again).
    pub structured: OnceLock<std::result::Result<Arc<Structured>, String>>,
    /// The LoRA adapters it was built with ([`crate::LlmBuilder::lora`]).
    pub lora: Option<crate::LoraModules>,
}

impl Drop for Core {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

impl Core {
    fn guide(&self, spec: &GuideSpec) -> Result<Guided> {
        let s = self.structured.get_or_init(|| {
            Structured::from_model_dir(&self.model_dir, &self.tok.eos_ids).map(Arc::new).map_err(|e| e.to_string())
        });
        match s {
            Ok(s) => Ok(s.compile(spec)?),
            Err(e) => Err(Error::Config(format!("structured output is unavailable for this model: {e}"))),
        }
    }

    fn encode(&self, p: Prompt) -> Result<Vec<u32>> {
        Ok(match p {
            Prompt::Text(s) => self.tok.encode(&s, true)?,
            Prompt::Tokens(ids) => ids,
            Prompt::Chat(m) => self.encode_chat(&m)?,
        })
    }

    fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, &ChatOptions::default())
    }

    fn encode_chat_with(&self, messages: &[Message], opts: &ChatOptions) -> Result<Vec<u32>> {
        if opts.add_generation_prompt && opts.continue_final_message {
            return Err(Error::Config(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.".into(),
            ));
        }
        let msgs: Vec<serde_json::Value> = messages.iter().map(Message::to_json).collect();
        let mut text = self.tok.apply_chat_template(&msgs, opts.add_generation_prompt)?;
        if opts.continue_final_message {
            // As transformers cuts it (and the server's chat): after the last place the final
            // message's content, stripped, appears.
            let last = messages.last().map_or("", |m| m.content.as_str());
            let at = text.rfind(last.trim()).ok_or_else(|| {
                Error::Config("continue_final_message: the final message does not appear in the rendered chat".into())
            })?;
            let end = if last.trim_start().len() == last.len() && text[at..].starts_with(last) {
                at + last.len()
            } else {
                at + last.trim().len()
            };
            text.truncate(end);
        }
        // The template writes the BOS itself (as the server's chat endpoint does).
        Ok(self.tok.encode(&text, false)?)
    }

    fn submit(&self, index: usize, prompt: Vec<u32>, params: &SamplingParams, priority: i32) -> Result<RequestStream> {
        self.handle.submit(Request { prompt, params: params.clone(), priority }).map_err(|e| Error::refused(index, e))
    }

    /// Submits every prompt, then gathers each one's outputs in order.
    fn run_all(&self, prompts: Vec<Vec<u32>>, params: &SamplingParams) -> Result<Vec<Output>> {
        params.validate()?;
        // All submitted before any is awaited, so that they share the engine's batches. Should
        // one be refused, dropping the streams already open aborts those requests.
        let streams = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| self.submit(i, p.clone(), params, 0))
            .collect::<Result<Vec<_>>>()?;
        Ok(prompts
            .into_iter()
            .zip(streams)
            .map(|(p, s)| Output::collect(p, params.n, params.logprobs.is_some(), s))
            .collect())
    }
}

/// `SamplingParams::default()` with the sampling fields of a generation_config.json over it
/// (vLLM's `LLM.get_default_sampling_params()`): temperature, top_p, top_k, min_p,
/// repetition_penalty, and max_new_tokens as max_tokens. A field outside what a request
/// accepts (`SamplingParams::validate`) is left at its default with a warning rather than served,
/// as `tandem serve --generation-config auto` does.
pub(crate) fn sampling_defaults(g: Option<&GenerationConfig>) -> SamplingParams {
    let mut out = SamplingParams::default();
    let Some(g) = g else { return out };
    let mut try_set = |name: &str, value: String, set: &dyn Fn(&mut SamplingParams)| {
        let mut trial = out.clone();
        set(&mut trial);
        match trial.validate() {
            Ok(()) => out = trial,
            Err(e) => tracing::warn!("generation_config.json: {name} = {value} is not a valid default ({e}); ignored"),
        }
    };
    if let Some(x) = g.temperature {
        try_set("temperature", x.to_string(), &|p| p.temperature = x);
    }
    if let Some(x) = g.top_p {
        try_set("top_p", x.to_string(), &|p| p.top_p = x);
    }
    if let Some(x) = g.top_k {
        // HF's top_k = 0 and negative values mean no limit, as 0 does here.
        try_set("top_k", x.to_string(), &|p| p.top_k = x.max(0) as usize);
    }
    if let Some(x) = g.min_p {
        try_set("min_p", x.to_string(), &|p| p.min_p = x);
    }
    if let Some(x) = g.repetition_penalty {
        try_set("repetition_penalty", x.to_string(), &|p| p.repetition_penalty = x);
    }
    if let Some(x) = g.max_new_tokens.filter(|&m| m > 0) {
        try_set("max_new_tokens", x.to_string(), &|p| p.max_tokens = Some(x));
    }
    out
}

/// Offline generation: a batch of prompts in, one [`Output`] per prompt out, in order.
///
/// The calls block the calling thread until the whole batch is done; they may be made from
/// several threads at once (their requests share the engine's batches). Made with
/// [`crate::LlmBuilder::build`].
pub struct Llm {
    pub(crate) core: Arc<Core>,
}

impl Llm {
    pub fn builder(model_dir: impl AsRef<std::path::Path>) -> crate::LlmBuilder {
        crate::LlmBuilder::new(model_dir)
    }

    /// One output per prompt, in the order given; the prompts may mix the forms of [`Prompt`].
    /// A bad parameter is [`Error::InvalidParam`] and nothing is submitted; a prompt the engine
    /// refuses is [`Error::Refused`] with its index.
    pub fn generate<P: Into<Prompt>>(
        &self,
        prompts: impl IntoIterator<Item = P>,
        params: &SamplingParams,
    ) -> Result<Vec<Output>> {
        let ids = prompts.into_iter().map(|p| self.core.encode(p.into())).collect::<Result<Vec<_>>>()?;
        self.core.run_all(ids, params)
    }

    /// One output per conversation, each rendered through the model's chat template with the
    /// assistant's turn opened (as the server's `/v1/chat/completions` does).
    pub fn chat<C: AsRef<[Message]>>(
        &self,
        conversations: impl IntoIterator<Item = C>,
        params: &SamplingParams,
    ) -> Result<Vec<Output>> {
        self.generate(conversations.into_iter().map(|c| Prompt::Chat(c.as_ref().to_vec())), params)
    }

    /// [`Llm::chat`] with vLLM's `LLM.chat` options: `continue_final_message` continues the
    /// last (assistant) message instead of closing it (a prefill); `add_generation_prompt:
    /// false` opens no assistant turn. Both true is an error, as in vLLM.
    pub fn chat_with<C: AsRef<[Message]>>(
        &self,
        conversations: impl IntoIterator<Item = C>,
        params: &SamplingParams,
        opts: &ChatOptions,
    ) -> Result<Vec<Output>> {
        let ids = conversations
            .into_iter()
            .map(|c| self.core.encode_chat_with(c.as_ref(), opts))
            .collect::<Result<Vec<_>>>()?;
        self.core.run_all(ids, params)
    }

    /// The same engine, for streaming.
    pub fn to_async(&self) -> AsyncLlm {
        AsyncLlm { core: self.core.clone() }
    }

    core_accessors!();

    /// The engine's id of the adapter built in under `name` ([`crate::LlmBuilder::lora`]; its
    /// slot at load for the first `max_loras`), for `engine().submit_with_adapter`.
    pub fn lora_slot(&self, name: &str) -> Option<u32> {
        self.core.lora.as_ref().and_then(|l| l.slot(name))
    }
}

/// The streaming face: [`AsyncLlm::generate`] returns an [`OutputStream`] of incremental
/// outputs. Cheap to clone; usable from tokio or any other executor (nothing here blocks).
#[derive(Clone)]
pub struct AsyncLlm {
    pub(crate) core: Arc<Core>,
}

impl AsyncLlm {
    /// Submits one request (checked at once: a bad parameter or a prompt that can never fit is
    /// an error here, not on the stream).
    pub fn generate(&self, prompt: impl Into<Prompt>, params: &SamplingParams) -> Result<OutputStream> {
        self.generate_with_priority(prompt, params, 0)
    }

    /// As [`AsyncLlm::generate`]; under [`tandem_engine::Policy::Priority`] a lower value is
    /// served first.
    pub fn generate_with_priority(
        &self,
        prompt: impl Into<Prompt>,
        params: &SamplingParams,
        priority: i32,
    ) -> Result<OutputStream> {
        let ids = self.core.encode(prompt.into())?;
        self.stream(ids, params, priority)
    }

    /// One conversation through the chat template, streamed.
    pub fn chat(&self, messages: &[Message], params: &SamplingParams) -> Result<OutputStream> {
        self.generate(Prompt::Chat(messages.to_vec()), params)
    }

    /// As [`Llm::chat_with`], streamed.
    pub fn chat_with(&self, messages: &[Message], params: &SamplingParams, opts: &ChatOptions) -> Result<OutputStream> {
        let ids = self.core.encode_chat_with(messages, opts)?;
        self.stream(ids, params, 0)
    }

    fn stream(&self, ids: Vec<u32>, params: &SamplingParams, priority: i32) -> Result<OutputStream> {
        params.validate()?;
        let inner = self.core.submit(0, ids.clone(), params, priority)?;
        Ok(OutputStream {
            inner,
            prompt_token_ids: ids,
            n: params.n,
            want_logprobs: params.logprobs.is_some(),
            _core: self.core.clone(),
        })
    }

    core_accessors!();
}

/// The incremental outputs of one request: each item is what completion `index` produced since
/// the last item (new token ids, new text, their logprobs), with `finish_reason` set on a
/// completion's last item and `finished` on the request's last. The stream ends after that.
///
/// Dropping the stream before its end aborts the request: the engine frees its KV blocks
/// before its next step.
pub struct OutputStream {
    inner: RequestStream,
    prompt_token_ids: Vec<u32>,
    n: usize,
    want_logprobs: bool,
    /// The engine lives while a stream does, even if every `AsyncLlm` was dropped.
    _core: Arc<Core>,
}

impl OutputStream {
    /// The engine's id of this request (for [`EngineHandle::abort`]).
    pub fn request_id(&self) -> tandem_engine::RequestId {
        self.inner.id()
    }
    pub fn prompt_token_ids(&self) -> &[u32] {
        &self.prompt_token_ids
    }

    /// The next item, blocking this thread (for code outside any async runtime; it does not
    /// panic inside one, but blocks that runtime's thread).
    pub fn blocking_next(&mut self) -> Option<RequestOutput> {
        pollster::block_on(self.inner.recv())
    }

    /// Awaits the rest of the stream and returns the finished [`Output`] (what
    /// [`Llm::generate`] gives for one prompt).
    pub async fn collect_output(mut self) -> Output {
        let mut acc = Accumulator::new(std::mem::take(&mut self.prompt_token_ids), self.n, self.want_logprobs);
        while let Some(o) = self.inner.recv().await {
            if acc.push(o) {
                break;
            }
        }
        acc.finish()
    }
}

impl futures_core::Stream for OutputStream {
    type Item = RequestOutput;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RequestOutput>> {
        self.get_mut().inner.poll_recv(cx)
    }
}
