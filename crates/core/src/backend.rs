//! The backend interface: one method per op family, nothing more.
//!
//! Buffers are flat and typed; shapes are passed with each call and written in comments as
//! `[rows, cols]`, outermost first. Activations are f32. Weights keep the dtype they were stored
//! in (bf16, f16 or f32); each backend converts on the fly. Ops may run asynchronously: results
//! are only guaranteed visible to the host after [`Storage::read_f32`] / [`Storage::read_u32`].
//!
//! Weight layout follows `torch.nn.Linear`: a projection is `[out_features, in_features]`, and
//! `matmul` computes `y = x · Wᵀ`.
//!
//! The paged KV cache: one K and one V buffer per layer, each `[num_blocks, block_size,
//! num_kv_heads, head_dim]`, of the [`KvDtype`] chosen at load among those the backend
//! stores ([`Storage::kv_dtypes`]); its layout is the backend's. A token's *slot* is
//! `block_id * block_size + offset_in_block`.

use half::{bf16, f16};

use crate::config::Activation;
use crate::error::{Error, Result};
use crate::lora::segmented::{lora_rows, LoraArgs};
use crate::sampling::{logprobs_rows, sample_row, sample_rows_masked, RowMasks, SampleSpec, TokenLogprobs};
use crate::weights::TensorView;

pub use crate::kv_dtype::KvDtype;
pub use crate::u32_group::{U32Group, U32Layout};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
        }
    }
    /// Little-endian bytes of this dtype to f32 values.
    pub fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            DType::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
            DType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        }
    }
    /// f32 values to little-endian bytes of this dtype (round to nearest even).
    pub fn from_f32(self, values: &[f32]) -> Vec<u8> {
        match self {
            DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::BF16 => values.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect(),
            DType::F16 => values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect(),
        }
    }
}

/// Geometry of the paged KV cache, fixed when the model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvGeometry {
    pub fn slots(&self) -> usize {
        self.num_blocks * self.block_size
    }
    /// Elements in one layer's K (or V) buffer.
    pub fn layer_elems(&self) -> usize {
        self.slots() * self.num_kv_heads * self.head_dim
    }
}

/// Attention over the paged cache for a flattened batch of query tokens.
///
/// Query token `t` belongs to sequence `token_seq[t]` and sits at position `positions[t]`; it
/// attends to that sequence's keys at positions `0..=positions[t]`, found through row
/// `token_seq[t]` of `block_tables` (`[num_seqs, max_blocks]`). Decode tokens and prefill
/// chunks (with or without a cached prefix) are the same thing here. With a sliding `window`
/// of `w > 0` keys it attends to positions `max(0, p + 1 - w)..=p` only (HF's
/// `sliding_window_overlay`: key `j` is seen when `j > p - w`).
pub struct AttnArgs<'a, B: Storage + ?Sized> {
    /// `[T, num_heads, head_dim]`
    pub q: &'a B::Buf,
    pub k_cache: &'a B::Buf,
    pub v_cache: &'a B::Buf,
    /// u32 `[T]`
    pub positions: &'a B::Buf,
    /// u32 `[T]`
    pub token_seq: &'a B::Buf,
    /// u32 `[num_seqs, max_blocks]`
    pub block_tables: &'a B::Buf,
    pub num_tokens: usize,
    pub num_seqs: usize,
    pub max_blocks: usize,
    /// Largest position in the batch + 1 (lets a backend size its work without a read-back).
    pub max_context: usize,
    /// How many of the first tokens are each a whole sequence of one token (decodes: token i
    /// is sequence i). A hint for how to cut the work (the CUDA kernel splits these tokens'
    /// contexts across blocks and serves the rest a chunk of tokens at a time); any value
    /// up to `num_tokens` gives the same output, bit for bit, and 0 is always correct.
    pub decode_tokens: usize,
    pub num_heads: usize,
    pub geometry: KvGeometry,
    pub scale: f32,
    /// Sliding window in keys (the query's own key included); 0: the whole context.
    pub window: usize,
}

/// A fused weight and its fused bias, if the parts had biases (see [`FusedOps::fuse_qkv`]).
pub type WeightAndBias<T> = (T, Option<T>);

/// Where [`FusedOps::qkv_rope_kv_write`] sends k and v: rotated (k) and written into the paged
/// KV cache of one layer at `slots`, as [`FusedOps::rope_kv_write`] does.
#[derive(Debug)]
pub struct KvDest<'a, Buf> {
    pub k_cache: &'a mut Buf,
    pub v_cache: &'a mut Buf,
    /// u32 `[T]`, the tokens' positions (rope angles).
    pub positions: &'a Buf,
    /// f32 `[head_dim / 2]`.
    pub inv_freq: &'a Buf,
    /// u32 `[T]`, the cache slot of each token.
    pub slots: &'a Buf,
    pub geometry: KvGeometry,
}

/// The RMS norm a fused projection applies to its input ([`FusedOps::fuses_norm`]): the
/// projection of `rms_norm(h) · gamma` without a norm op in between. The projection's x is
/// `h ∘ gamma` (as [`FusedOps::matmul_residual`] writes it); a backend may scale each row's
/// result by `1 / sqrt(mean(h_row²) + eps)` (wgpu), or ignore x and form `rms_norm(h) · gamma`
/// from `h` and `gamma` itself as its `rms_norm` would (CUDA: the unfused path's bits, so a
/// token's result does not depend on whether its step fused the norm).
#[derive(Debug)]
pub struct NormIn<'a, Buf> {
    /// f32 `[m, hidden]`: the residual stream the norm is taken of.
    pub h: &'a Buf,
    /// The norm's weight `[hidden]` (a weight buffer, as for `rms_norm`).
    pub gamma: &'a Buf,
    pub eps: f32,
}

