//! [`CudaBackend`]: `tandem_core::Backend` on one NVIDIA GPU through cudarc.
//!
//! Start-up: is libcuda there (else a clear error, never a panic), is libnvrtc there, create
//! the context, compile every kernel file with NVRTC for the device's compute capability
//! (PTX cached on disk), load the modules and resolve every kernel handle once (`Kernels`).
//! Each op checks its buffers' kinds and lengths on the host, then enqueues kernels on one
//! stream of our own (not the legacy NULL stream); nothing waits until a read. With
//! `TANDEM_CUDA_SYNC=1` every launch is followed by a synchronize, so an asynchronous fault is
//! reported against the kernel that caused it.
//!
//! The KV cache is bf16 by default, f32 on request (`LoadOptions::kv_dtype`; see
//! kernels/kv_write.cu): a cache buffer records its element kind, and kv_write and attention
//! pick their kernel by it. Buffers are untyped device bytes with a recorded element kind, so
//! one buffer type serves activations, ids, weights of any dtype and KV caches.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DriverError, LaunchConfig, PinnedHostSlice,
    PushKernelArg,
};
use tandem_core::backend::{
    AttnArgs, DType, Device, FusedOps, KvDtype, KvGeometry, Ops, Sampling, Storage, U32Group, U32Layout,
    WorkspaceLimits,
};
use tandem_core::sampling::{
    RowMasks, SampleSpec, TokenLogprobs, EDIT_WORDS, MAX_TOP_LOGPROBS, SAMPLE_LANES, SPEC_WORDS,
};
use tandem_core::weights::TensorView;
use tandem_core::{Error, Result};

use crate::compile::{compile_cubin_cached, compile_ptx_cached, ptx_entries};
use crate::sources::{self, KernelSource};
use crate::toolchain::Toolchain;

#[path = "attention.rs"]
mod attention;
#[path = "graph.rs"]
mod graph;
#[path = "launch.rs"]
mod launch;
#[path = "matmul.rs"]
mod matmul;
#[path = "moe.rs"]
mod moe;
#[path = "sampling.rs"]
mod sampling;
#[cfg(test)]
use matmul::gemm_kernel;
use matmul::{GemmOut, GEMM_COUNTERS, GEMM_PART_FLOATS};

/// The message when no driver is present; tests assert it.
pub const NO_DRIVER: &str = "no CUDA driver found (libcuda.so); use --backend wgpu or --backend reference";

fn err(msg: impl Into<String>) -> Error {
    Error::backend("cuda", msg)
}

fn drv(what: &str) -> impl Fn(DriverError) -> Error + '_ {
    move |e| driver_error(what, e.0, &format!("{e:?}"))
}

/// Driver results after which the context is unusable: every later call on it fails (or, for
/// memory the fault corrupted, returns garbage) until the process exits. CUDA documents these
/// as "the context cannot be used ... all existing device memory allocations are invalid";
/// CUDA_ERROR_UNKNOWN is counted with them because after a kernel nothing proves the context
/// sound, and serving from it would risk wrong tokens rather than an error.
fn is_sticky(code: CUresult) -> bool {
    use CUresult::*;
    matches!(
        code,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_ECC_UNCORRECTABLE
            | CUDA_ERROR_NVLINK_UNCORRECTABLE
            | CUDA_ERROR_CONTEXT_IS_DESTROYED
            | CUDA_ERROR_DEVICE_UNAVAILABLE
            | CUDA_ERROR_DEINITIALIZED
            | CUDA_ERROR_EXTERNAL_DEVICE
            | CUDA_ERROR_UNKNOWN
    )
}

/// Our error for a failed driver call `what` (the op and, for a launch, the kernel). A sticky
/// code is [`Error::DeviceLost`], so the engine stops instead of serving from a dead context;
/// without TANDEM_CUDA_SYNC=1 an asynchronous fault surfaces at a later call (often the copy
/// to host), so the message says how to pin it to the kernel that raised it.
fn driver_error(what: &str, code: CUresult, detail: &str) -> Error {
    if is_sticky(code) {
        Error::device_lost("cuda", format!("{what}: {detail} ({code:?}); the CUDA context is unusable, restart the server (TANDEM_CUDA_SYNC=1 reports a fault against the kernel that raised it)"))
    } else {
        err(format!("{what}: {detail}"))
    }
}

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    U32,
    BF16,
    F16,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::U32 => 4,
            Elem::BF16 | Elem::F16 => 2,
        }
    }
    fn of(d: DType) -> Elem {
        match d {
            DType::F32 => Elem::F32,
            DType::BF16 => Elem::BF16,
            DType::F16 => Elem::F16,
        }
    }
    /// The `bias_dtype` code of kernels/common.cuh `load_bias`.
    fn bias_code(self) -> i32 {
        match self {
            Elem::F32 => 1,
            Elem::BF16 => 2,
            Elem::F16 => 3,
            Elem::U32 => 0,
        }
    }
}

/// A device buffer: `len` elements of `elem`, in an allocation of its own or a view into one
/// shared with other buffers (the regions of a [`U32Group`]: the step's metadata). Ops see no
/// difference: a view's `mem` is a `CudaSlice` whose pointer is the allocation's plus the
/// view's offset, which is also what a captured graph records.
pub struct CudaBuf {
    /// The memory ops pass to kernels. Owned (freed on drop) unless `base` is Some: then it
    /// was made over the view's bytes by `upgrade_device_ptr` and is leaked, never freed.
    mem: ManuallyDrop<CudaSlice<u8>>,
    elem: Elem,
    len: usize,
    /// A view's allocation, alive as long as any view of it is.
    base: Option<Arc<CudaSlice<u8>>>,
    /// A carved group's whole buffer ([`U32Group::carved`]): its page-locked staging memory.
    staging: Option<Box<Staging>>,
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        // SAFETY: `mem` is not touched again; `drop` runs once.
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        match self.base {
            // The allocation belongs to `base` (dropped after this, with the last view).
            Some(_) => {
                mem.leak();
            }
            None => drop(mem),
        }
    }
}

/// The host side of a carved [`U32Group`]: page-locked memory in the group's layout, and the
/// event recorded after the copy that last read it.
///
/// One buffer and an event, not two buffers alternated. The copy is the first thing a step
/// queues, so when the host prepares the next step while this one runs (async scheduling,
/// worker.rs) the wait in `u32_staging` is at most the tail of that copy (the step's metadata,
/// a few hundred KB for a padded decode step at bucket 256), never a step; and today a forward
/// returns only once its work has run, so the wait finds the copy done. Two buffers would also
/// break what the model relies on: the staging memory holds what the last step wrote there
/// (meta.rs `MetaStaging` skips block-table entries that already hold the scratch block).
struct Staging {
    host: PinnedHostSlice<u32>,
    copied: CudaEvent,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The copy may still read the page-locked memory `host` frees after this.
        let _ = self.copied.synchronize();
    }
}

impl CudaBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn elem(&self) -> Elem {
        self.elem
    }
}

