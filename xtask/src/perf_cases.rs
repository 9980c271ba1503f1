//! The kernel lab's cases as launches of the performance model (perf_model.rs): each variant's
//! static facts (ptxas registers and shared memory on sm_90, pipeline stages, instructions per
//! mma from the SASS or ncu's counters) and, for a case (a GEMM m x n x k, a decode or prefill
//! attention, a sampler over a vocabulary), the grid, the mma work and the memory round trips
//! of one block, following the launchers in crates/cuda/src (gemm.rs, attention.rs, moe.rs).
//! The split-K rule is mirrored from crates/cuda/src/gemm.rs `k_slices` (xtask does not link
//! tandem-cuda); `k_slices_match_the_backend_table` holds the two together.

use crate::perf_model::{Kernel, Launch};

/// crates/cuda/src/gemm.rs' split-K constants.
const GEMM_BN: usize = 64;
const GEMM_BK: usize = 32;
const K_SLICE_TARGET_BLOCKS: usize = 264;
const K_SLICE_MIN: usize = 256;
const SPLIT_MAX_ROWS: usize = 128;

/// (slices, slice length) of an n x k GEMM: crates/cuda/src/gemm.rs `k_slices`.
pub fn k_slices(n: usize, k: usize) -> (usize, usize) {
    let n_tiles = n.div_ceil(GEMM_BN).max(1);
    let want = K_SLICE_TARGET_BLOCKS.div_ceil(n_tiles);
    let by_k = (k / K_SLICE_MIN).max(1);
    let s = want.min(by_k);
    let len = k.div_ceil(s).div_ceil(GEMM_BK).max(1) * GEMM_BK;
    (k.div_ceil(len).max(1), len)
}

/// A GEMM tile kernel: its tile, and the kernel facts.
#[derive(Clone, Copy, Debug)]
pub struct Tile {
    pub rows: usize,
    pub cols: usize,
    pub kernel: Kernel,
}

const SRC_SASS_OCC2: &str = "SASS main loop (kernels/matmul.cu: 152 per 16 HMMA)";
const SRC_ASSUMED_M64: &str = "assumed: m64's ncu figure (same tile code)";

/// Every GEMM tile variant the lab can name (crates/cuda/src/gemm.rs GEMM_SUFFIXES and the
/// wgmma kernel). Registers: ptxas 13.0 for sm_90 on kernels/matmul.cu as of 2026-12-06 (the
/// cubin's EIATTR_REGCOUNT; ncu's 2026-12-04 figures, 158-164, agree within a few); shared
/// memory: gemm.rs (the GEMV variants' at k = 2048).
/// Instructions per mma: ncu's executed instructions over the mma count of the 2026-12-04
/// profiles (m128, m128_n128, m64), the SASS counts written up in kernels/matmul.cu (m128_occ2,
/// m128_w64), else the figure of the kernel sharing its tile code, marked "assumed".
pub const TILES: [Tile; 11] = [
    tile("m16", 16, 64, 128, 80, 4 * (16 + 64) * 80, 4, 29.0, SRC_ASSUMED_M64),
    tile("m16_s8", 16, 64, 128, 96, 8 * (16 + 64) * 80, 8, 29.0, SRC_ASSUMED_M64),
    tile("m16_x1", 16, 64, 128, 72, 4 * 64 * 80 + 16 * 65 * 4 + 16 * 2056 * 2, 4, 29.0, SRC_ASSUMED_M64),
    tile("m16_gemv4", 16, 64, 128, 126, 16 * 65 * 4 + 16 * 2056 * 2, 4, 29.0, SRC_ASSUMED_M64),
    tile("m16_gemv8", 16, 64, 128, 184, 16 * 65 * 4 + 16 * 2056 * 2, 8, 29.0, SRC_ASSUMED_M64),
    tile("m64", 64, 64, 128, 159, 4 * (64 + 64) * 80, 4, 29.0, "ncu counters, m=64 qkv (fold included)"),
    tile("m64_occ4", 64, 64, 128, 126, 3 * (64 + 64) * 80 + 64 * 64 * 4, 3, 29.0, SRC_ASSUMED_M64),
    tile("m128", 128, 64, 256, 164, 3 * (128 + 64) * 80, 3, 21.9, "ncu counters, m=2048 qkv"),
    tile("m128_occ2", 128, 64, 256, 126, 4 * (128 + 64) * 80 + 128 * 64 * 4, 4, 9.5, SRC_SASS_OCC2),
    tile("m128_n128", 128, 128, 256, 165, 4 * (128 + 128) * 80 + 128 * 128 * 4, 4, 11.9, "ncu counters, m=2048 qkv"),
    tile(
        "m128_w64",
        128,
        128,
        128,
        238,
        6 * (128 + 128) * 80 + 128 * 128 * 4,
        6,
        2.33,
        "SASS main loop (kernels/matmul.cu: 298 per 128 HMMA)",
    ),
];

