//! The tensor-core GEMM's tile kernels (kernels/matmul.cu `matmul_tc_<dt>_<tile>`): their
//! shapes, the variants `TANDEM_CUDA_GEMM_LARGE` / `_MID` / `_SMALL` choose among, which one
//! serves an m, and the launch plan (K slices, split, grid) of one GEMM; the wgmma kernel's
//! shape. The launchers are matmul.rs'.

/// The tensor-core matmul (kernels/matmul.cu): output columns per block, k per pipeline tile.
/// GEMM_BN is also the unit in which [`k_slices`] counts column tiles, whatever the width of
/// the kernel launched.
pub(crate) const GEMM_BN: usize = 64;
/// The rope epilogue's wide tiles (the `_n128` kernels), for a head_dim that does not divide
/// GEMM_BN: every head must lie in one output tile.
pub(crate) const GEMM_BN_WIDE: usize = 128;
pub(crate) const GEMM_BK: usize = 32;
/// Blocks a decode matmul aims for (two per SM on the H200's 132) and the shortest K slice
/// worth a block; see [`k_slices`].
pub(crate) const K_SLICE_TARGET_BLOCKS: usize = 264;
pub(crate) const K_SLICE_MIN: usize = 256;
/// Up to this many rows a split K runs one block per slice and folds through the workspace;
/// above it each block folds its slices in registers (same bits, no workspace).
pub(crate) const SPLIT_MAX_ROWS: usize = 128;
/// Floats of the split-K workspace, from known limits: a split needs ceil(n / 64) <
/// K_SLICE_TARGET_BLOCKS, and slices <= ceil(TARGET / n_tiles), so slices * n_tiles <=
/// 2 TARGET - 2 and slices * m * n <= SPLIT_MAX_ROWS * (2 TARGET - 2) * 64 (17.2 MB).
pub(crate) const GEMM_PART_FLOATS: usize = SPLIT_MAX_ROWS * (2 * K_SLICE_TARGET_BLOCKS - 2) * GEMM_BN;

/// How the tensor-core matmul cuts K: (slices, slice length), a function of (n, k) ONLY —
/// never of m or of the rest of the step — so a row's reduction order, and bits, do not
/// depend on the batch (the contract at the top of kernels/matmul.cu). Enough slices that
/// ceil(n / 64) * slices reaches about K_SLICE_TARGET_BLOCKS blocks, none shorter than
/// K_SLICE_MIN (except a k below it), the length a multiple of the 32-wide k tile. The 64 is
/// GEMM_BN, never the launched kernel's width: the 128-wide rope kernels slice as the 64-wide
/// one does, so an output's bits do not depend on which of them computed it
/// (`wide_tiles_slice_as_the_64_wide_kernel`).
/// Mirrored by `k_slices` in kernels/emu/matmul_test.h (both test the same table).
pub(crate) fn k_slices(n: usize, k: usize) -> (usize, usize) {
    let n_tiles = n.div_ceil(GEMM_BN).max(1);
    let want = K_SLICE_TARGET_BLOCKS.div_ceil(n_tiles);
    let by_k = (k / K_SLICE_MIN).max(1);
    let s = want.min(by_k);
    let len = k.div_ceil(s).div_ceil(GEMM_BK).max(1) * GEMM_BK;
    (k.div_ceil(len).max(1), len)
}

/// One tensor-core tile kernel: `matmul_tc_<dt>_m<rows>[_n128]`, its tile, threads and
/// dynamic shared memory (kernels/matmul.cu `GemmShape<BM, WM, WN, STAGES, BN>::SMEM_BYTES`:
/// STAGES * (BM + BN) * 40 elements * 2 bytes; kernels/emu/matmul_test.h checks these
/// numbers against the kernels' own).
pub(crate) struct GemmKernel {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) threads: u32,
    pub(crate) smem: u32,
    /// Its place in [`Kernels`]' `matmul_tc` rows (m16, m64, m128, m16_n128, m64_n128).
    pub(crate) index: usize,
}
pub(crate) const GEMM_M16: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: 4 * (16 + 64) * 40 * 2, index: 0 };
pub(crate) const GEMM_M64: GemmKernel =
    GemmKernel { rows: 64, cols: 64, threads: 128, smem: 4 * (64 + 64) * 40 * 2, index: 1 };
pub(crate) const GEMM_M128: GemmKernel =
    GemmKernel { rows: 128, cols: 64, threads: 256, smem: 3 * (128 + 64) * 40 * 2, index: 2 };
