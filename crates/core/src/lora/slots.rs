//! The adapter slots on the device and the update a forward adds to a projection's output.
//!
//! `max_loras` slots, each empty or holding one adapter's A and B per layer and projection.
//! For every projection of a step, every occupied slot that updates it runs over every row:
//! `u = x Aᵀ` (`[T, r]`), `d = u Bᵀ` (`[T, out]`), then `y[t] += w[t, slot] · d[t]`
//! ([`crate::backend::Ops::moe_accumulate`]) where `w[t, slot]` is the adapter's scale for the
//! rows of that adapter and 0 for the others. It is the mixture of experts' every-expert form:
//! built from ops every backend has, its launches follow from the step's shape and the loaded
//! slots alone, and a row's result depends on its own adapter only (a matmul row's bits never
//! depend on the other rows, and adding `0 · d` leaves a value as it was), so a request gives
//! the same bits alone and in any mixed batch. The price is compute: each loaded adapter's two
//! thin products over every row of the step.

use super::adapter::{LoraAdapter, Proj};
use crate::backend::{Backend, DType};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// How many adapters fit on the device at once and their largest rank (vLLM's `--max-loras`
/// and `--max-lora-rank`); fixed at load, sizing the scratch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraLimits {
    pub max_loras: usize,
    pub max_rank: usize,
}

impl Default for LoraLimits {
    /// vLLM's defaults: one adapter, rank 16.
    fn default() -> Self {
        LoraLimits { max_loras: 1, max_rank: 16 }
    }
}

/// One layer's (A, B) on the device, indexed by [`Proj::index`].
type LayerPairs<Buf> = [Option<(Buf, Buf)>; 7];

/// One loaded adapter: A and B per layer and projection, on the device.
struct Loaded<B: Backend> {
    scale: f32,
    rank: usize,
    layers: Vec<LayerPairs<B::Buf>>,
}

/// The element types an adapter's A is uploaded in, so that it reads the activation it meets
/// as the base projection does (a backend may store x in the weights' 16-bit type:
/// `Storage::activation_dtype`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoraDtypes {
    /// A of q, k, v, gate, up (they read the normed x).
    pub x: DType,
    /// A of down (it reads the MLP activation).
    pub act: DType,
}

/// The slots and the scratch the updates run in, allocated at load for the largest step.
pub(crate) struct LoraSlots<B: Backend> {
    limits: LoraLimits,
    dtypes: LoraDtypes,
    slots: Vec<Option<Loaded<B>>>,
    /// `[T, max_rank]`: `x Aᵀ`.
    shrink: B::Buf,
    /// `[T, widest out]`: `(x Aᵀ) Bᵀ`.
    delta: B::Buf,
    /// `[T, max_loras]`: each row's factor per slot, written each step.
    weights: B::Buf,
    /// The host copy of `weights`.
    host: Vec<f32>,
}

impl<B: Backend> LoraSlots<B> {
    /// Empty slots and scratch for steps of up to `max_tokens` rows, projections up to `max_out` wide.
    pub fn new(b: &B, limits: LoraLimits, dtypes: LoraDtypes, max_tokens: usize, max_out: usize) -> Result<Self> {
        if limits.max_loras == 0 || limits.max_rank == 0 {
            return Err(Error::Batch(format!("LoRA limits must be positive: {limits:?}")));
        }
        Ok(LoraSlots {
            limits,
            dtypes,
            slots: (0..limits.max_loras).map(|_| None).collect(),
            shrink: b.alloc_f32(max_tokens * limits.max_rank)?,
            delta: b.alloc_f32(max_tokens * max_out)?,
            weights: b.alloc_f32(max_tokens * limits.max_loras)?,
            host: vec![0.0; max_tokens * limits.max_loras],
        })
    }

    pub fn limits(&self) -> LoraLimits {
        self.limits
    }

    /// Whether `slot` holds an adapter.
    pub fn occupied(&self, slot: usize) -> bool {
        self.slots.get(slot).is_some_and(Option::is_some)
    }