/// The wgmma + TMA kernel (kernels/matmul_sm90.cu): 128 x 128 tiles, 384 threads, 4 stages;
/// one wgmma m64n128k16 is 64 mma.sync m16n8k16's work, so a handful of instructions per 64.
pub const WGMMA: Tile = tile(
    "wgmma",
    128,
    128,
    384,
    167,
    1024 + 4 * 2 * 128 * 64 * 2 + 64 + 8 * 16 * 129 * 4,
    4,
    0.25,
    "assumed: ~16 instructions per wgmma (64 mma equivalents)",
);

/// The persistent, warp-specialised wgmma kernels (kernels/matmul_sm90.cu `matmul_wgmma_ws*`):
/// 128 x 128 tiles (4 stages), or 128 x 256 (3 stages, [`WGMMA_WS_WIDE`]) where the GEMM has one
/// K slice; one block an SM at most, each walking its tiles with the pipeline kept full across
/// them. Registers: launch bound 384 x 1 (168), the wide tiles' consumers 232 by setmaxnreg.
pub const WGMMA_WS: Tile = tile(
    "wgmma_ws",
    128,
    128,
    384,
    168,
    1024 + 4 * 2 * 128 * 64 * 2 + 64 + 8 * 16 * 129 * 4,
    4,
    0.25,
    "assumed: the wgmma kernel's figure (the same k loop)",
);
pub const WGMMA_WS_WIDE: Tile = tile(
    "wgmma_ws",
    128,
    256,
    384,
    168,
    1024 + 3 * (128 + 256) * 64 * 2 + 48 + 8 * 16 * 129 * 4,
    3,
    0.25,
    "assumed: the wgmma kernel's figure (the same k loop)",
);
/// SMs of the H200 the persistent grid covers.
const SMS: usize = 132;

#[allow(clippy::too_many_arguments)] // a table row: every field is one column of TILES
const fn tile(
    name: &'static str,
    rows: usize,
    cols: usize,
    threads: usize,
    regs: usize,
    smem: usize,
    stages: usize,
    ipm: f64,
    ipm_source: &'static str,
) -> Tile {
    Tile {
        rows,
        cols,
        kernel: Kernel { name, threads, regs, smem, stages, ipm, ipm_source, wgmma: false, mma_sync: true },
    }
}

pub fn tile_named(name: &str) -> Option<Tile> {
    if name == "wgmma" || name == "wgmma_ws" {
        let mut w = if name == "wgmma" { WGMMA } else { WGMMA_WS };
        w.kernel.wgmma = true;
        w.kernel.mma_sync = false;
        w.kernel.mma_sync = false;
        return Some(w);
    }
    TILES.iter().find(|t| t.kernel.name == name).copied()
}

/// One m x n x k bf16 GEMM on `t` (f32 out, as the lab's plain epilogue). Split K (m <= 128,
/// more than one slice) runs one block per slice and adds a fold: the arrival counter and the
/// last block's read of every partial. The wgmma kernel never splits. `x_f32`: x stored in
/// f32 (the o projection's input): up to 128 rows the tile kernel loads and rounds it itself,
/// by plain loads outside the cp.async pipeline (above 16 rows a round trip a k tile); above 128, a matmul_x
/// launch rounds it first (a second launch, x read in f32 and written in bf16).
pub fn gemm(t: &Tile, m: usize, n: usize, k: usize, x_f32: bool) -> Launch {
    let (slices, slice_len) = k_slices(n, k);
    if t.kernel.name == "wgmma_ws" {
        return gemm_persistent(t, m, n, k, x_f32, slices == 1);
    }
    let split = m <= SPLIT_MAX_ROWS && slices > 1 && !t.kernel.wgmma;
    let row_tiles = m.div_ceil(t.rows);
    let blocks = n.div_ceil(t.cols) * row_tiles * if split { slices } else { 1 };
    let k_range = if split { slice_len } else { k };
    let k_tiles = k_range.div_ceil(GEMM_BK) as f64;
    let mmas = (t.rows * t.cols) as f64 * k_range as f64 / (16.0 * 8.0 * 16.0);
    // f32 x by plain loads: a round trip a k tile on the 64-row tiles; up to 16 rows (at most 2
    // KB a k tile) the timings show it costs next to nothing (o against qkv at m = 1: +1.5 us).
    let x_trips = x_f32 && m > 16 && m <= SPLIT_MAX_ROWS;
    let refills = if x_trips { k_tiles } else { (k_tiles / t.kernel.stages as f64).ceil() };
    let trips = 1.0 + refills + if split { 1.0 } else { 0.0 };
    let pre = x_f32 && m > SPLIT_MAX_ROWS;
    // The fold: the tile's last block adds the other slices' partial tiles in index order,
    // one dependent L2 round a slice.
    let fold_rounds = if split { (slices - 1) as f64 } else { 0.0 };
    let padded_m = (row_tiles * t.rows) as f64;
    let tiles = (row_tiles * n.div_ceil(t.cols)) as f64;
    Launch {
        kernel: t.kernel,
        blocks,
        mmas_per_block: mmas,
        trips_per_block: trips,
        fold_rounds,
        longest: 1.0,
        dram_bytes: (n * k * 2 + m * k * 2 + m * n * 4 + if pre { m * k * 6 } else { 0 }) as f64,
        l2_bytes: tiles * ((t.rows + t.cols) * k * 2) as f64,
        tensor_flops: 2.0 * padded_m * n as f64 * k as f64,
        launches: if pre { 2 } else { 1 },
    }
}