/// The rope epilogue's 128-column tiles: 46080 bytes each, within the 48 KiB a launch gets
/// without opting in, with room for the staged f32 tile (64 x 129 floats); a 128 x 128 tile
/// would not fit, so m64_n128 serves every m above 16 (kernels/matmul.cu `GemmM16N128`).
pub(crate) const GEMM_M16_N128: GemmKernel =
    GemmKernel { rows: 16, cols: 128, threads: 256, smem: 4 * (16 + 128) * 40 * 2, index: 3 };
pub(crate) const GEMM_M64_N128: GemmKernel =
    GemmKernel { rows: 64, cols: 128, threads: 256, smem: 3 * (64 + 128) * 40 * 2, index: 4 };

/// Variants the GPU check times beside the defaults (kernels/matmul.cu, "Variants"): the same
/// warp-level arithmetic and k order, so the same bits; only speed differs.
/// Their shared memory adds the slice total (rows x cols floats) to the stages.
/// m128_n128: 128 x 128 tile, 8 warps of 64 x 32, 4 stages (147456 bytes: opt-in).
pub(crate) const GEMM_M128_N128: GemmKernel =
    GemmKernel { rows: 128, cols: 128, threads: 256, smem: 4 * (128 + 128) * 40 * 2 + 128 * 128 * 4, index: 5 };
/// m128_occ2: m128's tile, 4 stages (94208 bytes: opt-in), registers capped for 2 blocks an SM.
pub(crate) const GEMM_M128_OCC2: GemmKernel =
    GemmKernel { rows: 128, cols: 64, threads: 256, smem: 4 * (128 + 64) * 40 * 2 + 128 * 64 * 4, index: 6 };
/// m64_occ4: m64's tile, 3 stages (47104 bytes), registers capped for 4 blocks an SM.
pub(crate) const GEMM_M64_OCC4: GemmKernel =
    GemmKernel { rows: 64, cols: 64, threads: 128, smem: 3 * (64 + 64) * 40 * 2 + 64 * 64 * 4, index: 7 };
/// m16_s8: m16 with 8 stages (51200 bytes: opt-in), twice the weight bytes in flight.
pub(crate) const GEMM_M16_S8: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: 8 * (16 + 64) * 40 * 2, index: 8 };
/// The decode GEMV variants (kernels/matmul.cu, "Decode GEMV variants"; issue 25 item 1): m16's
/// grid, slices and bits, x staged once per block, the weights streamed through registers
/// (16-byte loads, D = 4 or 8 chunks of 32 k ahead, twice that at most), no pipeline in shared
/// memory. Their dynamic shared memory follows the launch ([`gemv_smem`]); `smem` here is the
/// most a launch may take (the opt-in set at load, within sm_80's and sm_90's limits): a launch
/// that would need more, or whose weight rows are not 16-byte aligned (k % 8 != 0), takes m16.
pub(crate) const GEMV_SMEM_MAX: u32 = 147456;
pub(crate) const GEMM_M16_GEMV4: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 9 };
pub(crate) const GEMM_M16_GEMV8: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 10 };
/// m16_x1: m16 with x staged once per block (issue 25 item 1), the weights still through m16's
/// 4-stage cp.async pipeline (any k); shared memory per launch as the GEMV variants, plus the
/// stages ([`gemv_smem`]).
pub(crate) const GEMM_M16_X1: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 11 };
/// m128_w64 (kernels/matmul.cu, "large-m loop variant"): 128 x 128 tile, 4 warps of 64 x 64, 6
/// stages of 32 k consumed two per barrier, addresses worked out once per block; the slice total
/// in shared memory (188416 bytes: opt-in), one block per SM. 128 wide, so it serves the rope
/// epilogue above 128 rows too, as m128_n128 does.
pub(crate) const GEMM_M128_W64: GemmKernel =
    GemmKernel { rows: 128, cols: 128, threads: 128, smem: 6 * (128 + 128) * 40 * 2 + 128 * 128 * 4, index: 12 };