/// Checks that `b` holds `elem` and at least `need` elements; `what` names the argument.
fn need(b: &CudaBuf, elem: Elem, need: usize, op: &str, what: &str) -> Result<()> {
    if b.elem != elem {
        return Err(err(format!("{op}: `{what}` holds {:?}, expected {elem:?}", b.elem)));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(())
}

/// An activation output (f32, bf16 or f16: [`Storage::activation_dtype`]) of at least `need`
/// elements; returns kernels/common.cuh `store_act`'s code for it.
pub(crate) fn need_act(b: &CudaBuf, need: usize, op: &str, what: &str) -> Result<i32> {
    if b.elem == Elem::U32 {
        return Err(err(format!("{op}: `{what}` holds u32, expected an activation (f32, bf16 or f16)")));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(b.elem.bias_code())
}

/// A weight buffer (f32, bf16 or f16) with at least `need` elements; returns its
/// [`weight_index`].
fn need_weight(b: &CudaBuf, need: usize, op: &str, what: &str) -> Result<usize> {
    if b.elem == Elem::U32 {
        return Err(err(format!("{op}: `{what}` holds u32, expected a weight (f32, bf16 or f16)")));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(weight_index(b.elem))
}

/// Both caches of one layer: the same element kind (f32 or bf16), each a whole layer. Returns
/// that kind's index in [`Kernels`]' per-cache arrays (f32, bf16).
fn need_kv(k_cache: &CudaBuf, v_cache: &CudaBuf, g: KvGeometry, op: &str) -> Result<usize> {
    let ci = match k_cache.elem {
        Elem::F32 => 0,
        Elem::BF16 => 1,
        other => {
            return Err(err(format!(
                "{op}: `k_cache` holds {other:?}, expected a KV cache (f32 or bf16, from alloc_kv)"
            )))
        }
    };
    need(k_cache, k_cache.elem, g.layer_elems(), op, "k_cache")?;
    need(v_cache, k_cache.elem, g.layer_elems(), op, "v_cache")?;
    Ok(ci)
}

fn i32_of(v: usize, op: &str, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| err(format!("{op}: {what} = {v} exceeds the kernels' 32-bit index range")))
}

fn u32_of(v: usize, op: &str, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| err(format!("{op}: {what} = {v} exceeds a launch dimension")))
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

/// Scratch of the split attention: partial outputs, (max, sum) pairs and one arrival counter
/// per (token, head) for the in-kernel combine (zeroed once; every launch leaves them 0). Sized once by
/// [`Device::reserve_workspace`] (the model does, before the KV pool); grown on demand only
/// where nothing reserved it (ops called directly: tests, `tandem test-ops`).
#[derive(Default)]
struct AttnScratch {
    part_out: Option<CudaSlice<u8>>,
    part_ml: Option<CudaSlice<u8>>,
    counters: Option<CudaSlice<u8>>,
    /// Reserved for limits: a step that needs more fails instead of allocating.
    fixed: bool,
}

/// Scratch of the tensor-core matmul: x rounded to the weights' 16-bit format (m > 128 only),
/// the split-K workspace (GEMM_PART_FLOATS) and its arrival counters (GEMM_COUNTERS words,
/// zeroed once: every launch leaves them zero). Reserved like [`AttnScratch`], else allocated
/// at first use.
#[derive(Default)]
struct MatmulScratch {
    xa: Option<CudaSlice<u8>>,
    part: Option<CudaSlice<u8>>,
    counters: Option<CudaSlice<u8>>,
    fixed: bool,
}

/// The ids argmax and sample write, and the specs sample reads: reserved for the logit rows
/// like [`AttnScratch`], else grown at first use.
#[derive(Default)]
struct IoScratch {
    ids: Option<CudaBuf>,
    specs: Option<CudaBuf>,
    /// Masked sampling: the constrained rows' mask bits, and each row's mask index (i32 as u32).
    masks: Option<CudaBuf>,
    mask_index: Option<CudaBuf>,
    /// Logit edits (penalties, logit_bias, bans): each row's first record (rows + 1 entries)
    /// and the records, EDIT_WORDS words each. Reserved for EDIT_RECORDS records; a step with
    /// more samples on the host (the same ids) rather than allocate mid-serving.
    edit_start: Option<CudaBuf>,
    edits: Option<CudaBuf>,
    /// Each record's logit before its edit (`logit_restore` puts them back for logprobs).
    edit_saved: Option<CudaBuf>,
    /// Logprobs: each row's top count (u32::MAX: none), the sampled token's logprob, and the
    /// top MAX_TOP_LOGPROBS ids and logprobs a row.
    top_n: Option<CudaBuf>,
    lp: Option<CudaBuf>,
    top_ids: Option<CudaBuf>,
    top_lp: Option<CudaBuf>,
    /// `TANDEM_CUDA_ARGMAX=multi`: each row's per-chunk (value, index) pairs, two words each.
    argmax_part: Option<CudaBuf>,
    /// `TANDEM_CUDA_SAMPLER=multi`: SMC_WORDS words a row ([`sampler_multi`]).
    sample_ws: Option<CudaBuf>,
    fixed: bool,
}

/// Logit-edit records reserved at load: a row edits the tokens its prompt and output hold
/// (repetition) at most, so this covers 64 rows of 4,096 distinct tokens (5.2 MB).
const EDIT_RECORDS: usize = 1 << 18;

/// Bytes of the step workspace for `l`: (attention partial outputs, attention (max, sum)
/// pairs, matmul x in 16 bits, split-K partials); the attention's is [`attention::workspace`].
fn workspace_bytes(l: &WorkspaceLimits) -> (usize, usize, usize, usize) {
    let (out, ml, _) = attention::workspace(l);
    let m = l.max_tokens.max(l.max_logit_rows);
    let xa = (m * l.max_k.div_ceil(8) * 8 * 2).max(16);
    (out, ml, xa, GEMM_PART_FLOATS * 4)
}

/// A kernel resolved once at load, with its name for launch errors.
struct Kernel<F> {
    name: &'static str,
    f: F,
}

/// Every kernel the ops launch, looked up once when the modules load (a kernel missing from
/// them fails start-up, naming it), so a launch costs no string formatting or map lookup.
/// Arrays are indexed by weight kind (f32, bf16, f16: [`weight_index`]), 16-bit weight kind
/// (bf16, f16), tile kernel ([`GemmKernel::index`]) or KV cache kind (f32, bf16).
struct Kernels<F> {
    embedding: [Kernel<F>; 3],
    rms_norm: [Kernel<F>; 3],
    add_rms_norm: [Kernel<F>; 3],
    gather_rows: Kernel<F>,
    add: Kernel<F>,
    silu_mul: Kernel<F>,
    gelu_tanh_mul: Kernel<F>,
    scale: Kernel<F>,
    rope: Kernel<F>,
    matmul_tiled_f32: Kernel<F>,
    matmul_x: [Kernel<F>; 2],
    matmul_tc: [[Kernel<F>; 13]; 2],
    kv_write: [Kernel<F>; 2],
    rope_kv_write: [Kernel<F>; 2],
    attn_partial: [Kernel<F>; 2],
    attn_tc: [Kernel<F>; 3],
    attn_tc_deep: [Kernel<F>; 2],
    attn_tc_shared: [Kernel<F>; 2],
    argmax: Kernel<F>,
    /// `TANDEM_CUDA_ARGMAX=multi`: per-chunk partials, then a fold a row ([`argmax_multi`]).
    argmax_partial: Kernel<F>,
    argmax_fold: Kernel<F>,
    moe_route: Kernel<F>,
    moe_accumulate: Kernel<F>,
    moe: MoeKernels<F>,
    sample: Kernel<F>,
    sample_masked: Kernel<F>,
    /// `TANDEM_CUDA_SAMPLER=radix`: the same ids in fewer passes ([`sampler_radix`]).
    sample_radix: Kernel<F>,
    sample_masked_radix: Kernel<F>,
    /// `TANDEM_CUDA_SAMPLER=multi`: the same ids with 64 CTAs a row ([`sampler_multi`]).
    sample_mc_max: Kernel<F>,
    sample_mc_topk: Kernel<F>,
    sample_mc_topp: Kernel<F>,
    sample_mc_draw: Kernel<F>,
    logit_edits: Kernel<F>,
    logit_restore: Kernel<F>,
    logprobs: Kernel<F>,
}

/// The routed mixture of experts' kernels (kernels/moe.cu, moe.rs); gemm_tc by 16-bit weight
/// kind (bf16, f16) and row tile (m16, m64).
struct MoeKernels<F> {
    select: Kernel<F>,
    count: Kernel<F>,
    offsets: Kernel<F>,
    scatter: Kernel<F>,
    gather: Kernel<F>,
    gemm_tc: [[Kernel<F>; 2]; 2],
    gemm_f32: Kernel<F>,
    combine: Kernel<F>,
}

impl<F> Kernels<F> {
    /// The one list of kernel names: `take` finds each (the loaded modules, or a test that
    /// only collects the names).
    fn resolve(mut take: impl FnMut(&'static str) -> Result<F>) -> Result<Self> {
        let mut k = |name: &'static str| -> Result<Kernel<F>> { Ok(Kernel { name, f: take(name)? }) };
        Ok(Kernels {
            embedding: [k("embedding_f32")?, k("embedding_bf16")?, k("embedding_f16")?],
            rms_norm: [k("rms_norm_f32")?, k("rms_norm_bf16")?, k("rms_norm_f16")?],
            add_rms_norm: [k("add_rms_norm_f32")?, k("add_rms_norm_bf16")?, k("add_rms_norm_f16")?],
            gather_rows: k("gather_rows")?,
            add: k("add")?,
            silu_mul: k("silu_mul")?,
            gelu_tanh_mul: k("gelu_tanh_mul")?,
            scale: k("scale")?,
            rope: k("rope")?,
            matmul_tiled_f32: k("matmul_tiled_f32")?,
            matmul_x: [k("matmul_x_bf16")?, k("matmul_x_f16")?],
            matmul_tc: [
                [
                    k("matmul_tc_bf16_m16")?,
                    k("matmul_tc_bf16_m64")?,
                    k("matmul_tc_bf16_m128")?,
                    k("matmul_tc_bf16_m16_n128")?,
                    k("matmul_tc_bf16_m64_n128")?,
                    k("matmul_tc_bf16_m128_n128")?,
                    k("matmul_tc_bf16_m128_occ2")?,
                    k("matmul_tc_bf16_m64_occ4")?,
                    k("matmul_tc_bf16_m16_s8")?,
                    k("matmul_tc_bf16_m16_gemv4")?,
                    k("matmul_tc_bf16_m16_gemv8")?,
                    k("matmul_tc_bf16_m16_x1")?,
                    k("matmul_tc_bf16_m128_w64")?,
                ],
                [
                    k("matmul_tc_f16_m16")?,
                    k("matmul_tc_f16_m64")?,
                    k("matmul_tc_f16_m128")?,
                    k("matmul_tc_f16_m16_n128")?,
                    k("matmul_tc_f16_m64_n128")?,
                    k("matmul_tc_f16_m128_n128")?,
                    k("matmul_tc_f16_m128_occ2")?,
                    k("matmul_tc_f16_m64_occ4")?,
                    k("matmul_tc_f16_m16_s8")?,
                    k("matmul_tc_f16_m16_gemv4")?,
                    k("matmul_tc_f16_m16_gemv8")?,
                    k("matmul_tc_f16_m16_x1")?,
                    k("matmul_tc_f16_m128_w64")?,
                ],
            ],
            kv_write: [k("kv_write_f32")?, k("kv_write_bf16")?],
            rope_kv_write: [k("rope_kv_write_f32")?, k("rope_kv_write_bf16")?],
            attn_partial: [k("paged_attention_partial_f32")?, k("paged_attention_partial_bf16")?],
            attn_tc: [k("paged_attention_tc_d64")?, k("paged_attention_tc_d128")?, k("paged_attention_tc_d256")?],
            attn_tc_deep: [k("paged_attention_tc_deep_d64")?, k("paged_attention_tc_deep_d128")?],
            attn_tc_shared: [k("paged_attention_tc_shared_d64")?, k("paged_attention_tc_shared_d128")?],
            argmax: k("argmax")?,
            argmax_partial: k("argmax_partial")?,
            argmax_fold: k("argmax_fold")?,
            moe_route: k("moe_route")?,
            moe_accumulate: k("moe_accumulate")?,
            moe: MoeKernels {
                select: k("moe_select")?,
                count: k("moe_count")?,
                offsets: k("moe_offsets")?,
                scatter: k("moe_scatter")?,
                gather: k("moe_gather")?,
                gemm_tc: [
                    [k("moe_gemm_bf16_m16")?, k("moe_gemm_bf16_m64")?],
                    [k("moe_gemm_f16_m16")?, k("moe_gemm_f16_m64")?],
                ],
                gemm_f32: k("moe_gemm_f32")?,
                combine: k("moe_combine")?,
            },
            sample: k("sample")?,
            sample_masked: k("sample_masked")?,
            sample_radix: k("sample_radix")?,
            sample_masked_radix: k("sample_masked_radix")?,
            sample_mc_max: k("sample_mc_max")?,
            sample_mc_topk: k("sample_mc_topk")?,
            sample_mc_topp: k("sample_mc_topp")?,
            sample_mc_draw: k("sample_mc_draw")?,
            logit_edits: k("logit_edits")?,
            logit_restore: k("logit_restore")?,
            logprobs: k("logprobs")?,
        })
    }
}

/// `TANDEM_CUDA_SAMPLER=radix`: sampled rows take kernels/sampling.cu `sample_radix` /
/// `sample_masked_radix` (top-k by a radix select, top-p 4 key bits a pass: the same ids as
/// the bisecting `sample`, bit for bit, in about a quarter of the passes); anything else keeps
/// `sample` (the default until an H200 measures both: gpu/tune.sh times them side by side).
pub(crate) fn sampler_radix() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("TANDEM_CUDA_SAMPLER").is_ok_and(|v| v == "radix"))
}

/// `TANDEM_CUDA_SAMPLER=multi`: sampled rows take kernels/sampling.cu `sample_mc_*` (64 CTAs a
/// row, twelve launches, the same ids as `sample`), with [`SMC_WORDS`] words of workspace a
/// row, reserved at load; a step the reservation does not cover takes `sample` (same ids).
pub(crate) fn sampler_multi() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("TANDEM_CUDA_SAMPLER").is_ok_and(|v| v == "multi"))
}