/// [`gemm`] on the persistent kernels: min(tiles, SMs) blocks, each walking ceil(tiles /
/// blocks) tiles back to back (its mmas and pipeline refills add up; one first trip a block).
fn gemm_persistent(t: &Tile, m: usize, n: usize, k: usize, x_f32: bool, wide: bool) -> Launch {
    let mut w = if wide { WGMMA_WS_WIDE } else { *t };
    w.kernel.wgmma = true;
    w.kernel.mma_sync = false;
    let tiles = m.div_ceil(w.rows) * n.div_ceil(w.cols);
    let blocks = tiles.clamp(1, SMS);
    let per_block = tiles.div_ceil(blocks) as f64;
    let k_tiles = k.div_ceil(GEMM_BK) as f64;
    let pre = x_f32 && m > SPLIT_MAX_ROWS;
    Launch {
        kernel: w.kernel,
        blocks,
        mmas_per_block: per_block * (w.rows * w.cols) as f64 * k as f64 / (16.0 * 8.0 * 16.0),
        trips_per_block: 1.0 + per_block * (k_tiles / w.kernel.stages as f64).ceil(),
        fold_rounds: 0.0,
        longest: 1.0,
        dram_bytes: (n * k * 2 + m * k * 2 + m * n * 4 + if pre { m * k * 6 } else { 0 }) as f64,
        l2_bytes: tiles as f64 * ((w.rows + w.cols) * k * 2) as f64,
        tensor_flops: 2.0 * (m.div_ceil(w.rows) * w.rows) as f64 * n as f64 * k as f64,
        launches: if pre { 2 } else { 1 },
    }
}

/// The attention shape of a model (query heads, KV heads, head_dim).
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}
pub const LLAMA_1B: AttnShape = AttnShape { heads: 32, kv_heads: 8, head_dim: 64 };
pub const LLAMA_8B: AttnShape = AttnShape { heads: 32, kv_heads: 8, head_dim: 128 };
pub const GEMMA3_1B: AttnShape = AttnShape { heads: 4, kv_heads: 1, head_dim: 256 };

/// The attention variants (crates/cuda/src/attention.rs): warps a block, keys a stage, stages,
/// partitions at most, and the kernel facts. Registers: ptxas 13.0 for sm_90 (tandem-kernels-check
/// on 2026-12-06: tc 168 / 210 / 243 at d64 / d128 / d256, tc_deep 168, tc_shared 168 / 210,
/// partial 40 with 17024 bytes of static shared memory). Instructions per mma: ncu's counters on
/// tc_d64's decode (0.60 IPC x 5678 cycles x 132 SMs over 16384 mma), the same figure assumed
/// for the others; `partial` is SIMT: its "mma" is one key x 32 dims of one head (a warp FMA
/// step), 3 instructions each assumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnVariant {
    Tc,
    TcDeep,
    TcShared,
    /// kernels/paged_attention_sm90.cu (prefill chunks on wgmma; decodes as tc).
    Wgmma,
    Partial,
}

const TC_IPM: f64 = 27.0;