/// m16_x1's weight stages: 4 x 64 rows x 40 elements x 2 bytes.
const X1_W_BYTES: usize = 4 * GEMM_BN * 40 * 2;
/// Every tile kernel, in [`GemmKernel::index`] order (the `matmul_tc` rows of `Kernels`).
pub(crate) const GEMM_KERNELS: [&GemmKernel; 13] = [
    &GEMM_M16,
    &GEMM_M64,
    &GEMM_M128,
    &GEMM_M16_N128,
    &GEMM_M64_N128,
    &GEMM_M128_N128,
    &GEMM_M128_OCC2,
    &GEMM_M64_OCC4,
    &GEMM_M16_S8,
    &GEMM_M16_GEMV4,
    &GEMM_M16_GEMV8,
    &GEMM_M16_X1,
    &GEMM_M128_W64,
];
/// The name suffix of each tile kernel, in index order (`matmul_tc_<dt>_<suffix>`).
pub(crate) const GEMM_SUFFIXES: [&str; 13] = [
    "m16",
    "m64",
    "m128",
    "m16_n128",
    "m64_n128",
    "m128_n128",
    "m128_occ2",
    "m64_occ4",
    "m16_s8",
    "m16_gemv4",
    "m16_gemv8",
    "m16_x1",
    "m128_w64",
];

/// Whether `g` is one of the GEMV variants or m16_x1 (shared memory per launch, [`gemv_smem`]).
pub(crate) fn is_gemv(g: &GemmKernel) -> bool {
    g.index == GEMM_M16_GEMV4.index || g.index == GEMM_M16_GEMV8.index || g.index == GEMM_M16_X1.index
}
/// A GEMV variant's (`g`'s) dynamic shared memory for one launch (kernels/matmul.cu
/// `GemvShape::smem_bytes`, the same formula, checked there against this table's numbers): the
/// 16 x 65 f32 exchange tile of the silu / rope epilogues, m16_x1's weight stages, then
/// min(m, 16) rows of the block's K range (its slice when split, else k, rounded up to 32) + 8
/// 16-bit elements.
pub(crate) fn gemv_smem(g: &GemmKernel, m: usize, k: usize, slice_len: usize, split: bool) -> usize {
    let range = if split { slice_len } else { k.div_ceil(GEMM_BK) * GEMM_BK };
    let stages = if g.index == GEMM_M16_X1.index { X1_W_BYTES } else { 0 };
    16 * (GEMM_BN + 1) * 4 + stages + m.min(16) * (range + 8) * 2
}
/// A launch without opting in gets at most this much dynamic shared memory.
pub(crate) const SMEM_DEFAULT_LIMIT: u32 = 48 * 1024;

/// Which tile kernel serves m > 128 rows (`large`), 17..=128 rows (`mid`) and up to 16
/// (`small`) on 64-wide tiles: the defaults ([`GEMM_DEFAULT_VARIANTS`]), or the variants named
/// by TANDEM_CUDA_GEMM_LARGE (m128_occ2, m128, m128_n128, m128_w64, wgmma, wgmma_ws), TANDEM_CUDA_GEMM_MID (m64_occ4, m64)
/// and TANDEM_CUDA_GEMM_SMALL (m16, m16_s8, m16_gemv4, m16_gemv8, m16_x1), so the kernel lab can time
/// them side by side.
/// Read once at load (switches.rs), where a bad name is a load error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct GemmVariants {
    pub(crate) large: &'static GemmKernel,
    pub(crate) mid: &'static GemmKernel,
    pub(crate) small: &'static GemmKernel,
    /// TANDEM_CUDA_GEMM_LARGE=wgmma: m > 128 takes kernels/matmul_sm90.cu's wgmma + TMA kernel
    /// (sm_90 only) where it applies ([`wgmma_applies`]); `large` (the default) serves the rest.
    pub(crate) wgmma: bool,
    /// TANDEM_CUDA_GEMM_LARGE=wgmma_ws: m > 128 takes the persistent, warp-specialised wgmma
    /// kernels (`matmul_wgmma_ws_<dt>`, and `matmul_wgmma_ws256_<dt>` where [`wgmma_ws_wide`])
    /// where [`wgmma_applies`]; `large` serves the rest. Excludes `wgmma`.
    pub(crate) wgmma_ws: bool,
}
impl std::fmt::Debug for GemmKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(GEMM_SUFFIXES[self.index])
    }
}
impl PartialEq for GemmKernel {
    fn eq(&self, o: &Self) -> bool {
        self.index == o.index
    }
}
/// The defaults follow the H200's measurements (docs/gpu-check.md, "Tuning round",
/// 2026-12-04): m128_occ2 gave prefill 2048 49.0k tok/s against m128's 30.9k and m128_n128's
/// 47.0k, every GEMM at m >= 256 1.2-1.9x faster; m64_occ4 gave decode at batch 64 9.7k tok/s
/// against m64's 8.9k; m16_s8 lost to m16 (decode batch 1 327 against 378 tok/s).
pub(crate) const GEMM_DEFAULT_VARIANTS: GemmVariants =
    GemmVariants { large: &GEMM_M128_OCC2, mid: &GEMM_M64_OCC4, small: &GEMM_M16, wgmma: false, wgmma_ws: false };

