//! The forward pass of one step, written once against [`Backend`]: embed, then each layer's
//! attention and MLP, then the head; what a step records (eagerly or by replaying its graph)
//! and the checks a batch passes first.

use super::graphs::StepShape;
use super::layers::{Ffn, FfnBufs, Layer, QkvBufs};
use super::load::Scratch;
use super::Model;
use crate::backend::{AttnArgs, Backend, KvDest, NormIn};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::lora::slots::{check_adapters, LoraAt};
use crate::lora::Proj;
use crate::meta::{self, PadRows};

impl<B: Backend> Model<B> {
    /// Queues the whole forward pass on the backend; logits are left in `self.s.logits`, the
    /// batch's logit rows first (a padded step's padding rows after them). A decode step is
    /// padded to its bucket where padding is on, and replays the bucket's graph where one was
    /// captured; every other step runs as it is.
    pub(super) fn record(&mut self, batch: &ForwardBatch) -> Result<()> {
        // Keeping aux hidden states reads them back mid-step: never a padded or replayed step.
        if let Some(i) = self.decode_bucket(batch).filter(|_| self.aux.is_none()) {
            let pad = self.pad.as_ref().expect("decode_bucket implies padding");
            let rows = pad.buckets[i];
            let (shape, pad_rows) = (pad.shape(rows), pad.rows(self.opts.block_size));
            self.upload_padded(batch, pad_rows, rows)?;
            if let Some(lora) = &mut self.lora {
                lora.stage(&self.backend, batch, rows)?;
            }
            return match self.graphs[i] {
                Some(g) => match self.backend.replay(g) {
                    // A replay that could not be queued queued nothing: run the step eagerly,
                    // and every later one (a graph that failed once is not trusted again).
                    Err(e) if !e.is_fatal() => {
                        tracing::warn!(rows, error = %e, "replaying the decode graph failed: decode steps run eagerly from now on");
                        self.graphs.iter_mut().for_each(|g| *g = None);
                        self.launch(shape)
                    }
                    r => r,
                },
                None => self.launch(shape),
            };
        }
        self.upload(batch)?;
        if let Some(lora) = &mut self.lora {
            lora.stage(&self.backend, batch, batch.num_tokens())?;
        }
        let max_context = batch.positions.iter().copied().max().unwrap_or(0) as usize + 1;
        self.launch(StepShape {
            tokens: batch.num_tokens(),
            seqs: batch.num_seqs(),
            logit_rows: batch.logit_rows.len(),
            max_blocks: batch.max_blocks,
            max_context,
            decodes: crate::batch::leading_decodes(&batch.token_seq),
        })
    }

    /// The step's metadata into its buffers: staged in the group's host memory, then one
    /// upload (what a replay reads).
    fn upload(&mut self, batch: &ForwardBatch) -> Result<()> {
        let (b, s) = (&self.backend, &mut self.s);
        let used = self.staging.stage_batch(b.u32_staging(&mut s.meta)?, batch)?;
        b.upload_u32_group(&mut s.meta, &used)
    }

    /// A decode step (`decode_bucket`) padded to `rows` rows, written straight into the staging
    /// memory (no padded `ForwardBatch` is built, nothing allocated), then one upload.
    pub(super) fn upload_padded(&mut self, batch: &ForwardBatch, pad: PadRows, rows: usize) -> Result<()> {
        let (b, s) = (&self.backend, &mut self.s);
        let used = self.staging.stage_padded(b.u32_staging(&mut s.meta)?, batch, pad, rows)?;
        b.upload_u32_group(&mut s.meta, &used)
    }

    /// Every op of the forward pass for a step of this shape, on the uploaded metadata: no
    /// upload, no read, nothing from the batch but `shape` (so it can be captured).
    pub(super) fn launch(&mut self, shape: StepShape) -> Result<()> {
        let (t, d) = (shape.tokens, self.cfg.hidden_size);
        let b = &self.backend;
        b.embedding(&self.embed, &self.s.meta.parts[meta::TOKENS], &mut self.s.h, t, d)?;
        if let Some(scale) = self.embed_scale {
            b.scale(&mut self.s.h, scale, t * d)?;
        }
        // Adapters update the projections' outputs before the norms: never folded into them.
        let fold = self.lora.is_none() && b.fuses_norm(d, t) && self.layers.iter().all(Layer::fully_fused);
        let mut residual = Residual::new(fold);
        for l in 0..self.layers.len() {
            self.attention(l, shape, &mut residual)?;
            self.mlp(l, t, &mut residual)?;
        }
        residual.finish(&self.backend, &mut self.s, t, d)?;
        let last = self.layers.len();
        if let Some(aux) = self.aux.as_mut().filter(|a| a.layers.contains(&last)) {
            // `h` is now the last layer's output, before the final norm.
            keep_aux(aux, last, &self.backend.read_f32(&self.s.h, t * d)?, t, d);
        }
        self.head(shape.logit_rows)
    }

