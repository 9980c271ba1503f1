//! [`EngineClient`] for `tandem_engine`'s [`EngineHandle`].
//!
//! The engine's [`RequestStream`] can only be awaited through `recv()`, so [`StreamSource`]
//! keeps one boxed `recv()` future (which owns the stream) and polls it from the response
//! body: no task and no extra wake-up per token. Dropping it drops the stream, which aborts
//! an unfinished request; the server also calls [`EngineClient::abort`] directly.
//!
//! The handle may be set after the server starts (`/health` answers 503 until then), so a
//! binary can listen while the model loads.

use std::sync::{Arc, OnceLock};

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tandem_engine::{EngineHandle, Request, RequestOutput, RequestStream, SubmitError};

use crate::engine_client::{
    CompletionDelta, EngineClient, EngineStats, EngineUpdate, FinishReason, GenerateRequest, LoraFuture, LoraRefusal,
    RequestId, Submission, SubmitRefusal, TokenLogprob, UpdateSource,
};
use crate::step_estimate;

#[derive(Default)]
pub struct TandemEngine {
    handle: OnceLock<EngineHandle>,
}

impl TandemEngine {
    /// Not ready yet; call [`TandemEngine::set`] once the model is loaded.
    pub fn loading() -> Arc<Self> {
        Arc::new(TandemEngine { handle: OnceLock::new() })
    }

    pub fn ready(handle: EngineHandle) -> Arc<Self> {
        let e = Self::loading();
        e.set(handle);
        e
    }

    /// Installs the engine; later calls are ignored.
    pub fn set(&self, handle: EngineHandle) {
        let _ = self.handle.set(handle);
    }

    pub fn handle(&self) -> Option<&EngineHandle> {
        self.handle.get()
    }
}

/// The engine's text decoder over our tokenizer (the engine's, shared with the `tandem` library).
pub use tandem_engine::tokenizer_decode_fn as decode_fn;

fn to_logprob(l: tandem_engine::sampler::TokenLogprobs) -> TokenLogprob {
    TokenLogprob { token: l.token, logprob: l.logprob, top: l.top, rank: None }
}

fn to_update(o: RequestOutput) -> EngineUpdate {
    let mut stop_string = None;
    let finish = o.finish_reason.map(|f| match f {
        tandem_engine::FinishReason::Stop { stop_string: s, .. } => {
            stop_string = s;
            FinishReason::Stop
        }
        tandem_engine::FinishReason::Length => FinishReason::Length,
        tandem_engine::FinishReason::Abort => FinishReason::Abort,
        tandem_engine::FinishReason::Error(e) => FinishReason::Error(e),
    });
    let logprobs = o.logprobs.into_iter().map(to_logprob).collect();
    let ranks = o.prompt_ranks;
    let prompt_logprobs = o.prompt_logprobs.map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, l)| l.map(|l| TokenLogprob { rank: ranks.get(i).copied().filter(|&r| r > 0), ..to_logprob(l) }))
            .collect()
    });
    EngineUpdate {
        deltas: vec![CompletionDelta {
            index: o.index,
            text: o.text,
            token_ids: o.token_ids,
            logprobs,
            prompt_logprobs,
            finish,
            stop_string,
        }],
        queue_time: o.metrics.as_ref().and_then(|m| m.queue_time),
        num_preemptions: o.metrics.as_ref().map(|m| m.num_preemptions),
        num_cached_tokens: o.metrics.as_ref().and_then(|m| m.num_cached_tokens),
    }
}

type Recv = Pin<Box<dyn Future<Output = (RequestStream, Option<RequestOutput>)> + Send>>;

/// One pending `recv()` of the engine's stream; it hands the stream back with each output.
pub struct StreamSource {
    recv: Option<Recv>,
}

impl StreamSource {
    fn new(stream: RequestStream) -> Self {
        StreamSource { recv: Some(Self::next(stream)) }
    }

    fn next(mut stream: RequestStream) -> Recv {
        Box::pin(async move {
            let o = stream.recv().await;
            (stream, o)
        })
    }
}

impl UpdateSource for StreamSource {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<EngineUpdate>> {
        let Some(f) = self.recv.as_mut() else { return Poll::Ready(None) };
        match f.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready((_, None)) => {
                self.recv = None;
                Poll::Ready(None)
            }
            Poll::Ready((stream, Some(o))) => {
                self.recv = Some(Self::next(stream));
                Poll::Ready(Some(to_update(o)))
            }
        }
    }
}

impl EngineClient for TandemEngine {
    fn submit(&self, req: GenerateRequest) -> Result<Submission, SubmitRefusal> {
        let Some(h) = self.handle.get() else {
            return Err(SubmitRefusal::Stopped("the model is still loading".into()));
        };
        let stream = h
            .submit_with_adapter(
                Request { prompt: req.prompt, params: req.params.sampling, priority: req.priority },
                req.params.adapter,
            )
            .map_err(|e| match e {
                SubmitError::Overloaded { .. } => SubmitRefusal::Overloaded(e.to_string()),
                SubmitError::Stopped(_) => SubmitRefusal::Stopped(e.to_string()),
                _ => SubmitRefusal::Invalid(e.to_string()),
            })?;
        let id = stream.id();
        Ok(Submission { id, updates: Box::new(StreamSource::new(stream)) })
    }