fn attn_kernel(v: AttnVariant, d: usize) -> (Kernel, usize, usize) {
    // (kernel, warps a block, partitions at most)
    let k = |name, threads, regs, smem, stages, ipm, src| Kernel {
        name,
        threads,
        regs,
        smem,
        stages,
        ipm,
        ipm_source: src,
        wgmma: false,
        mma_sync: true,
    };
    const SRC: &str = "ncu counters, tc_d64 decode b1 ctx 1024";
    const ASSUMED: &str = "assumed: tc_d64's ncu figure";
    match (v, d) {
        (AttnVariant::Tc, 256) => (k("tc_d256", 128, 243, 4 * 3 * 16 * 264 * 2, 2, TC_IPM, ASSUMED), 4, 16),
        (AttnVariant::Tc, _) => {
            (k("tc", 128, if d == 64 { 168 } else { 210 }, 4 * 2 * 16 * (d + 8) * 2, 2, TC_IPM, SRC), 4, 16)
        }
        (AttnVariant::TcDeep, _) => {
            let (stages, smem) = if d == 64 { (8, 17 * 16 * 72 * 2 + 32) } else { (6, 13 * 16 * 136 * 2 + 24) };
            (k("tc_deep", 32, 168, smem, stages, TC_IPM, ASSUMED), 1, 32)
        }
        (AttnVariant::TcShared, _) => {
            let (stages, smem) = if d == 64 { (3, 3 * 2 * 64 * 72 * 2 + 80) } else { (2, 2 * 2 * 64 * 136 * 2 + 64) };
            (k("tc_shared", 128, if d == 64 { 168 } else { 210 }, smem, stages, TC_IPM, ASSUMED), 4, 16)
        }
        // 384 threads (a producer warpgroup, two consumers of 4 row warps each: `per block` counts
        // the 8 row warps), launch bound 384 x 1 (168 registers), one 64-key K and V^T tile a
        // stage. Its per-tile SIMT work (mask, softmax, fold) is tc's; what goes is the mma.sync
        // and ldmatrix issue, one wgmma standing for 32-64 mma.sync's.
        (AttnVariant::Wgmma, _) => {
            let stages = match d {
                64 => 4,
                128 => 3,
                _ => 2,
            };
            let smem = 128 + stages * 2 * 64 * d * 2 + 2 * 64 * d * 2 + 2 * 64 * 64 * 2 + stages * 32;
            let mut kern = k(
                "attn_wgmma",
                384,
                168,
                smem,
                stages,
                TC_IPM - 1.5,
                "assumed: tc_d64's ncu figure less its mma.sync and ldmatrix issue",
            );
            kern.wgmma = true;
            (kern, 8, 16)
        }
        (AttnVariant::Partial, _) => {
            let simt = k("partial", 128, 64, d * 4 * 4, 1, 3.0, "assumed: 3 instructions a warp FMA step");
            (Kernel { mma_sync: false, ..simt }, 4, 16)
        }
    }
}

/// Decode attention: `batch` sequences of `ctx` keys each, one query token each (split jobs:
/// the context cut into partitions of at least 64 keys, each partition a warp job of 16
/// (token, head) rows of one KV head; the last job to arrive folds the partials).
pub fn attention_decode(v: AttnVariant, s: AttnShape, batch: usize, ctx: usize) -> Launch {
    let (kernel, per_block, splits) = attn_kernel(v, s.head_dim);
    let d = s.head_dim;
    let gqa = s.heads / s.kv_heads;
    let kv_bytes = (batch * s.kv_heads * ctx * d * 2 * 2) as f64;
    if v == AttnVariant::Partial {
        // One block per (token, head pack of up to 4, partition of 64-512 keys), K/V widened to
        // f32 in registers: 64 threads x 4 heads.
        let pack = (1..=4).rev().find(|p| gqa.is_multiple_of(*p)).unwrap_or(1);
        let parts = if ctx <= 16 * 512 { 16.min(ctx.div_ceil(64)) } else { ctx.div_ceil(512) };
        let keys = ctx.div_ceil(parts);
        let blocks = batch * (s.heads / pack) * parts;
        let steps = (keys * pack * 2 * d.div_ceil(32)) as f64;
        return Launch {
            kernel,
            blocks,
            mmas_per_block: steps,
            trips_per_block: 2.0 + (keys as f64 / 16.0).ceil(),
            fold_rounds: if parts > 1 { (parts - 1) as f64 } else { 0.0 },
            longest: 1.0,
            dram_bytes: kv_bytes,
            l2_bytes: (blocks / pack.max(1) * keys * d * 2 * 2) as f64,
            tensor_flops: 0.0,
            launches: 1,
        };
    }
    let halves = if d > 128 { 2 } else { 1 };
    let groups = s.kv_heads * gqa.div_ceil(16) * halves;
    let parts = splits.min(ctx.div_ceil(64)).max(1);
    let keys = ctx.div_ceil(parts);
    let warps = batch * groups * parts;
    let blocks = warps.div_ceil(per_block);
    // Per warp job: scores 16 x keys x d and the PV product 16 x (d / halves) x keys.
    let mma_warp = (16 * keys * d) as f64 / 2048.0 + (16 * keys * d / halves) as f64 / 2048.0;
    let sub_tiles = keys.div_ceil(16) as f64;
    let trips = 1.0 + (sub_tiles / kernel.stages as f64).ceil() + if parts > 1 { 1.0 } else { 0.0 };
    // The last job of a row group folds the other partitions' partials in order, one
    // dependent L2 round a partition.
    let fold_rounds = if parts > 1 { (parts - 1) as f64 } else { 0.0 };
    Launch {
        kernel,
        blocks,
        mmas_per_block: mma_warp * per_block as f64,
        trips_per_block: trips,
        fold_rounds,
        longest: 1.0,
        dram_bytes: kv_bytes,
        l2_bytes: kv_bytes,
        tensor_flops: 2.0 * 2.0 * (batch * s.kv_heads * 16 * ctx * d) as f64,
        launches: 1,
    }
}

