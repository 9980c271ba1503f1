//! The adapter slots on the device and the update a forward adds to a projection's output.
//!
//! `max_loras` slots, each empty or holding one adapter. Every layer's projection has one
//! stacked A `[max_loras, max_rank, in]` and one stacked B `[max_loras, out, max_rank]`,
//! allocated (zeroed) at load; loading an adapter writes its slot's region of each (zeros where
//! it leaves a projection alone, and in the rank rows past its own). A step stages each row's
//! slot, and each projection runs one [`crate::backend::Ops::lora`] over every row
//! ([`super::segmented`]): the work follows from the rows, and a row's bits from its own
//! adapter only, so a request gives the same bits alone and in any mixed batch.
//!
//! A step none of whose rows names an adapter runs no LoRA op at all: the op leaves a row
//! without a slot exactly as it is (no zero is added, so not even a -0.0 changes), and its
//! shrink scratch is read by nothing else, so skipping it changes no bit. A recorded graph
//! must hold the op whatever the step it was recorded on ([`LoraSlots::run_always`]); the
//! model records none while LoRA is on, so today every LoRA step runs eagerly.

use super::adapter::{LoraAdapter, Proj};
use super::segmented::{round_to, LoraArgs, NO_SLOT};
use crate::backend::{Backend, DType};
use crate::batch::ForwardBatch;
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// How many adapters fit on the device at once and their largest rank (vLLM's `--max-loras`
/// and `--max-lora-rank`); fixed at load, sizing the stacks and the scratch.
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

/// One projection's stacked factors: A `[max_loras, max_rank, in]`, B `[max_loras, out, max_rank]`.
struct Stack<Buf> {
    a: Buf,
    b: Buf,
}

/// The element types A is read against, so that the update reads the activation it meets as
/// the base projection does (a backend may store x in the weights' 16-bit type:
/// `Storage::activation_dtype`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoraDtypes {
    /// A of q, k, v, gate, up (they read the normed x).
    pub x: DType,
    /// A of down (it reads the MLP activation).
    pub act: DType,
}

impl LoraDtypes {
    /// The type projection `p`'s A is held in (its values rounded to it).
    fn of(self, p: Proj) -> DType {
        match p {
            Proj::O => DType::F32,
            Proj::Down => self.act,
            _ => self.x,
        }
    }
}

/// The slots, their stacked factors and the scratch the updates run in, allocated at load for
/// the largest step.
pub(crate) struct LoraSlots<B: Backend> {
    limits: LoraLimits,
    dtypes: LoraDtypes,
    /// Each projection's `(out, in)`, by [`Proj::index`].
    shapes: [(usize, usize); 7],
    /// Per layer, by [`Proj::index`].
    stacks: Vec<[Stack<B::Buf>; 7]>,
    /// Each slot's scale, `None` where it is empty.
    loaded: Vec<Option<f32>>,
    /// f32 `[max_loras]`: the scales (0 for an empty slot).
    scales: B::Buf,
    /// u32 `[T]`: each row's slot or [`NO_SLOT`], written each step.
    rows: B::Buf,
    /// The host copy of `rows`.
    host: Vec<u32>,
    /// Whether the projections run the op: some row of the staged step has a slot, or a
    /// recording asked for it ([`LoraSlots::run_always`]).
    active: bool,
    /// f32 `[T, max_rank]`: `x Aᵀ`.
    shrink: B::Buf,
}

impl<B: Backend> LoraSlots<B> {
    /// Empty slots, zeroed stacks for every layer and projection of `cfg`, and scratch for steps
    /// of up to `max_tokens` rows.
    pub fn new(b: &B, limits: LoraLimits, dtypes: LoraDtypes, cfg: &ModelConfig, max_tokens: usize) -> Result<Self> {
        if limits.max_loras == 0 || limits.max_rank == 0 {
            return Err(Error::Batch(format!("LoRA limits must be positive: {limits:?}")));
        }
        let (n, r) = (limits.max_loras, limits.max_rank);
        let shapes = Proj::ALL.map(|p| p.shape(cfg));
        let widest = shapes.iter().map(|&(o, i)| o.max(i)).max().unwrap_or(0);
        let zeros = vec![0.0f32; n * r * widest];
        let zeroed = |len: usize| -> Result<B::Buf> {
            let mut buf = b.alloc_f32(len)?;
            b.write_f32(&mut buf, &zeros[..len])?;
            Ok(buf)
        };
        let mut stacks = Vec::with_capacity(cfg.num_hidden_layers);
        for _ in 0..cfg.num_hidden_layers {
            let mut layer = Vec::with_capacity(7);
            for &(out, inp) in &shapes {
                layer.push(Stack { a: zeroed(n * r * inp)?, b: zeroed(n * out * r)? });
            }
            stacks.push(layer.try_into().unwrap_or_else(|_| unreachable!("seven projections")));
        }
        let mut rows = b.alloc_u32(max_tokens)?;
        let host = vec![NO_SLOT; max_tokens];
        b.write_u32(&mut rows, &host)?;
        Ok(LoraSlots {
            limits,
            dtypes,
            shapes,
            stacks,
            loaded: vec![None; n],
            scales: zeroed(n)?,
            rows,
            host,
            active: true,
            shrink: b.alloc_f32(max_tokens * r)?,
        })
    }

    pub fn limits(&self) -> LoraLimits {
        self.limits
    }

    /// Whether `slot` holds an adapter.
    pub fn occupied(&self, slot: usize) -> bool {
        self.loaded.get(slot).is_some_and(Option::is_some)
    }