// By hand: derived, they would require `Buf: Copy`.
impl<Buf> Clone for NormIn<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Buf> Copy for NormIn<'_, Buf> {}

/// The largest forward the model will run: what [`Device::reserve_workspace`] sizes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// Tokens per forward (`max_num_batched_tokens`).
    pub max_tokens: usize,
    /// Sequences per forward (`max_num_seqs`).
    pub max_seqs: usize,
    /// Logit rows per forward (max_seqs + prompt-logprob rows).
    pub max_logit_rows: usize,
    /// Longest context a token attends over (the context limit).
    pub max_context: usize,
    pub num_heads: usize,
    pub head_dim: usize,
    /// Largest reduction length of any matmul whose x is stored in f32 (q_dim, and hidden or
    /// intermediate where those inputs are f32: [`Storage::activation_dtype`]); an x stored in
    /// the weights' 16-bit type is read as it is.
    pub max_k: usize,
    /// Widest matmul output (the vocabulary or the fused projections).
    pub max_n: usize,
    /// The KV cache's element type (which attention kernel, and so which scratch, a step uses).
    pub kv_dtype: KvDtype,
    /// A mixture of experts' shape, where the model has one (a routed path's scratch).
    pub moe: Option<MoeLimits>,
}

/// A mixture-of-experts layer's shape, for [`WorkspaceLimits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeLimits {
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    /// Each expert's MLP width.
    pub inter: usize,
}

/// One expert of a mixture of experts as the model holds it: its fused gate/up weight
/// ([`FusedOps::fuse_gate_up`]; `up` None) or gate and up apart, and down.
pub struct MoeExpert<'a, Buf> {
    pub gate: &'a Buf,
    pub up: Option<&'a Buf>,
    pub down: &'a Buf,
}

/// A step recorded by [`Device::end_capture`], which [`Device::replay`] runs again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub usize);

/// The device itself: its name and memory, the workspace, graph capture, and waiting for queued work.
pub trait Device {
    fn name(&self) -> &'static str;

    /// Bytes of device memory free now, if known.
    fn free_memory(&self) -> Option<u64> {
        None
    }

    /// Bytes the weights this backend has uploaded take where it holds them (device buffers,
    /// textures, or the mapped file), counted since it was created; the difference over a load
    /// is that model's weights as held (`tandem:model_weights_bytes`). None, the default, where
    /// the backend does not count.
    fn weight_bytes(&self) -> Option<u64> {
        None
    }

    /// Bytes of device memory in all, if known; with [`Device::free_memory`] it sizes the KV
    /// pool as a fraction of the total (`crate::memory`).
    fn total_memory(&self) -> Option<u64> {
        None
    }

    /// Allocates, once, every scratch a forward within `limits` needs beyond the buffers the
    /// model passes in (attention partials, matmul workspace...), so that no step allocates and
    /// the KV pool is sized after them. A later op beyond the limits fails instead of growing.
    /// Returns the bytes reserved; a backend without such scratch reserves nothing.
    fn reserve_workspace(&self, _limits: &WorkspaceLimits) -> Result<u64> {
        Ok(0)
    }

    /// Kernels (or dispatches) launched since the backend was created, where it counts them; the
    /// difference over a forward is that forward's launch count (`tandem bench decode` reports it
    /// per step). None, the default, where it does not count.
    fn launch_count(&self) -> Option<u64> {
        None
    }

    /// Whether [`Device::begin_capture`] works here: the model then captures its padded decode
    /// steps once at load and replays them. The default is no (every step runs eagerly).
    fn supports_graphs(&self) -> bool {
        false
    }
    /// Starts recording: the ops called until [`Device::end_capture`] are recorded, not run
    /// (a backend may also run them, but nothing may depend on it). They name their buffers
    /// by identity and their scalars by value: a replay reads what the buffers hold then, so
    /// whatever varies per step must live in a buffer written before the replay. Uploads
    /// (`write_*`) and reads are not allowed while recording. The default: not supported.
    fn begin_capture(&self) -> Result<()> {
        Err(Error::backend(self.name(), "begin_capture: this backend does not capture graphs"))
    }
    /// Ends the recording [`Device::begin_capture`] started, whether or not its ops succeeded
    /// (a failed op leaves the capture to be ended here, and this then fails), and returns the
    /// recorded graph for [`Device::replay`].
    fn end_capture(&self) -> Result<GraphId> {
        Err(Error::backend(self.name(), "end_capture: this backend does not capture graphs"))
    }
    /// Queues the ops `graph` recorded again, on the buffers' current contents. A replay counts
    /// its kernels in [`Device::launch_count`].
    fn replay(&self, graph: GraphId) -> Result<()> {
        Err(Error::backend(self.name(), format!("replay: this backend does not capture graphs ({graph:?})")))
    }