/// Workspace words a row of the multi-CTA sampler (kernels/sampling.cu SMC_WORDS).
pub(crate) const SMC_WORDS: usize = 10400;

/// `TANDEM_CUDA_ARGMAX=multi`: greedy rows take kernels/argmax.cu `argmax_partial` (a CTA per
/// 4,096 logits) and `argmax_fold` (the same ids); anything else the one-CTA-a-row `argmax`
/// (the default until an H200 measures both).
pub(crate) fn argmax_multi() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var("TANDEM_CUDA_ARGMAX").is_ok_and(|v| v == "multi"))
}

/// Logits one `argmax_partial` CTA folds (kernels/argmax.cu AMX_CHUNK).
pub(crate) const ARGMAX_CHUNK: usize = 4096;

/// Every kernel name the backend launches (what start-up resolves); tests/cuda/kernels_check.rs
/// holds them against what NVRTC compiled, so a renamed kernel fails without a GPU.
pub fn kernel_names() -> Vec<&'static str> {
    let mut names = vec![];
    let _ = Kernels::<()>::resolve(|n| {
        names.push(n);
        Ok(())
    });
    names
}

/// The index of a weight kind in [`Kernels`]' per-weight arrays (f32, bf16, f16).
fn weight_index(e: Elem) -> usize {
    match e {
        Elem::F32 | Elem::U32 => 0,
        Elem::BF16 => 1,
        Elem::F16 => 2,
    }
}

pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: Kernels<CudaFunction>,
    /// kernels/matmul_sm90.cu's `matmul_wgmma_bf16` / `_f16`, loaded only with
    /// TANDEM_CUDA_GEMM_LARGE=wgmma on an sm_90 GPU (matmul.rs `wgmma_applies`).
    wgmma: Option<[Kernel<CudaFunction>; 2]>,
    scratch: Mutex<AttnScratch>,
    mm_scratch: Mutex<MatmulScratch>,
    io_scratch: Mutex<IoScratch>,
    moe_scratch: Mutex<moe::MoeScratch>,
    /// Which path a mixture of experts takes (`TANDEM_CUDA_MOE`, moe.rs).
    moe_path: moe::MoePath,
    /// Kernels launched so far ([`CudaBackend::launches`]).
    launches: AtomicU64,
    /// CUDA graphs captured at load (graph.rs), and whether a capture is open.
    graphs: Mutex<graph::Graphs>,
    capturing: std::sync::atomic::AtomicBool,
    sync_each: bool,
    /// `TANDEM_CUDA_PDL=1` on sm_90+: the kernels (CUfunction handles) launched with
    /// programmatic dependent launch ([`launch::PDL_FILES`]); empty otherwise.
    pdl: std::collections::HashSet<usize>,
    /// Keep every activation in f32 (`TANDEM_CUDA_ACTIVATIONS=f32`, or
    /// [`CudaBackend::set_f32_activations`]): the same bits, more bytes; for checks.
    f32_activations: bool,
    arch: String,
    device_name: String,
}