    /// Layer `l`'s attention block: its input norm, q/k/v (rotated, K/V written to the cache),
    /// paged attention, the output projection into the residual stream.
    fn attention(&mut self, l: usize, shape: StepShape, residual: &mut Residual) -> Result<()> {
        let (b, c, s) = (&self.backend, &self.cfg, &mut self.s);
        let (layer, (k_cache, v_cache)) = (&self.layers[l], &mut self.caches[l]);
        let mut lora = self.lora.as_mut().map(|slots| LoraAt { slots, layer: l });
        let m = &s.meta.parts;
        let (positions, slots) = (&m[meta::POSITIONS], &m[meta::SLOTS]);
        let (t, qd, eps) = (shape.tokens, c.q_dim(), c.rms_norm_eps);
        let folded = residual.norm(b, &mut s.h, &s.o, &layer.input_norm, &mut s.x, t, c.hidden_size, eps)?;
        if let Some(aux) = self.aux.as_mut().filter(|a| a.layers.contains(&l)) {
            // `h` is now the hidden state entering layer `l` (the residual add is done).
            keep_aux(aux, l, &b.read_f32(&s.h, t * c.hidden_size)?, t, c.hidden_size);
        }
        let norm = folded.then_some(NormIn { h: &s.h, gamma: &layer.input_norm, eps });
        let inv_freq = match (&self.local_inv_freq, c.uses_local_rope(l)) {
            (Some(local), true) => local,
            _ => &self.inv_freq,
        };
        let kv = KvDest {
            k_cache: &mut *k_cache,
            v_cache: &mut *v_cache,
            positions,
            inv_freq,
            slots,
            geometry: self.geometry,
        };
        let bufs = QkvBufs { q: &mut s.q, k: &mut s.k, v: &mut s.v, raw: s.qk_raw.as_mut().map(|(q, k)| (q, k)) };
        layer.attn.project(b, c, &s.x, norm, bufs, kv, t, lora.as_mut())?;
        let args = AttnArgs {
            q: &s.q,
            k_cache,
            v_cache,
            positions,
            token_seq: &m[meta::TOKEN_SEQ],
            block_tables: &m[meta::BLOCK_TABLES],
            num_tokens: t,
            num_seqs: shape.seqs,
            max_blocks: shape.max_blocks,
            max_context: shape.max_context,
            decode_tokens: shape.decodes,
            num_heads: c.num_attention_heads,
            geometry: self.geometry,
            scale: c.attn_scale(),
            window: c.layer_windows.get(l).copied().unwrap_or(0),
        };
        b.paged_attention(&args, &mut s.attn)?;
        let out =
            BlockOut { from: Source::Attn, w: &layer.attn.o, k: qd, norm: layer.out_norms.as_ref().map(|(a, _)| a) };
        residual.output(b, s, out, Some(&layer.post_norm), t, c, lora.as_mut().map(|l| (l, Proj::O)))
    }

    /// Layer `l`'s feed-forward block: its input norm, the MLP or the experts, the output into
    /// the residual stream.
    fn mlp(&mut self, l: usize, t: usize, residual: &mut Residual) -> Result<()> {
        let (b, c, s) = (&self.backend, &self.cfg, &mut self.s);
        let (layer, d, eps) = (&self.layers[l], c.hidden_size, c.rms_norm_eps);
        let mut lora = self.lora.as_mut().map(|slots| LoraAt { slots, layer: l });
        let folded = residual.norm(b, &mut s.h, &s.o, &layer.post_norm, &mut s.x, t, d, eps)?;
        match &layer.ffn {
            Ffn::Dense(mlp) => {
                let norm = folded.then_some(NormIn { h: &s.h, gamma: &layer.post_norm, eps });
                mlp.activation(b, c, &s.x, &mut s.gate, &mut s.up, &mut s.act, t, norm, lora.as_mut())?;
                let next = self.layers.get(l + 1).map(|n| &n.input_norm);
                let out = BlockOut {
                    from: Source::Act,
                    w: &mlp.down,
                    k: mlp.inter,
                    norm: layer.out_norms.as_ref().map(|(_, f)| f),
                };
                residual.output(b, s, out, next, t, c, lora.as_mut().map(|l| (l, Proj::Down)))
            }
            Ffn::Moe(moe) => {
                // Never with fused norms (`Layer::fully_fused` is false): out is added later.
                let bufs = FfnBufs {
                    x: &s.x,
                    gate: &mut s.gate,
                    up: &mut s.up,
                    act: &mut s.act,
                    out: &mut s.o,
                    moe: s.moe.as_mut().map(|(l, w, y)| (l, w, y)),
                };
                moe.forward(b, c, bufs, t)?;
                residual.output_in_o();
                Ok(())
            }
        }
    }