    /// Uploads `adapter` into `slot` (replacing what was there); an adapter over the rank
    /// limit or a slot beyond `max_loras` is refused.
    pub fn load(&mut self, b: &B, slot: usize, adapter: &LoraAdapter) -> Result<()> {
        if slot >= self.limits.max_loras {
            return Err(Error::config(
                &adapter.dir,
                format!("LoRA slot {slot}, but there are {} (--max-loras)", self.limits.max_loras),
            ));
        }
        if adapter.rank > self.limits.max_rank {
            return Err(Error::config(
                &adapter.dir,
                format!("rank {} is over the limit {} (--max-lora-rank)", adapter.rank, self.limits.max_rank),
            ));
        }
        let mut layers = Vec::with_capacity(adapter.layers.len());
        for pairs in &adapter.layers {
            let mut up: LayerPairs<B::Buf> = Default::default();
            for p in Proj::ALL {
                if let Some(pair) = &pairs[p.index()] {
                    let a_dtype = match p {
                        Proj::O => DType::F32,
                        Proj::Down => self.dtypes.act,
                        _ => self.dtypes.x,
                    };
                    let a = b.weight_from_f32(a_dtype, &pair.a.to_f32())?;
                    let bb = b.weight_from_f32(DType::F32, &pair.b.to_f32())?;
                    up[p.index()] = Some((a, bb));
                }
            }
            layers.push(up);
        }
        self.slots[slot] = Some(Loaded { scale: adapter.scale, rank: adapter.rank, layers });
        Ok(())
    }

    /// Empties `slot` (its buffers are freed).
    pub fn unload(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = None;
        }
    }

    /// Writes each row's factors for a step of `rows` rows (the batch's tokens, then padding
    /// rows with none).
    pub fn stage(&mut self, b: &B, batch: &ForwardBatch, rows: usize) -> Result<()> {
        let n = self.limits.max_loras;
        let host = &mut self.host[..rows * n];
        host.fill(0.0);
        if !batch.adapters.is_empty() {
            for (t, &seq) in batch.token_seq.iter().enumerate() {
                if let Some(slot) = batch.adapters[seq as usize] {
                    let slot = slot as usize;
                    host[t * n + slot] = self.slots[slot].as_ref().map_or(0.0, |s| s.scale);
                }
            }
        }
        b.write_f32(&mut self.weights, host)
    }

    /// `y += w · (x Aᵀ) Bᵀ` for projection `p` of layer `layer` over `t` rows, every loaded
    /// slot in order; x `[t, in]`, y f32 `[t, out]`.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(
        &mut self,
        b: &B,
        layer: usize,
        p: Proj,
        x: &B::Buf,
        y: &mut B::Buf,
        t: usize,
        shape: (usize, usize),
    ) -> Result<()> {
        let (out, inp) = shape;
        let n = self.limits.max_loras;
        for (slot, loaded) in self.slots.iter().enumerate() {
            let Some(l) = loaded else { continue };
            let Some((a, bw)) = l.layers.get(layer).and_then(|ps| ps[p.index()].as_ref()) else { continue };
            b.matmul(x, a, None, &mut self.shrink, t, l.rank, inp)?;
            b.matmul(&self.shrink, bw, None, &mut self.delta, t, out, l.rank)?;
            b.moe_accumulate(y, &self.delta, &self.weights, t, out, slot, n, false)?;
        }
        Ok(())
    }
}

/// Checks `batch.adapters` against the slots (`None`: a model without LoRA, where any adapter
/// is an error).
pub(crate) fn check_adapters<B: Backend>(batch: &ForwardBatch, slots: Option<&LoraSlots<B>>) -> Result<()> {
    if batch.adapters.is_empty() {
        return Ok(());
    }
    if batch.adapters.len() != batch.num_seqs() {
        return Err(Error::Batch(format!(
            "{} adapters for {} sequences (one per sequence, or none)",
            batch.adapters.len(),
            batch.num_seqs()
        )));
    }
    for (seq, a) in batch.adapters.iter().enumerate() {
        let Some(slot) = a else { continue };
        match slots {
            None => return Err(Error::Batch(format!("sequence {seq} asks for LoRA slot {slot}: LoRA is not enabled"))),
            Some(s) if !s.occupied(*slot as usize) => {
                return Err(Error::Batch(format!("sequence {seq} asks for LoRA slot {slot}, which holds no adapter")))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The slots as one layer's projections meet them in a forward.
pub(crate) struct LoraAt<'a, B: Backend> {
    pub slots: &'a mut LoraSlots<B>,
    pub layer: usize,
}

impl<B: Backend> LoraAt<'_, B> {
    /// [`LoraSlots::apply`] for projection `p` of this layer in a model of `cfg`.
    pub fn apply(&mut self, b: &B, cfg: &ModelConfig, p: Proj, x: &B::Buf, y: &mut B::Buf, t: usize) -> Result<()> {
        self.slots.apply(b, self.layer, p, x, y, t, p.shape(cfg))
    }
}
