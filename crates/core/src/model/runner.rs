//! What the engine needs from a loaded model, whatever the backend ([`ModelRunner`]), its
//! default samplers (the forward's logits on the host), and [`Model`]'s answers.

use super::Model;
use crate::backend::{Backend, DType, KvDtype, KvGeometry};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::head_layer::HeadCache;
use crate::sampling::{logprobs_rows, sample_row, sample_rows_masked, RowMasks, SampleSpec, TokenLogprobs};

/// What the engine needs from a loaded model, whatever the backend. Object-safe.
pub trait ModelRunner: Send {
    fn config(&self) -> &ModelConfig;
    fn backend_name(&self) -> &'static str;
    fn kv_geometry(&self) -> KvGeometry;
    /// What the KV cache stores (its bytes per token follow it). The default is for runners
    /// without a real cache (test doubles); a loaded model reports what it allocated.
    fn kv_dtype(&self) -> KvDtype {
        KvDtype::F32
    }
    /// Most tokens one [`ModelRunner::forward`] accepts.
    fn max_batch_tokens(&self) -> usize;
    /// Most sequences one forward accepts.
    fn max_seqs(&self) -> usize;
    /// Bytes the backend holds for the weights, where it counts them (`Device::weight_bytes`).
    fn weights_bytes(&self) -> Option<u64> {
        None
    }
    /// Most logit rows one forward returns (at least `max_seqs`; the rest serve prompt logprobs).
    fn max_logit_rows(&self) -> usize {
        self.max_seqs()
    }
    /// Kernels the backend has launched so far, where it counts them ([`Device::launch_count`]).
    fn launch_count(&self) -> Option<u64> {
        None
    }
    /// What a projection's input is rounded to before it meets this model's weights
    /// ([`Storage::matmul_operand`]): f32 (no rounding) unless the backend computes in 16 bits.
    fn matmul_operand(&self) -> DType {
        DType::F32
    }
    /// What the projections' stored inputs are ([`ActDtypes`]); f32 by default.
    fn activation_dtypes(&self) -> ActDtypes {
        ActDtypes { x: DType::F32, act: DType::F32, last_normed: DType::F32 }
    }
    /// Runs the batch, writing K/V into the cache; returns f32 logits `[logit_rows.len(), vocab]`.
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>>;
    /// Which LoRA slots hold an adapter (what a batch's `adapters` may name); empty where the
    /// model has none.
    fn lora_slots(&self) -> Vec<bool> {
        Vec::new()
    }
    /// From now on every forward keeps the hidden states entering `layers` (in that order,
    /// concatenated per token) for [`ModelRunner::take_aux_hidden`]: what an EAGLE-3 draft
    /// head reads (layer `num_hidden_layers` names the last layer's output before the final
    /// norm, what an MTP layer reads). Empty: keep none (the plain forward). The default refuses.
    fn set_aux_layers(&mut self, layers: &[usize]) -> Result<()> {
        let _ = layers;
        Err(Error::Batch("this model runner does not keep aux hidden states".into()))
    }
    /// The last forward's aux hidden states, `[tokens, layers * hidden]` in the batch's token
    /// order (taken: a second call gives none); empty when none are kept.
    /// Takes an EAGLE-3 head's weights onto this runner's backend, where
    /// [`Self::propose_draft`] runs it; false: this runner keeps draft heads on the host.
    fn load_draft_head(&mut self, _head: &crate::eagle3::Eagle3Head) -> Result<bool> {
        Ok(false)
    }
    /// The loaded draft head's proposal (as [`crate::head_layer::HeadModel::propose`]).
    fn propose_draft(
        &mut self,
        _cache: &mut HeadCache,
        _tokens: &[u32],
        _aux: &[f32],
        _aux_from: usize,
        _k: usize,
    ) -> Result<Option<Vec<u32>>> {
        Err(Error::Batch("propose_draft: this runner keeps draft heads on the host".into()))
    }
    fn take_aux_hidden(&mut self) -> Vec<f32> {
        Vec::new()
    }
    /// Uploads `adapter` into LoRA slot `slot`, replacing what was there ([`Model::load_lora`]);
    /// refused where the runner has no slots.
    fn load_lora(&mut self, _slot: usize, adapter: &crate::lora::LoraAdapter) -> Result<()> {
        Err(Error::config(&adapter.dir, "the model was loaded without LoRA slots (--enable-lora)"))
    }
    /// Empties LoRA slot `slot` ([`Model::unload_lora`]).
    fn unload_lora(&mut self, _slot: usize) {}
    /// The LoRA limits the slots were made with, where the runner has slots.
    fn lora_limits(&self) -> Option<crate::lora::LoraLimits> {
        None
    }
    /// Runs the batch and turns logit row `r` into a token id by `specs[r]` (one spec per
    /// logit row) where the logits are, so that only ids leave the device. The ids equal
    /// [`sample_row`] of the rows [`ModelRunner::forward`] would return. The default is that:
    /// `forward`, then the host.
    fn forward_sampled(&mut self, batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        let (logits, vocab) = host_logits(self, batch, specs)?;
        Ok(logits.chunks_exact(vocab).zip(specs).map(|(row, s)| sample_row(row, s)).collect())
    }
    /// As [`ModelRunner::forward_sampled`], some rows masked (structured output) or edited
    /// (penalties, `logit_bias`, bans: the edits of [`RowMasks`]). `masks` is called once, after the forward is on its way and before the sample needs it, so a caller
    /// can compute the masks while the device runs; its error fails the step. The ids equal
    /// [`crate::sampling::sample_rows_masked`] of what [`ModelRunner::forward`] would return.
    /// The default: `forward`, then the host.
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
    ) -> Result<Vec<u32>> {
        let (logits, vocab) = host_logits(self, batch, specs)?;
        let m = masks()?;
        m.check(specs.len(), vocab).map_err(Error::Batch)?;
        Ok(sample_rows_masked(&logits, vocab, specs, &m))
    }
    /// As [`ModelRunner::forward_sampled_masked`], and for each row with `top_n[r] = Some(n)`
    /// the sampled token's logprob and top `n` of the raw logits
    /// ([`crate::sampling::logprobs_row`]), computed where the logits are. The default:
    /// `forward`, then the host.
    fn forward_sampled_logprobs(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        if top_n.len() != specs.len() {
            return Err(Error::Batch(format!("{} logprob counts for {} rows", top_n.len(), specs.len())));
        }
        let (logits, vocab) = host_logits(self, batch, specs)?;
        let m = masks()?;
        m.check(specs.len(), vocab).map_err(Error::Batch)?;
        let ids = sample_rows_masked(&logits, vocab, specs, &m);
        let lps = logprobs_rows(&logits, vocab, &ids, top_n);
        Ok((ids, lps))
    }
}