    fn abort(&self, id: RequestId) {
        if let Some(h) = self.handle.get() {
            h.abort(id);
        }
    }

    fn stats(&self) -> EngineStats {
        let Some(h) = self.handle.get() else { return EngineStats::default() };
        let s = h.stats();
        EngineStats {
            num_running: s.num_running,
            num_waiting: s.num_waiting,
            kv_cache_usage: s.kv_usage as f64,
            prefix_cache_queries: s.prefix_cache_queries_total,
            prefix_cache_hits: s.prefix_cache_hits_total,
            num_preemptions: s.preemptions_total,
            batch_size: s.batch_size,
            guided_masks_total: s.guided_masks_total,
            guided_mask_seconds_total: s.guided_mask_seconds_total,
            async_steps: s.async_steps_total,
            sync_steps: s.sync_steps_total,
            iteration_tokens: s.iteration_tokens.to_vec(),
            iteration_tokens_sum: s.iteration_tokens_sum,
            block_size: h.kv_blocks().0,
            num_blocks: h.kv_blocks().1,
            weights_bytes: h.weights_bytes(),
            spec_decode_num_drafts: s.spec_decode_num_drafts_total,
            spec_decode_num_draft_tokens: s.spec_decode_num_draft_tokens_total,
            spec_decode_num_accepted_tokens: s.spec_decode_num_accepted_tokens_total,
            spec_decode_num_accepted_tokens_per_pos: s.spec_decode_num_accepted_tokens_per_pos,
            step_estimate: Some(step_estimate::estimate(
                h.model_config(),
                &step_estimate::StepCounts {
                    steps: s.async_steps_total + s.sync_steps_total,
                    tokens: s.iteration_tokens_sum,
                    attended_keys: s.attended_keys_total,
                    kv_rows_read: s.kv_rows_read_total,
                },
            )),
            running_lora_adapters: s.running_adapters,
            waiting_lora_adapters: s.waiting_adapters,
        }
    }

    fn is_ready(&self) -> bool {
        self.handle.get().is_some()
    }

    fn failure(&self) -> Option<String> {
        self.handle.get().and_then(EngineHandle::failure)
    }

    fn max_model_len(&self) -> Option<usize> {
        self.handle.get().map(EngineHandle::max_model_len)
    }

    fn load_lora(&self, dir: std::path::PathBuf) -> LoraFuture<'_, u32> {
        Box::pin(async move {
            let h = self.handle.get().ok_or_else(|| LoraRefusal::Invalid("the model is still loading".into()))?;
            // vLLM's words for a path without an adapter (its clients match on them).
            if !dir.join("adapter_config.json").is_file() {
                return Err(LoraRefusal::NotFound(format!("No adapter found for {}", dir.display())));
            }
            let adapter = tandem_core::lora::LoraAdapter::load(&dir, h.model_config())
                .map_err(|e| LoraRefusal::Invalid(e.to_string()))?;
            h.load_adapter(adapter).await.map_err(LoraRefusal::Invalid)
        })
    }

    fn unload_lora(&self, id: u32) -> LoraFuture<'_, ()> {
        Box::pin(async move {
            let h = self.handle.get().ok_or_else(|| LoraRefusal::Invalid("the model is still loading".into()))?;
            h.unload_adapter(id).await.map_err(LoraRefusal::NotFound)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_map_to_updates() {
        let o = RequestOutput {
            request_id: 5,
            index: 1,
            token_ids: vec![3],
            text: " a".into(),
            logprobs: vec![tandem_engine::sampler::TokenLogprobs {
                token: 3,
                logprob: -0.5,
                top: vec![(3, -0.5), (4, -1.0)],
            }],
            prompt_logprobs: None,
            prompt_ranks: Vec::new(),
            finish_reason: Some(tandem_engine::FinishReason::Stop { stop_string: Some("b".into()), stop_token: None }),
            finished: true,
            usage: None,
            metrics: None,
        };
        let u = to_update(o);
        assert_eq!(u.deltas.len(), 1);
        let d = &u.deltas[0];
        assert_eq!(
            (d.index, d.text.as_str(), d.token_ids.as_slice(), d.finish.clone()),
            (1, " a", &[3u32][..], Some(FinishReason::Stop))
        );
        assert_eq!(d.stop_string.as_deref(), Some("b"), "the stop string that ended the text");
        assert_eq!(
            d.logprobs,
            vec![TokenLogprob { token: 3, logprob: -0.5, top: vec![(3, -0.5), (4, -1.0)], rank: None }]
        );
    }
}