impl CudaBackend {
    /// Opens GPU `device_ordinal` and compiles the kernels for it. Kernel sources come from
    /// `TANDEM_KERNEL_DIR` when set, else from the copies built into this binary.
    pub fn new(device_ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library and drops it again.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(err(NO_DRIVER));
        }
        if !Toolchain::nvrtc_loadable() {
            return Err(err(format!(
                "the CUDA backend compiles its kernels at start-up, but {}",
                Toolchain::discover().nvrtc_missing_message()
            )));
        }
        let srcs = match std::env::var_os("TANDEM_KERNEL_DIR").filter(|v| !v.is_empty()) {
            Some(dir) => sources::from_dir(std::path::Path::new(&dir))?,
            None => sources::embedded(),
        };
        // cudarc panics when a driver symbol it expects is missing (a driver older than CUDA 13).
        let ctx = std::panic::catch_unwind(|| CudaContext::new(device_ordinal))
            .map_err(|_| err("creating the CUDA context panicked: is the driver older than CUDA 13.0? (see stderr)"))?
            .map_err(drv(&format!("opening GPU {device_ordinal}")))?;
        // One stream orders everything; per-buffer events would only add cost.
        // SAFETY: all work of this backend goes to the one stream below.
        unsafe { ctx.disable_event_tracking() };
        // Our own stream, not the legacy NULL stream: the NULL stream synchronizes with every
        // other stream of the context (a profiler's, a library's) and is what CUDA graph
        // capture cannot use.
        let stream = ctx.new_stream().map_err(drv("creating the stream"))?;
        let (maj, min) = ctx.compute_capability().map_err(drv("compute capability"))?;
        if maj < 8 {
            return Err(err(format!(
                "GPU {device_ordinal} is sm_{maj}{min}; the kernels need sm_80 or newer (bf16 mma.sync, cp.async)"
            )));
        }
        let arch = format!("{maj}{min}");
        // kernels/matmul_sm90.cu (wgmma + TMA, sm_90a) is compiled and loaded only when asked for.
        let variants = matmul::check_gemm_variants()?;
        if variants.wgmma && arch != "90" {
            return Err(err(format!(
                "TANDEM_CUDA_GEMM_LARGE=wgmma needs an sm_90 (Hopper) GPU; GPU {device_ordinal} is sm_{arch}"
            )));
        }
        let srcs: Vec<KernelSource> = srcs.into_iter().filter(|s| s.name != "matmul_sm90" || variants.wgmma).collect();
        let device_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let include = Toolchain::discover().include_dir;
        let images = compile_modules(&srcs, &arch, include.as_ref())?;
        let mut funcs = HashMap::new();
        let pdl_on = launch::pdl_switch().map_err(err)?;
        if pdl_on && maj < 9 {
            tracing::warn!("TANDEM_CUDA_PDL=1: GPU {device_ordinal} is sm_{arch}, below sm_90; launching without it");
        }
        let mut pdl_names = std::collections::HashSet::new();
        for (src, image) in srcs.iter().zip(images) {
            let cubin = matches!(image, Image::Cubin(_));
            let before: std::collections::HashSet<String> = funcs.keys().cloned().collect();
            let pdl_file = launch::PDL_FILES.contains(&src.name.as_str());
            let mut note = |funcs: &HashMap<String, CudaFunction>| {
                if pdl_file {
                    pdl_names.extend(funcs.keys().filter(|k| !before.contains(*k)).cloned());
                }
            };
            if let Err(e) = load_module(&ctx, src, image, &mut funcs) {
                if !cubin {
                    return Err(e);
                }
                // Not seen yet (the cubin path has not met a GPU): the PTX the driver compiles
                // itself is the path that has.
                tracing::warn!("{}.cu: the driver refused its sm_{arch} cubin ({e}); loading PTX instead", src.name);
                load_module(&ctx, src, Image::Ptx(compile_ptx_cached(src, &arch, include.as_ref())?), &mut funcs)?;
            }
            note(&funcs);
        }
        let loaded = funcs.len();
        let pdl: std::collections::HashSet<usize> = if pdl_on && maj >= 9 {
            pdl_names.iter().filter_map(|n| funcs.get(n)).map(|f| f.cu_function() as usize).collect()
        } else {
            Default::default()
        };
        if !pdl.is_empty() {
            tracing::info!("cuda: programmatic dependent launch for {} kernels (TANDEM_CUDA_PDL)", pdl.len());
        }
        let wgmma = if variants.wgmma {
            let mut k = |name: &'static str| -> Result<Kernel<CudaFunction>> {
                let f = funcs.remove(name).ok_or_else(|| {
                    err(format!("kernel `{name}` is not in the loaded modules (kernels/matmul_sm90.cu)"))
                })?;
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    matmul::WGMMA_SMEM as i32,
                )
                .map_err(drv(&format!("{name}: {} bytes of shared memory", matmul::WGMMA_SMEM)))?;
                Ok(Kernel { name, f })
            };
            Some([k(matmul::WGMMA_KERNELS[0])?, k(matmul::WGMMA_KERNELS[1])?])
        } else {
            None
        };
        let kernels = Kernels::resolve(|name| {
            funcs
                .remove(name)
                .ok_or_else(|| err(format!("kernel `{name}` is not in the loaded modules (edited kernels/*.cu?)")))
        })?;
        // Tile kernels with more than 48 KiB of dynamic shared memory opt in to it.
        for row in &kernels.matmul_tc {
            for (kern, g) in row.iter().zip(matmul::GEMM_KERNELS) {
                if g.smem > matmul::SMEM_DEFAULT_LIMIT {
                    kern.f
                        .set_attribute(
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            g.smem as i32,
                        )
                        .map_err(drv(&format!("{}: {} bytes of shared memory", kern.name, g.smem)))?;
                }
            }
        }
        // The tc_deep attention at head_dim 128 takes more than 48 KiB.
        for (kern, &bytes) in kernels.attn_tc_deep.iter().zip(&attention::PATD_SMEM) {
            if bytes as u32 > matmul::SMEM_DEFAULT_LIMIT {
                kern.f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(drv(&format!("{}: {bytes} bytes of shared memory", kern.name)))?;
            }
        }
        // The tc_shared attention's K/V tile ring takes more than 48 KiB at both head sizes.
        for (kern, &bytes) in kernels.attn_tc_shared.iter().zip(&attention::PATS_SMEM) {
            if bytes as u32 > matmul::SMEM_DEFAULT_LIMIT {
                kern.f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(drv(&format!("{}: {bytes} bytes of shared memory", kern.name)))?;
            }
        }
        // So does tc at head_dim 256 (four warps, each with a third buffer for q).
        let d256 = &kernels.attn_tc[2];
        d256.f
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                attention::PAT_SMEM_D256 as i32,
            )
            .map_err(drv(&format!("{}: {} bytes of shared memory", d256.name, attention::PAT_SMEM_D256)))?;
        let attn_variant = attention::check_variant()?;
        if attention::check_d256()? != attention::D256Variant::Partial {
            tracing::info!("cuda: attention at head_dim 256 on the tensor cores (TANDEM_CUDA_ATTENTION_D256=tc)");
        }
        if attn_variant != attention::AttnVariant::Tc {
            tracing::info!("cuda: attention {attn_variant:?} (TANDEM_CUDA_ATTENTION)");
        }
        if variants != matmul::GEMM_DEFAULT_VARIANTS {
            tracing::info!("cuda: GEMM tile kernels {variants:?} (TANDEM_CUDA_GEMM_LARGE / _MID / _SMALL)");
        }
        let sync_each = std::env::var("TANDEM_CUDA_SYNC").is_ok_and(|v| v == "1");
        let f32_activations = std::env::var("TANDEM_CUDA_ACTIVATIONS").is_ok_and(|v| v == "f32");
        let moe_path = moe::moe_path(std::env::var("TANDEM_CUDA_MOE").ok().as_deref())?;
        if moe_path != moe::MOE_DEFAULT {
            tracing::info!("cuda: mixture of experts {moe_path:?} (TANDEM_CUDA_MOE)");
        }
        tracing::info!("cuda: {device_name} (sm_{arch}), {loaded} kernels from {} files", srcs.len());
        Ok(CudaBackend {
            ctx,
            stream,
            kernels,
            wgmma,
            scratch: Mutex::new(AttnScratch::default()),
            mm_scratch: Mutex::new(MatmulScratch::default()),
            io_scratch: Mutex::new(IoScratch::default()),
            moe_scratch: Mutex::new(moe::MoeScratch::default()),
            moe_path,
            launches: AtomicU64::new(0),
            graphs: Mutex::new(graph::Graphs::default()),
            capturing: std::sync::atomic::AtomicBool::new(false),
            sync_each,
            pdl,
            f32_activations,
            arch,
            device_name,
        })
    }

    /// Stores every activation in f32 from now on (models loaded after this call); the
    /// tokens are the same bits either way (kernels/matmul.cu's contract), which the GPU
    /// tests check by loading one model each way.
    pub fn set_f32_activations(&mut self, on: bool) {
        self.f32_activations = on;
    }

    /// Routes mixtures of experts (each expert over its own tokens) or runs every expert over
    /// every token, for models loaded after this call (`TANDEM_CUDA_MOE`'s choice otherwise);
    /// the same bits either way, which the GPU tests check by loading one model each way.
    pub fn set_moe_routed(&mut self, on: bool) {
        self.moe_path = if on { moe::MoePath::Routed } else { moe::MoePath::Dense };
    }

    /// `"90"` for an H100/H200.
    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Waits for all queued work and reports any fault it raised.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    /// Kernels this backend has launched since it was created (every enqueue that succeeded):
    /// the difference over one forward is its launch count, what the fused ops bring down.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// A launch of `f` on the stream, with programmatic dependent launch where it is on for `f`.
    fn launch_args<'a>(&'a self, f: &'a CudaFunction) -> launch::Launch<'a> {
        launch::Launch::new(&self.stream, f, !self.pdl.is_empty() && self.pdl.contains(&(f.cu_function() as usize)))
    }

    /// Whether kernels are launched with programmatic dependent launch (`TANDEM_CUDA_PDL=1` on sm_90+).
    pub fn pdl(&self) -> bool {
        !self.pdl.is_empty()
    }

    /// Turns a launch result into ours and, in sync mode, waits for the kernel.
    fn launched<T>(&self, name: &str, r: std::result::Result<T, DriverError>) -> Result<()> {
        r.map_err(drv(&format!("launching {name}")))?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // A synchronize inside a capture would invalidate it.
        if self.sync_each && !self.capturing.load(Ordering::Relaxed) {
            self.stream.synchronize().map_err(drv(&format!("{name} (TANDEM_CUDA_SYNC=1)")))?;
        }
        Ok(())
    }

    fn alloc(&self, elem: Elem, len: usize) -> Result<CudaBuf> {
        // Zero-length device allocations are not portable; keep a few bytes behind every buffer.
        let bytes = (len * elem.size()).max(4);
        // SAFETY: contents are unspecified by the Backend contract.
        let mem = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(drv(&format!("allocating {bytes} bytes")))?;
        Ok(CudaBuf { mem: ManuallyDrop::new(mem), elem, len, base: None, staging: None })
    }

    /// `len` u32 elements of `base` from element `at`: a view (nothing is allocated).
    fn u32_view(&self, base: &Arc<CudaSlice<u8>>, at: usize, len: usize) -> Result<CudaBuf> {
        let end = at.checked_add(len).and_then(|e| e.checked_mul(4)).filter(|&e| e <= base.len());
        if end.is_none() {
            return Err(err(format!("u32_view: elements {at}..+{len} beyond an allocation of {} bytes", base.len())));
        }
        let ptr = base.device_ptr(&self.stream).0 + (at * 4) as u64;
        // SAFETY: ptr..ptr + 4 len lies inside `base` (checked above), which the view keeps
        // alive; the CudaSlice made here is leaked, never freed, when the view drops.
        let mem = unsafe { self.stream.upgrade_device_ptr::<u8>(ptr, len * 4) };
        Ok(CudaBuf { mem: ManuallyDrop::new(mem), elem: Elem::U32, len, base: Some(base.clone()), staging: None })
    }

    fn upload_bytes(&self, elem: Elem, bytes: &[u8]) -> Result<CudaBuf> {
        let len = bytes.len() / elem.size();
        let mut b = self.alloc(elem, len)?;
        if !bytes.is_empty() {
            let mut dst = b.mem.slice_mut(0..bytes.len());
            self.stream.memcpy_htod(bytes, &mut dst).map_err(drv("copy to device"))?;
        }
        Ok(b)
    }

    fn write<T: cudarc::driver::DeviceRepr>(&self, buf: &mut CudaBuf, elem: Elem, data: &[T]) -> Result<()> {
        need(buf, elem, data.len(), "write", "buffer")?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `buf` holds at least data.len() elements of T (checked above; T is 4 bytes).
        let mut dst =
            unsafe { buf.mem.transmute_mut::<T>(data.len()) }.ok_or_else(|| err("write: buffer too small"))?;
        self.stream.memcpy_htod(data, &mut dst).map_err(drv("copy to device"))
    }

    fn read<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaBuf,
        elem: Elem,
        len: usize,
    ) -> Result<Vec<T>> {
        need(buf, elem, len, "read", "buffer")?;
        let mut out = vec![T::default(); len];
        if len > 0 {
            // SAFETY: `buf` holds at least len elements of T (checked above).
            let src = unsafe { buf.mem.transmute::<T>(len) }.ok_or_else(|| err("read: buffer too small"))?;
            self.stream.memcpy_dtoh(&src, &mut out).map_err(drv("copy to host"))?;
        }
        self.stream.synchronize().map_err(drv("synchronize after copy to host"))?;
        Ok(out)
    }

    /// Elementwise kernels over `len` values: grid ceil(len / 256), block 256.
    /// The id buffer (at least `rows`) and spec buffer (at least `spec_words`), grown only
    /// where nothing was reserved.
    fn io_scratch(&self, rows: usize, spec_words: usize, op: &str) -> Result<std::sync::MutexGuard<'_, IoScratch>> {
        self.io_scratch_masked(rows, spec_words, 0, op)
    }

    /// As [`Self::io_scratch`], with room for `mask_words` words of masks and `rows` indices
    /// when `mask_words` > 0.
    fn io_scratch_masked(
        &self,
        rows: usize,
        spec_words: usize,
        mask_words: usize,
        op: &str,
    ) -> Result<std::sync::MutexGuard<'_, IoScratch>> {
        let mut s =
            self.io_scratch.lock().map_err(|_| err(format!("{op}: scratch lock poisoned by an earlier panic")))?;
        let short = |b: &Option<CudaBuf>, n: usize| n > 0 && b.as_ref().is_none_or(|b| b.len < n);
        let index_rows = if mask_words > 0 { rows } else { 0 };
        if s.fixed
            && (short(&s.ids, rows)
                || short(&s.specs, spec_words)
                || short(&s.masks, mask_words)
                || short(&s.mask_index, index_rows))
        {
            return Err(err(format!("{op}: {rows} logit rows exceed the workspace reserved at load")));
        }
        if short(&s.ids, rows) {
            s.ids = Some(self.alloc(Elem::U32, rows)?);
        }
        if short(&s.specs, spec_words) {
            s.specs = Some(self.alloc(Elem::U32, spec_words)?);
        }
        if short(&s.masks, mask_words) {
            s.masks = Some(self.alloc(Elem::U32, mask_words)?);
        }
        if short(&s.mask_index, index_rows) {
            s.mask_index = Some(self.alloc(Elem::U32, index_rows)?);
        }
        Ok(s)
    }

    fn elementwise_cfg(len: usize, op: &str) -> Result<LaunchConfig> {
        Ok(cfg((u32_of(len.div_ceil(256), op, "blocks")?, 1, 1), 256))
    }
}

/// A compiled kernel file: a cubin for the device's own architecture (the default), or PTX the
/// driver compiles at load (`TANDEM_CUDA_CUBIN=0`, or where NVRTC could not make a cubin).
enum Image {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// Every kernel file compiled (or read from the cache, compile.rs) on its own thread: NVRTC
/// programs are independent, and a cold start's time is then the slowest file's, not the sum.
fn compile_modules(srcs: &[KernelSource], arch: &str, include: Option<&std::path::PathBuf>) -> Result<Vec<Image>> {
    let cubin = std::env::var("TANDEM_CUDA_CUBIN").map_or(true, |v| v != "0");
    std::thread::scope(|s| {
        let jobs: Vec<_> = srcs
            .iter()
            .map(|src| {
                s.spawn(move || -> Result<Image> {
                    if cubin {
                        match compile_cubin_cached(src, arch, include) {
                            Ok(c) => return Ok(Image::Cubin(c)),
                            Err(e) => {
                                tracing::warn!("{}.cu: no cubin for sm_{arch}, loading PTX instead: {e}", src.name)
                            }
                        }
                    }
                    compile_ptx_cached(src, arch, include).map(Image::Ptx)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(err("a kernel compile thread panicked (see stderr)"))))
            .collect()
    })
}

fn load_module(
    ctx: &Arc<CudaContext>,
    src: &KernelSource,
    image: Image,
    funcs: &mut HashMap<String, CudaFunction>,
) -> Result<()> {
    // A cubin names no entries we can read cheaply: look up every kernel the backend launches
    // (those of other files are absent and skipped). PTX lists its own.
    let (module, names, cubin) = match image {
        Image::Cubin(c) => (
            ctx.load_module(cudarc::nvrtc::Ptx::from_binary(c))
                .map_err(drv(&format!("loading the cubin of {}.cu", src.name)))?,
            kernel_names()
                .into_iter()
                .chain(matmul::WGMMA_KERNELS)
                .filter(|n| !funcs.contains_key(*n))
                .map(str::to_string)
                .collect::<Vec<_>>(),
            true,
        ),
        Image::Ptx(ptx) => {
            let names = ptx_entries(&ptx);
            let m = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(drv(&format!(
                "loading the PTX of {}.cu (driver older than the NVRTC that made it?)",
                src.name
            )))?;
            (m, names, false)
        }
    };
    for name in names {
        match module.load_function(&name) {
            Ok(f) => {
                funcs.insert(name, f);
            }
            // A cubin's lookup misses the kernels of other files; one missing everywhere fails
            // Kernels::resolve, by name.
            Err(_) if cubin => {}
            Err(e) => return Err(drv(&format!("{}.cu: kernel {name}", src.name))(e)),
        }
    }
    Ok(())
}

impl Device for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<()> {
        self.begin_capture_impl()
    }

    fn end_capture(&self) -> Result<tandem_core::backend::GraphId> {
        self.end_capture_impl()
    }

    fn replay(&self, graph: tandem_core::backend::GraphId) -> Result<()> {
        self.replay_impl(graph)
    }

    fn launch_count(&self) -> Option<u64> {
        Some(self.launches())
    }

    fn sync(&self) -> Result<()> {
        self.synchronize()
    }

    fn free_memory(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free as u64)
    }

    fn total_memory(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(_free, total)| total as u64)
    }