    /// Returns once every op queued so far has run (a backend that runs ops as they are called
    /// has nothing to wait for). The model calls it after a forward that reads nothing back, so
    /// that at most one step of work is ever ahead of the host and an abort frees the device
    /// within one step.
    fn sync(&self) -> Result<()> {
        Ok(())
    }
}

/// Buffers: allocation, uploads and read-backs, and the element types the backend stores.
pub trait Storage: Device {
    /// A device buffer. Its dtype and length are fixed at creation.
    type Buf: Send + 'static;

    /// The element type a matmul rounds its activation operand `x` to before it meets weights
    /// stored as `weight` (round to nearest even); f32, the default, is no rounding. The CUDA
    /// backend's tensor cores take 16-bit operands, so it rounds x to bf16 or f16 with such
    /// weights: the whole-model compare sets its limits by this (and by the KV element type).
    fn matmul_operand(&self, _weight: DType) -> DType {
        DType::F32
    }

    /// The element type this backend stores an activation in when every matmul that reads it
    /// has weights of type `weight` (the norms' outputs, the MLP activation, the final norm's
    /// rows): f32, the default, or [`Storage::matmul_operand`]'s 16-bit type, where storing the
    /// value already rounded gives the matmul the bits it would have formed from the f32 one
    /// (so the choice changes bytes moved, never a token). The ops that write such a buffer
    /// (`rms_norm`, `add_rms_norm`, `silu_mul`, `gelu_tanh_mul`, `gate_up_act`, `matmul_residual`'s hg) store
    /// into it rounded to nearest even, and the matmuls read it as it is; a 16-bit activation
    /// buffer is only ever written by those ops and read by matmuls.
    fn activation_dtype(&self, _weight: DType) -> DType {
        DType::F32
    }
    /// An activation buffer of `len` elements of `dtype` (contents unspecified): f32 is
    /// [`Storage::alloc_f32`]; another type only where [`Storage::activation_dtype`] gives it.
    fn alloc_activation(&self, dtype: DType, len: usize) -> Result<Self::Buf> {
        match dtype {
            DType::F32 => self.alloc_f32(len),
            other => Err(Error::backend(
                self.name(),
                format!("alloc_activation: this backend stores activations in f32, not {other:?}"),
            )),
        }
    }

    /// Makes a weight tensor available to the backend (keeps its dtype).
    fn upload_weight(&self, t: &TensorView) -> Result<Self::Buf>;
    /// A weight-like buffer from host f32 values stored as `dtype` (tests and generated tables).
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<Self::Buf>;
    /// An f32 activation buffer of `len` elements (contents unspecified).
    fn alloc_f32(&self, len: usize) -> Result<Self::Buf>;
    /// A u32 buffer of `len` elements (contents unspecified).
    fn alloc_u32(&self, len: usize) -> Result<Self::Buf>;
    /// The u32 buffers of `layout`, uploaded together from one host staging buffer (a step's
    /// metadata: model.rs `upload`). A backend may carve them out of one device allocation and
    /// stage them in memory of its own, so that one copy writes them all (CUDA: page-locked
    /// memory, one asynchronous copy). The default: a buffer per region, staged in a host Vec
    /// and written region by region ([`Storage::write_u32`]).
    fn alloc_u32_group(&self, layout: &U32Layout) -> Result<U32Group<Self::Buf>> {
        let parts = (0..layout.regions()).map(|i| self.alloc_u32(layout.len(i))).collect::<Result<Vec<_>>>()?;
        Ok(U32Group::separate(layout.clone(), parts))
    }
    /// The host staging memory of `group`, `layout.total()` elements in its layout, holding
    /// what the host left there before the last upload (so a host may rewrite only what
    /// changed). Where the backend copies asynchronously, this waits until the last upload's
    /// copy has read it.
    fn u32_staging<'a>(&self, group: &'a mut U32Group<Self::Buf>) -> Result<&'a mut [u32]> {
        if group.carved.is_some() {
            return Err(Error::backend(
                self.name(),
                "u32_staging: this group was carved by a backend that does not stage it",
            ));
        }
        Ok(&mut group.host)
    }
    /// Copies the first `used[i]` staged elements of every region `i` to the start of
    /// `group.parts[i]` (a count beyond a region is an error, and nothing is copied). The
    /// default writes each region that has any; a backend that carved the group copies the
    /// span [`U32Layout::span`] covers at once, so a region's elements past `used[i]` (before
    /// the last region used) may be copied too, as the staging memory holds them: nothing
    /// reads them.
    fn upload_u32_group(&self, group: &mut U32Group<Self::Buf>, used: &[usize]) -> Result<()> {
        group.layout.span(used)?;
        if group.carved.is_some() {
            return Err(Error::backend(
                self.name(),
                "upload_u32_group: this group was carved by a backend that does not upload it",
            ));
        }
        for (i, &n) in used.iter().enumerate() {
            if n > 0 {
                let o = group.layout.offset(i);
                self.write_u32(&mut group.parts[i], &group.host[o..o + n])?;
            }
        }
        Ok(())
    }
    /// The KV element types this backend stores, its default first (what `auto` picks).
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        &[KvDtype::F32]
    }
    /// One layer's K or V cache buffer for `geometry` in the backend's default KV element type,
    /// `kv_dtypes()[0]` (contents unspecified).
    fn alloc_kv(&self, geometry: KvGeometry) -> Result<Self::Buf>;
    /// As [`Storage::alloc_kv`], in `dtype`; a type not in [`Storage::kv_dtypes`] is an error.
    /// The buffer knows its type: every op that touches the cache follows it.
    fn alloc_kv_as(&self, geometry: KvGeometry, dtype: KvDtype) -> Result<Self::Buf> {
        if self.kv_dtypes().first() == Some(&dtype) {
            return self.alloc_kv(geometry);
        }
        Err(Error::backend(
            self.name(),
            format!(
                "alloc_kv: a {} KV cache is not supported here (this backend stores {})",
                dtype.name(),
                kv_dtype_names(self.kv_dtypes())
            ),
        ))
    }

    /// As [`Storage::alloc_kv_as`] for an fp8 `dtype` whose values are stored divided by
    /// `scale` and read back times it (a checkpoint's per-layer `k_scale` / `v_scale`,
    /// [`crate::kv_scales`]; `fp8_round::quantize` / `dequantize`). `scale` is positive, finite
    /// and normal. The default takes only 1.0 (a backend that stores no scale).
    fn alloc_kv_scaled(&self, geometry: KvGeometry, dtype: KvDtype, scale: f32) -> Result<Self::Buf> {
        if scale == 1.0 {
            return self.alloc_kv_as(geometry, dtype);
        }
        Err(Error::backend(
            self.name(),
            format!("alloc_kv: a {} KV cache with a scale of {scale} is not supported here", dtype.name()),
        ))
    }

    /// Host to device; `data.len()` may be shorter than the buffer.
    fn write_f32(&self, buf: &mut Self::Buf, data: &[f32]) -> Result<()>;
    fn write_u32(&self, buf: &mut Self::Buf, data: &[u32]) -> Result<()>;
    /// Device to host: waits for all queued work, returns the first `len` elements.
    fn read_f32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<f32>>;
    fn read_u32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<u32>>;
    /// Reads a KV buffer back as f32, whatever it stores (tests compare caches across backends).
    fn read_kv(&self, buf: &Self::Buf, geometry: KvGeometry) -> Result<Vec<f32>>;
}

