//! The paged-attention launchers of [`CudaBackend`] (kernels/paged_attention.cu): the
//! tensor-core kernel (`paged_attention_tc_d64` / `_d128`) over a bf16 cache with head_dim 64
//! or 128, its fp8 form (kernels/paged_attention_fp8.cu, `paged_attention_tc_fp8e4m3_d*` /
//! `_fp8e5m2_d*`: bitwise tc over the decoded cache) over an fp8 cache wherever tc serves a
//! bf16 one under `TANDEM_CUDA_ATTENTION_FP8=tc` (off by default until a GPU times it), and the f32 kernel (`paged_attention_partial_*`) for everything else (the f32
//! cache kept for checks, other head sizes, `=f32`). `TANDEM_CUDA_ATTENTION=tc_deep` swaps the
//! tensor-core kernel for its variant `paged_attention_tc_deep_d64` / `_d128` (a deeper K+V
//! pipeline, one warp a block, up to 32 partitions; the sliding window as tc's);
//! `=tc_shared` for `paged_attention_tc_shared_d64` / `_d128` (prefill chunks by blocks of 4
//! warps over consecutive tokens of one sequence sharing each 64-key K/V tile, loaded once
//! through a multi-stage cp.async ring; tc's bits; decodes as tc); `=wgmma` for
//! kernels/paged_attention_sm90.cu's `paged_attention_wgmma_d64` / `_d128` / `_d256` (sm_90
//! only: prefill chunks on wgmma, FlashAttention-3 style, a producer warpgroup and two consumer
//! warpgroups of 64 rows; tc's bits on the emulator; decodes as tc); `=f32` keeps the f32 kernel.
//! Head_dim 256 (Gemma 2 and 3) runs the f32 kernel unless `TANDEM_CUDA_ATTENTION_D256=tc`
//! picks `paged_attention_tc_d256` (tc's arithmetic; tc_deep and tc_shared have no d256 and
//! `f32` above still wins) — the default stays `partial` until a GPU times both.
//! An fp8 cache takes tc's fp8 form under tc_deep, tc_shared and wgmma too (they have no fp8
//! form). Which one serves a model depends only on the model, the cache type and those
//! switches, never on the step, so a token's bits never follow the batch.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};
use tandem_core::backend::{AttnArgs, KvDtype, WorkspaceLimits};
use tandem_core::Result;

use crate::buf::{kv_scales, need, need_kv, CudaBuf, Elem, KV_BF16, KV_F32, KV_FP8_E4M3, KV_FP8_E5M2};
use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::kernels::Kernel;
use crate::launch::{cfg, i32_of, u32_of};
use crate::switches::Switches;
use crate::workspace::AttnScratch;

/// `paged_attention_partial`'s partitions (kernels/paged_attention.cu): the longest (PA_PART),
/// the shortest (PA_MIN_PART), and how many a context up to PA_MAX_SPLITS * PA_PART keys is
/// cut into at most (PA_MAX_SPLITS); a token's partition length depends on its context alone.
const PA_PART: usize = 512;
const PA_MIN_PART: usize = 64;
const PA_MAX_SPLITS: usize = 16;

/// Partitions enough for every token whose context is at most `ctx` keys (the kernel's
/// `pa_part_len` makes at most PA_MAX_SPLITS, and at most ctx / PA_MIN_PART, up to
/// PA_MAX_SPLITS * PA_PART keys; beyond that partitions are PA_PART long).
pub(super) fn pa_max_parts(ctx: usize) -> usize {
    if ctx <= PA_MAX_SPLITS * PA_PART {
        PA_MAX_SPLITS.min(ctx.div_ceil(PA_MIN_PART))
    } else {
        ctx.div_ceil(PA_PART)
    }
}
/// Largest head_dim the attention kernel holds in shared memory (PA_MAX_D).
const PA_MAX_D: usize = 256;
/// Threads per query head, and query heads of one GQA group per block at most (PA_THREADS,
/// PA_MAX_PACK in kernels/paged_attention.cu).
const PA_THREADS: u32 = 128;
const PA_MAX_PACK: usize = 4;

/// Query heads per attention block: the largest count up to PA_MAX_PACK that divides the GQA
/// group (`gqa` query heads per kv head), so a block's heads read the same K/V rows, fetched
/// once and then served from L1. The bits do not depend on it (kernels/paged_attention.cu).
/// Mirrored by `pa_pack` in kernels/emu/emu_test.cpp.
fn pa_pack(gqa: usize) -> usize {
    (1..=PA_MAX_PACK).rev().find(|p| gqa.is_multiple_of(*p)).unwrap_or(1)
}

/// paged_attention_tc's warps per block, keys per staged sub-tile, and partitions (PAT_WARPS,
/// PAT_SUB, PAT_MIN_PART, PAT_SPLITS in kernels/paged_attention.cu): a token's context is cut
/// into at most PAT_SPLITS partitions of at least PAT_MIN_PART keys (a function of its own
/// context: `pat_part_len`), with no longest partition (nothing is held per key).
const PAT_WARPS: usize = 4;
const PAT_SUB: usize = 16;
const PAT_MIN_PART: usize = 64;
const PAT_SPLITS: usize = 16;

/// paged_attention_tc_d256's dynamic shared memory per 4-warp block (PatCfg<256>::WARP_ELEMS
/// bf16 a warp: two K/V stages and q, of 16 rows of 256 + 8), over 48 KiB: opted in at load.
pub(super) const PAT_SMEM_D256: usize = PAT_WARPS * 3 * PAT_SUB * (256 + 8) * 2;