pub(crate) fn parse_gemm_variants(
    large: Option<&str>,
    mid: Option<&str>,
    small: Option<&str>,
) -> std::result::Result<GemmVariants, String> {
    let mut v = GEMM_DEFAULT_VARIANTS;
    if let Some(l) = large.filter(|s| !s.is_empty()) {
        v.large = match l {
            "m128" => &GEMM_M128,
            "m128_n128" => &GEMM_M128_N128,
            "m128_occ2" => &GEMM_M128_OCC2,
            "m128_w64" => &GEMM_M128_W64,
            "wgmma" => {
                v.wgmma = true;
                &GEMM_M128_OCC2
            }
            "wgmma_ws" => {
                v.wgmma_ws = true;
                &GEMM_M128_OCC2
            }
            _ => {
                return Err(format!(
                "TANDEM_CUDA_GEMM_LARGE={l}: one of m128_occ2 (the default), m128, m128_n128, m128_w64, wgmma, wgmma_ws (sm_90)"
            ))
            }
        };
    }
    if let Some(m) = mid.filter(|s| !s.is_empty()) {
        v.mid = match m {
            "m64" => &GEMM_M64,
            "m64_occ4" => &GEMM_M64_OCC4,
            _ => return Err(format!("TANDEM_CUDA_GEMM_MID={m}: one of m64_occ4 (the default), m64")),
        };
    }
    if let Some(m) = small.filter(|s| !s.is_empty()) {
        v.small = match m {
            "m16" => &GEMM_M16,
            "m16_s8" => &GEMM_M16_S8,
            "m16_gemv4" => &GEMM_M16_GEMV4,
            "m16_gemv8" => &GEMM_M16_GEMV8,
            "m16_x1" => &GEMM_M16_X1,
            _ => {
                return Err(format!(
                    "TANDEM_CUDA_GEMM_SMALL={m}: one of m16 (the default), m16_s8, m16_gemv4, m16_gemv8, m16_x1"
                ))
            }
        };
    }
    Ok(v)
}

/// Tile shapes may follow m, and the tile's width (`cols`: GEMM_BN, or GEMM_BN_WIDE for the
/// rope epilogue at head_dim 128); the reduction order does not.
#[cfg(test)]
pub(crate) fn gemm_kernel(m: usize, cols: usize) -> &'static GemmKernel {
    gemm_kernel_of(m, cols, &GEMM_DEFAULT_VARIANTS)
}
pub(crate) fn gemm_kernel_of(m: usize, cols: usize, v: &GemmVariants) -> &'static GemmKernel {
    match (cols == GEMM_BN_WIDE, m) {
        (false, 0..=16) => v.small,
        (false, 17..=SPLIT_MAX_ROWS) => v.mid,
        (false, _) => v.large,
        (true, 0..=16) => &GEMM_M16_N128,
        // m128_n128 and m128_w64 are 128 wide: where one is the large kernel, it serves the rope epilogue too.
        (true, 17..=SPLIT_MAX_ROWS) => &GEMM_M64_N128,
        (true, _) => {
            if v.large.cols == GEMM_BN_WIDE {
                v.large
            } else {
                &GEMM_M64_N128
            }
        }
    }
}