/// The default samplers' start: the specs checked, the forward run, its logits (and the
/// vocabulary, at least 1) checked against the rows.
fn host_logits<M: ModelRunner + ?Sized>(
    m: &mut M,
    batch: &ForwardBatch,
    specs: &[SampleSpec],
) -> Result<(Vec<f32>, usize)> {
    check_specs(batch, specs)?;
    let logits = m.forward(batch)?;
    let vocab = m.config().vocab_size.max(1);
    if logits.len() != specs.len() * vocab {
        return Err(Error::Batch(format!(
            "forward returned {} logits for {} rows of vocabulary {vocab}",
            logits.len(),
            specs.len()
        )));
    }
    Ok((logits, vocab))
}

fn check_specs(batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<()> {
    if specs.len() != batch.logit_rows.len() {
        return Err(Error::Batch(format!("{} sampling specs for {} logit rows", specs.len(), batch.logit_rows.len())));
    }
    Ok(())
}

/// The element types of the stored activations a matmul reads (the rest are f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActDtypes {
    /// The norms' output, read by the q/k/v and gate/up projections.
    pub x: DType,
    /// The MLP activation, read by the down projection.
    pub act: DType,
    /// The final norm's rows, read by the head.
    pub last_normed: DType,
}

impl<B: Backend> ModelRunner for Model<B> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn backend_name(&self) -> &'static str {
        self.backend.name()
    }
    fn launch_count(&self) -> Option<u64> {
        self.backend.launch_count()
    }
    fn weights_bytes(&self) -> Option<u64> {
        self.weights_bytes
    }
    fn matmul_operand(&self) -> DType {
        self.matmul_operand
    }
    fn activation_dtypes(&self) -> ActDtypes {
        self.act_dtypes
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.kv_view
    }
    fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }
    fn max_batch_tokens(&self) -> usize {
        self.opts.max_batch_tokens
    }
    fn max_seqs(&self) -> usize {
        self.opts.max_seqs
    }
    fn max_logit_rows(&self) -> usize {
        self.opts.max_seqs + self.opts.prompt_logit_rows
    }
    fn lora_slots(&self) -> Vec<bool> {
        self.lora_slots()
    }
    fn set_aux_layers(&mut self, layers: &[usize]) -> Result<()> {
        let n = self.cfg.num_hidden_layers;
        if let Some(&l) = layers.iter().find(|&&l| l > n) {
            return Err(Error::Batch(format!(
                "aux layer {l}: the model has {n} layers (layer {n} names their output)"
            )));
        }
        self.aux = (!layers.is_empty()).then(|| super::load::AuxHidden { layers: layers.to_vec(), rows: Vec::new() });
        Ok(())
    }
    fn load_draft_head(&mut self, head: &crate::eagle3::Eagle3Head) -> Result<bool> {
        self.draft_head = Some(crate::device_head::DeviceHead::upload(&self.backend, head)?);
        Ok(true)
    }
    fn propose_draft(
        &mut self,
        cache: &mut HeadCache,
        tokens: &[u32],
        aux: &[f32],
        aux_from: usize,
        k: usize,
    ) -> Result<Option<Vec<u32>>> {
        match &self.draft_head {
            Some(h) => h.propose(&self.backend, cache, tokens, aux, aux_from, k),
            None => Err(Error::Batch("propose_draft: no draft head was loaded".into())),
        }
    }
    fn take_aux_hidden(&mut self) -> Vec<f32> {
        self.aux.as_mut().map(|a| std::mem::take(&mut a.rows)).unwrap_or_default()
    }
    fn load_lora(&mut self, slot: usize, adapter: &crate::lora::LoraAdapter) -> Result<()> {
        Model::load_lora(self, slot, adapter)
    }
    fn unload_lora(&mut self, slot: usize) {
        Model::unload_lora(self, slot)
    }
    fn lora_limits(&self) -> Option<crate::lora::LoraLimits> {
        Model::lora_limits(self)
    }
    fn forward(&mut self, batch: &ForwardBatch) -> Result<Vec<f32>> {
        self.check(batch)?;
        self.record(batch)?;
        let n = batch.logit_rows.len() * self.cfg.vocab_size;
        if n == 0 {
            // A prefill chunk that samples nothing: wait for it anyway, so that aborted work
            // never piles up on the device behind the host.
            self.backend.sync()?;
            return Ok(vec![]);
        }
        self.backend.read_f32(&self.s.logits, n)
    }
    fn forward_sampled(&mut self, batch: &ForwardBatch, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        check_specs(batch, specs)?;
        self.check(batch)?;
        self.record(batch)?;
        if specs.is_empty() {
            // As in `forward`: a chunk that samples nothing still waits for its work.
            self.backend.sync()?;
            return Ok(vec![]);
        }
        self.backend.sample(&self.s.logits, specs.len(), self.cfg.vocab_size, specs)
    }
    fn forward_sampled_masked(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
    ) -> Result<Vec<u32>> {
        check_specs(batch, specs)?;
        self.check(batch)?;
        // Recorded (on a device: launched) before the masks are asked for, so they are computed
        // while the device runs.
        self.record(batch)?;
        let m = masks()?;
        if specs.is_empty() {
            self.backend.sync()?;
            return Ok(vec![]);
        }
        m.check(specs.len(), self.cfg.vocab_size).map_err(Error::Batch)?;
        self.backend.sample_masked(&self.s.logits, specs.len(), self.cfg.vocab_size, specs, &m)
    }
    fn forward_sampled_logprobs(
        &mut self,
        batch: &ForwardBatch,
        specs: &[SampleSpec],
        masks: &mut dyn FnMut() -> Result<RowMasks>,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        check_specs(batch, specs)?;
        if top_n.len() != specs.len() {
            return Err(Error::Batch(format!("{} logprob counts for {} rows", top_n.len(), specs.len())));
        }
        self.check(batch)?;
        self.record(batch)?;
        let m = masks()?;
        if specs.is_empty() {
            self.backend.sync()?;
            return Ok((vec![], vec![]));
        }
        m.check(specs.len(), self.cfg.vocab_size).map_err(Error::Batch)?;
        self.backend.sample_logprobs(&self.s.logits, specs.len(), self.cfg.vocab_size, specs, &m, top_n)
    }
}