/// Decode attention over an fp8 KV cache (`--kv-cache-dtype fp8`), reading one byte a K/V
/// element (half the DRAM and L2 bytes of a bf16 cache). `Tc`: tc's fp8 form
/// (kernels/paged_attention_fp8.cu), which crates/cuda/src/attention.rs takes for an fp8 cache
/// where tc serves bf16: tc's work plus each byte decoded into its shared-memory stage, 4
/// elements a lane per mma step (assumed: 15 instructions an element). `Partial`: the f32
/// kernel (TANDEM_CUDA_ATTENTION=f32), decoding each byte in registers (assumed: twice the
/// partial kernel's instructions a warp FMA step).
pub fn attention_decode_fp8(v: AttnVariant, s: AttnShape, batch: usize, ctx: usize) -> Launch {
    let mut l = attention_decode(v, s, batch, ctx);
    l.dram_bytes /= 2.0;
    l.l2_bytes /= 2.0;
    if v == AttnVariant::Partial {
        l.kernel.name = "partial_fp8";
        l.kernel.ipm *= 2.0;
        l.kernel.ipm_source = "assumed: twice partial's 3 instructions a warp FMA step (the byte's decode)";
    } else {
        l.kernel.name = "tc_fp8";
        l.kernel.ipm += 4.0 * 15.0;
        l.kernel.ipm_source =
            "assumed: tc's ncu figure plus 4 decoded elements a lane a mma step, 15 instructions each";
    }
    l
}

/// Prefill attention: one sequence of `tokens` tokens, causal (chunk jobs of 16 rows: 16 / gqa
/// tokens of one KV head group, walking the keys up to their last token; tc_shared: blocks of
/// 4 such jobs over consecutive tokens sharing each 64-key tile; wgmma: blocks of 8, whole rows
/// at head_dim 256, no halves).
pub fn attention_prefill(v: AttnVariant, s: AttnShape, tokens: usize) -> Launch {
    let (kernel, per_block, _) = attn_kernel(v, s.head_dim);
    let d = s.head_dim;
    let gqa = s.heads / s.kv_heads;
    let wgmma = v == AttnVariant::Wgmma;
    let halves = if d > 128 && !wgmma { 2 } else { 1 };
    let groups = s.kv_heads * gqa.div_ceil(16) * halves;
    let tw = 16 / gqa.min(16);
    let jobs = tokens.div_ceil(tw) * groups;
    let blocks = jobs.div_ceil(per_block);
    // The average job walks half the prompt (rounded to 64-key tiles); the longest the whole.
    let keys = (tokens as f64 / 2.0 / 64.0).ceil() * 64.0 + 32.0;
    let mma_warp = 16.0 * keys * d as f64 / 2048.0 * (1.0 + 1.0 / halves as f64);
    let keys_a_trip = if v == AttnVariant::TcShared || wgmma { 64.0 } else { 16.0 };
    let trips = 1.0 + (keys / keys_a_trip / kernel.stages as f64).ceil();
    // Each job reads the K/V of its keys (tc_shared, wgmma: once for the block's 4 / 8 jobs).
    let sharing = if v == AttnVariant::TcShared || wgmma { per_block as f64 } else { 1.0 };
    let longest_keys = (tokens as f64 / 64.0).ceil() * 64.0;
    Launch {
        kernel,
        blocks,
        mmas_per_block: mma_warp * per_block as f64,
        trips_per_block: trips,
        fold_rounds: 0.0,
        longest: longest_keys / keys,
        dram_bytes: (tokens * s.kv_heads * d * 2 * 2 + tokens * s.heads * d * 8) as f64,
        l2_bytes: jobs as f64 * keys * (d * 2 * 2) as f64 / sharing,
        tensor_flops: 2.0 * 2.0 * jobs as f64 * 16.0 * keys * d as f64,
        launches: 1,
    }
}