/// The wgmma + TMA kernel (kernels/matmul_sm90.cu `matmul_wgmma_<dt>`): 128 x 128 output tiles,
/// 384 threads (a TMA producer warpgroup, two wgmma consumer warpgroups), 4 stages of 32 KiB,
/// the mbarriers, each consumer warp's 16 x 129 floats for the rope / silu epilogues and 1 KiB
/// of alignment slack (`WGMMA_SMEM_BYTES`; kernels/emu/sm90_test.cpp checks the number).
pub(crate) const WGMMA_TILE: usize = 128;
pub(crate) const WGMMA_THREADS: u32 = 384;
pub(crate) const WGMMA_SMEM: u32 = 1024 + 4 * 2 * 128 * 64 * 2 + 2 * 4 * 8 + 8 * 16 * (128 + 1) * 4;
const _: () = assert!(WGMMA_SMEM <= 227 * 1024, "within an sm_90 block's opt-in shared memory");
pub(crate) const WGMMA_KERNELS: [&str; 2] = ["matmul_wgmma_bf16", "matmul_wgmma_f16"];
/// The persistent, warp-specialised wgmma kernels (kernels/matmul_sm90.cu `matmul_wgmma_ws_<dt>`,
/// 128 x 128 tiles, and `matmul_wgmma_ws256_<dt>`, 128 x 256): 384 threads, 4 stages of 32 KiB
/// or 3 of 48 KiB, the rest as [`WGMMA_SMEM`] (`WGMMA_WS_SMEM(BN)`; sm90_test.cpp checks both).
/// Grid: [`wgmma_ws_grid`].
pub(crate) const WGMMA_WS_SMEM: [u32; 2] = [
    1024 + 4 * (128 + 128) * 64 * 2 + 2 * 4 * 8 + 8 * 16 * (128 + 1) * 4,
    1024 + 3 * (128 + 256) * 64 * 2 + 2 * 3 * 8 + 8 * 16 * (128 + 1) * 4,
];
const _: () = assert!(WGMMA_WS_SMEM[1] <= 227 * 1024, "within an sm_90 block's opt-in shared memory");
/// `[tile][dtype]`: the 128-wide kernels, then the 256-wide; bf16 then f16.
pub(crate) const WGMMA_WS_KERNELS: [[&str; 2]; 2] =
    [["matmul_wgmma_ws_bf16", "matmul_wgmma_ws_f16"], ["matmul_wgmma_ws256_bf16", "matmul_wgmma_ws256_f16"]];
/// Whether the persistent kernel takes 128 x 256 tiles: only where the GEMM has one K slice
/// (a 256-wide consumer holds 128 accumulators a thread, and no second set to fold slices in).
/// A function of (n, k) only, as the slices are: the bits never depend on it.
pub(crate) fn wgmma_ws_wide(n: usize, k: usize) -> bool {
    k_slices(n, k).0 == 1
}
/// The persistent kernel's grid: one block a tile up to one block an SM; each block walks
/// tiles b, b + grid, ... (kernels/matmul_sm90.cu).
pub(crate) fn wgmma_ws_grid(m: usize, n: usize, wide: bool, sms: usize) -> usize {
    let tiles = m.div_ceil(WGMMA_TILE) * n.div_ceil(if wide { 2 * WGMMA_TILE } else { WGMMA_TILE });
    tiles.min(sms.max(1))
}
/// Where the wgmma kernel may serve a GEMM (else the mma.sync kernel does, with the same bits
/// by the contract): m > 128 (no split K; the input norm is fused only up to
/// FUSE_NORM_MAX_TOKENS rows, so never here, but a norm is refused all the same), 16-bit
/// weights, k a positive multiple of 8 (TMA rows must be 16-byte aligned; x's pitch kp is k or
/// k rounded up to 8, so then kp == k). Every epilogue: the plain one, q/k/v with or without
/// rope (head_dim divides 128: [`rope_in_epilogue`], the tile's width), silu, the residual add.
pub(crate) fn wgmma_applies(m: usize, k: usize, norm: bool) -> bool {
    m > SPLIT_MAX_ROWS && !norm && k > 0 && k.is_multiple_of(8)
}

/// How one tensor-core GEMM launches: its kernel, K slices, whether the slices run one block
/// each (folded in-kernel over the workspace) and whether the tile kernel reads x itself.
pub(crate) struct GemmPlan {
    pub(crate) kernel: &'static GemmKernel,
    pub(crate) slices: usize,
    pub(crate) slice_len: usize,
    pub(crate) split: bool,
    pub(crate) direct: bool,
    /// Column tiles, row tiles, slice blocks (the launch grid).
    pub(crate) grid: (usize, usize, usize),
    /// Dynamic shared memory of the launch: the kernel's own, or [`gemv_smem`]'s.
    pub(crate) smem: u32,
}