/// The tc_deep variant's partitions at most (PATD_SPLITS), and its dynamic shared memory per
/// one-warp block (PatdCfg<D>::SMEM: 8 stages at head_dim 64, 6 at 128).
const PATD_SPLITS: usize = 32;
pub(super) const PATD_SMEM: [usize; 2] =
    [(8 * 2 + 1) * PAT_SUB * (64 + 8) * 2 + 8 * 4, (6 * 2 + 1) * PAT_SUB * (128 + 8) * 2 + 6 * 4];

/// The tc_shared variant's warps a chunk block (PATS_WARPS: a block holds PATS_WARPS * tw
/// tokens), and its dynamic shared memory (PatsCfg<D>::SMEM: a ring of 3 K+V 64-key tile stages
/// at head_dim 64, 2 at 128, their bad-key masks, 8 ints).
const PATS_WARPS: usize = 4;
pub(super) const PATS_SMEM: [usize; 2] =
    [3 * 2 * 64 * (64 + 8) * 2 + 3 * 16 + 32, 2 * 2 * 64 * (128 + 8) * 2 + 2 * 16 + 32];

/// The wgmma variant (kernels/paged_attention_sm90.cu): 384 threads a block, chunk blocks of
/// PAW_ROW_WARPS * tw tokens (two consumer warpgroups of 4 warps), then PAT_WARPS split jobs a
/// block; its dynamic shared memory at head_dim 64 / 128 / 256 (PawCfg<D>::SMEM: a ring of 4 /
/// 3 / 2 stages of a K and a V^T 64-key tile, two Q and two P tiles, the bad-key masks, the
/// mbarriers, 128 bytes of alignment slack; kernels/emu/sm90_attention_test.cpp checks them).
const PAW_THREADS: u32 = 384;
const PAW_ROW_WARPS: usize = 8;
pub(super) const PAW_SMEM: [usize; 3] = [paw_smem(64, 4), paw_smem(128, 3), paw_smem(256, 2)];
/// The kernels' names, loaded from the sm_90a module only under `TANDEM_CUDA_ATTENTION=wgmma`.
pub(crate) const PAW_KERNELS: [&str; 3] =
    ["paged_attention_wgmma_d64", "paged_attention_wgmma_d128", "paged_attention_wgmma_d256"];
const fn paw_smem(d: usize, stages: usize) -> usize {
    let tile = 64 * d * 2;
    128 + stages * 2 * tile + 2 * tile + 2 * 64 * 64 * 2 + stages * 16 + 2 * stages * 8
}

/// Partitions enough for every token whose context is at most `ctx` keys, for a kernel that
/// cuts at most `splits` (PAT_SPLITS for tc, PATD_SPLITS for tc_deep).
fn pat_max_parts_of(ctx: usize, splits: usize) -> usize {
    splits.min(ctx.div_ceil(PAT_MIN_PART)).max(1)
}
#[cfg(test)]
fn pat_max_parts(ctx: usize) -> usize {
    pat_max_parts_of(ctx, PAT_SPLITS)
}

/// The attention kernel family `TANDEM_CUDA_ATTENTION` picks (read once; a bad value fails the
/// backend's load, switches.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AttnVariant {
    /// paged_attention_tc (the default).
    Tc,
    /// paged_attention_tc_deep.
    TcDeep,
    /// paged_attention_tc_shared.
    TcShared,
    /// paged_attention_wgmma (sm_90 only).
    Wgmma,
    /// paged_attention_partial for every cache.
    F32,
}

pub(crate) fn parse_variant(v: Option<&str>) -> std::result::Result<AttnVariant, String> {
    match v.unwrap_or("") {
        "" | "tc" => Ok(AttnVariant::Tc),
        "tc_deep" => Ok(AttnVariant::TcDeep),
        "tc_shared" => Ok(AttnVariant::TcShared),
        "wgmma" => Ok(AttnVariant::Wgmma),
        "f32" => Ok(AttnVariant::F32),
        x => Err(format!("TANDEM_CUDA_ATTENTION={x}: one of tc (the default), tc_deep, tc_shared, wgmma, f32")),
    }
}

/// The kernel `TANDEM_CUDA_ATTENTION_D256` picks at head_dim 256 (read once; a bad value fails
/// the backend's load, switches.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum D256Variant {
    /// paged_attention_partial (the default until a GPU measures both).
    Partial,
    /// paged_attention_tc_d256.
    Tc,
}

/// `TANDEM_CUDA_ATTENTION_FP8`: whether an fp8 cache takes tc's fp8 form (a bad value fails the
/// backend's load, switches.rs).
pub(crate) fn parse_fp8(v: Option<&str>) -> std::result::Result<bool, String> {
    match v.unwrap_or("") {
        "" | "partial" => Ok(false),
        "tc" => Ok(true),
        x => Err(format!("TANDEM_CUDA_ATTENTION_FP8={x}: one of partial (the default), tc")),
    }
}

pub(crate) fn parse_d256(v: Option<&str>) -> std::result::Result<D256Variant, String> {
    match v.unwrap_or("") {
        "" | "partial" => Ok(D256Variant::Partial),
        "tc" => Ok(D256Variant::Tc),
        x => Err(format!("TANDEM_CUDA_ATTENTION_D256={x}: one of partial (the default), tc")),
    }
}