/// The op families every backend implements.
pub trait Ops: Storage {
    /// `out[t, :] = table[ids[t], :]`; table `[vocab, hidden]` (weight dtype), ids u32 `[T]`.
    fn embedding(
        &self,
        table: &Self::Buf,
        ids: &Self::Buf,
        out: &mut Self::Buf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()>;
    /// `out[i, :] = src[rows[i], :]`; f32 `[_, dim]`, rows u32 `[n]`.
    fn gather_rows(&self, src: &Self::Buf, rows: &Self::Buf, out: &mut Self::Buf, n: usize, dim: usize) -> Result<()>;
    /// `out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w`; x f32 `[rows, dim]`, w weight
    /// `[dim]`, out `[rows, dim]` f32 or of [`Storage::activation_dtype`] (stored rounded).
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()>;
    /// `acc += x`, elementwise over `len` f32 values (the residual add).
    fn add(&self, acc: &mut Self::Buf, x: &Self::Buf, len: usize) -> Result<()>;
    /// `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])`; x `[m, k]` f32 or of
    /// [`Storage::activation_dtype`] for w's type, w weight `[n, k]`, bias weight `[n]`, out f32.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
        out: &mut Self::Buf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()>;
    /// Rotary embedding in place, HF "rotate half" layout: dimension `i` pairs with `i + head_dim/2`.
    /// q f32 `[T, q_heads, head_dim]`, k f32 `[T, kv_heads, head_dim]`, positions u32 `[T]`,
    /// inv_freq f32 `[head_dim/2]`; angle = position · `inv_freq[i]`.
    #[allow(clippy::too_many_arguments)]
    fn rope(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        positions: &Self::Buf,
        inv_freq: &Self::Buf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// `out = silu(gate) * up`, elementwise over `len` values; gate, up f32, out f32 or of
    /// [`Storage::activation_dtype`] (stored rounded).
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()>;
    /// `out = gelu_tanh(gate) * up` (GeGLU: Gemma's MLP), elementwise over `len` values, with
    /// PyTorch's `gelu(approximate="tanh")`: `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))`;
    /// types as [`Ops::silu_mul`]'s.
    fn gelu_tanh_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()>;
    /// `x *= factor`, elementwise over `len` f32 values (Gemma's scaled embedding).
    fn scale(&self, x: &mut Self::Buf, factor: f32, len: usize) -> Result<()>;
    /// Writes k, v f32 `[T, kv_heads, head_dim]` into the caches at `slots` u32 `[T]`.
    #[allow(clippy::too_many_arguments)]
    fn kv_write(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        k_cache: &mut Self::Buf,
        v_cache: &mut Self::Buf,
        slots: &Self::Buf,
        num_tokens: usize,
        geometry: KvGeometry,
    ) -> Result<()>;
    /// A mixture of experts' routing: router logits f32 `[rows, experts]` to dense routing
    /// weights f32 `[rows, experts]`, as HF transformers' Mixtral and Qwen3-MoE route: a softmax
    /// over every expert, the `top_k` largest probabilities kept (the lower index first on
    /// ties), every other weight 0; with `renormalize`, the kept ones divided by their sum
    /// (summed from the largest down). See [`moe_route_rows`], the arithmetic every backend
    /// repeats. The default runs that on the host (a read and a write of the buffers).
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        logits: &Self::Buf,
        weights: &mut Self::Buf,
        rows: usize,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        let l = self.read_f32(logits, rows * experts)?;
        let mut w = vec![0.0; rows * experts];
        moe_route_rows(&l, &mut w, experts, top_k, renormalize);
        self.write_f32(weights, &w)
    }
    /// One expert's share of a mixture of experts, added in expert order: `acc[r, :] =
    /// weights[r, expert] · y[r, :]` when `first` (expert 0), else `acc[r, :] += weights[r,
    /// expert] · y[r, :]`; acc, y f32 `[rows, dim]`, weights f32 `[rows, experts]`. A row's
    /// result depends on its own values only (batch invariance), and adding every expert, a
    /// weight of 0 included, keeps the sum in a fixed order. The default runs on the host.
    #[allow(clippy::too_many_arguments)]
    fn moe_accumulate(
        &self,
        acc: &mut Self::Buf,
        y: &Self::Buf,
        weights: &Self::Buf,
        rows: usize,
        dim: usize,
        expert: usize,
        experts: usize,
        first: bool,
    ) -> Result<()> {
        let w = self.read_f32(weights, rows * experts)?;
        let yv = self.read_f32(y, rows * dim)?;
        let mut a = if first { vec![0.0; rows * dim] } else { self.read_f32(acc, rows * dim)? };
        moe_accumulate_rows(&mut a, &yv, &w, dim, expert, experts, first);
        self.write_f32(acc, &a)
    }
    /// Each row's LoRA update added to y f32 `[rows, out]`, from the row's slot of the stacked
    /// factors ([`crate::lora::segmented`]); `shrink` is f32 scratch `[rows, max_rank]`
    /// (contents after unspecified). The default reads back and runs the host loop.
    fn lora(&self, args: &LoraArgs<'_, Self::Buf>, shrink: &mut Self::Buf, y: &mut Self::Buf) -> Result<()> {
        let _ = shrink;
        crate::lora::segmented::check(args, "lora")?;
        if args.rows == 0 || args.out == 0 {
            return Ok(());
        }
        let (l, r) = (args.max_loras, args.max_rank);
        let x = self.read_f32(args.x, args.rows * args.inp)?;
        let a = self.read_f32(args.a, l * r * args.inp)?;
        let b = self.read_f32(args.b, l * args.out * r)?;
        let slots = self.read_u32(args.slots, args.rows)?;
        let scales = self.read_f32(args.scales, l)?;
        let mut yv = self.read_f32(y, args.rows * args.out)?;
        lora_rows(&x, args.operand, &a, &b, &slots, &scales, &mut yv, (args.inp, args.out, r));
        self.write_f32(y, &yv)
    }
    /// Paged attention; out f32 `[T, num_heads, head_dim]`. See [`AttnArgs`].
    fn paged_attention(&self, args: &AttnArgs<'_, Self>, out: &mut Self::Buf) -> Result<()>;
}

/// Fused and model-specific ops. Each has a default composed from [`Ops`] (or one that says the
/// backend does not fuse, where a companion method gives the model nothing to fuse with), which a
/// backend overrides where it has a faster kernel.
pub trait FusedOps: Ops {
    /// The residual add and the norm after it in one op: `acc += x`, then
    /// `out = rms_norm(acc) * w`; acc, x f32 `[rows, dim]`, out as [`Ops::rms_norm`]'s,
    /// w weight `[dim]`. The default
    /// calls [`Ops::add`] then [`Ops::rms_norm`]; a backend may fuse them (one pass,
    /// one launch fewer per residual).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(
        &self,
        acc: &mut Self::Buf,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        add_then_rms_norm(self, acc, x, w, out, rows, dim, eps)
    }
    /// The q, k and v projections (`[nq, hidden]`, `[nkv, hidden]` twice) as one weight for
    /// [`FusedOps::qkv_proj`], and their biases (when given) as one bias; `None`, the default,
    /// when this backend does not fuse them (the model then runs three matmuls). A backend fuses
    /// to launch one kernel where there were three (vLLM's merged QKV projection).
    fn fuse_qkv(
        &self,
        _q: &TensorView,
        _k: &TensorView,
        _v: &TensorView,
        _bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<WeightAndBias<Self::Buf>>> {
        Ok(None)
    }
    /// `q = x Wq^T (+ bq)`, `k = x Wk^T (+ bk)`, `v = x Wv^T (+ bv)` with the weight and bias
    /// from [`FusedOps::fuse_qkv`]; x f32 `[m, hidden]`, q `[m, nq]`, k and v `[m, nkv]`.
    /// With `norm` (only where [`FusedOps::fuses_norm`]), x is `h ∘ gamma`: see [`NormIn`].
    #[allow(clippy::too_many_arguments)]
    fn qkv_proj(
        &self,
        _x: &Self::Buf,
        _w: &Self::Buf,
        _bias: Option<&Self::Buf>,
        _q: &mut Self::Buf,
        _k: &mut Self::Buf,
        _v: &mut Self::Buf,
        _m: usize,
        _nq: usize,
        _nkv: usize,
        _hidden: usize,
        _norm: Option<NormIn<'_, Self::Buf>>,
    ) -> Result<()> {
        Err(Error::backend(
            self.name(),
            "qkv_proj: this backend does not fuse the q, k, v projections (fuse_qkv gave none)",
        ))
    }
    /// The gate and up projections (`[inter, hidden]` each) as one weight for
    /// [`FusedOps::gate_up_act`]; `None`, the default, when this backend does not fuse them.
    fn fuse_gate_up(&self, _gate: &TensorView, _up: &TensorView) -> Result<Option<Self::Buf>> {
        Ok(None)
    }
    /// `out = act(x Wg^T) * (x Wu^T)` with the weight from [`FusedOps::fuse_gate_up`]: the two
    /// projections and the activation in one op, the activation's formula that of
    /// [`Ops::silu_mul`] (`Activation::Silu`) or [`Ops::gelu_tanh_mul`]
    /// (`Activation::GeluTanh`); x `[m, hidden]` as [`Ops::matmul`]'s, out `[m, inter]` f32
    /// or of [`Storage::activation_dtype`] (stored rounded).
    /// With `norm` (only where [`FusedOps::fuses_norm`]), x is `h ∘ gamma`: see [`NormIn`].
    #[allow(clippy::too_many_arguments)]
    fn gate_up_act(
        &self,
        _act: Activation,
        _x: &Self::Buf,
        _w: &Self::Buf,
        _out: &mut Self::Buf,
        _m: usize,
        _inter: usize,
        _hidden: usize,
        _norm: Option<NormIn<'_, Self::Buf>>,
    ) -> Result<()> {
        Err(Error::backend(
            self.name(),
            "gate_up_act: this backend does not fuse the gate and up projections (fuse_gate_up gave none)",
        ))
    }
    /// Whether this backend fuses the residual adds and RMS norms into the projections
    /// ([`FusedOps::matmul_residual`], and the `norm` of [`FusedOps::qkv_proj`] and
    /// [`FusedOps::gate_up_act`]) for a forward pass of `tokens` tokens at this hidden size. The
    /// default is no: the model then runs `add_rms_norm` between them. Fused, a layer launches
    /// two ops fewer, but each projection block recomputes its rows' norm, which pays only for
    /// few rows (wgpu: decode steps of one or two tokens).
    fn fuses_norm(&self, _hidden: usize, _tokens: usize) -> bool {
        false
    }
    /// The residual add fused into a projection: `h[m, n] += Σ_k x[m, k] · w[n, k]`; with
    /// `next_norm = Some((gamma, hg))` also `hg = h ∘ gamma` (the next norm's input, see
    /// [`NormIn`]). x `[m, k]` as [`Ops::matmul`]'s, w weight `[n, k]`, h f32 `[m, n]`, hg
    /// `[m, n]` f32 or of [`Storage::activation_dtype`], gamma weight `[n]`.
    /// Only where [`FusedOps::fuses_norm`].
    #[allow(clippy::too_many_arguments)]
    fn matmul_residual(
        &self,
        _x: &Self::Buf,
        _w: &Self::Buf,
        _h: &mut Self::Buf,
        _next_norm: Option<(&Self::Buf, &mut Self::Buf)>,
        _m: usize,
        _n: usize,
        _k: usize,
    ) -> Result<()> {
        Err(Error::backend(
            self.name(),
            "matmul_residual: this backend does not fuse residual adds (fuses_norm is false)",
        ))
    }
    /// [`qkv_proj`](FusedOps::qkv_proj) then [`rope_kv_write`](FusedOps::rope_kv_write): the
    /// attention's input projection, rope, and the KV-cache write. Afterwards q holds the
    /// rotated queries; k and v are scratch (a backend that fuses all of it into the projection's
    /// epilogue, as wgpu does where each head's rows fit one lane, never writes them). The
    /// default runs the two ops.
    #[allow(clippy::too_many_arguments)]
    fn qkv_rope_kv_write(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &mut Self::Buf,
        m: usize,
        nq: usize,
        hidden: usize,
        norm: Option<NormIn<'_, Self::Buf>>,
        kv: KvDest<'_, Self::Buf>,
    ) -> Result<()> {
        let g = kv.geometry;
        if g.head_dim == 0 || !nq.is_multiple_of(g.head_dim) {
            return Err(Error::backend(
                self.name(),
                format!("qkv_rope_kv_write: nq {nq} is not a multiple of head_dim {}", g.head_dim),
            ));
        }
        self.qkv_proj(x, w, bias, q, k, v, m, nq, g.num_kv_heads * g.head_dim, hidden, norm)?;
        self.rope_kv_write(q, k, v, kv.k_cache, kv.v_cache, kv.positions, kv.inv_freq, kv.slots, m, nq / g.head_dim, g)
    }
    /// [`rope`](Ops::rope) then [`kv_write`](Ops::kv_write) in one step: q rotated in
    /// place, k rotated and written with v into the caches at `slots`. Afterwards k holds either
    /// the rotated or the original values (a fused kernel need not write it back), so read K
    /// from the cache. The default runs the two ops; a backend that fuses them saves a launch
    /// per layer (wgpu: one dispatch instead of two).
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        k_cache: &mut Self::Buf,
        v_cache: &mut Self::Buf,
        positions: &Self::Buf,
        inv_freq: &Self::Buf,
        slots: &Self::Buf,
        num_tokens: usize,
        q_heads: usize,
        geometry: KvGeometry,
    ) -> Result<()> {
        self.rope(q, k, positions, inv_freq, num_tokens, q_heads, geometry.num_kv_heads, geometry.head_dim)?;
        self.kv_write(k, v, k_cache, v_cache, slots, num_tokens, geometry)
    }
    /// A backend that can run each expert over only the tokens routed to it (CUDA,
    /// `TANDEM_CUDA_MOE=routed`) returns what [`FusedOps::moe_routed`] needs besides the weights
    /// (CUDA: a device table of the experts' weight pointers), made once at load; None (the
    /// default): the model runs every expert over every token ([`Ops::moe_accumulate`]).
    fn moe_prepare(
        &self,
        _experts: &[MoeExpert<'_, Self::Buf>],
        _hidden: usize,
        _inter: usize,
    ) -> Result<Option<Self::Buf>> {
        Ok(None)
    }
    /// The routed mixture of experts: `out` f32 `[rows, hidden]` = for each token, over its
    /// experts (the non-zero routing `weights` f32 `[rows, experts]` of [`Ops::moe_route`])
    /// in ascending expert id, weight · down(silu(gate(x)) · up(x)), the first term stored and
    /// the others added; x is the normed input (`ActDtypes::x`). A token's bits depend on its
    /// own values only, and must be those of the every-expert path but for the sign of an
    /// exact zero. `table` is [`FusedOps::moe_prepare`]'s.
    #[allow(clippy::too_many_arguments)]
    fn moe_routed(
        &self,
        _table: &Self::Buf,
        _experts: &[MoeExpert<'_, Self::Buf>],
        _x: &Self::Buf,
        _weights: &Self::Buf,
        _out: &mut Self::Buf,
        _rows: usize,
        _hidden: usize,
        _inter: usize,
        _top_k: usize,
    ) -> Result<()> {
        Err(Error::backend(self.name(), "moe_routed: this backend runs every expert (moe_prepare gave no table)"))
    }
}

/// Turning logits into tokens. The defaults read the logits back and sample on the host.
pub trait Sampling: Storage {
    /// Index of the largest value in each row of logits f32 `[rows, vocab]` (lowest index on ties).
    fn argmax(&self, logits: &Self::Buf, rows: usize, vocab: usize) -> Result<Vec<u32>> {
        let v = self.read_f32(logits, rows * vocab)?;
        Ok(v.chunks_exact(vocab).map(argmax_row).collect())
    }
    /// One token id per row of logits f32 `[rows, vocab]`, row `r` turned into a token by
    /// `specs[r]` exactly as [`crate::sampling::sample_row`] defines it (a backend's kernel
    /// must give the same ids bit for bit). The default: [`Sampling::argmax`] when every row is
    /// greedy (the device argmax where a backend has one), else the logits read back and
    /// sampled on the host.
    fn sample(&self, logits: &Self::Buf, rows: usize, vocab: usize, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        if specs.len() != rows {
            return Err(Error::backend(self.name(), format!("sample: {} specs for {rows} rows", specs.len())));
        }
        if specs.iter().all(SampleSpec::is_greedy) {
            return self.argmax(logits, rows, vocab);
        }
        let v = self.read_f32(logits, rows * vocab)?;
        Ok(v.chunks_exact(vocab.max(1)).zip(specs).map(|(row, s)| sample_row(row, s)).collect())
    }
    /// As [`Sampling::sample`], row `r` edited by its [`crate::sampling::LogitEdit`]s and then
    /// read with the tokens its mask forbids at -inf (see [`RowMasks`]): the ids of
    /// [`crate::sampling::sample_rows_masked`]. The logits' contents are unspecified afterwards
    /// (a device applies the edits in place). The default reads the logits back and samples on
    /// the host; a backend with a sampling kernel uploads the masks and edits.
    fn sample_masked(
        &self,
        logits: &Self::Buf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
    ) -> Result<Vec<u32>> {
        if masks.is_empty() {
            return self.sample(logits, rows, vocab, specs);
        }
        masks.check(rows, vocab).map_err(|m| Error::backend(self.name(), format!("sample_masked: {m}")))?;
        if specs.len() != rows {
            return Err(Error::backend(self.name(), format!("sample_masked: {} specs for {rows} rows", specs.len())));
        }
        let v = self.read_f32(logits, rows * vocab)?;
        Ok(sample_rows_masked(&v, vocab, specs, masks))
    }
    /// As [`Sampling::sample_masked`], and for each row with `top_n[r] = Some(n)` the sampled
    /// token's logprob and the `n` (at most [`crate::sampling::MAX_TOP_LOGPROBS`]) most likely
    /// tokens of the raw logits, before any edit: [`crate::sampling::logprobs_row`], bit for
    /// bit, so that only ids and those values leave the device. The default reads the logits
    /// back and computes both on the host.
    fn sample_logprobs(
        &self,
        logits: &Self::Buf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        if top_n.len() != rows || specs.len() != rows {
            return Err(Error::backend(
                self.name(),
                format!("sample_logprobs: {} specs and {} logprob counts for {rows} rows", specs.len(), top_n.len()),
            ));
        }
        if !masks.index.is_empty() || !masks.edits.is_empty() {
            masks.check(rows, vocab).map_err(|m| Error::backend(self.name(), format!("sample_logprobs: {m}")))?;
        }
        let v = self.read_f32(logits, rows * vocab)?;
        let ids = sample_rows_masked(&v, vocab, specs, masks);
        let lps = logprobs_rows(&v, vocab, &ids, top_n);
        Ok((ids, lps))
    }
}

/// A compute backend: the five groups together. Every method that can fail returns an error
/// instead of panicking. Implemented for every type that implements the five, so `B: Backend`
/// bounds and `B::Buf` work as one trait; code that calls methods on a concrete backend type
/// imports the groups with `use tandem_core::backend::prelude::*`.
pub trait Backend: Device + Storage + Ops + FusedOps + Sampling + Send + 'static {}

impl<T: Device + Storage + Ops + FusedOps + Sampling + Send + 'static> Backend for T {}

/// The five groups of [`Backend`], for code that calls their methods on a concrete type.
pub mod prelude {
    pub use super::{Backend, Device, FusedOps, Ops, Sampling, Storage};
}

/// Index of the largest value: lowest index on ties; NaN never wins (a row of only NaN gives
/// the last index, as the device kernels do). Max over 8 lanes first so the scan vectorizes:
/// at 256 rows of a 49k vocabulary this is the host's whole sampling cost.
pub fn argmax_row(row: &[f32]) -> u32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] = if c[i] > lanes[i] { c[i] } else { lanes[i] };
        }
    }
    let max = tail.iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if max == f32::NEG_INFINITY {
        // Every value is -inf or NaN: the first that is not NaN.
        return row.iter().position(|x| !x.is_nan()).unwrap_or(row.len().saturating_sub(1)) as u32;
    }
    row.iter().position(|&x| x == max).unwrap_or(0) as u32
}