/// The samplers and argmax (kernels/sampling.cu, argmax.cu) over `batch` rows of `vocab` f32
/// logits: `passes` reads of the row by one CTA of 256 threads (bisect: 32 top-k + 32 top-p
/// bisection passes and the draw; radix: 4 + 8 and the draw; multi: 64 CTAs a row, 12 launches,
/// 4 + 6 passes over a 64th of the row each). The row (513 KB at 128256) stays in L2: each
/// pass streams it through the CTA at 4 loads of 16 bytes a thread in flight, one dependent L2
/// round (`fold_round_us`) each; the first read comes from DRAM. SIMT steps: one per element a
/// pass, 8 instructions each assumed. Coarse: no sampler has been timed.
pub fn sampler(name: &'static str, batch: usize, vocab: usize) -> Launch {
    let (ctas, passes, launches) = match name {
        "argmax" => (1, 1.0, 1),
        "argmax_multi" => (vocab.div_ceil(4096), 1.0, 2),
        "sample_bisect" => (1, 66.0, 1),
        "sample_radix" => (1, 14.0, 1),
        "sample_multi" => (64, 11.0, 12),
        _ => (1, 1.0, 1),
    };
    let per_cta = vocab.div_ceil(ctas);
    let kernel = Kernel {
        name,
        threads: 256,
        regs: 64,
        smem: 8192,
        stages: 1,
        ipm: 8.0 / 32.0,
        ipm_source: "assumed: 8 instructions an element a pass",
        wgmma: false,
        mma_sync: false,
    };
    Launch {
        kernel,
        blocks: batch * ctas,
        mmas_per_block: passes * per_cta as f64,
        trips_per_block: (per_cta as f64 * 4.0 / (256.0 * 64.0)).ceil(),
        fold_rounds: passes * (per_cta as f64 * 4.0 / (256.0 * 64.0)).ceil(),
        longest: 1.0,
        dram_bytes: (batch * vocab * 4) as f64,
        l2_bytes: passes * (batch * vocab * 4) as f64,
        tensor_flops: 0.0,
        launches,
    }
}

/// A routed mixture-of-experts layer's two grouped GEMMs (kernels/moe.cu; crates/cuda/src/moe.rs
/// `routed_bm`, `routed_rows`): `tokens` x `top_k` rows over `experts` experts of `inter`
/// columns, gate/up (2 inter wide) then down, each expert's segment padded to the row tile,
/// routing spread evenly. Returns (gate/up, down).
pub fn moe(tokens: usize, experts: usize, top_k: usize, hidden: usize, inter: usize) -> (Launch, Launch) {
    let bm = if tokens * top_k > 16 * experts { 64 } else { 16 };
    let pairs = tokens * top_k.min(experts);
    let padded = (pairs + pairs.min(experts) * (bm - 1)).div_ceil(bm) * bm;
    let used = pairs.min(experts);
    let t = tile_named(if bm == 16 { "m16" } else { "m64" }).expect("a tile of the table");
    let grouped = |n: usize, k: usize| {
        // One row tile's GEMM (split K as a plain GEMM of bm rows), repeated over the padded
        // layout's row tiles; every used expert's weights read once from DRAM.
        let mut l = gemm(&t, bm, n, k, false);
        let row_tiles = (padded / bm) as f64;
        l.blocks *= padded / bm;
        l.l2_bytes *= row_tiles;
        l.tensor_flops *= row_tiles;
        l.dram_bytes = (used * n * k * 2 + padded * k * 2 + padded * n * 4) as f64;
        l.trips_per_block += 1.0; // the tile-to-expert map and the gathered rows
        l.kernel.name = if bm == 16 { "moe_gemm_m16" } else { "moe_gemm_m64" }; // its own code size
        l
    };
    (grouped(2 * inter, hidden), grouped(hidden, inter))
}