    fn reserve_workspace(&self, l: &WorkspaceLimits) -> Result<u64> {
        const OP: &str = "reserve_workspace";
        let (out, ml, xa, part) = workspace_bytes(l);
        let alloc = |bytes: usize, what: &str| -> Result<Option<CudaSlice<u8>>> {
            if bytes == 0 {
                return Ok(None);
            }
            // SAFETY: scratch contents are unspecified; every kernel writes what it later reads.
            let mem = unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(drv(&format!("{OP}: {what} of {bytes} bytes for {l:?}")))?;
            Ok(Some(mem))
        };
        let mut a = self.scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        // Dropped first, so that a second reservation never holds both sizes at once.
        *a = AttnScratch::default();
        let counter_bytes = attention::workspace(l).2;
        let counters = if counter_bytes > 0 {
            Some(self.stream.alloc_zeros::<u8>(counter_bytes).map_err(drv(&format!("{OP}: attention counters")))?)
        } else {
            None
        };
        *a = AttnScratch {
            part_out: alloc(out, "attention partials")?,
            part_ml: alloc(ml, "attention (max, sum) pairs")?,
            counters,
            fixed: true,
        };
        let mut m =
            self.mm_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        *m = MatmulScratch::default();
        let counters =
            self.stream.alloc_zeros::<u8>(GEMM_COUNTERS * 4).map_err(drv(&format!("{OP}: split-K counters")))?;
        *m = MatmulScratch {
            xa: alloc(xa, "matmul x in 16 bits")?,
            part: alloc(part, "split-K workspace")?,
            counters: Some(counters),
            fixed: true,
        };
        let rows = l.max_logit_rows.max(1);
        let mut io =
            self.io_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        // Every row may be constrained: a mask of the largest output width (the vocabulary) each.
        let mask_words = rows * l.max_n.div_ceil(32);
        let argmax_part_words = 2 * rows * l.max_n.div_ceil(ARGMAX_CHUNK).max(1);
        // Only under the switch: 40.6 KiB a logit row.
        let sample_ws_words = if sampler_multi() { rows * SMC_WORDS } else { 0 };
        *io = IoScratch {
            ids: Some(self.alloc(Elem::U32, rows)?),
            specs: Some(self.alloc(Elem::U32, rows * SPEC_WORDS)?),
            masks: Some(self.alloc(Elem::U32, mask_words.max(1))?),
            mask_index: Some(self.alloc(Elem::U32, rows)?),
            edit_start: Some(self.alloc(Elem::U32, rows + 1)?),
            edits: Some(self.alloc(Elem::U32, EDIT_RECORDS * EDIT_WORDS)?),
            edit_saved: Some(self.alloc(Elem::F32, EDIT_RECORDS)?),
            top_n: Some(self.alloc(Elem::U32, rows)?),
            lp: Some(self.alloc(Elem::F32, rows)?),
            top_ids: Some(self.alloc(Elem::U32, rows * MAX_TOP_LOGPROBS)?),
            top_lp: Some(self.alloc(Elem::F32, rows * MAX_TOP_LOGPROBS)?),
            argmax_part: Some(self.alloc(Elem::U32, argmax_part_words)?),
            sample_ws: if sample_ws_words > 0 { Some(self.alloc(Elem::U32, sample_ws_words)?) } else { None },
            fixed: true,
        };
        let moe_bytes = moe::workspace(l.max_tokens, l.moe.as_ref());
        let mut ms =
            self.moe_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        *ms = moe::MoeScratch::default();
        *ms = moe::MoeScratch { mem: alloc(moe_bytes, "routed mixture-of-experts scratch")?, fixed: true };
        let io_bytes = (rows * (5 + SPEC_WORDS + 2 * MAX_TOP_LOGPROBS)
            + 1
            + mask_words
            + EDIT_RECORDS * (EDIT_WORDS + 1)
            + argmax_part_words
            + sample_ws_words)
            * 4;
        // The allocations are stream-ordered: wait, so that free_memory sees them.
        self.synchronize()?;
        Ok((out + ml + counter_bytes + xa + part + GEMM_COUNTERS * 4 + io_bytes + moe_bytes) as u64)
    }
}

impl Storage for CudaBackend {
    type Buf = CudaBuf;

    fn matmul_operand(&self, weight: DType) -> DType {
        // kernels/matmul.cu: bf16 and f16 weights take the tensor cores with x rounded to their
        // type; f32 weights take the f32 SIMT kernel.
        match weight {
            DType::BF16 | DType::F16 => weight,
            _ => DType::F32,
        }
    }

    /// The tensor cores' operand type: every reader of the activation rounds it so, so it is
    /// stored so (half the bytes, the same bits; kernels/common.cuh `store_act`).
    fn activation_dtype(&self, weight: DType) -> DType {
        if self.f32_activations {
            return DType::F32;
        }
        self.matmul_operand(weight)
    }

    fn alloc_activation(&self, dtype: DType, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::of(dtype), len)
    }

    fn upload_weight(&self, t: &TensorView) -> Result<CudaBuf> {
        self.upload_bytes(Elem::of(t.dtype), t.bytes())
    }

    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<CudaBuf> {
        self.upload_bytes(Elem::of(dtype), &dtype.from_f32(values))
    }

    fn alloc_f32(&self, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::F32, len)
    }

    fn alloc_u32(&self, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::U32, len)
    }

    /// One device allocation the regions are views of, and page-locked staging memory of the
    /// same layout: a step's metadata is one asynchronous copy ([`Staging`]).
    fn alloc_u32_group(&self, layout: &U32Layout) -> Result<U32Group<CudaBuf>> {
        const OP: &str = "alloc_u32_group";
        let total = layout.total();
        // SAFETY: contents are unspecified until the first upload, which writes what it uses.
        let base = Arc::new(
            unsafe { self.stream.alloc::<u8>((total * 4).max(4)) }.map_err(drv(&format!("{OP}: {total} u32")))?,
        );
        let parts = (0..layout.regions())
            .map(|i| self.u32_view(&base, layout.offset(i), layout.len(i)))
            .collect::<Result<Vec<_>>>()?;
        let mut whole = self.u32_view(&base, 0, total)?;
        // Plain page-locked memory, not write-combined: the host also reads it (tests), and
        // write-combined reads are uncached.
        // SAFETY: zeroed below before anyone reads it.
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u32>(total.max(1), 0) }
            .map_err(drv(&format!("{OP}: {total} u32 of page-locked memory")))?;
        host.as_mut_slice().map_err(drv(OP))?.fill(0);
        let copied = self.ctx.new_event(None).map_err(drv(&format!("{OP}: creating the copy's event")))?;
        whole.staging = Some(Box::new(Staging { host, copied }));
        Ok(U32Group::carved(layout.clone(), parts, whole))
    }

    fn u32_staging<'a>(&self, group: &'a mut U32Group<CudaBuf>) -> Result<&'a mut [u32]> {
        const OP: &str = "u32_staging";
        let st = group
            .carved
            .as_mut()
            .and_then(|w| w.staging.as_deref_mut())
            .ok_or_else(|| err(format!("{OP}: a group this backend did not carve")))?;
        // The last upload's copy may still be reading it.
        st.copied.synchronize().map_err(drv(&format!("{OP}: waiting for the last metadata copy")))?;
        st.host.as_mut_slice().map_err(drv(OP))
    }

    /// One asynchronous copy from the page-locked staging memory of everything `used` spans
    /// ([`U32Layout::span`]: the regions before the last one used whole, that one's prefix),
    /// then the event `u32_staging` waits on before the host writes the memory again.
    fn upload_u32_group(&self, group: &mut U32Group<CudaBuf>, used: &[usize]) -> Result<()> {
        const OP: &str = "upload_u32_group";
        let end = group.layout.span(used)?;
        if self.capturing.load(Ordering::Relaxed) {
            return Err(err(format!("{OP}: uploads are not allowed while a graph is captured")));
        }
        let whole = group.carved.as_mut().ok_or_else(|| err(format!("{OP}: a group this backend did not carve")))?;
        let dst = whole.mem.device_ptr(&self.stream).0;
        let st = whole.staging.as_deref_mut().ok_or_else(|| err(format!("{OP}: a group without staging memory")))?;
        if end == 0 {
            return Ok(());
        }
        let src = &st.host.as_slice().map_err(drv(OP))?[..end];
        self.ctx.bind_to_thread().map_err(drv(OP))?;
        // SAFETY: dst is the group's allocation of layout.total() >= end u32 (span checked
        // `used` against the layout); src is page-locked and nobody writes it until `copied`
        // has completed (u32_staging waits for it, and so does Staging's drop before freeing).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(drv(&format!("{OP}: copy of {end} u32 to device")))?;
        st.copied.record(&self.stream).map_err(drv(&format!("{OP}: recording the copy's event")))
    }

    /// bf16 first: half the bytes a decode step reads per token of context, twice the blocks
    /// in the same memory; f32 is kept for checks against the reference.
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        &[KvDtype::Bf16, KvDtype::F32]
    }

    fn alloc_kv(&self, geometry: KvGeometry) -> Result<CudaBuf> {
        self.alloc_kv_as(geometry, KvDtype::Bf16)
    }

    fn alloc_kv_as(&self, geometry: KvGeometry, dtype: KvDtype) -> Result<CudaBuf> {
        let elem = match dtype {
            KvDtype::F32 => Elem::F32,
            KvDtype::Bf16 => Elem::BF16,
        };
        self.alloc(elem, geometry.layer_elems())
    }

    fn write_f32(&self, buf: &mut CudaBuf, data: &[f32]) -> Result<()> {
        self.write(buf, Elem::F32, data)
    }

    fn write_u32(&self, buf: &mut CudaBuf, data: &[u32]) -> Result<()> {
        self.write(buf, Elem::U32, data)
    }

    fn read_f32(&self, buf: &CudaBuf, len: usize) -> Result<Vec<f32>> {
        self.read(buf, Elem::F32, len)
    }

    fn read_u32(&self, buf: &CudaBuf, len: usize) -> Result<Vec<u32>> {
        self.read(buf, Elem::U32, len)
    }

    fn read_kv(&self, buf: &CudaBuf, geometry: KvGeometry) -> Result<Vec<f32>> {
        let n = geometry.layer_elems();
        match buf.elem {
            // bf16 widens to f32 exactly: the top half of the f32 bits.
            Elem::BF16 => Ok(self
                .read::<u16>(buf, Elem::BF16, n)?
                .into_iter()
                .map(|b| f32::from_bits(u32::from(b) << 16))
                .collect()),
            _ => self.read(buf, Elem::F32, n),
        }
    }
}