    /// Writes `adapter` into `slot`'s region of every stack (replacing what was there); an
    /// adapter over the rank limit or a slot beyond `max_loras` is refused.
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
        if adapter.layers.len() > self.stacks.len() {
            return Err(Error::config(
                &adapter.dir,
                format!("{} layers, but the base model has {}", adapter.layers.len(), self.stacks.len()),
            ));
        }
        // The slot is empty while its regions are rewritten: a failed write leaves no half adapter.
        self.loaded[slot] = None;
        let (r, mr) = (adapter.rank, self.limits.max_rank);
        for (l, layer) in self.stacks.iter_mut().enumerate() {
            for p in Proj::ALL {
                let (out, inp) = self.shapes[p.index()];
                let mut a = vec![0.0f32; mr * inp];
                let mut bw = vec![0.0f32; out * mr];
                if let Some(pair) = adapter.layers.get(l).and_then(|ps| ps[p.index()].as_ref()) {
                    let (av, bv) = (pair.a.to_f32(), pair.b.to_f32());
                    if av.len() != r * inp || bv.len() != out * r {
                        return Err(Error::config(
                            &adapter.dir,
                            format!(
                                "layer {l} {}: A has {} values and B {}, want {r}x{inp} and {out}x{r}",
                                p.hf_name(),
                                av.len(),
                                bv.len()
                            ),
                        ));
                    }
                    let d = self.dtypes.of(p);
                    for (dst, &v) in a.iter_mut().zip(&av) {
                        *dst = round_to(d, v);
                    }
                    for o in 0..out {
                        bw[o * mr..o * mr + r].copy_from_slice(&bv[o * r..(o + 1) * r]);
                    }
                }
                let st = &mut layer[p.index()];
                write_region(b, &mut st.a, slot, &a)?;
                write_region(b, &mut st.b, slot, &bw)?;
            }
        }
        self.loaded[slot] = Some(adapter.scale);
        self.write_scales(b)
    }

    /// Empties `slot` (its regions and scale stay as they were: no row is staged with an
    /// empty slot).
    pub fn unload(&mut self, slot: usize) {
        if let Some(s) = self.loaded.get_mut(slot) {
            *s = None;
        }
    }

    fn write_scales(&mut self, b: &B) -> Result<()> {
        let host: Vec<f32> = self.loaded.iter().map(|s| s.unwrap_or(0.0)).collect();
        b.write_f32(&mut self.scales, &host)
    }

    /// Writes each row's slot for a step of `rows` rows (the batch's tokens, then padding
    /// rows with none); a step where no row has one runs no op ([`LoraSlots::apply`]).
    pub fn stage(&mut self, b: &B, batch: &ForwardBatch, rows: usize) -> Result<()> {
        let host = &mut self.host[..rows];
        host.fill(NO_SLOT);
        if !batch.adapters.is_empty() {
            for (t, &seq) in batch.token_seq.iter().enumerate() {
                if let Some(slot) = batch.adapters[seq as usize] {
                    if self.loaded.get(slot as usize).is_some_and(Option::is_some) {
                        host[t] = slot;
                    }
                }
            }
        }
        self.active = host.iter().any(|&s| s != NO_SLOT);
        b.write_u32(&mut self.rows, host)
    }

    /// Every projection runs the op until the next [`LoraSlots::stage`], whatever the rows:
    /// for a step being recorded, whose replays may carry adapters the recorded step had not.
    pub fn run_always(&mut self) {
        self.active = true;
    }

    /// `y += scale · (x Aᵀ) Bᵀ` for projection `p` of layer `layer` over `t` rows, each row
    /// with its own slot's factors; x `[t, in]`, y f32 `[t, out]`. Nothing where no row of
    /// the staged step has a slot (y is then what the op would leave, bit for bit).
    pub fn apply(&mut self, b: &B, layer: usize, p: Proj, x: &B::Buf, y: &mut B::Buf, t: usize) -> Result<()> {
        if !self.active {
            return Ok(());
        }
        let (out, inp) = self.shapes[p.index()];
        let st = &self.stacks[layer][p.index()];
        let args = LoraArgs {
            x,
            operand: b.matmul_operand(self.dtypes.of(p)),
            a: &st.a,
            b: &st.b,
            slots: &self.rows,
            scales: &self.scales,
            rows: t,
            inp,
            out,
            max_loras: self.limits.max_loras,
            max_rank: self.limits.max_rank,
        };
        b.lora(&args, &mut self.shrink, y)
    }
}

/// Writes `region` into slot `slot`'s part of a stack whose slots are `region.len()` long:
/// the stack up to the slot's end is read back, the slot's part replaced, and written again
/// (a load is rare; the interface writes from a buffer's start).
fn write_region<B: Backend>(b: &B, stack: &mut B::Buf, slot: usize, region: &[f32]) -> Result<()> {
    let n = region.len();
    let mut host = if slot == 0 { Vec::with_capacity(n) } else { b.read_f32(stack, slot * n)? };
    host.truncate(slot * n);
    host.extend_from_slice(region);
    b.write_f32(stack, &host)
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
    /// [`LoraSlots::apply`] for projection `p` of this layer (`cfg` is the model's: each
    /// projection's shape was fixed from it at load).
    pub fn apply(&mut self, b: &B, cfg: &ModelConfig, p: Proj, x: &B::Buf, y: &mut B::Buf, t: usize) -> Result<()> {
        debug_assert_eq!(self.slots.shapes[p.index()], p.shape(cfg));
        self.slots.apply(b, self.layer, p, x, y, t)
    }
}