    /// The logit rows' final norm and the head.
    fn head(&mut self, n_out: usize) -> Result<()> {
        if n_out == 0 {
            return Ok(());
        }
        let (b, c, s) = (&self.backend, &self.cfg, &mut self.s);
        let d = c.hidden_size;
        b.gather_rows(&s.h, &s.meta.parts[meta::LOGIT_ROWS], &mut s.last, n_out, d)?;
        b.rms_norm(&s.last, &self.final_norm, &mut s.last_normed, n_out, d, c.rms_norm_eps)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        b.matmul(&s.last_normed, head, None, &mut s.logits, n_out, c.vocab_size, d)
    }

    pub(super) fn check(&self, batch: &ForwardBatch) -> Result<()> {
        let o = &self.opts;
        if batch.num_tokens() == 0 {
            return Err(Error::Batch("empty batch".into()));
        }
        if batch.num_tokens() > o.max_batch_tokens {
            return Err(Error::Batch(format!(
                "{} tokens, at most {} per forward",
                batch.num_tokens(),
                o.max_batch_tokens
            )));
        }
        if batch.num_seqs() > o.max_seqs {
            return Err(Error::Batch(format!("{} sequences, at most {} per forward", batch.num_seqs(), o.max_seqs)));
        }
        if batch.logit_rows.len() > o.max_seqs + o.prompt_logit_rows {
            return Err(Error::Batch(format!(
                "{} logit rows, at most {} per forward",
                batch.logit_rows.len(),
                o.max_seqs + o.prompt_logit_rows
            )));
        }
        if batch.max_blocks > self.max_blocks_cap {
            return Err(Error::Batch(format!(
                "{} blocks per sequence, at most {}",
                batch.max_blocks, self.max_blocks_cap
            )));
        }
        batch.validate(self.cfg.vocab_size, self.kv_view.slots(), self.kv_view.block_size)?;
        check_adapters(batch, self.lora.as_ref())
    }

    /// Greedy ids for the logit rows, computed where the logits are (only ids leave the device).
    pub fn forward_argmax(&mut self, batch: &ForwardBatch) -> Result<Vec<u32>> {
        self.check(batch)?;
        self.record(batch)?;
        self.backend.argmax(&self.s.logits, batch.logit_rows.len(), self.cfg.vocab_size)
    }
}

/// Writes layer `l`'s hidden states `h` (`[t, d]`) into each of its places among `aux`'s
/// rows (a layer named twice fills both).
fn keep_aux(aux: &mut super::load::AuxHidden, l: usize, h: &[f32], t: usize, d: usize) {
    let w = aux.layers.len() * d;
    aux.rows.resize(t * w, 0.0);
    for (j, _) in aux.layers.iter().enumerate().filter(|(_, &x)| x == l) {
        for (r, row) in h.chunks_exact(d).enumerate() {
            aux.rows[r * w + j * d..r * w + (j + 1) * d].copy_from_slice(row);
        }
    }
}

/// Which activation a block's output projection reads.
#[derive(Clone, Copy)]
enum Source {
    /// The attention's output `[T, q_dim]`.
    Attn,
    /// The MLP activation `[T, intermediate]`.
    Act,
}

/// A block's output projection: `from · wᵀ` (`[t, k]` by `[hidden, k]`), normed by `norm`
/// where the family norms its blocks' outputs (sandwich norms, `layers::Layer::out_norms`).
struct BlockOut<'a, Buf> {
    from: Source,
    w: &'a Buf,
    k: usize,
    norm: Option<&'a Buf>,
}