/// Whether a tensor-core kernel serves a cache of this kind (`need_kv`'s index: bf16, and the
/// fp8 caches through tc's fp8 form, which decodes each byte into its shared-memory stage; the
/// f32 cache, kept for checks, takes the f32 kernel) and head size.
/// `TANDEM_CUDA_ATTENTION=f32` keeps the f32 kernel for every cache (the kernel lab compares).
/// An fp8 cache takes tc's fp8 form only under `TANDEM_CUDA_ATTENTION_FP8=tc`: the performance
/// model predicts it slower than the f32 kernel at decode (its software decode of each byte;
/// docs/gpu/predictions.md, "tc fp8_e4m3"), so the f32 kernel stays the default until a GPU
/// times both.
fn uses_tc(kv: usize, head_dim: usize, sw: &Switches) -> bool {
    (kv < KV_FP8_E4M3 || sw.attention_fp8_tc) && uses_tc_with(kv, head_dim, sw.attention, sw.attention_d256)
}
fn uses_tc_with(kv: usize, head_dim: usize, v: AttnVariant, d256: D256Variant) -> bool {
    let sized = head_dim == 64 || head_dim == 128 || (head_dim == 256 && d256 == D256Variant::Tc);
    kv != KV_F32 && sized && v != AttnVariant::F32
}

/// The tensor-core variant serving a cache of kind `kv` and `head_dim` under the
/// `TANDEM_CUDA_ATTENTION` value `v`: only tc has a head_dim-256 kernel and an fp8 form, so
/// tc_deep and tc_shared run tc there, and wgmma runs tc over an fp8 cache (a model's kernel is
/// fixed by its head size and cache, so each token's bits still follow its own context alone).
fn tc_variant(kv: usize, v: AttnVariant, head_dim: usize) -> AttnVariant {
    if kv >= KV_FP8_E4M3 || (head_dim == 256 && v != AttnVariant::Wgmma) {
        AttnVariant::Tc
    } else {
        v
    }
}

/// `need_kv`'s index of a cache of this type.
fn kv_index(d: KvDtype) -> usize {
    match d {
        KvDtype::F32 => KV_F32,
        KvDtype::Bf16 => KV_BF16,
        KvDtype::Fp8E4m3 => KV_FP8_E4M3,
        KvDtype::Fp8E5m2 => KV_FP8_E5M2,
    }
}

/// Warp jobs a row's output dims are cut into by tc (PatCfg<D>::HALVES: 2 at head_dim 256,
/// each half with its own partial row and arrival counter).
fn tc_halves(head_dim: usize) -> usize {
    if head_dim > 128 {
        2
    } else {
        1
    }
}

/// Partitions at most of the tensor-core kernel in use, for contexts up to `ctx` keys.
fn tc_max_parts(ctx: usize, v: AttnVariant) -> usize {
    pat_max_parts_of(ctx, if v == AttnVariant::TcDeep { PATD_SPLITS } else { PAT_SPLITS })
}

/// The attention scratch for `l`: (partial outputs, (max, sum) pairs, arrival counters), in
/// bytes. The tensor-core kernel splits only decodes (at most max_seqs tokens a step), and only
/// into PAT_SPLITS partitions; the f32 kernel may split every token of a step.
pub(super) fn workspace(l: &WorkspaceLimits, sw: &Switches) -> (usize, usize, usize) {
    let ctx = l.max_context.max(1);
    let kv = kv_index(l.kv_dtype);
    if uses_tc(kv, l.head_dim, sw) {
        let parts = tc_max_parts(ctx, tc_variant(kv, sw.attention, l.head_dim));
        if parts == 1 {
            return (0, 0, 0);
        }
        let rows = l.max_seqs * l.num_heads * parts;
        let halves = tc_halves(l.head_dim);
        return (rows * l.head_dim * 4, rows * halves * 2 * 4, l.max_seqs * l.num_heads * halves * 4);
    }
    let parts = pa_max_parts(ctx);
    if parts == 1 {
        return (0, 0, 0);
    }
    let rows = l.max_tokens * l.num_heads * parts;
    (rows * l.head_dim * 4, rows * 2 * 4, l.max_tokens * l.num_heads * 4)
}