/// The launch of an m x n x k GEMM on `cols`-wide tiles. Slices come from (n, k) alone, so
/// every tile width and every m gives an output the same K slices.
pub(crate) fn gemm_plan(m: usize, n: usize, k: usize, cols: usize, v: &GemmVariants) -> GemmPlan {
    gemm_plan_of(m, n, k, gemm_kernel_of(m, cols, v))
}
/// [`gemm_plan`] with the kernel given; a GEMV variant that cannot serve (k % 8 != 0 for the
/// register-streaming ones, or more shared memory than [`GEMV_SMEM_MAX`]) gives way to m16,
/// whose bits it shares.
pub(crate) fn gemm_plan_of(m: usize, n: usize, k: usize, mut kernel: &'static GemmKernel) -> GemmPlan {
    let (slices, slice_len) = k_slices(n, k);
    let split = m <= SPLIT_MAX_ROWS && slices > 1;
    let mut smem = kernel.smem;
    if is_gemv(kernel) {
        let need = gemv_smem(kernel, m, k, slice_len, split);
        // The register-streaming kernels load 16 bytes of a weight row at a time.
        let aligned = k.is_multiple_of(8) || kernel.index == GEMM_M16_X1.index;
        if !aligned || need > GEMV_SMEM_MAX as usize {
            kernel = &GEMM_M16;
            smem = kernel.smem;
        } else {
            smem = need as u32;
        }
    }
    GemmPlan {
        kernel,
        slices,
        slice_len,
        split,
        direct: m <= SPLIT_MAX_ROWS,
        grid: (n.div_ceil(kernel.cols), m.div_ceil(kernel.rows), if split { slices } else { 1 }),
        smem,
    }
}

/// Arrival counters of the in-kernel split-K fold, one per output tile of a split launch
/// (zeroed once; each launch's last block resets its tile's): a split has m <= 128, so at most
/// 2 row tiles of the m64 kernels, and fewer than K_SLICE_TARGET_BLOCKS column tiles (half as
/// many for the 128-wide kernels).
pub(crate) const GEMM_COUNTERS: usize = 2 * K_SLICE_TARGET_BLOCKS;

#[cfg(test)]
mod tests {
    use super::*;