/// What of the residual stream a block has left for the next to do.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// `h` is complete; the next block norms it.
    Nothing,
    /// The block's output waits in `o`: the next block adds it to `h` as it norms (`add_rms_norm`).
    OutputInO,
    /// The output was added into `h` by the projection, which also wrote `h ∘ gamma` of the
    /// next norm into `x`: the next block's projections apply the norm (`NormIn`).
    NormFolded,
}

/// The residual adds and the norms that follow them, in one place. Where the backend fuses
/// norms into the projections (`FusedOps::fuses_norm`), each residual add happens in the
/// projection that produces it (`matmul_residual`, which also writes `h ∘ gamma` of the next
/// norm into x) and each norm in the projection that consumes it (`NormIn`): per layer, o and
/// down, then qkv and gate/up, with no norm op between. Otherwise each block's output is added
/// with the norm that follows it (`add_rms_norm`): after attention with the feed-forward's
/// input norm, after the MLP with the next layer's input norm; the last block's output is
/// added alone ([`Residual::finish`]).
struct Residual {
    fused: bool,
    pending: Pending,
}

impl Residual {
    fn new(fused: bool) -> Self {
        Residual { fused, pending: Pending::Nothing }
    }

    /// A block's input norm of `h` into `x`, the previous block's output added first where it
    /// waits. True: the norm is folded into the block's projections (pass them a `NormIn`).
    #[allow(clippy::too_many_arguments)]
    fn norm<B: Backend>(
        &mut self,
        b: &B,
        h: &mut B::Buf,
        o: &B::Buf,
        gamma: &B::Buf,
        x: &mut B::Buf,
        t: usize,
        d: usize,
        eps: f32,
    ) -> Result<bool> {
        let pending = std::mem::replace(&mut self.pending, Pending::Nothing);
        match pending {
            Pending::Nothing => b.rms_norm(h, gamma, x, t, d, eps)?,
            Pending::OutputInO => b.add_rms_norm(h, o, gamma, x, t, d, eps)?,
            Pending::NormFolded => return Ok(true),
        }
        Ok(false)
    }

    /// A block's output projection: added into `h` by the projection where norms are fused
    /// (with `next`, the following block's input norm, folded into x), else left in `o`, the
    /// adapters' update of projection `lora.1` added before the output's norm.
    #[allow(clippy::too_many_arguments)]
    fn output<B: Backend>(
        &mut self,
        b: &B,
        s: &mut Scratch<B>,
        out: BlockOut<'_, B::Buf>,
        next: Option<&B::Buf>,
        t: usize,
        c: &ModelConfig,
        lora: Option<(&mut LoraAt<'_, B>, Proj)>,
    ) -> Result<()> {
        let (d, eps) = (c.hidden_size, c.rms_norm_eps);
        let from = match out.from {
            Source::Attn => &s.attn,
            Source::Act => &s.act,
        };
        if self.fused {
            b.matmul_residual(from, out.w, &mut s.h, next.map(|g| (g, &mut s.x)), t, d, out.k)?;
            self.pending = if next.is_some() { Pending::NormFolded } else { Pending::Nothing };
            return Ok(());
        }
        match (out.norm, &mut s.pre_norm) {
            (Some(gamma), Some(pre)) => {
                b.matmul(from, out.w, None, pre, t, d, out.k)?;
                if let Some((l, p)) = lora {
                    l.apply(b, c, p, from, pre, t)?;
                }
                b.rms_norm(pre, gamma, &mut s.o, t, d, eps)?;
            }
            _ => {
                b.matmul(from, out.w, None, &mut s.o, t, d, out.k)?;
                if let Some((l, p)) = lora {
                    l.apply(b, c, p, from, &mut s.o, t)?;
                }
            }
        }
        self.pending = Pending::OutputInO;
        Ok(())
    }

    /// A block that wrote its output into `o` itself (a mixture of experts).
    fn output_in_o(&mut self) {
        self.pending = Pending::OutputInO;
    }

    /// After the last layer: its output added where it waits.
    fn finish<B: Backend>(&mut self, b: &B, s: &mut Scratch<B>, t: usize, d: usize) -> Result<()> {
        if std::mem::replace(&mut self.pending, Pending::Nothing) == Pending::OutputInO {
            b.add(&mut s.h, &s.o, t * d)?;
        }
        Ok(())
    }
}