impl CudaBackend {
    /// Checks the arguments both kernels share, then launches the tensor-core kernel where
    /// [`uses_tc`] says so and the f32 kernel otherwise.
    pub(super) fn attention(&self, a: &AttnArgs<'_, CudaBackend>, out: &mut CudaBuf) -> Result<()> {
        const OP: &str = "paged_attention";
        let g = a.geometry;
        let (t, h, kvh, d) = (a.num_tokens, a.num_heads, g.num_kv_heads, g.head_dim);
        if t == 0 || h == 0 || d == 0 {
            return Ok(());
        }
        if kvh == 0 || h % kvh != 0 {
            return Err(err(format!("{OP}: {h} query heads do not group evenly over {kvh} kv heads")));
        }
        if d > PA_MAX_D {
            return Err(err(format!("{OP}: head_dim = {d}, the kernel holds at most {PA_MAX_D}")));
        }
        if a.max_blocks == 0 || a.num_seqs == 0 {
            return Err(err(format!(
                "{OP}: no block table (num_seqs = {}, max_blocks = {})",
                a.num_seqs, a.max_blocks
            )));
        }
        need(a.q, Elem::F32, t * h * d, OP, "q")?;
        need(a.positions, Elem::U32, t, OP, "positions")?;
        need(a.token_seq, Elem::U32, t, OP, "token_seq")?;
        need(a.block_tables, Elem::U32, a.num_seqs * a.max_blocks, OP, "block_tables")?;
        need(out, Elem::F32, t * h * d, OP, "out")?;
        i32_of(g.slots(), OP, "num_blocks*block_size")?;
        i32_of(a.max_blocks * g.block_size, OP, "max_blocks*block_size")?;
        let kv = need_kv(a.k_cache, a.v_cache, g, OP)?;
        if uses_tc(kv, d, &self.switches) {
            return self.attention_tc(a, out, usize::from(d == 128) + 2 * usize::from(d == 256), kv);
        }
        let partial = &self.kernels.attn_partial[kv];
        let (ks, vs) = kv_scales(a.k_cache, a.v_cache);
        let parts = pa_max_parts(a.max_context.max(1));
        if parts > 65535 {
            return Err(err(format!("{OP}: max_context = {} is beyond {} tokens", a.max_context, 65535 * PA_PART)));
        }
        let ints = [t, h, kvh, d, g.block_size, g.num_blocks, a.num_seqs, a.max_blocks, parts];
        let names =
            ["T", "num_heads", "kv_heads", "head_dim", "block_size", "num_blocks", "num_seqs", "max_blocks", "parts"];
        let mut v = [0i32; 9];
        for i in 0..9 {
            v[i] = i32_of(ints[i], OP, names[i])?;
        }
        let [ti, hi, kvi, di, bsi, nbi, nsi, mbi, pi] = v;
        let window = i32_of(a.window, OP, "window")?;
        let pack = pa_pack(h / kvh);
        let grid = (u32_of(t, OP, "T")?, u32_of(h / pack, OP, "num_heads")?, parts as u32);
        let threads = PA_THREADS * pack as u32;
        if grid.1 > 65535 {
            return Err(err(format!("{OP}: {h} heads exceed a launch dimension")));
        }
        if parts == 1 {
            // Direct path: the scratch pointers are never touched; q stands in for them.
            let mut l = self.launch_args(&partial.f);
            l.arg(&*a.q.mem)
                .arg(&*a.k_cache.mem)
                .arg(&*a.v_cache.mem)
                .arg(&*a.positions.mem)
                .arg(&*a.token_seq.mem)
                .arg(&*a.block_tables.mem);
            l.arg(&mut *out.mem).arg(&*a.q.mem).arg(&*a.q.mem).arg(&*a.q.mem);
            l.arg(&ti)
                .arg(&hi)
                .arg(&kvi)
                .arg(&di)
                .arg(&bsi)
                .arg(&nbi)
                .arg(&nsi)
                .arg(&mbi)
                .arg(&pi)
                .arg(&a.scale)
                .arg(&window);
            if kv >= KV_FP8_E4M3 {
                l.arg(&ks).arg(&vs);
            }
            // SAFETY: as in embedding.
            let r = unsafe { l.launch(cfg(grid, threads)) };
            return self.launched(partial.name, r);
        }
        let mut s = self.scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        let out_bytes = t * h * parts * d * 4;
        let ml_bytes = t * h * parts * 2 * 4;
        let fixed = s.fixed;
        let grow = |slot: &mut Option<CudaSlice<u8>>, bytes: usize| -> Result<()> {
            if slot.as_ref().is_none_or(|b| b.len() < bytes) {
                if fixed {
                    return Err(err(format!("{OP}: {t} tokens x {h} heads x {parts} partitions need {bytes} bytes of scratch, beyond the workspace reserved at load (context or token limit exceeded)")));
                }
                // SAFETY: every partial the combining block reads is written first by its partition's block.
                *slot = Some(
                    unsafe { self.stream.alloc::<u8>(bytes) }
                        .map_err(drv(&format!("{OP}: scratch of {bytes} bytes")))?,
                );
            }
            Ok(())
        };
        grow(&mut s.part_out, out_bytes)?;
        grow(&mut s.part_ml, ml_bytes)?;
        let counter_bytes = t * h * 4;
        if s.counters.as_ref().is_none_or(|b| b.len() < counter_bytes) {
            if fixed {
                return Err(err(format!(
                    "{OP}: {t} tokens x {h} heads exceed the attention counters reserved at load"
                )));
            }
            s.counters = Some(
                self.stream
                    .alloc_zeros::<u8>(counter_bytes)
                    .map_err(drv(&format!("{OP}: counters of {counter_bytes} bytes")))?,
            );
        }
        let AttnScratch { part_out: Some(po), part_ml: Some(pm), counters: Some(cn), .. } = &mut *s else {
            return Err(err(format!("{OP}: scratch missing after allocation")));
        };
        let mut l = self.launch_args(&partial.f);
        l.arg(&*a.q.mem)
            .arg(&*a.k_cache.mem)
            .arg(&*a.v_cache.mem)
            .arg(&*a.positions.mem)
            .arg(&*a.token_seq.mem)
            .arg(&*a.block_tables.mem);
        // The last partition block of each (token, head) combines (kernels/paged_attention.cu).
        l.arg(&mut *out.mem).arg(&mut *po).arg(&mut *pm).arg(&mut *cn);
        l.arg(&ti)
            .arg(&hi)
            .arg(&kvi)
            .arg(&di)
            .arg(&bsi)
            .arg(&nbi)
            .arg(&nsi)
            .arg(&mbi)
            .arg(&pi)
            .arg(&a.scale)
            .arg(&window);
        if kv >= KV_FP8_E4M3 {
            l.arg(&ks).arg(&vs);
        }
        // SAFETY: as in embedding; scratch sized for [T, H, parts, D] and [T, H, parts, 2],
        // counters for [T, H].
        let r = unsafe { l.launch(cfg(grid, threads)) };
        self.launched(partial.name, r)
    }