    /// The same table is asserted on the emulator (kernels/emu/matmul_test.h `slices_table`).
    #[test]
    fn k_slices_depend_on_n_and_k_only() {
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

    /// Every slice is non-empty, lengths are whole k tiles, and the split-K workspace bound
    /// holds for every n and k the split path can see.
    #[test]
    fn split_workspace_bound_holds() {
        for n in (1..40_000).step_by(37) {
            for k in [1, 31, 255, 256, 1000, 4096, 14336, 65536] {
                let (s, len) = k_slices(n, k);
                assert!(len.is_multiple_of(GEMM_BK) && len >= GEMM_BK);
                assert!((s - 1) * len < k.max(1) && s * len >= k, "n {n} k {k}: {s} x {len}");
                if s > 1 {
                    assert!(
                        s * SPLIT_MAX_ROWS * n <= GEMM_PART_FLOATS,
                        "n {n} k {k}: {s} slices overflow the workspace"
                    );
                }
            }
        }
        assert_eq!(gemm_kernel(1, GEMM_BN).rows, 16);
        assert_eq!(gemm_kernel(16, GEMM_BN).rows, 16);
        assert_eq!(gemm_kernel(17, GEMM_BN).rows, 64);
        assert_eq!(gemm_kernel(128, GEMM_BN).rows, 64);
        assert_eq!(gemm_kernel(129, GEMM_BN).rows, 128);
        let d = GEMM_DEFAULT_VARIANTS;
        assert_eq!(
            (gemm_kernel_of(16, GEMM_BN, &d), gemm_kernel_of(17, GEMM_BN, &d), gemm_kernel_of(129, GEMM_BN, &d)),
            (&GEMM_M16, &GEMM_M64_OCC4, &GEMM_M128_OCC2)
        );
        let v = parse_gemm_variants(Some("m128_n128"), Some("m64_occ4"), None).unwrap();
        assert_eq!(
            (gemm_kernel_of(129, GEMM_BN, &v), gemm_kernel_of(2048, GEMM_BN_WIDE, &v)),
            (&GEMM_M128_N128, &GEMM_M128_N128)
        );
        assert_eq!(
            (gemm_kernel_of(17, GEMM_BN, &v), gemm_kernel_of(128, GEMM_BN_WIDE, &v), gemm_kernel_of(16, GEMM_BN, &v)),
            (&GEMM_M64_OCC4, &GEMM_M64_N128, &GEMM_M16)
        );
        let v = parse_gemm_variants(Some("m128"), Some("m64"), Some("m16_s8")).unwrap();
        assert_eq!(
            (gemm_kernel_of(129, GEMM_BN, &v), gemm_kernel_of(129, GEMM_BN_WIDE, &v), gemm_kernel_of(64, GEMM_BN, &v)),
            (&GEMM_M128, &GEMM_M64_N128, &GEMM_M64)
        );
        assert_eq!(
            (gemm_kernel_of(16, GEMM_BN, &v), gemm_kernel_of(16, GEMM_BN_WIDE, &v)),
            (&GEMM_M16_S8, &GEMM_M16_N128)
        );
        assert!(parse_gemm_variants(Some("m256"), None, None).unwrap_err().contains("TANDEM_CUDA_GEMM_LARGE=m256"));
        let v = parse_gemm_variants(Some("m128_w64"), None, None).unwrap();
        assert_eq!(
            (gemm_kernel_of(129, GEMM_BN, &v), gemm_kernel_of(2048, GEMM_BN_WIDE, &v)),
            (&GEMM_M128_W64, &GEMM_M128_W64)
        );
        assert_eq!(
            (gemm_kernel_of(128, GEMM_BN, &v), gemm_kernel_of(128, GEMM_BN_WIDE, &v)),
            (&GEMM_M64_OCC4, &GEMM_M64_N128)
        );
        assert_eq!(GEMM_M128_W64.smem, 188416, "kernels/matmul.cu GemmM128W64::SMEM_BYTES");
        let w = parse_gemm_variants(Some("wgmma"), None, None).unwrap();
        assert!(w.wgmma && w.large == &GEMM_M128_OCC2, "wgmma keeps m128_occ2 where it does not apply");
        const { assert!(!GEMM_DEFAULT_VARIANTS.wgmma, "the wgmma kernel is off by default") };
        let ws = parse_gemm_variants(Some("wgmma_ws"), None, None).unwrap();
        assert!(ws.wgmma_ws && !ws.wgmma && ws.large == &GEMM_M128_OCC2);
        const { assert!(!GEMM_DEFAULT_VARIANTS.wgmma_ws, "the persistent wgmma kernels are off by default") };
        assert_eq!(WGMMA_WS_SMEM, [198208, 214576], "kernels/matmul_sm90.cu WGMMA_WS_SMEM(128), (256)");
        // The lm_head (one slice) takes the wide tiles; a Llama-3.2-1B projection (8 slices) not.
        assert!(wgmma_ws_wide(128256, 2048) && !wgmma_ws_wide(2048, 2048) && wgmma_ws_wide(600, 136));
        assert_eq!(wgmma_ws_grid(2048, 2048, false, 132), 132);
        assert_eq!(wgmma_ws_grid(300, 600, true, 132), 9);
        assert_eq!(wgmma_ws_grid(129, 128, false, 132), 2);
        assert_eq!(WGMMA_SMEM, 198208, "kernels/matmul_sm90.cu WGMMA_SMEM_BYTES (with the 8 warps' staged rows)");
        assert!(wgmma_applies(129, 2048, false) && !wgmma_applies(128, 2048, false));
        assert!(
            !wgmma_applies(2048, 2044, false) && !wgmma_applies(2048, 2048, true) && !wgmma_applies(2048, 0, false)
        );
        assert!(parse_gemm_variants(None, Some("x"), None).unwrap_err().contains("TANDEM_CUDA_GEMM_MID=x"));
        assert!(parse_gemm_variants(None, None, Some("m8")).unwrap_err().contains("TANDEM_CUDA_GEMM_SMALL=m8"));
        for (name, g) in [("m16_gemv4", &GEMM_M16_GEMV4), ("m16_gemv8", &GEMM_M16_GEMV8), ("m16_x1", &GEMM_M16_X1)] {
            let v = parse_gemm_variants(None, None, Some(name)).unwrap();
            assert_eq!(
                (
                    gemm_kernel_of(16, GEMM_BN, &v),
                    gemm_kernel_of(16, GEMM_BN_WIDE, &v),
                    gemm_kernel_of(17, GEMM_BN, &v)
                ),
                (g, &GEMM_M16_N128, &GEMM_M64_OCC4)
            );
        }
        assert_eq!(parse_gemm_variants(Some(""), None, None).unwrap(), GEMM_DEFAULT_VARIANTS);
        for (i, g) in GEMM_KERNELS.iter().enumerate() {
            assert_eq!(g.index, i);
        }
        for (m, rows) in [(1, 16), (16, 16), (17, 64), (128, 64), (129, 64), (2048, 64)] {
            let g = gemm_kernel(m, GEMM_BN_WIDE);
            assert_eq!((g.rows, g.cols), (rows, GEMM_BN_WIDE), "m {m}");
        }
    }

    /// The 128-wide rope kernels cut K exactly as the 64-wide kernels would for the same (n, k),
    /// for every m (so every output sees the same k16 steps and slice bounds: the same bits),
    /// and their split launches stay within the counters and the workspace.
    #[test]
    fn wide_tiles_slice_as_the_64_wide_kernel() {
        for n in (128..40_000).step_by(128 * 7).chain([768, 6144, 4096 + 2 * 1024, 3584 + 2 * 512, 128]) {
            for k in [1, 136, 999, 1000, 2048, 3584, 4096, 5120, 8192] {
                for m in [1, 2, 7, 16, 17, 64, 128, 129, 200, 2048] {
                    let (narrow, wide) = (
                        gemm_plan(m, n, k, GEMM_BN, &GEMM_DEFAULT_VARIANTS),
                        gemm_plan(m, n, k, GEMM_BN_WIDE, &GEMM_DEFAULT_VARIANTS),
                    );
                    assert_eq!(
                        (wide.slices, wide.slice_len, wide.split, wide.direct),
                        (narrow.slices, narrow.slice_len, narrow.split, narrow.direct),
                        "m {m} n {n} k {k}"
                    );
                    assert_eq!((wide.grid.0, wide.grid.2), (n.div_ceil(128), narrow.grid.2), "m {m} n {n} k {k}");
                    assert!(wide.grid.0 * wide.kernel.cols >= n && wide.grid.1 * wide.kernel.rows >= m);
                    if wide.split {
                        assert!(
                            wide.grid.0 * wide.grid.1 <= GEMM_COUNTERS && wide.slices * m * n <= GEMM_PART_FLOATS,
                            "m {m} n {n} k {k}"
                        );
                    }
                }
            }
        }
        // Llama-3.1-8B's q/k/v (4096 + 2 x 1024 rows, hidden 4096): 3 slices of 1376 either way.
        assert_eq!(
            (
                gemm_plan(1, 6144, 4096, GEMM_BN_WIDE, &GEMM_DEFAULT_VARIANTS).slices,
                gemm_plan(1, 6144, 4096, GEMM_BN_WIDE, &GEMM_DEFAULT_VARIANTS).slice_len
            ),
            (3, 1376)
        );
    }

    /// The GEMV variants' shared memory per launch (the same table is asserted on the emulator,
    /// kernels/emu/matmul_test.h `slices_table`), and where they give way to m16.
    #[test]
    fn gemv_variants_plan() {
        for ((m, k, len, split), want) in [
            ((1, 2048, 256, true), 4688),
            ((16, 2048, 2048, false), 69952),
            ((7, 1000, 352, true), 9200),
            ((3, 40, 64, false), 4592),
        ] {
            for g in [&GEMM_M16_GEMV4, &GEMM_M16_GEMV8] {
                assert_eq!(gemv_smem(g, m, k, len, split), want, "gemv_smem({g:?}, {m}, {k}, {len}, {split})");
            }
        }
        assert_eq!(
            (gemv_smem(&GEMM_M16_X1, 1, 2048, 256, true), gemv_smem(&GEMM_M16_X1, 16, 1001, 352, true)),
            (25168, 36160)
        );
        // m16_x1 takes any k (its weights go through m16's own copies).
        let p = gemm_plan_of(1, 72, 1001, &GEMM_M16_X1);
        assert_eq!((p.kernel, p.smem as usize), (&GEMM_M16_X1, gemv_smem(&GEMM_M16_X1, 1, 1001, p.slice_len, p.split)));
        assert_eq!(gemm_plan_of(16, 128256, 8192, &GEMM_M16_X1).kernel, &GEMM_M16);
        for g in [&GEMM_M16_GEMV4, &GEMM_M16_GEMV8] {
            // Llama-3.2-1B's decode GEMMs at one token: the variant, m16's grid and slices.
            for (n, k) in [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192), (128256, 2048), (128256, 4096)] {
                let (p, base) = (gemm_plan_of(1, n, k, g), gemm_plan_of(1, n, k, &GEMM_M16));
                assert_eq!(
                    (p.kernel, p.grid, p.slices, p.slice_len, p.split),
                    (g, base.grid, base.slices, base.slice_len, base.split),
                    "n {n} k {k}"
                );
                assert_eq!(p.smem as usize, gemv_smem(g, 1, k, p.slice_len, p.split));
            }
            // Weight rows not 16-byte aligned, and x too long for the shared memory: m16.
            for (m, n, k) in [(1, 72, 1001), (16, 72, 999), (16, 128256, 8192)] {
                let p = gemm_plan_of(m, n, k, g);
                assert_eq!((p.kernel, p.smem), (&GEMM_M16, GEMM_M16.smem), "m {m} n {n} k {k}");
            }
            assert!(gemm_plan_of(16, 128256, 4096, g).smem <= GEMV_SMEM_MAX);
        }
    }
}