impl Ops for CudaBackend {
    fn embedding(
        &self,
        table: &CudaBuf,
        ids: &CudaBuf,
        out: &mut CudaBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        const OP: &str = "embedding";
        if num_tokens == 0 || hidden == 0 {
            return Ok(());
        }
        let wi = need_weight(table, hidden, OP, "table")?;
        if !table.len.is_multiple_of(hidden) {
            return Err(err(format!("{OP}: table has {} elements, not a multiple of hidden = {hidden}", table.len)));
        }
        need(ids, Elem::U32, num_tokens, OP, "ids")?;
        need(out, Elem::F32, num_tokens * hidden, OP, "out")?;
        let k = &self.kernels.embedding[wi];
        let (t, h, v) = (
            i32_of(num_tokens, OP, "num_tokens")?,
            i32_of(hidden, OP, "hidden")?,
            i32_of(table.len / hidden, OP, "vocab")?,
        );
        let mut l = self.launch_args(&k.f);
        l.arg(&*table.mem).arg(&*ids.mem).arg(&mut *out.mem).arg(&t).arg(&h).arg(&v);
        // SAFETY: argument list matches the kernel signature; lengths checked above.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    fn gather_rows(&self, src: &CudaBuf, rows: &CudaBuf, out: &mut CudaBuf, n: usize, dim: usize) -> Result<()> {
        const OP: &str = "gather_rows";
        if n == 0 || dim == 0 {
            return Ok(());
        }
        need(src, Elem::F32, 0, OP, "src")?;
        need(rows, Elem::U32, n, OP, "rows")?;
        need(out, Elem::F32, n * dim, OP, "out")?;
        let f = &self.kernels.gather_rows.f;
        let (ni, di, sr) = (i32_of(n, OP, "n")?, i32_of(dim, OP, "dim")?, i32_of(src.len / dim, OP, "src rows")?);
        let mut l = self.launch_args(f);
        l.arg(&*src.mem).arg(&*rows.mem).arg(&mut *out.mem).arg(&ni).arg(&di).arg(&sr);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ni as u32, 1, 1), 256)) };
        self.launched(OP, r)
    }

    fn rms_norm(&self, x: &CudaBuf, w: &CudaBuf, out: &mut CudaBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        const OP: &str = "rms_norm";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        need(x, Elem::F32, rows * dim, OP, "x")?;
        let wi = need_weight(w, dim, OP, "w")?;
        let code = need_act(out, rows * dim, OP, "out")?;
        let k = &self.kernels.rms_norm[wi];
        let (ri, di) = (i32_of(rows, OP, "rows")?, i32_of(dim, OP, "dim")?);
        let mut l = self.launch_args(&k.f);
        l.arg(&*x.mem).arg(&*w.mem).arg(&mut *out.mem).arg(&code).arg(&ri).arg(&di).arg(&eps);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    fn add(&self, acc: &mut CudaBuf, x: &CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "add";
        if len == 0 {
            return Ok(());
        }
        need(acc, Elem::F32, len, OP, "acc")?;
        need(x, Elem::F32, len, OP, "x")?;
        let f = &self.kernels.add.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&mut *acc.mem).arg(&*x.mem).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn matmul(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        out: &mut CudaBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        need(out, Elem::F32, m * n, "matmul", "out")?;
        self.gemm("matmul", x, w, bias, GemmOut::Plain(out), m, n, k, None)
    }

    fn rope(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        positions: &CudaBuf,
        inv_freq: &CudaBuf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        const OP: &str = "rope";
        if num_tokens == 0 || head_dim == 0 {
            return Ok(());
        }
        if !head_dim.is_multiple_of(2) {
            return Err(err(format!("{OP}: head_dim = {head_dim} is odd")));
        }
        need(q, Elem::F32, num_tokens * q_heads * head_dim, OP, "q")?;
        need(k, Elem::F32, num_tokens * kv_heads * head_dim, OP, "k")?;
        need(positions, Elem::U32, num_tokens, OP, "positions")?;
        need(inv_freq, Elem::F32, head_dim / 2, OP, "inv_freq")?;
        i32_of(num_tokens * (q_heads + kv_heads) * head_dim, OP, "elements")?;
        let f = &self.kernels.rope.f;
        let (t, qh, kh, d) = (
            i32_of(num_tokens, OP, "T")?,
            i32_of(q_heads, OP, "q_heads")?,
            i32_of(kv_heads, OP, "kv_heads")?,
            i32_of(head_dim, OP, "head_dim")?,
        );
        let mut l = self.launch_args(f);
        l.arg(&mut *q.mem).arg(&mut *k.mem).arg(&*positions.mem).arg(&*inv_freq.mem).arg(&t).arg(&qh).arg(&kh).arg(&d);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(OP, r)
    }

    fn silu_mul(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "silu_mul";
        if len == 0 {
            return Ok(());
        }
        need(gate, Elem::F32, len, OP, "gate")?;
        need(up, Elem::F32, len, OP, "up")?;
        let code = need_act(out, len, OP, "out")?;
        let f = &self.kernels.silu_mul.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&*gate.mem).arg(&*up.mem).arg(&mut *out.mem).arg(&code).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn gelu_tanh_mul(&self, gate: &CudaBuf, up: &CudaBuf, out: &mut CudaBuf, len: usize) -> Result<()> {
        const OP: &str = "gelu_tanh_mul";
        if len == 0 {
            return Ok(());
        }
        need(gate, Elem::F32, len, OP, "gate")?;
        need(up, Elem::F32, len, OP, "up")?;
        let code = need_act(out, len, OP, "out")?;
        let f = &self.kernels.gelu_tanh_mul.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&*gate.mem).arg(&*up.mem).arg(&mut *out.mem).arg(&code).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn scale(&self, x: &mut CudaBuf, factor: f32, len: usize) -> Result<()> {
        const OP: &str = "scale";
        if len == 0 {
            return Ok(());
        }
        need(x, Elem::F32, len, OP, "x")?;
        let f = &self.kernels.scale.f;
        let n = len as u64;
        let mut l = self.launch_args(f);
        l.arg(&mut *x.mem).arg(&factor).arg(&n);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn moe_route(
        &self,
        logits: &CudaBuf,
        weights: &mut CudaBuf,
        rows: usize,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        const OP: &str = "moe_route";
        if rows == 0 || experts == 0 {
            return Ok(());
        }
        need(logits, Elem::F32, rows * experts, OP, "logits")?;
        need(weights, Elem::F32, rows * experts, OP, "weights")?;
        let (ri, ei, ki, rn) = (
            i32_of(rows, OP, "rows")?,
            i32_of(experts, OP, "experts")?,
            i32_of(top_k.min(experts), OP, "top_k")?,
            renormalize as i32,
        );
        i32_of(rows * experts, OP, "rows * experts")?;
        let f = &self.kernels.moe_route.f;
        let mut l = self.stream.launch_builder(f);
        l.arg(&*logits.mem).arg(&mut *weights.mem).arg(&ri).arg(&ei).arg(&ki).arg(&rn);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((u32_of(rows.div_ceil(64), OP, "blocks")?, 1, 1), 64)) };
        self.launched(OP, r)
    }

    fn moe_accumulate(
        &self,
        acc: &mut CudaBuf,
        y: &CudaBuf,
        weights: &CudaBuf,
        rows: usize,
        dim: usize,
        expert: usize,
        experts: usize,
        first: bool,
    ) -> Result<()> {
        const OP: &str = "moe_accumulate";
        let len = rows * dim;
        if len == 0 {
            return Ok(());
        }
        if expert >= experts {
            return Err(err(format!("{OP}: expert {expert} of {experts}")));
        }
        need(acc, Elem::F32, len, OP, "acc")?;
        need(y, Elem::F32, len, OP, "y")?;
        need(weights, Elem::F32, rows * experts, OP, "weights")?;
        let (n, di, xi, ei, fi) = (
            len as u64,
            i32_of(dim, OP, "dim")?,
            i32_of(expert, OP, "expert")?,
            i32_of(experts, OP, "experts")?,
            first as i32,
        );
        let f = &self.kernels.moe_accumulate.f;
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut *acc.mem).arg(&*y.mem).arg(&*weights.mem).arg(&n).arg(&di).arg(&xi).arg(&ei).arg(&fi);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(Self::elementwise_cfg(len, OP)?) };
        self.launched(OP, r)
    }

    fn kv_write(
        &self,
        k: &CudaBuf,
        v: &CudaBuf,
        k_cache: &mut CudaBuf,
        v_cache: &mut CudaBuf,
        slots: &CudaBuf,
        num_tokens: usize,
        g: KvGeometry,
    ) -> Result<()> {
        const OP: &str = "kv_write";
        let row = g.num_kv_heads * g.head_dim;
        if num_tokens == 0 || row == 0 {
            return Ok(());
        }
        need(k, Elem::F32, num_tokens * row, OP, "k")?;
        need(v, Elem::F32, num_tokens * row, OP, "v")?;
        let kern = &self.kernels.kv_write[need_kv(k_cache, v_cache, g, OP)?];
        need(slots, Elem::U32, num_tokens, OP, "slots")?;
        let f = &kern.f;
        let (t, rl, ns) = (i32_of(num_tokens, OP, "T")?, i32_of(row, OP, "kv_heads*head_dim")?, g.slots() as u64);
        let mut l = self.launch_args(f);
        l.arg(&*k.mem)
            .arg(&*v.mem)
            .arg(&mut *k_cache.mem)
            .arg(&mut *v_cache.mem)
            .arg(&*slots.mem)
            .arg(&t)
            .arg(&rl)
            .arg(&ns);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(kern.name, r)
    }

    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut CudaBuf) -> Result<()> {
        self.attention(a, out)
    }
}