    /// paged_attention_tc_d64 / _d128 / _d256 (`kernel` 0 / 1 / 2), or the tc_deep variant's, or
    /// tc's fp8 form over an fp8 cache (`kv`, `need_kv`'s index): the first `decode_tokens`
    /// tokens as split jobs (as many as the scratch holds: fewer changes no bit, only how the
    /// work is cut), the rest a chunk of `16 / min(gqa, 16)` tokens a warp. The caller has
    /// checked the arguments.
    fn attention_tc(&self, a: &AttnArgs<'_, CudaBackend>, out: &mut CudaBuf, kernel: usize, kv: usize) -> Result<()> {
        const OP: &str = "paged_attention";
        let g = a.geometry;
        let (t, h, kvh, d) = (a.num_tokens, a.num_heads, g.num_kv_heads, g.head_dim);
        let gqa = h / kvh;
        // At head_dim 256 each (token, head group) is two warp jobs, one a half of the output
        // dims, counted as groups of their own.
        let groups = kvh * gqa.div_ceil(16) * tc_halves(d);
        let tw = 16 / gqa.min(16);
        let var = tc_variant(kv, self.switches.attention, d);
        let deep = var == AttnVariant::TcDeep;
        let shared = var == AttnVariant::TcShared;
        let wgmma = var == AttnVariant::Wgmma;
        // The partition count (the split jobs' stride) follows the context bound alone: fixed
        // for a captured step padded to graph_max_context.
        let parts = tc_max_parts(a.max_context.max(1), var);
        let mut n_split = a.decode_tokens.min(t);
        let k = match var {
            AttnVariant::TcDeep => &self.kernels.attn_tc_deep[kernel],
            AttnVariant::TcShared => &self.kernels.attn_tc_shared[kernel],
            AttnVariant::Wgmma => match &self.wgmma_attn {
                Some(w) => &w[kernel],
                None => return Err(err(format!("{OP}: TANDEM_CUDA_ATTENTION=wgmma but its kernels were not loaded"))),
            },
            _ if kv >= KV_FP8_E4M3 => &self.kernels.attn_tc_fp8[kv - KV_FP8_E4M3][kernel],
            _ => &self.kernels.attn_tc[kernel],
        };
        let (ks, vs) = kv_scales(a.k_cache, a.v_cache);
        let mut s = self.scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        let (out_b, ml_b, cnt_b) = (h * parts * d * 4, h * tc_halves(d) * parts * 2 * 4, groups * 4);
        if parts > 1 && n_split > 0 {
            if s.fixed {
                let cap = |b: &Option<CudaSlice<u8>>, per: usize| b.as_ref().map_or(0, |b| b.len() / per);
                n_split = n_split.min(cap(&s.part_out, out_b)).min(cap(&s.part_ml, ml_b)).min(cap(&s.counters, cnt_b));
            } else {
                let grow = |slot: &mut Option<CudaSlice<u8>>, bytes: usize, zero: bool| -> Result<()> {
                    if slot.as_ref().is_none_or(|b| b.len() < bytes) {
                        *slot = Some(if zero {
                            self.stream
                                .alloc_zeros::<u8>(bytes)
                                .map_err(drv(&format!("{OP}: counters of {bytes} bytes")))?
                        } else {
                            // SAFETY: the combining job reads only partials written first by their jobs.
                            unsafe { self.stream.alloc::<u8>(bytes) }
                                .map_err(drv(&format!("{OP}: scratch of {bytes} bytes")))?
                        });
                    }
                    Ok(())
                };
                grow(&mut s.part_out, n_split * out_b, false)?;
                grow(&mut s.part_ml, n_split * ml_b, false)?;
                grow(&mut s.counters, n_split * cnt_b, true)?;
            }
        }
        let split = if parts > 1 { n_split } else { 0 };
        // tc: PAT_WARPS warp jobs a block; tc_deep: one; tc_shared: chunk blocks of
        // PATS_WARPS * tw tokens, then PAT_WARPS split jobs a block; wgmma: its chunk blocks of
        // PAW_ROW_WARPS * tw tokens (a whole row per head group: no halves at head_dim 256),
        // then tc's kernel for the split tokens alone (num_tokens = n_split: the same split
        // jobs tc's own launch runs, so the same bits).
        let per_block = if deep { 1 } else { PAT_WARPS };
        let tc_smem = if d == 256 { PAT_SMEM_D256 } else { PAT_WARPS * 2 * PAT_SUB * (d + 8) * 2 };
        let tc_threads = (PAT_WARPS * 32) as u32;
        // (kernel, tokens, blocks, threads, dynamic shared memory) of each launch, in order.
        let mut plan: Vec<(&Kernel<CudaFunction>, usize, usize, u32, usize)> = Vec::with_capacity(2);
        if wgmma {
            if t > n_split {
                let chunk_blocks = (t - n_split).div_ceil(PAW_ROW_WARPS * tw) * (kvh * gqa.div_ceil(16));
                plan.push((k, t, chunk_blocks, PAW_THREADS, PAW_SMEM[kernel]));
            }
            if n_split > 0 {
                let split_blocks = (n_split * groups * parts).div_ceil(PAT_WARPS);
                plan.push((&self.kernels.attn_tc[kernel], n_split, split_blocks, tc_threads, tc_smem));
            }
        } else {
            let block_count = if shared {
                (t - n_split).div_ceil(PATS_WARPS * tw) * groups + (n_split * groups * parts).div_ceil(PAT_WARPS)
            } else {
                let warps = (t - n_split).div_ceil(tw) * groups + n_split * groups * parts;
                warps.div_ceil(per_block)
            };
            let smem = match var {
                AttnVariant::TcDeep => PATD_SMEM[kernel],
                AttnVariant::TcShared => PATS_SMEM[kernel],
                _ => tc_smem,
            };
            plan.push((k, t, block_count, (per_block * 32) as u32, smem));
        }
        let names = [
            "T",
            "n_split",
            "num_heads",
            "kv_heads",
            "block_size",
            "num_blocks",
            "num_seqs",
            "max_blocks",
            "parts",
            "tw",
        ];
        let window = i32_of(a.window, OP, "window")?;
        for (kern, tokens, block_count, threads, smem) in plan {
            let blocks = u32_of(block_count, OP, "warp jobs a block")?;
            let ints = [tokens, n_split, h, kvh, g.block_size, g.num_blocks, a.num_seqs, a.max_blocks, parts, tw];
            let mut v = [0i32; 10];
            for i in 0..10 {
                v[i] = i32_of(ints[i], OP, names[i])?;
            }
            let mut l = self.launch_args(&kern.f);
            l.arg(&*a.q.mem)
                .arg(&*a.k_cache.mem)
                .arg(&*a.v_cache.mem)
                .arg(&*a.positions.mem)
                .arg(&*a.token_seq.mem)
                .arg(&*a.block_tables.mem);
            l.arg(&mut *out.mem);
            let sc = &mut *s;
            match (&mut sc.part_out, &mut sc.part_ml, &mut sc.counters) {
                (Some(po), Some(pm), Some(cn)) if split > 0 => {
                    l.arg(&mut *po).arg(&mut *pm).arg(&mut *cn);
                }
                // Nothing is split (one partition, or no split tokens): the scratch is never
                // touched; q stands in for it.
                _ if split == 0 => {
                    l.arg(&*a.q.mem).arg(&*a.q.mem).arg(&*a.q.mem);
                }
                _ => return Err(err(format!("{OP}: scratch missing after allocation"))),
            }
            for x in &v {
                l.arg(x);
            }
            l.arg(&a.scale).arg(&window);
            if kv >= KV_FP8_E4M3 {
                l.arg(&ks).arg(&vs);
            }
            let launch = LaunchConfig {
                grid_dim: (blocks.max(1), 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            // SAFETY: the argument list matches paged_attention_tc's (and the wgmma variant's,
            // the same; the fp8 form's: tc's, then the two scales); partials sized for [n_split, H, parts, D] and [n_split, H, parts, 2],
            // counters for [n_split, groups] (zeroed, and left zero by every launch); `tokens`
            // of the step's arrays; dynamic shared memory as the kernel's blocks use (tc_deep at
            // head_dim 128, tc_shared, wgmma, and tc at 256 past 48 KiB: opted in at load).
            let r = unsafe { l.launch(launch) };
            self.launched(kern.name, r)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod partition_tests {
    use super::*;

    /// The kernel's `pa_part_len` (kernels/paged_attention.cu), mirrored.
    fn part_len(ctx: usize) -> usize {
        ctx.div_ceil(PA_MAX_SPLITS).div_ceil(PA_MIN_PART).max(1) * PA_MIN_PART
    }

    /// Query heads per attention block: the largest divisor of the GQA group up to 4 (the
    /// emulator's `pa_pack` takes the same).
    #[test]
    fn heads_pack_by_the_largest_divisor_of_the_group_up_to_four() {
        let got: Vec<usize> = [1, 2, 3, 4, 5, 6, 7, 8, 12, 16].iter().map(|&g| pa_pack(g)).collect();
        assert_eq!(got, [1, 2, 3, 4, 1, 3, 1, 4, 4, 4]);
    }

    /// Every token with a context up to `ctx` fits the partitions the host launches and sizes
    /// its scratch for; and a decode context of a few hundred keys gets several partitions.
    #[test]
    fn max_parts_bounds_every_shorter_context() {
        let mut most = 0;
        for ctx in 1..=20_000usize {
            let len = part_len(ctx).min(PA_PART);
            assert!((PA_MIN_PART..=PA_PART).contains(&len), "ctx {ctx}: partition of {len}");
            most = most.max(ctx.div_ceil(len));
            assert!(most <= pa_max_parts(ctx), "ctx {ctx}: {most} partitions, host allows {}", pa_max_parts(ctx));
        }
        assert_eq!(pa_max_parts(64), 1, "a short context takes the direct path");
        assert_eq!(pa_max_parts(600), 10);
        assert_eq!(pa_max_parts(8192), 16);
        assert_eq!(pa_max_parts(8193), 17);
    }

    /// The tensor-core kernel's `pat_part_len`, mirrored: partitions of every context fit
    /// PAT_SPLITS and what the host launches, and a decode context of a few hundred keys gets
    /// several (the split is what fills the GPU at decode).
    #[test]
    fn tc_partitions_bound_every_shorter_context() {
        let tc_len = |ctx: usize| ctx.div_ceil(PAT_SPLITS).div_ceil(PAT_MIN_PART).max(1) * PAT_MIN_PART;
        let mut most = 0;
        for ctx in (1..=40_000usize).chain([131_072, 1 << 20]) {
            let len = tc_len(ctx);
            assert!(len >= PAT_MIN_PART && len % PAT_MIN_PART == 0, "ctx {ctx}: partition of {len}");
            most = most.max(ctx.div_ceil(len));
            assert!(
                most <= pat_max_parts(ctx) && most <= PAT_SPLITS,
                "ctx {ctx}: {most} partitions, host allows {}",
                pat_max_parts(ctx)
            );
        }
        assert_eq!(pat_max_parts(64), 1);
        assert_eq!(pat_max_parts(600), 10);
        assert_eq!(pat_max_parts(131_072), 16);
    }

    /// TANDEM_CUDA_ATTENTION's values, and a bad one named.
    #[test]
    fn attention_variants_parse() {
        assert_eq!(parse_variant(None), Ok(AttnVariant::Tc));
        assert_eq!(parse_variant(Some("tc")), Ok(AttnVariant::Tc));
        assert_eq!(parse_variant(Some("tc_deep")), Ok(AttnVariant::TcDeep));
        assert_eq!(parse_variant(Some("tc_shared")), Ok(AttnVariant::TcShared));
        assert_eq!(parse_variant(Some("f32")), Ok(AttnVariant::F32));
        assert_eq!(parse_variant(Some("wgmma")), Ok(AttnVariant::Wgmma));
        assert!(parse_variant(Some("deep")).unwrap_err().contains("tc_deep"));
    }

    /// TANDEM_CUDA_ATTENTION_FP8's values, a bad one named; an fp8 cache keeps the f32 kernel by
    /// default and takes tc's fp8 form with it, a bf16 cache is left alone.
    #[test]
    fn fp8_cache_switch() {
        assert_eq!(parse_fp8(None), Ok(false));
        assert_eq!(parse_fp8(Some("partial")), Ok(false));
        assert_eq!(parse_fp8(Some("tc")), Ok(true));
        assert!(parse_fp8(Some("1")).unwrap_err().contains("TANDEM_CUDA_ATTENTION_FP8=1: one of partial"));
        let mut sw = Switches::default();
        assert!(!uses_tc(KV_FP8_E4M3, 64, &sw) && !uses_tc(KV_FP8_E5M2, 128, &sw));
        assert!(uses_tc(KV_BF16, 64, &sw));
        sw.attention_fp8_tc = true;
        assert!(uses_tc(KV_FP8_E4M3, 64, &sw) && uses_tc(KV_FP8_E5M2, 128, &sw));
        assert!(uses_tc(KV_BF16, 64, &sw) && !uses_tc(KV_F32, 64, &sw));
    }

    /// TANDEM_CUDA_ATTENTION_D256's values, a bad one named; which kernel serves head_dim 256
    /// under each combination (partial by default; tc_deep has no d256 and runs tc; f32 wins).
    #[test]
    fn head_dim_256_switch() {
        assert_eq!(parse_d256(None), Ok(D256Variant::Partial));
        assert_eq!(parse_d256(Some("partial")), Ok(D256Variant::Partial));
        assert_eq!(parse_d256(Some("tc")), Ok(D256Variant::Tc));
        assert!(parse_d256(Some("tc_deep"))
            .unwrap_err()
            .contains("TANDEM_CUDA_ATTENTION_D256=tc_deep: one of partial"));
        assert!(!uses_tc_with(1, 256, AttnVariant::Tc, D256Variant::Partial));
        assert!(uses_tc_with(1, 256, AttnVariant::Tc, D256Variant::Tc));
        assert!(uses_tc_with(1, 256, AttnVariant::TcDeep, D256Variant::Tc));
        assert!(!uses_tc_with(1, 256, AttnVariant::F32, D256Variant::Tc));
        assert!(!uses_tc_with(0, 256, AttnVariant::Tc, D256Variant::Tc), "an f32 cache keeps the f32 kernel");
        assert!(!uses_tc_with(1, 96, AttnVariant::Tc, D256Variant::Tc));
        assert!(uses_tc_with(1, 128, AttnVariant::Tc, D256Variant::Partial), "the switch leaves 64 and 128 alone");
        for fp8 in [KV_FP8_E4M3, KV_FP8_E5M2] {
            // An fp8 cache takes tc's fp8 form where a bf16 cache takes tc, and tc for every variant.
            for d in [64, 128, 256, 96] {
                for v in
                    [AttnVariant::Tc, AttnVariant::TcDeep, AttnVariant::TcShared, AttnVariant::Wgmma, AttnVariant::F32]
                {
                    for d256 in [D256Variant::Partial, D256Variant::Tc] {
                        assert_eq!(
                            uses_tc_with(fp8, d, v, d256),
                            uses_tc_with(KV_BF16, d, v, d256),
                            "{fp8} {d} {v:?} {d256:?}"
                        );
                    }
                    assert_eq!(tc_variant(fp8, v, d), AttnVariant::Tc, "{v:?}: no fp8 form but tc's");
                }
            }
            assert!(!uses_tc_with(fp8, 128, AttnVariant::F32, D256Variant::Tc), "=f32 keeps the f32 kernel for fp8");
        }
        assert_eq!(tc_variant(KV_BF16, AttnVariant::TcDeep, 256), AttnVariant::Tc);
        assert_eq!(tc_variant(KV_BF16, AttnVariant::TcShared, 256), AttnVariant::Tc);
        assert_eq!(
            tc_variant(KV_BF16, AttnVariant::TcDeep, 128),
            AttnVariant::TcDeep,
            "tc_deep takes the window itself now"
        );
        assert_eq!(tc_variant(KV_BF16, AttnVariant::TcShared, 64), AttnVariant::TcShared);
        assert_eq!(
            tc_variant(KV_BF16, AttnVariant::Wgmma, 256),
            AttnVariant::Wgmma,
            "wgmma has its own head_dim-256 kernel"
        );
        // Four warps of (two K/V stages + q) x 16 rows x (256 + 8) bf16: past 48 KiB.
        assert_eq!(PAT_SMEM_D256, 101_376);
        assert_eq!((tc_halves(64), tc_halves(128), tc_halves(256)), (1, 1, 2));
    }

    /// tc_deep's `patd_part_len`, mirrored: at most PATD_SPLITS partitions, what the host
    /// launches; the same 64-key partitions as tc up to 1024 keys (the same bits), twice as
    /// many past 2048; and its shared memory is what the kernel's PatdCfg computes.
    #[test]
    fn tc_deep_partitions_bound_every_shorter_context() {
        let len = |ctx: usize, splits: usize| ctx.div_ceil(splits).div_ceil(PAT_MIN_PART).max(1) * PAT_MIN_PART;
        let mut most = 0;
        for ctx in (1..=40_000usize).chain([131_072, 1 << 20]) {
            let l = len(ctx, PATD_SPLITS);
            most = most.max(ctx.div_ceil(l));
            assert!(most <= tc_max_parts(ctx, AttnVariant::TcDeep) && most <= PATD_SPLITS, "ctx {ctx}");
            if ctx <= 1024 {
                assert_eq!(l, len(ctx, PAT_SPLITS), "ctx {ctx}: tc and tc_deep cut alike");
            }
        }
        assert_eq!(tc_max_parts(1024, AttnVariant::TcDeep), 16);
        assert_eq!(tc_max_parts(4096, AttnVariant::TcDeep), 32);
        assert_eq!(tc_max_parts(4096, AttnVariant::Tc), 16);
        assert_eq!(PATD_SMEM, [39_200, 56_600]);
    }

    /// tc_shared cuts partitions as tc does (the same bits), and its shared memory is what the
    /// kernel's PatsCfg computes (over 48 KiB at both head sizes: opted in at load).
    #[test]
    fn tc_shared_partitions_and_shared_memory() {
        for ctx in [1, 64, 1024, 4096, 131_072] {
            assert_eq!(tc_max_parts(ctx, AttnVariant::TcShared), tc_max_parts(ctx, AttnVariant::Tc), "ctx {ctx}");
        }
        assert_eq!(PATS_SMEM, [55_376, 69_696]);
        // The wgmma variant: tc's partitions, and kernels/paged_attention_sm90.cu's PawCfg<D>::SMEM
        // (kernels/emu/sm90_attention_test.cpp checks the same numbers), within the 227 KiB opt-in.
        for ctx in [1, 64, 65, 1024, 5000] {
            assert_eq!(tc_max_parts(ctx, AttnVariant::Wgmma), tc_max_parts(ctx, AttnVariant::Tc), "ctx {ctx}");
        }
        assert_eq!(PAW_SMEM, [98_560, 147_680, 213_184]);
        assert!(PAW_SMEM.iter().all(|&b| b <= 227 * 1024));
    }

    /// The tensor-core kernel's scratch follows the sequences, not the tokens: 2,048 tokens
    /// over a 131k context need what 64 decodes need (the f32 kernel's 4.3 GB is gone).
    #[test]
    fn tc_workspace_follows_the_decodes() {
        let l = WorkspaceLimits {
            max_tokens: 2048,
            max_seqs: 64,
            max_logit_rows: 192,
            max_context: 131_072,
            num_heads: 32,
            head_dim: 64,
            max_k: 8192,
            max_n: 128_256,
            kv_dtype: KvDtype::Bf16,
            moe: None,
        };
        assert_eq!(workspace(&l, &Switches::default()), (64 * 32 * 16 * 64 * 4, 64 * 32 * 16 * 2 * 4, 64 * 32 * 4));
        assert_eq!(workspace(&WorkspaceLimits { max_context: 64, ..l }, &Switches::default()), (0, 0, 0));
        let f32 = WorkspaceLimits { kv_dtype: KvDtype::F32, ..l };
        assert_eq!(workspace(&f32, &Switches::default()).0, 2048 * 32 * 256 * 64 * 4);
        // An fp8 cache runs the f32 kernel by default (its scratch), and under
        // TANDEM_CUDA_ATTENTION_FP8=tc tc's fp8 form: tc's scratch.
        let fp8_tc = Switches { attention_fp8_tc: true, ..Switches::default() };
        for kv_dtype in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
            assert_eq!(
                workspace(&WorkspaceLimits { kv_dtype, ..l }, &Switches::default()),
                workspace(&f32, &Switches::default())
            );
            assert_eq!(workspace(&WorkspaceLimits { kv_dtype, ..l }, &fp8_tc), workspace(&l, &Switches::default()));
        }
        // head_dim 96 has no tensor-core kernel: the f32 kernel's scratch.
        assert_eq!(workspace(&WorkspaceLimits { head_dim: 96, ..l }, &Switches::default()).2, 2048 * 32 * 4);
        // head_dim 256 under the default (TANDEM_CUDA_ATTENTION_D256 unset in tests): the f32
        // kernel's scratch too.
        if std::env::var_os("TANDEM_CUDA_ATTENTION_D256").is_none() {
            assert_eq!(workspace(&WorkspaceLimits { head_dim: 256, ..l }, &Switches::default()).2, 2048 * 32 * 4);
        }
    }
}