/// A kept block layout as the quant kernel sees it: (name, values a block, bytes a block).
pub type QuantBlocks = (&'static str, usize, usize);
pub const Q4_K: QuantBlocks = ("q4_k", 256, 144);
pub const Q8_0: QuantBlocks = ("q8_0", 32, 34);
/// Int4 in groups of 128 (AWQ's and GPTQ's usual group): an f32 scale, a zero byte, 3 bytes of
/// padding and 64 bytes of nibbles (tandem_core::int4).
pub const INT4_G128: QuantBlocks = ("int4_g128", 128, 72);

/// FP8 e4m3 as runs of 32 values, each led by its f32 scale (tandem_core::fp8::pack_blocks).
pub const FP8: QuantBlocks = ("fp8", 32, 36);

/// crates/cuda/src/quant.rs' grid: output columns (a warp each) and x rows a block.
const QM_WARPS: usize = 4;
const QM_ROWS: usize = 8;

/// The weight's bytes in layout `q`: what a decode step must read (the quantized floor's bytes).
pub fn quant_weight_bytes(q: QuantBlocks, n: usize, k: usize) -> f64 {
    (n * k / q.1 * q.2) as f64
}

/// One m x n x k matmul on a weight kept in `q` (kernels/quant_matmul.cu): a warp per output
/// column and 8 rows of x, each lane decoding a 32-value unit at a time and adding its products
/// per row; a block's weight rows are read once per 8-row block of x (L2 above the first).
/// A SIMT kernel: its "mmas" are a lane's element-steps (k / 32 a warp, four warps a block),
/// each about 6 instructions to decode the weight value plus 4 a row of x (load, widen,
/// multiply, add: --fmad=false). Registers: ptxas 13.0 for sm_90 on kernels/quant_matmul.cu
/// (2026-12-07: 64 for q4_k, q8_0 and the int4 groups, no spills).
pub fn quant_gemv(q: QuantBlocks, m: usize, n: usize, k: usize) -> Launch {
    let rows = m.min(QM_ROWS);
    let row_blocks = m.div_ceil(QM_ROWS);
    let w = quant_weight_bytes(q, n, k);
    let kernel = Kernel {
        name: q.0,
        threads: 32 * QM_WARPS,
        regs: 64,
        smem: 0,
        stages: 1,
        ipm: 6.0 + 4.0 * rows as f64,
        ipm_source: "assumed: 6 instructions to decode a weight value, 4 a row of x",
        wgmma: false,
        mma_sync: false,
    };
    Launch {
        kernel,
        blocks: n.div_ceil(QM_WARPS) * row_blocks,
        mmas_per_block: (QM_WARPS * k / 32) as f64,
        // A lane's units one after another: a dependent round trip a unit (32 lanes: 1024 values).
        trips_per_block: 1.0 + k.div_ceil(1024) as f64,
        fold_rounds: 0.0,
        longest: 1.0,
        dram_bytes: w + (m * k * 4 + m * n * 4) as f64,
        l2_bytes: w * row_blocks as f64 + (n.div_ceil(QM_WARPS) * row_blocks * rows * k * 4) as f64,
        tensor_flops: 0.0,
        launches: 1,
    }
}

/// crates/cuda/src/quant_mma.rs' tile: output columns and warps a block.
const QT_BN: usize = 64;
const QT_WARPS: usize = 4;

/// One m x n x k matmul on quantized weights through kernels/quant_mma.cu
/// (`TANDEM_CUDA_QUANT_TC=1`): a block owns 64 columns and 16 (m <= 16) or 64 rows; each
/// stage of k (128 wide in the m16 tile, 32 in the m64 tile) it rounds x's tile to bf16 and
/// decodes the weight's 64 x BK tile into shared memory (two threads a column, 16 values each
/// 32-wide step), a barrier, then each warp's mmas: (rows / 16) x 2 fragments x BK / 16 k16
/// steps, plus one all-ones mma a fragment a k16 step for the x-sums of the layouts with a min
/// (Q4_1, Q5_1, Q4_K, Q5_K). Single-buffered: every stage is a dependent round trip (load,
/// barrier, mma, barrier). The weight is read once per row block (L2 above the first), x once
/// per column block. Instructions per mma are assumed: about 8 a decoded weight value and 8 an
/// x element staged, 4 a fragment load, over the block's mmas of a stage. Registers: ptxas
/// 13.0 for sm_90 on kernels/quant_mma.cu (2026-12-07, no spills: m16 int4_g128 56, q4_k 72,
/// fp8 64; m64 int4_g128 123, q4_k 96, fp8 80; shared memory m16 23808, 25856 with a min, m64
/// 10752, 11264 with a min).
pub fn quant_mma(q: QuantBlocks, m: usize, n: usize, k: usize) -> Launch {
    let bm = if m <= 16 { 16 } else { 64 };
    let bk = if bm == 16 { 128 } else { 32 };
    let frags = bm / 16;
    let row_blocks = m.div_ceil(bm);
    let col_blocks = n.div_ceil(QT_BN);
    let w = quant_weight_bytes(q, n, k);
    let steps = k.div_ceil(bk);
    let min = matches!(q.0, "q4_1" | "q5_1" | "q4_k" | "q5_k");
    let mmas_per_step = (frags * (2 + min as usize) * QT_WARPS * (bk / 16)) as f64;
    let warp_instr_per_step =
        (8 * QT_BN * bk + 8 * bm * bk) as f64 / 32.0 + (QT_WARPS * (bk / 16) * (4 + 4 * frags)) as f64;
    let kernel = Kernel {
        name: if bm == 16 { "quant_mma_m16" } else { "quant_mma_m64" },
        threads: 32 * QT_WARPS,
        regs: match (q.0, bm) {
            ("int4_g128", 16) => 56,
            ("q4_k", 16) => 72,
            ("int4_g128", _) => 123,
            ("q4_k", _) => 96,
            (_, 16) => 64,
            _ => 80,
        },
        smem: (bm + QT_BN) * (bk + 8) * 2 + (1 + min as usize) * (bk / 16) * QT_BN * 4,
        stages: 1,
        ipm: warp_instr_per_step / mmas_per_step,
        ipm_source: "assumed: 8 instructions a decoded weight value, 8 a staged x element, 4 a fragment load",
        wgmma: false,
        mma_sync: true,
    };
    Launch {
        kernel,
        blocks: col_blocks * row_blocks,
        mmas_per_block: mmas_per_step * steps as f64,
        trips_per_block: 1.0 + steps as f64,
        fold_rounds: 0.0,
        longest: 1.0,
        dram_bytes: w + (m * k * 4 + m * n * 4) as f64,
        l2_bytes: w * row_blocks as f64 + (col_blocks * m * k * 4) as f64,
        tensor_flops: 2.0 * (row_blocks * bm * col_blocks * QT_BN * k) as f64,
        launches: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of crates/cuda/src/gemm.rs `k_slices_depend_on_n_and_k_only`.
    #[test]
    fn k_slices_match_the_backend_table() {
        let table = [
            ((72, 40), (1, 64)),
            ((72, 1000), (3, 352)),
            ((200, 1000), (3, 352)),
            ((2048, 2048), (8, 256)),
            ((128256, 2048), (1, 2048)),
            ((4096, 14336), (5, 2880)),
            ((72, 0), (1, 32)),
        ];
        for ((n, k), want) in table {
            assert_eq!(k_slices(n, k), want, "k_slices({n}, {k})");
        }
    }

    /// The grids ncu recorded on 2026-12-04: m128 at m=2048 qkv (48, 16, 1), m128_n128
    /// (24, 16, 1), m64 at m=64 qkv (48, 1, 6), tc_d64 decode b1 ctx 1024: 32 blocks.
    #[test]
    fn grids_match_the_profiled_launches() {
        let g = |name: &str, m| gemm(&tile_named(name).unwrap(), m, 3072, 2048, false).blocks;
        assert_eq!(g("m128", 2048), 48 * 16);
        assert_eq!(g("m128_n128", 2048), 24 * 16);
        assert_eq!(g("m64", 64), 48 * 6);
        assert_eq!(attention_decode(AttnVariant::Tc, LLAMA_1B, 1, 1024).blocks, 32);
        // tc_deep: one warp a block, 32 partitions at most.
        assert_eq!(attention_decode(AttnVariant::TcDeep, LLAMA_1B, 1, 4096).blocks, 8 * 32);
    }

    #[test]
    fn split_k_only_up_to_128_rows() {
        let t = tile_named("m16").unwrap();
        let l = gemm(&t, 1, 2048, 2048, false);
        assert_eq!(l.blocks, 32 * 8);
        // 256-long slices of 8 k tiles, 4 stages: 1 + 2 refills + the arrival counter; the
        // fold reads the 7 other slices' partial tiles.
        assert_eq!((l.trips_per_block, l.fold_rounds), (4.0, 7.0));
        let big = gemm(&tile_named("m128").unwrap(), 256, 2048, 2048, false);
        assert_eq!(big.blocks, 32 * 2);
        assert_eq!(big.trips_per_block, 1.0 + (64.0f64 / 3.0).ceil());
    }
}