impl FusedOps for CudaBackend {
    /// kernels/rms_norm.cu `add_rms_norm_<w>`: one launch, the bits of add then rms_norm.
    fn add_rms_norm(
        &self,
        acc: &mut CudaBuf,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "add_rms_norm";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        need(acc, Elem::F32, rows * dim, OP, "acc")?;
        need(x, Elem::F32, rows * dim, OP, "x")?;
        let wi = need_weight(w, dim, OP, "w")?;
        let code = need_act(out, rows * dim, OP, "out")?;
        let k = &self.kernels.add_rms_norm[wi];
        let (ri, di) = (i32_of(rows, OP, "rows")?, i32_of(dim, OP, "dim")?);
        i32_of(rows * dim, OP, "rows*dim")?;
        let mut l = self.launch_args(&k.f);
        l.arg(&mut *acc.mem).arg(&*x.mem).arg(&*w.mem).arg(&mut *out.mem).arg(&code).arg(&ri).arg(&di).arg(&eps);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
        self.launched(k.name, r)
    }

    /// One [nq + 2 nkv, hidden] weight (bf16/f16 only; f32 weights are not fused), gathered on
    /// the device from the three mappings.
    fn fuse_qkv(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<tandem_core::backend::WeightAndBias<CudaBuf>>> {
        self.fuse_qkv_weights(q, k, v, bias)
    }

    /// One GEMM whose epilogue routes each column to q, k or v (kernels/matmul.cu EPI_QKV).
    /// With `norm`, the GEMM forms rms_norm(h) * gamma itself (x is not read).
    fn qkv_proj(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        m: usize,
        nq: usize,
        nkv: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        self.gemm("qkv_proj", x, w, bias, GemmOut::Qkv { q, k, v, nq, nkv }, m, nq + 2 * nkv, hidden, norm)
    }

    /// Gate and up interleaved in blocks of 32 rows (matmul.rs `fuse_gate_up_rows`).
    fn fuse_gate_up(&self, gate: &TensorView, up: &TensorView) -> Result<Option<CudaBuf>> {
        self.fuse_gate_up_weight(gate, up)
    }

    /// One GEMM whose epilogue writes act(gate) * up (kernels/matmul.cu EPI_SILU, EPI_GEGLU).
    /// With `norm`, the GEMM forms rms_norm(h) * gamma itself (x is not read).
    fn gate_up_act(
        &self,
        act: tandem_core::config::Activation,
        x: &CudaBuf,
        w: &CudaBuf,
        out: &mut CudaBuf,
        m: usize,
        inter: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        self.gemm(
            "gate_up_act",
            x,
            w,
            None,
            GemmOut::GateUp { out, inter, act },
            m,
            matmul::fuse_gate_up_rows(inter),
            hidden,
            norm,
        )
    }

    /// Up to FUSE_NORM_MAX_TOKENS tokens (see there): a layer is then 5 launches. The fused
    /// path gives the unfused path's bits (kernels/matmul.cu `norm_prologue`, EPI_RESID), so
    /// which one a step takes never changes a token.
    fn fuses_norm(&self, _hidden: usize, tokens: usize) -> bool {
        tokens <= matmul::FUSE_NORM_MAX_TOKENS
    }

    /// One GEMM whose epilogue adds into h and writes h * gamma (kernels/matmul.cu EPI_RESID).
    fn matmul_residual(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        h: &mut CudaBuf,
        next_norm: Option<(&CudaBuf, &mut CudaBuf)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if w.elem == Elem::F32 {
            return Err(err("matmul_residual: f32 weights take the SIMT kernel, which has no residual epilogue (the model fuses norms only with fused 16-bit projections)"));
        }
        self.gemm("matmul_residual", x, w, None, GemmOut::Residual { h, hg: next_norm }, m, n, k, None)
    }

    /// One GEMM with rope and the cache write in its epilogue (kernels/matmul.cu EPI_QKV_ROPE)
    /// where every head fits one output tile (head_dim divides 64, or 128 on the 128-wide
    /// kernels), else qkv_proj then rope_kv_write: the same bits either way.
    fn qkv_rope_kv_write(
        &self,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        m: usize,
        nq: usize,
        hidden: usize,
        norm: Option<tandem_core::backend::NormIn<'_, CudaBuf>>,
        kv: tandem_core::backend::KvDest<'_, CudaBuf>,
    ) -> Result<()> {
        const OP: &str = "qkv_rope_kv_write";
        let g = kv.geometry;
        if g.head_dim == 0 || !nq.is_multiple_of(g.head_dim) {
            return Err(err(format!("{OP}: nq {nq} is not a multiple of head_dim {}", g.head_dim)));
        }
        let nkv = g.num_kv_heads * g.head_dim;
        if matmul::rope_in_epilogue(g.head_dim) && w.elem != Elem::F32 {
            return self.gemm(OP, x, w, bias, GemmOut::QkvRope { q, nq, nkv, kv }, m, nq + 2 * nkv, hidden, norm);
        }
        self.qkv_proj(x, w, bias, q, k, v, m, nq, nkv, hidden, norm)?;
        self.rope_kv_write(q, k, v, kv.k_cache, kv.v_cache, kv.positions, kv.inv_freq, kv.slots, m, nq / g.head_dim, g)
    }

    /// kernels/kv_write.cu `rope_kv_write_<kv>`: rope and the cache write in one launch; k is
    /// left unrotated (the contract allows it: read K from the cache).
    fn rope_kv_write(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &CudaBuf,
        k_cache: &mut CudaBuf,
        v_cache: &mut CudaBuf,
        positions: &CudaBuf,
        inv_freq: &CudaBuf,
        slots: &CudaBuf,
        num_tokens: usize,
        q_heads: usize,
        g: KvGeometry,
    ) -> Result<()> {
        const OP: &str = "rope_kv_write";
        let (kvh, d) = (g.num_kv_heads, g.head_dim);
        if num_tokens == 0 || d == 0 {
            return Ok(());
        }
        if !d.is_multiple_of(2) {
            return Err(err(format!("{OP}: head_dim = {d} is odd")));
        }
        need(q, Elem::F32, num_tokens * q_heads * d, OP, "q")?;
        need(k, Elem::F32, num_tokens * kvh * d, OP, "k")?;
        need(v, Elem::F32, num_tokens * kvh * d, OP, "v")?;
        let kern = &self.kernels.rope_kv_write[need_kv(k_cache, v_cache, g, OP)?];
        need(positions, Elem::U32, num_tokens, OP, "positions")?;
        need(inv_freq, Elem::F32, d / 2, OP, "inv_freq")?;
        need(slots, Elem::U32, num_tokens, OP, "slots")?;
        i32_of(num_tokens * (q_heads + kvh) * d, OP, "elements")?;
        let (t, qh, kh, di, ns) = (
            i32_of(num_tokens, OP, "T")?,
            i32_of(q_heads, OP, "q_heads")?,
            i32_of(kvh, OP, "kv_heads")?,
            i32_of(d, OP, "head_dim")?,
            g.slots() as u64,
        );
        let mut l = self.launch_args(&kern.f);
        l.arg(&mut *q.mem)
            .arg(&*k.mem)
            .arg(&*v.mem)
            .arg(&mut *k_cache.mem)
            .arg(&mut *v_cache.mem)
            .arg(&*positions.mem)
            .arg(&*inv_freq.mem)
            .arg(&*slots.mem);
        l.arg(&t).arg(&qh).arg(&kh).arg(&di).arg(&ns);
        // SAFETY: as in embedding.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 128)) };
        self.launched(kern.name, r)
    }

    fn moe_prepare(
        &self,
        experts: &[tandem_core::backend::MoeExpert<'_, CudaBuf>],
        hidden: usize,
        inter: usize,
    ) -> Result<Option<CudaBuf>> {
        self.moe_table(experts, hidden, inter)
    }

    fn moe_routed(
        &self,
        table: &CudaBuf,
        experts: &[tandem_core::backend::MoeExpert<'_, CudaBuf>],
        x: &CudaBuf,
        weights: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        hidden: usize,
        inter: usize,
        top_k: usize,
    ) -> Result<()> {
        self.moe_routed_impl(table, experts, x, weights, out, rows, hidden, inter, top_k)
    }
}

impl Sampling for CudaBackend {
    fn argmax(&self, logits: &CudaBuf, rows: usize, vocab: usize) -> Result<Vec<u32>> {
        const OP: &str = "argmax";
        if rows == 0 {
            return Ok(vec![]);
        }
        if vocab == 0 {
            return Err(err(format!("{OP}: vocab = 0")));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        i32_of(rows * vocab, OP, "rows*vocab")?;
        let mut io = self.io_scratch(rows, 0, OP)?;
        let IoScratch { ids: Some(ids), argmax_part, fixed, .. } = &mut *io else {
            return Err(err(format!("{OP}: id buffer missing after allocation")));
        };
        if argmax_multi() {
            let chunks = vocab.div_ceil(ARGMAX_CHUNK);
            let words = 2 * rows * chunks;
            if !*fixed && argmax_part.as_ref().is_none_or(|b| b.len < words) {
                *argmax_part = Some(self.alloc(Elem::U32, words)?);
            }
            // A workspace reserved for fewer logits than these: the one-CTA kernel, same ids.
            if let Some(part) = argmax_part.as_mut().filter(|b| b.len >= words) {
                let ci = i32_of(chunks, OP, "chunks")?;
                let mut l = self.launch_args(&self.kernels.argmax_partial.f);
                l.arg(&*logits.mem).arg(&mut *part.mem).arg(&ri).arg(&vi).arg(&ci);
                // SAFETY: grid (chunks, rows): CTA (c, r) reads row r's logits [c * 4096,
                // min(vocab, (c + 1) * 4096)) and writes words r * chunks + c and rows * chunks +
                // r * chunks + c of `part` (2 * rows * chunks words, checked above).
                let r = unsafe { l.launch(cfg((ci as u32, ri as u32, 1), 256)) };
                self.launched(self.kernels.argmax_partial.name, r)?;
                let mut l = self.launch_args(&self.kernels.argmax_fold.f);
                l.arg(&*part.mem).arg(&mut *ids.mem).arg(&ri).arg(&ci);
                // SAFETY: reads the pairs argmax_partial wrote; writes ids[0..rows].
                let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 256)) };
                self.launched(self.kernels.argmax_fold.name, r)?;
                return self.read_u32(ids, rows);
            }
        }
        let mut l = self.launch_args(&self.kernels.argmax.f);
        l.arg(&*logits.mem).arg(&mut *ids.mem).arg(&ri).arg(&vi);
        // SAFETY: as in embedding; ids holds at least `rows` words.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), 512)) };
        self.launched(OP, r)?;
        self.read_u32(ids, rows)
    }

    /// kernels/sampling.cu: one block of 256 threads per row; only the specs (32 bytes a row)
    /// go up and the ids come back. Greedy-only steps take the argmax kernel.
    fn sample(&self, logits: &CudaBuf, rows: usize, vocab: usize, specs: &[SampleSpec]) -> Result<Vec<u32>> {
        const OP: &str = "sample";
        if specs.len() != rows {
            return Err(err(format!("{OP}: {} specs for {rows} rows", specs.len())));
        }
        if specs.iter().all(SampleSpec::is_greedy) {
            return self.argmax(logits, rows, vocab);
        }
        if vocab == 0 {
            return Err(err(format!("{OP}: vocab = 0")));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        let (ri, vi) = (i32_of(rows, OP, "rows")?, i32_of(vocab, OP, "vocab")?);
        i32_of(rows * vocab, OP, "rows*vocab")?;
        let words: Vec<u32> = specs.iter().flat_map(SampleSpec::to_words).collect();
        debug_assert_eq!(words.len(), rows * SPEC_WORDS);
        let mut io = self.io_scratch(rows, words.len(), OP)?;
        let IoScratch { ids: Some(_), specs: Some(spec_buf), .. } = &mut *io else {
            return Err(err(format!("{OP}: id or spec buffer missing after allocation")));
        };
        self.write_u32(spec_buf, &words)?;
        if sampler_multi() && self.sample_multi(&mut io, logits, rows, vocab, false)? {
            let IoScratch { ids: Some(ids), .. } = &*io else { return Err(err(format!("{OP}: id buffer missing"))) };
            return self.read_u32(ids, rows);
        }
        let IoScratch { ids: Some(ids), specs: Some(spec_buf), .. } = &mut *io else {
            return Err(err(format!("{OP}: id or spec buffer missing after allocation")));
        };
        let f = if sampler_radix() { &self.kernels.sample_radix.f } else { &self.kernels.sample.f };
        let mut l = self.stream.launch_builder(f);
        l.arg(&*logits.mem).arg(&*spec_buf.mem).arg(&mut *ids.mem).arg(&ri).arg(&vi);
        // SAFETY: as in embedding; specs hold SPEC_WORDS words a row, ids one a row.
        let r = unsafe { l.launch(cfg((ri as u32, 1, 1), SAMPLE_LANES as u32)) };
        self.launched(OP, r)?;
        self.read_u32(ids, rows)
    }

    fn sample_masked(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
    ) -> Result<Vec<u32>> {
        const OP: &str = "sample_masked";
        if masks.is_empty() {
            return self.sample(logits, rows, vocab, specs);
        }
        masks.check(rows, vocab).map_err(|m| err(format!("{OP}: {m}")))?;
        if specs.len() != rows || vocab == 0 {
            return Err(err(format!("{OP}: {} specs for {rows} rows of vocabulary {vocab}", specs.len())));
        }
        need(logits, Elem::F32, rows * vocab, OP, "logits")?;
        if masks.has_edits() && !self.edit_logits(logits, rows, vocab, masks)? {
            // More edits than the reserved records: the host, with the same ids.
            let v = self.read_f32(logits, rows * vocab)?;
            return Ok(tandem_core::sampling::sample_rows_masked(&v, vocab, specs, masks));
        }
        self.sample_edited(logits, rows, vocab, specs, masks)
    }

    fn sample_logprobs(
        &self,
        logits: &CudaBuf,
        rows: usize,
        vocab: usize,
        specs: &[SampleSpec],
        masks: &RowMasks,
        top_n: &[Option<usize>],
    ) -> Result<(Vec<u32>, Vec<Option<TokenLogprobs>>)> {
        self.sample_with_logprobs(logits, rows, vocab, specs, masks, top_n)
    }
}

#[cfg(test)]
mod kernel_table_tests {
    use super::*;

    /// One name per kernel, each once; the per-kind arrays line up with their index functions.
    #[test]
    fn every_kernel_is_named_once() {
        let names = kernel_names();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(names.len(), 84); // 50 + 11 routed-MoE + 6 decode GEMM + 2 m128_w64 + 8 sampler/argmax + 2 tc_deep and 2 tc_shared attention variants + gelu_tanh_mul and scale (Gemma 3) + tc attention at head_dim 256
        let k = Kernels::<&'static str>::resolve(Ok).unwrap();
        assert_eq!(k.embedding.map(|x| x.f), ["embedding_f32", "embedding_bf16", "embedding_f16"]);
        assert_eq!(
            [Elem::F32, Elem::BF16, Elem::F16].map(|e| k.rms_norm[weight_index(e)].f),
            ["rms_norm_f32", "rms_norm_bf16", "rms_norm_f16"]
        );
        for (m, want) in [(1, "matmul_tc_f16_m16"), (17, "matmul_tc_f16_m64_occ4"), (129, "matmul_tc_f16_m128_occ2")] {
            assert_eq!(k.matmul_tc[weight_index(Elem::F16) - 1][gemm_kernel(m, matmul::GEMM_BN).index].f, want);
        }
        for (m, want) in
            [(1, "matmul_tc_bf16_m16_n128"), (17, "matmul_tc_bf16_m64_n128"), (129, "matmul_tc_bf16_m64_n128")]
        {
            assert_eq!(k.matmul_tc[weight_index(Elem::BF16) - 1][gemm_kernel(m, matmul::GEMM_BN_WIDE).index].f, want);
        }
        assert_eq!(k.matmul_x[weight_index(Elem::BF16) - 1].f, "matmul_x_bf16");
        assert_eq!((k.kv_write[0].f, k.kv_write[1].f), ("kv_write_f32", "kv_write_bf16"));
        assert_eq!(
            (k.attn_partial[0].f, k.attn_partial[1].f),
            ("paged_attention_partial_f32", "paged_attention_partial_bf16")
        );
        assert_eq!(
            k.attn_tc.map(|x| x.f),
            ["paged_attention_tc_d64", "paged_attention_tc_d128", "paged_attention_tc_d256"]
        );
        // moe.rs indexes gemm_tc by [bf16, f16][m16, m64].
        assert_eq!(
            k.moe.gemm_tc.map(|r| r.map(|x| x.f)),
            [["moe_gemm_bf16_m16", "moe_gemm_bf16_m64"], ["moe_gemm_f16_m16", "moe_gemm_f16_m64"]]
        );
    }
}

#[cfg(test)]
mod workspace_tests {
    use super::*;

    fn limits(max_tokens: usize, max_context: usize) -> WorkspaceLimits {
        WorkspaceLimits {
            max_tokens,
            max_seqs: 64,
            max_logit_rows: 192,
            max_context,
            num_heads: 32,
            head_dim: 64,
            max_k: 8192,
            max_n: 128256,
            kv_dtype: KvDtype::F32,
            moe: None,
        }
    }

    /// The reservation covers what paged_attention and matmul ask for at the limits (the
    /// formulas those ops use), and follows the limits: the fix for a workspace that grew with
    /// the longest context is to bound the context, and the sizes say so.
    #[test]
    fn workspace_covers_the_largest_step_and_follows_the_limits() {
        let l = limits(512, 8192);
        let (out, ml, xa, part) = workspace_bytes(&l);
        let parts = attention::pa_max_parts(8192);
        assert_eq!(parts, 16);
        assert_eq!(out, 512 * 32 * parts * 64 * 4);
        assert_eq!(ml, 512 * 32 * parts * 2 * 4);
        assert_eq!(xa, 512 * 8192 * 2);
        assert_eq!(part, GEMM_PART_FLOATS * 4);
        // Any shorter context or fewer tokens fits what was reserved.
        for (t, ctx) in [(1, 1), (1, 8192), (512, 600), (100, 8000)] {
            let p = attention::pa_max_parts(ctx);
            assert!(t * 32 * p * 64 * 4 <= out && t * 32 * p * 2 * 4 <= ml, "t {t} ctx {ctx}");
        }
        // A short context limit takes the direct path: no attention scratch at all.
        let (out, ml, ..) = workspace_bytes(&limits(512, 64));
        assert_eq!((out, ml), (0, 0));
        // The logit rows can exceed the tokens (prompt logprobs): x scratch covers them.
        let (.., xa, _) = workspace_bytes(&WorkspaceLimits { max_logit_rows: 1000, ..limits(16, 64) });
        assert_eq!(xa, 1000 * 8192 * 2);
        // 2,048 tokens over a 131k context: about 4.3 GB of attention partials, now counted
        // before the KV pool rather than allocated mid-serving.
        let (out, ..) = workspace_bytes(&limits(2048, 131072));
        assert_eq!(out, 2048 * 32 * 256 * 64 * 4);
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    /// Sticky codes stop the engine; the others fail one call. Built from codes, not from a
    /// live driver (formatting a DriverError asks libcuda for its text).
    #[test]
    fn sticky_codes_are_fatal_and_named_by_op() {
        use CUresult::*;
        for code in [
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_ECC_UNCORRECTABLE,
            CUDA_ERROR_MISALIGNED_ADDRESS,
            CUDA_ERROR_ILLEGAL_INSTRUCTION,
            CUDA_ERROR_ASSERT,
            CUDA_ERROR_HARDWARE_STACK_ERROR,
            CUDA_ERROR_CONTEXT_IS_DESTROYED,
        ] {
            let e = driver_error("launching rms_norm_bf16", code, "an illegal memory access was encountered");
            assert!(e.is_fatal(), "{code:?} must be fatal");
            let m = e.to_string();
            assert!(
                m.contains("launching rms_norm_bf16") && m.contains(&format!("{code:?}")) && m.contains("restart"),
                "{m}"
            );
        }
        for code in [
            CUDA_ERROR_OUT_OF_MEMORY,
            CUDA_ERROR_INVALID_VALUE,
            CUDA_ERROR_NOT_FOUND,
            CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            CUDA_ERROR_INVALID_PTX,
            CUDA_ERROR_NO_BINARY_FOR_GPU,
        ] {
            let e = driver_error("matmul: x scratch of 64 bytes", code, "detail");
            assert!(!e.is_fatal(), "{code:?} must not stop the engine");
            assert!(e.to_string().contains("matmul: x scratch of 64 bytes"), "{e}");
        }
    }
}