/// PyTorch's `gelu(x, approximate="tanh")` in f32, the order of its CPU kernel:
/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`. The reference's [`Ops::gelu_tanh_mul`].
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// [`Ops::moe_route`] on the host, row by row: `logits` and `out` `[rows, experts]`.
/// In f32: m = the row's max, e_i = exp(l_i - m), s = Σ e_i in index order, p_i = e_i / s;
/// then `top_k` times the largest p not yet taken (lowest index on ties), its weight p (or,
/// with `renormalize`, p / Σ of the taken p, summed in the order taken).
pub fn moe_route_rows(logits: &[f32], out: &mut [f32], experts: usize, top_k: usize, renormalize: bool) {
    for (l, o) in logits.chunks_exact(experts).zip(out.chunks_exact_mut(experts)) {
        let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0f32;
        for &x in l {
            s += (x - m).exp();
        }
        let p = |i: usize| (l[i] - m).exp() / s;
        o.fill(-1.0);
        let mut sum = 0.0f32;
        for _ in 0..top_k.min(experts) {
            let mut best = usize::MAX;
            for (i, &w) in o.iter().enumerate() {
                if w < 0.0 && (best == usize::MAX || p(i) > p(best)) {
                    best = i;
                }
            }
            o[best] = p(best);
            sum += o[best];
        }
        for v in o.iter_mut() {
            *v = if *v < 0.0 {
                0.0
            } else if renormalize {
                *v / sum
            } else {
                *v
            };
        }
    }
}

/// [`Ops::moe_accumulate`] on the host: `acc` and `y` `[rows, dim]`, `weights` `[rows, experts]`.
pub fn moe_accumulate_rows(
    acc: &mut [f32],
    y: &[f32],
    weights: &[f32],
    dim: usize,
    expert: usize,
    experts: usize,
    first: bool,
) {
    for (r, (a, yr)) in acc.chunks_exact_mut(dim).zip(y.chunks_exact(dim)).enumerate() {
        let w = weights[r * experts + expert];
        for (a, &y) in a.iter_mut().zip(yr) {
            *a = if first { w * y } else { *a + w * y };
        }
    }
}

/// `f32` or `bf16, f32`: the KV element types a backend lists, for messages.
pub fn kv_dtype_names(d: &[KvDtype]) -> String {
    d.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}

/// [`FusedOps::add_rms_norm`] as two ops: the trait's default, and the path a backend that fuses
/// it takes for shapes its fused kernel does not cover.
#[allow(clippy::too_many_arguments)]
pub fn add_then_rms_norm<B: Ops + ?Sized>(
    b: &B,
    acc: &mut B::Buf,
    x: &B::Buf,
    w: &B::Buf,
    out: &mut B::Buf,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    b.add(acc, x, rows * dim)?;
    b.rms_norm(acc, w, out, rows, dim, eps)
}

#[cfg(test)]
mod tests {
    use super::argmax_row;

    /// The plain definition, element by element.
    fn naive(row: &[f32]) -> u32 {
        let mut best = 0usize;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] || row[best].is_nan() {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn argmax_matches_the_plain_definition() {
        let mut state = 7u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            state >> 33
        };
        for len in [1usize, 7, 8, 9, 64, 1000] {
            for _ in 0..50 {
                let mut row: Vec<f32> = (0..len).map(|_| (next() % 5) as f32 - 2.0).collect();
                if next() % 3 == 0 {
                    let i = (next() % len as u64) as usize;
                    row[i] = f32::NAN;
                }
                assert_eq!(argmax_row(&row), naive(&row), "{row:?}");
            }
        }
        assert_eq!(argmax_row(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax_row(&[f32::NAN, f32::NAN]), 1);
        assert_eq!(argmax_row(&[1.0, f32::NAN, 3.0, 3.0]), 2);
    }
}
