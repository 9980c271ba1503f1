//! The tensor-core and f32 matmul launchers of [`CudaBackend`] (kernels/matmul.cu): the plain
//! projection (`Ops::matmul`) and the fused q/k/v and gate/up projections
//! (`FusedOps::fuse_qkv` / `qkv_proj`, `fuse_gate_up` / `gate_up_act`), the residual add
//! (`matmul_residual`) and the input norm (`NormIn`) where `fuses_norm` says so, one GEMM
//! launch each for m <= 128 (x read in-kernel, split K folded in-kernel), two above
//! (matmul_x first).
//! A child module of `backend`, so it shares that module's private helpers.

use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig};
use tandem_core::backend::{DType, KvDest, NormIn};
use tandem_core::config::Activation;
use tandem_core::weights::TensorView;
use tandem_core::Result;

use super::{
    cfg, drv, err, i32_of, need, need_act, need_kv, need_weight, u32_of, CudaBackend, CudaBuf, Elem, MatmulScratch,
};

/// The tensor-core matmul (kernels/matmul.cu): output columns per block, k per pipeline tile.
/// GEMM_BN is also the unit in which [`k_slices`] counts column tiles, whatever the width of
/// the kernel launched.
pub(super) const GEMM_BN: usize = 64;
/// The rope epilogue's wide tiles (the `_n128` kernels), for a head_dim that does not divide
/// GEMM_BN: every head must lie in one output tile.
pub(super) const GEMM_BN_WIDE: usize = 128;
pub(super) const GEMM_BK: usize = 32;
/// Blocks a decode matmul aims for (two per SM on the H200's 132) and the shortest K slice
/// worth a block; see [`k_slices`].
pub(super) const K_SLICE_TARGET_BLOCKS: usize = 264;
pub(super) const K_SLICE_MIN: usize = 256;
/// Up to this many rows a split K runs one block per slice and folds through the workspace;
/// above it each block folds its slices in registers (same bits, no workspace).
pub(super) const SPLIT_MAX_ROWS: usize = 128;
/// Floats of the split-K workspace, from known limits: a split needs ceil(n / 64) <
/// K_SLICE_TARGET_BLOCKS, and slices <= ceil(TARGET / n_tiles), so slices * n_tiles <=
/// 2 TARGET - 2 and slices * m * n <= SPLIT_MAX_ROWS * (2 TARGET - 2) * 64 (17.2 MB).
pub(super) const GEMM_PART_FLOATS: usize = SPLIT_MAX_ROWS * (2 * K_SLICE_TARGET_BLOCKS - 2) * GEMM_BN;

/// How the tensor-core matmul cuts K: (slices, slice length), a function of (n, k) ONLY —
/// never of m or of the rest of the step — so a row's reduction order, and bits, do not
/// depend on the batch (the contract at the top of kernels/matmul.cu). Enough slices that
/// ceil(n / 64) * slices reaches about K_SLICE_TARGET_BLOCKS blocks, none shorter than
/// K_SLICE_MIN (except a k below it), the length a multiple of the 32-wide k tile. The 64 is
/// GEMM_BN, never the launched kernel's width: the 128-wide rope kernels slice as the 64-wide
/// one does, so an output's bits do not depend on which of them computed it
/// (`wide_tiles_slice_as_the_64_wide_kernel`).
/// Mirrored by `k_slices` in kernels/emu/matmul_test.h (both test the same table).
pub(super) fn k_slices(n: usize, k: usize) -> (usize, usize) {
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
pub(super) struct GemmKernel {
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) threads: u32,
    pub(super) smem: u32,
    /// Its place in [`Kernels`]' `matmul_tc` rows (m16, m64, m128, m16_n128, m64_n128).
    pub(super) index: usize,
}
pub(super) const GEMM_M16: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: 4 * (16 + 64) * 40 * 2, index: 0 };
pub(super) const GEMM_M64: GemmKernel =
    GemmKernel { rows: 64, cols: 64, threads: 128, smem: 4 * (64 + 64) * 40 * 2, index: 1 };
pub(super) const GEMM_M128: GemmKernel =
    GemmKernel { rows: 128, cols: 64, threads: 256, smem: 3 * (128 + 64) * 40 * 2, index: 2 };
/// The rope epilogue's 128-column tiles: 46080 bytes each, within the 48 KiB a launch gets
/// without opting in, with room for the staged f32 tile (64 x 129 floats); a 128 x 128 tile
/// would not fit, so m64_n128 serves every m above 16 (kernels/matmul.cu `GemmM16N128`).
pub(super) const GEMM_M16_N128: GemmKernel =
    GemmKernel { rows: 16, cols: 128, threads: 256, smem: 4 * (16 + 128) * 40 * 2, index: 3 };
pub(super) const GEMM_M64_N128: GemmKernel =
    GemmKernel { rows: 64, cols: 128, threads: 256, smem: 3 * (64 + 128) * 40 * 2, index: 4 };

/// Variants the GPU check times beside the defaults (kernels/matmul.cu, "Variants"): the same
/// warp-level arithmetic and k order, so the same bits; only speed differs.
/// Their shared memory adds the slice total (rows x cols floats) to the stages.
/// m128_n128: 128 x 128 tile, 8 warps of 64 x 32, 4 stages (147456 bytes: opt-in).
pub(super) const GEMM_M128_N128: GemmKernel =
    GemmKernel { rows: 128, cols: 128, threads: 256, smem: 4 * (128 + 128) * 40 * 2 + 128 * 128 * 4, index: 5 };
/// m128_occ2: m128's tile, 4 stages (94208 bytes: opt-in), registers capped for 2 blocks an SM.
pub(super) const GEMM_M128_OCC2: GemmKernel =
    GemmKernel { rows: 128, cols: 64, threads: 256, smem: 4 * (128 + 64) * 40 * 2 + 128 * 64 * 4, index: 6 };
/// m64_occ4: m64's tile, 3 stages (47104 bytes), registers capped for 4 blocks an SM.
pub(super) const GEMM_M64_OCC4: GemmKernel =
    GemmKernel { rows: 64, cols: 64, threads: 128, smem: 3 * (64 + 64) * 40 * 2 + 64 * 64 * 4, index: 7 };
/// m16_s8: m16 with 8 stages (51200 bytes: opt-in), twice the weight bytes in flight.
pub(super) const GEMM_M16_S8: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: 8 * (16 + 64) * 40 * 2, index: 8 };
/// The decode GEMV variants (kernels/matmul.cu, "Decode GEMV variants"; issue 25 item 1): m16's
/// grid, slices and bits, x staged once per block, the weights streamed through registers
/// (16-byte loads, D = 4 or 8 chunks of 32 k ahead, twice that at most), no pipeline in shared
/// memory. Their dynamic shared memory follows the launch ([`gemv_smem`]); `smem` here is the
/// most a launch may take (the opt-in set at load, within sm_80's and sm_90's limits): a launch
/// that would need more, or whose weight rows are not 16-byte aligned (k % 8 != 0), takes m16.
pub(super) const GEMV_SMEM_MAX: u32 = 147456;
pub(super) const GEMM_M16_GEMV4: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 9 };
pub(super) const GEMM_M16_GEMV8: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 10 };
/// m16_x1: m16 with x staged once per block (issue 25 item 1), the weights still through m16's
/// 4-stage cp.async pipeline (any k); shared memory per launch as the GEMV variants, plus the
/// stages ([`gemv_smem`]).
pub(super) const GEMM_M16_X1: GemmKernel =
    GemmKernel { rows: 16, cols: 64, threads: 128, smem: GEMV_SMEM_MAX, index: 11 };
/// m128_w64 (kernels/matmul.cu, "large-m loop variant"): 128 x 128 tile, 4 warps of 64 x 64, 6
/// stages of 32 k consumed two per barrier, addresses worked out once per block; the slice total
/// in shared memory (188416 bytes: opt-in), one block per SM. 128 wide, so it serves the rope
/// epilogue above 128 rows too, as m128_n128 does.
pub(super) const GEMM_M128_W64: GemmKernel =
    GemmKernel { rows: 128, cols: 128, threads: 128, smem: 6 * (128 + 128) * 40 * 2 + 128 * 128 * 4, index: 12 };
/// m16_x1's weight stages: 4 x 64 rows x 40 elements x 2 bytes.
const X1_W_BYTES: usize = 4 * GEMM_BN * 40 * 2;
/// Every tile kernel, in [`GemmKernel::index`] order (the `matmul_tc` rows of `Kernels`).
pub(super) const GEMM_KERNELS: [&GemmKernel; 13] = [
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
pub(super) const GEMM_SUFFIXES: [&str; 13] = [
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
pub(super) fn is_gemv(g: &GemmKernel) -> bool {
    g.index == GEMM_M16_GEMV4.index || g.index == GEMM_M16_GEMV8.index || g.index == GEMM_M16_X1.index
}
/// A GEMV variant's (`g`'s) dynamic shared memory for one launch (kernels/matmul.cu
/// `GemvShape::smem_bytes`, the same formula, checked there against this table's numbers): the
/// 16 x 65 f32 exchange tile of the silu / rope epilogues, m16_x1's weight stages, then
/// min(m, 16) rows of the block's K range (its slice when split, else k, rounded up to 32) + 8
/// 16-bit elements.
pub(super) fn gemv_smem(g: &GemmKernel, m: usize, k: usize, slice_len: usize, split: bool) -> usize {
    let range = if split { slice_len } else { k.div_ceil(GEMM_BK) * GEMM_BK };
    let stages = if g.index == GEMM_M16_X1.index { X1_W_BYTES } else { 0 };
    16 * (GEMM_BN + 1) * 4 + stages + m.min(16) * (range + 8) * 2
}
/// A launch without opting in gets at most this much dynamic shared memory.
pub(super) const SMEM_DEFAULT_LIMIT: u32 = 48 * 1024;

/// Which tile kernel serves m > 128 rows (`large`), 17..=128 rows (`mid`) and up to 16
/// (`small`) on 64-wide tiles: the defaults ([`GEMM_DEFAULT_VARIANTS`]), or the variants named
/// by TANDEM_CUDA_GEMM_LARGE (m128_occ2, m128, m128_n128, m128_w64, wgmma), TANDEM_CUDA_GEMM_MID (m64_occ4, m64)
/// and TANDEM_CUDA_GEMM_SMALL (m16, m16_s8, m16_gemv4, m16_gemv8, m16_x1), so the kernel lab can time
/// them side by side.
/// Read once per process; [`check_gemm_variants`] turns a bad name into a load error.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct GemmVariants {
    pub(super) large: &'static GemmKernel,
    pub(super) mid: &'static GemmKernel,
    pub(super) small: &'static GemmKernel,
    /// TANDEM_CUDA_GEMM_LARGE=wgmma: m > 128 takes kernels/matmul_sm90.cu's wgmma + TMA kernel
    /// (sm_90 only) where it applies ([`wgmma_applies`]); `large` (the default) serves the rest.
    pub(super) wgmma: bool,
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
pub(super) const GEMM_DEFAULT_VARIANTS: GemmVariants =
    GemmVariants { large: &GEMM_M128_OCC2, mid: &GEMM_M64_OCC4, small: &GEMM_M16, wgmma: false };

fn parse_gemm_variants(
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
            _ => {
                return Err(format!(
                "TANDEM_CUDA_GEMM_LARGE={l}: one of m128_occ2 (the default), m128, m128_n128, m128_w64, wgmma (sm_90)"
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

static GEMM_VARIANTS: std::sync::OnceLock<std::result::Result<GemmVariants, String>> = std::sync::OnceLock::new();
fn gemm_variants() -> &'static std::result::Result<GemmVariants, String> {
    GEMM_VARIANTS.get_or_init(|| {
        let var = |n: &str| std::env::var(n).ok();
        parse_gemm_variants(
            var("TANDEM_CUDA_GEMM_LARGE").as_deref(),
            var("TANDEM_CUDA_GEMM_MID").as_deref(),
            var("TANDEM_CUDA_GEMM_SMALL").as_deref(),
        )
    })
}
/// The variants in use, or the error naming a bad TANDEM_CUDA_GEMM_* value (checked at load).
pub(super) fn check_gemm_variants() -> Result<GemmVariants> {
    gemm_variants().clone().map_err(err)
}

/// Tile shapes may follow m, and the tile's width (`cols`: GEMM_BN, or GEMM_BN_WIDE for the
/// rope epilogue at head_dim 128); the reduction order does not.
pub(super) fn gemm_kernel(m: usize, cols: usize) -> &'static GemmKernel {
    gemm_kernel_of(m, cols, gemm_variants().as_ref().unwrap_or(&GEMM_DEFAULT_VARIANTS))
}
pub(super) fn gemm_kernel_of(m: usize, cols: usize, v: &GemmVariants) -> &'static GemmKernel {
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
pub(super) const WGMMA_TILE: usize = 128;
pub(super) const WGMMA_THREADS: u32 = 384;
pub(super) const WGMMA_SMEM: u32 = 1024 + 4 * 2 * 128 * 64 * 2 + 2 * 4 * 8 + 8 * 16 * (128 + 1) * 4;
const _: () = assert!(WGMMA_SMEM <= 227 * 1024, "within an sm_90 block's opt-in shared memory");
pub(super) const WGMMA_KERNELS: [&str; 2] = ["matmul_wgmma_bf16", "matmul_wgmma_f16"];
/// Where the wgmma kernel may serve a GEMM (else the mma.sync kernel does, with the same bits
/// by the contract): m > 128 (no split K; the input norm is fused only up to
/// FUSE_NORM_MAX_TOKENS rows, so never here, but a norm is refused all the same), 16-bit
/// weights, k a positive multiple of 8 (TMA rows must be 16-byte aligned; x's pitch kp is k or
/// k rounded up to 8, so then kp == k). Every epilogue: the plain one, q/k/v with or without
/// rope (head_dim divides 128: [`rope_in_epilogue`], the tile's width), silu, the residual add.
pub(super) fn wgmma_applies(m: usize, k: usize, norm: bool) -> bool {
    m > SPLIT_MAX_ROWS && !norm && k > 0 && k.is_multiple_of(8)
}

/// A CUtensorMap (128 opaque bytes, 64-byte aligned), passed to the kernel by value.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TmaArg([u64; 16]);
// SAFETY: plain bytes, laid out as the kernel's `TmaMap` parameter.
unsafe impl DeviceRepr for TmaArg {}
impl super::launch::Plain for TmaArg {}

/// cuTensorMapEncodeTiled for a row-major 16-bit matrix [rows, cols] with row pitch `pitch`
/// elements: boxes of 64 columns (128 bytes, the 128-byte swizzle's width) x 128 rows, out of
/// bounds read as zeros.
fn tma_map(op: &str, addr: u64, bf16: bool, rows: usize, cols: usize, pitch: usize) -> Result<TmaArg> {
    use cudarc::driver::sys;
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(pitch * 2) as u64];
    let bx: [u32; 2] = [64, WGMMA_TILE as u32];
    let es: [u32; 2] = [1, 1];
    let dt = if bf16 {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    } else {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    };
    // SAFETY: every pointer is to a local array of the length rank 2 asks for; `map` is written.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dt,
            2,
            addr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            bx.as_ptr(),
            es.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(err(format!("{op}: cuTensorMapEncodeTiled [{rows}, {cols}] pitch {pitch}: {r:?}")));
    }
    // SAFETY: a CUtensorMap is 128 bytes, 64-byte aligned, written above.
    Ok(TmaArg(unsafe { std::mem::transmute::<sys::CUtensorMap, [u64; 16]>(map.assume_init()) }))
}

/// How one tensor-core GEMM launches: its kernel, K slices, whether the slices run one block
/// each (folded in-kernel over the workspace) and whether the tile kernel reads x itself.
pub(super) struct GemmPlan {
    pub(super) kernel: &'static GemmKernel,
    pub(super) slices: usize,
    pub(super) slice_len: usize,
    pub(super) split: bool,
    pub(super) direct: bool,
    /// Column tiles, row tiles, slice blocks (the launch grid).
    pub(super) grid: (usize, usize, usize),
    /// Dynamic shared memory of the launch: the kernel's own, or [`gemv_smem`]'s.
    pub(super) smem: u32,
}

/// The launch of an m x n x k GEMM on `cols`-wide tiles. Slices come from (n, k) alone, so
/// every tile width and every m gives an output the same K slices.
pub(super) fn gemm_plan(m: usize, n: usize, k: usize, cols: usize) -> GemmPlan {
    gemm_plan_of(m, n, k, gemm_kernel(m, cols))
}
/// [`gemm_plan`] with the kernel given; a GEMV variant that cannot serve (k % 8 != 0 for the
/// register-streaming ones, or more shared memory than [`GEMV_SMEM_MAX`]) gives way to m16,
/// whose bits it shares.
pub(super) fn gemm_plan_of(m: usize, n: usize, k: usize, mut kernel: &'static GemmKernel) -> GemmPlan {
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
pub(super) const GEMM_COUNTERS: usize = 2 * K_SLICE_TARGET_BLOCKS;

/// The epilogue codes of kernels/matmul.cu (EPI_PLAIN, EPI_QKV, EPI_SILU, EPI_RESID,
/// EPI_QKV_ROPE, EPI_GEGLU).
pub(super) const EPI_PLAIN: i32 = 0;
const EPI_QKV: i32 = 1;
pub(super) const EPI_SILU: i32 = 2;
const EPI_RESID: i32 = 3;
const EPI_QKV_ROPE: i32 = 4;
const EPI_GEGLU: i32 = 5;

/// Whether rope and the KV write can run in the q/k/v GEMM's epilogue (EPI_QKV_ROPE): every
/// head must lie inside one output tile, so head_dim must divide the tile's width: 64
/// (Llama-3.2-1B, SmolLM2) on the 64-wide kernels, 128 (Llama-3.1-8B, Mistral, Qwen2-7B) on
/// the 128-wide ones ([`rope_tile_cols`]). Others (96, 256...) take qkv_proj then rope_kv_write.
pub(super) fn rope_in_epilogue(head_dim: usize) -> bool {
    head_dim >= 2 && head_dim.is_multiple_of(2) && GEMM_BN_WIDE.is_multiple_of(head_dim)
}

/// The output tile's width for the rope epilogue at `head_dim` (where [`rope_in_epilogue`]):
/// the 64-wide kernels wherever a head fits them (more blocks for a decode step), else 128.
pub(super) fn rope_tile_cols(head_dim: usize) -> usize {
    if head_dim > 0 && GEMM_BN.is_multiple_of(head_dim) {
        GEMM_BN
    } else {
        GEMM_BN_WIDE
    }
}

/// kernels/matmul.cu `RopeKv`, passed by value (all zeros where the epilogue is another).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RopeKvArg {
    positions: u64,
    inv_freq: u64,
    slots: u64,
    k_cache: u64,
    v_cache: u64,
    num_slots: u64,
    head_dim: i32,
    cache_bf16: i32,
}
// SAFETY: plain integers laid out as the kernel's struct (five pointers, a u64, two ints).
unsafe impl DeviceRepr for RopeKvArg {}
impl super::launch::Plain for RopeKvArg {}

/// Up to this many tokens a step folds the norms into the projections (`fuses_norm`): every
/// block of a projection's columns recomputes its rows' norm, reading all of each row of h
/// (264 blocks x rows x hidden floats from L2); at one or two rows that is cheaper than the
/// add_rms_norm launch it saves, at 64 it would read ~135 MB for a 2048-wide model. The bits
/// are the unfused path's either way (kernels/matmul.cu `norm_prologue`), so the threshold
/// changes speed only, never a token.
pub(super) const FUSE_NORM_MAX_TOKENS: usize = 2;

/// Where a GEMM's results go (kernels/matmul.cu `Epilogue`).
pub(super) enum GemmOut<'a> {
    /// out f32 [m, n] (+ bias).
    Plain(&'a mut CudaBuf),
    /// Fused weight rows [0, nq) to q [m, nq], the next nkv to k [m, nkv], the rest to v.
    Qkv { q: &'a mut CudaBuf, k: &'a mut CudaBuf, v: &'a mut CudaBuf, nq: usize, nkv: usize },
    /// The [`fuse_gate_up_rows`] layout: out [m, inter] = act(gate) * up (silu_mul.cu's
    /// silu or gelu_tanh).
    GateUp { out: &'a mut CudaBuf, inter: usize, act: Activation },
    /// h [m, n] += the result; with `hg`, also hg = the new h * gamma (gamma [n], a weight).
    Residual { h: &'a mut CudaBuf, hg: Option<(&'a CudaBuf, &'a mut CudaBuf)> },
    /// [`GemmOut::Qkv`]'s columns, q rotated into `q`, k rotated and v written into the
    /// caches at `kv.slots` (where [`rope_in_epilogue`]).
    QkvRope { q: &'a mut CudaBuf, nq: usize, nkv: usize, kv: KvDest<'a, CudaBuf> },
}

/// Rows of the fused gate/up weight for `inter` rows each: 64-row tiles, each 32 gate rows then
/// the same 32 up rows, the last tile zero-padded past `inter` (kernels/matmul.cu EPI_SILU).
pub(super) fn fuse_gate_up_rows(inter: usize) -> usize {
    inter.div_ceil(GEMM_BN / 2) * GEMM_BN
}

/// Row `r` of the fused gate/up weight: `Some((is_up, part row))`, or None for a padding row.
pub(super) fn gate_up_source(r: usize, inter: usize) -> Option<(bool, usize)> {
    let (tile, at) = (r / GEMM_BN, r % GEMM_BN);
    let half = GEMM_BN / 2;
    let row = tile * half + at % half;
    (row < inter).then_some((at >= half, row))
}

impl CudaBackend {
    /// A weight gathered on the device from the parts' mappings, row range by row range
    /// (`runs`: (source, first row, rows) in order), so no host copy of the whole is made.
    fn gather_weight(
        &self,
        dtype: DType,
        row_bytes: usize,
        total_rows: usize,
        runs: &[(&TensorView, usize, usize)],
        op: &str,
    ) -> Result<CudaBuf> {
        let elem = Elem::of(dtype);
        let mut b = self.alloc(elem, total_rows * row_bytes / elem.size())?;
        let mut at = 0;
        for &(src, first, rows) in runs {
            let bytes = &src.bytes()[first * row_bytes..(first + rows) * row_bytes];
            let mut dst = b.mem.slice_mut(at * row_bytes..at * row_bytes + bytes.len());
            self.stream.memcpy_htod(bytes, &mut dst).map_err(drv(&format!("{op}: copy to device")))?;
            at += rows;
        }
        Ok(b)
    }

    pub(super) fn fuse_qkv_weights(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<(CudaBuf, Option<CudaBuf>)>> {
        const OP: &str = "fuse_qkv";
        // f32 weights take the SIMT kernel, which has no epilogues: the model runs three matmuls.
        if q.dtype == DType::F32
            || k.dtype != q.dtype
            || v.dtype != q.dtype
            || q.shape.len() != 2
            || k.shape.len() != 2
            || k.shape != v.shape
            || k.shape[1] != q.shape[1]
        {
            return Ok(None);
        }
        let (nq, nkv, hidden) = (q.shape[0], k.shape[0], q.shape[1]);
        let row_bytes = hidden * Elem::of(q.dtype).size();
        let w = self.gather_weight(q.dtype, row_bytes, nq + 2 * nkv, &[(q, 0, nq), (k, 0, nkv), (v, 0, nkv)], OP)?;
        let b = match bias {
            None => None,
            Some(bs) => {
                if bs.iter().any(|b| b.dtype != bs[0].dtype)
                    || bs[0].numel() != nq
                    || bs[1].numel() != nkv
                    || bs[2].numel() != nkv
                {
                    return Ok(None);
                }
                let es = Elem::of(bs[0].dtype).size();
                Some(self.gather_weight(
                    bs[0].dtype,
                    es,
                    nq + 2 * nkv,
                    &[(bs[0], 0, nq), (bs[1], 0, nkv), (bs[2], 0, nkv)],
                    OP,
                )?)
            }
        };
        Ok(Some((w, b)))
    }

    pub(super) fn fuse_gate_up_weight(&self, gate: &TensorView, up: &TensorView) -> Result<Option<CudaBuf>> {
        const OP: &str = "fuse_gate_up";
        if gate.dtype == DType::F32 || gate.dtype != up.dtype || gate.shape != up.shape || gate.shape.len() != 2 {
            return Ok(None);
        }
        let (inter, hidden) = (gate.shape[0], gate.shape[1]);
        let half = GEMM_BN / 2;
        let mut runs = Vec::with_capacity(2 * inter.div_ceil(half));
        for first in (0..inter).step_by(half) {
            let rows = half.min(inter - first);
            runs.push((gate, first, rows));
            runs.push((up, first, rows));
        }
        // Runs are contiguous in the fused weight except where the last tile is short: place
        // each run at its own row instead of packing them.
        let elem = Elem::of(gate.dtype);
        let row_bytes = hidden * elem.size();
        let total = fuse_gate_up_rows(inter);
        let mut b = self.alloc(elem, total * hidden)?;
        self.stream.memset_zeros(&mut *b.mem).map_err(drv(&format!("{OP}: zeroing the fused weight")))?;
        for (i, &(src, first, rows)) in runs.iter().enumerate() {
            let dst_row = (i / 2) * GEMM_BN + (i % 2) * half;
            debug_assert_eq!(gate_up_source(dst_row, inter), Some((i % 2 == 1, first)));
            let bytes = &src.bytes()[first * row_bytes..(first + rows) * row_bytes];
            let mut dst = b.mem.slice_mut(dst_row * row_bytes..dst_row * row_bytes + bytes.len());
            self.stream.memcpy_htod(bytes, &mut dst).map_err(drv(&format!("{OP}: copy to device")))?;
        }
        Ok(Some(b))
    }

    /// One projection: x [m, k] times w [n, k] into `dst` (the epilogue). x is f32, or stored
    /// in w's 16-bit type (`Storage::activation_dtype`: the tile kernel then reads it as its
    /// xa, with no matmul_x pass at any m). With `norm` (m <= SPLIT_MAX_ROWS only), the input
    /// is rms_norm(norm.h) * norm.gamma, formed in the kernel, and x is not read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &self,
        op: &str,
        x: &CudaBuf,
        w: &CudaBuf,
        bias: Option<&CudaBuf>,
        dst: GemmOut<'_>,
        m: usize,
        n: usize,
        k: usize,
        norm: Option<NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let (x, norm_code) = match norm {
            Some(nm) => {
                if m > SPLIT_MAX_ROWS || w.elem == Elem::F32 {
                    return Err(err(format!("{op}: the input norm is fused only for 16-bit weights and at most {SPLIT_MAX_ROWS} rows (fuses_norm), not m = {m} with {:?} weights", w.elem)));
                }
                need_weight(nm.gamma, k, op, "norm gamma")?;
                (nm.h, nm.gamma.elem.bias_code())
            }
            None => (x, 0),
        };
        // x stored in 16 bits: only in w's own type (the tensor cores' operand), never with a norm.
        let x16 = norm.is_none() && x.elem != Elem::F32;
        if x16 {
            if x.elem != w.elem {
                return Err(err(format!(
                    "{op}: x holds {:?}, but {:?} weights take f32 x or x of their own type",
                    x.elem, w.elem
                )));
            }
            need(x, w.elem, m * k, op, "x")?;
        } else {
            need(x, Elem::F32, m * k, op, if norm.is_some() { "norm h" } else { "x" })?;
        }
        let wi = need_weight(w, n * k, op, "w")?;
        let bias_code = match bias {
            Some(b) => {
                need_weight(b, n, op, "bias")?;
                b.elem.bias_code()
            }
            None => 0,
        };
        let (mi, ni, ki) = (i32_of(m, op, "m")?, i32_of(n, op, "n")?, i32_of(k, op, "k")?);
        i32_of(m * k, op, "m*k")?;
        i32_of(n * k, op, "n*k")?;
        i32_of(m * n, op, "m*n")?;
        // Without a bias the kernels never read the pointer; pass w to have a valid one.
        let bias_mem = bias.map(|b| &*b.mem).unwrap_or(&*w.mem);
        if w.elem == Elem::F32 {
            let GemmOut::Plain(out) = dst else {
                return Err(err(format!(
                    "{op}: f32 weights have no fused epilogue (fuse_qkv / fuse_gate_up give none for them)"
                )));
            };
            // f32 weights: the SIMT kernel for every m (exact f32, see kernels/matmul.cu).
            let grid = (u32_of(n.div_ceil(64), op, "blocks")?, u32_of(m.div_ceil(64), op, "blocks")?, 1);
            if grid.1 > 65535 {
                return Err(err(format!("{op}: m = {m} needs more than 65535 row tiles")));
            }
            let kern = &self.kernels.matmul_tiled_f32;
            let mut l = self.launch_args(&kern.f);
            l.arg(&*x.mem).arg(&*w.mem).arg(bias_mem).arg(&bias_code).arg(&mut *out.mem).arg(&mi).arg(&ni).arg(&ki);
            // SAFETY: as in embedding.
            let r = unsafe { l.launch(cfg(grid, 256)) };
            return self.launched(kern.name, r);
        }
        // xa's row pitch: k itself for x stored in 16 bits (the kernel loads rows that are not
        // 16-byte aligned, k % 8 != 0, element by element), else matmul_x's padded kp.
        let kp = if x16 { k } else { k.div_ceil(8) * 8 };
        let kpi = i32_of(m * kp, op, "m*kp").and(i32_of(kp, op, "kp"))?;
        let cols = match &dst {
            GemmOut::QkvRope { kv, .. } => rope_tile_cols(kv.geometry.head_dim),
            _ => GEMM_BN,
        };
        // Up to SPLIT_MAX_ROWS rows the tile kernel reads x f32 itself (no matmul_x launch).
        let GemmPlan { kernel: g, slices, slice_len, split, direct, grid, smem } = gemm_plan(m, n, k, cols);
        let grid = (u32_of(grid.0, op, "blocks")?, u32_of(grid.1, op, "blocks")?, u32_of(grid.2, op, "blocks")?);
        if grid.1 > 65535 || grid.2 > 65535 {
            return Err(err(format!("{op}: m = {m}, k = {k} exceed the launch grid")));
        }
        if split && (grid.0 * grid.1) as usize > GEMM_COUNTERS {
            return Err(err(format!(
                "{op}: {} output tiles exceed the split-K counters (k_slices broke its bound)",
                grid.0 * grid.1
            )));
        }
        let mut s =
            self.mm_scratch.lock().map_err(|_| err(format!("{op}: scratch lock poisoned by an earlier panic")))?;
        let xa_bytes = if direct || x16 { 16 } else { m * kp * 2 };
        if s.fixed && s.xa.as_ref().is_none_or(|b| b.len() < xa_bytes) {
            return Err(err(format!("{op}: m = {m}, k = {k} need {xa_bytes} bytes of x scratch, beyond the workspace reserved at load (max_num_batched_tokens?)")));
        }
        if s.xa.as_ref().is_none_or(|b| b.len() < xa_bytes) {
            // SAFETY: matmul_x writes every element the tile kernel reads (kp columns of m rows).
            s.xa = Some(
                unsafe { self.stream.alloc::<u8>(xa_bytes) }
                    .map_err(drv(&format!("{op}: x scratch of {xa_bytes} bytes")))?,
            );
        }
        if split && s.part.is_none() {
            let bytes = GEMM_PART_FLOATS * 4;
            // SAFETY: each split launch writes every partial its fold reads.
            s.part = Some(
                unsafe { self.stream.alloc::<u8>(bytes) }
                    .map_err(drv(&format!("{op}: split-K workspace of {bytes} bytes")))?,
            );
        }
        if s.counters.is_none() {
            s.counters = Some(
                self.stream.alloc_zeros::<u8>(GEMM_COUNTERS * 4).map_err(drv(&format!("{op}: split-K counters")))?,
            );
        }
        if split && slices * m * n > GEMM_PART_FLOATS {
            return Err(err(format!(
                "{op}: {slices} slices of {m}x{n} exceed the split-K workspace (k_slices broke its bound)"
            )));
        }
        let MatmulScratch { xa: Some(xa), part, counters: Some(counters), .. } = &mut *s else {
            return Err(err(format!("{op}: scratch missing after allocation")));
        };
        if !direct && !x16 {
            // wi is 1 (bf16) or 2 (f16) here: f32 weights returned above.
            let kern = &self.kernels.matmul_x[wi - 1];
            let mut l = self.launch_args(&kern.f);
            l.arg(&*x.mem).arg(&mut *xa).arg(&mi).arg(&ki).arg(&kpi);
            // SAFETY: as in embedding; xa holds m * kp 16-bit values.
            let r = unsafe { l.launch(cfg((mi as u32, 1, 1), 256)) };
            self.launched(kern.name, r)?;
        }
        // TANDEM_CUDA_GEMM_LARGE=wgmma: the wgmma + TMA kernel where it applies, with the same
        // epilogue arguments; its tensor maps replace x, xa and w at the head of the list.
        let wg = match &self.wgmma {
            Some(kerns) if wgmma_applies(m, k, norm.is_some()) => {
                let kern = &kerns[wi - 1];
                // kp == k here (k % 8 == 0): xa (or x stored in 16 bits) is [m, k].
                let x_addr = if x16 { x.mem.device_ptr(&self.stream).0 } else { xa.device_ptr(&self.stream).0 };
                let xm = tma_map(op, x_addr, wi == 1, m, k, k)?;
                let wm = tma_map(op, w.mem.device_ptr(&self.stream).0, wi == 1, n, k, k)?;
                let grid =
                    (u32_of(n.div_ceil(WGMMA_TILE), op, "blocks")?, u32_of(m.div_ceil(WGMMA_TILE), op, "blocks")?, 1);
                if grid.1 > 65535 {
                    return Err(err(format!("{op}: m = {m} needs more than 65535 row tiles")));
                }
                Some((kern, xm, wm, grid))
            }
            _ => None,
        };
        // A null pointer where the kernel reads nothing: x when it reads xa, unused outputs.
        let null = 0u64;
        let kern = match &wg {
            Some((kern, ..)) => *kern,
            None => &self.kernels.matmul_tc[wi - 1][g.index],
        };
        let (li, si) = (i32_of(slice_len, op, "slice_len")?, i32_of(slices, op, "slices")?);
        let mut l = self.launch_args(&kern.f);
        if let Some((_, xm, wm, _)) = &wg {
            l.arg(xm).arg(wm);
        } else {
            if direct && !x16 {
                l.arg(&*x.mem);
            } else {
                l.arg(&null);
            }
            if x16 {
                l.arg(&*x.mem);
            } else {
                l.arg(&*xa);
            }
            l.arg(&*w.mem);
        }
        l.arg(bias_mem).arg(&bias_code);
        let (epi, en0, en1);
        let mut rope = RopeKvArg::default();
        // The epilogue's gamma (EPI_RESID with hg) and its dtype code; w where there is none.
        let (mut ep_gamma, mut ep_gamma_code) = (&*w.mem, 0i32);
        // Whether the activation output (silu's out, the residual's hg) is stored in w's type.
        let mut act16 = 0i32;
        let act_out = |b: &CudaBuf, len: usize, what: &str| -> Result<i32> {
            need_act(b, len, op, what)?;
            if b.elem != Elem::F32 && b.elem != w.elem {
                return Err(err(format!(
                    "{op}: `{what}` holds {:?}; with {:?} weights it is f32 or {:?}",
                    b.elem, w.elem, w.elem
                )));
            }
            Ok(i32::from(b.elem != Elem::F32))
        };
        match dst {
            GemmOut::Plain(out) => {
                need(out, Elem::F32, m * n, op, "out")?;
                l.arg(&mut *out.mem).arg(&null).arg(&null);
                (epi, en0, en1) = (EPI_PLAIN, 0, 0);
            }
            GemmOut::Residual { h, hg } => {
                if bias_code != 0 {
                    return Err(err(format!("{op}: the residual add takes no bias")));
                }
                need(h, Elem::F32, m * n, op, "h")?;
                l.arg(&mut *h.mem);
                match hg {
                    Some((gamma, hg)) => {
                        need_weight(gamma, n, op, "gamma")?;
                        act16 = act_out(hg, m * n, "hg")?;
                        (ep_gamma, ep_gamma_code) = (&*gamma.mem, gamma.elem.bias_code());
                        l.arg(&mut *hg.mem);
                    }
                    None => {
                        l.arg(&null);
                    }
                }
                l.arg(&null);
                (epi, en0, en1) = (EPI_RESID, 0, 0);
            }
            GemmOut::QkvRope { q, nq, nkv, kv } => {
                let g = kv.geometry;
                if nq + 2 * nkv != n
                    || !rope_in_epilogue(g.head_dim)
                    || !nq.is_multiple_of(g.head_dim)
                    || nkv != g.num_kv_heads * g.head_dim
                    || !cols.is_multiple_of(g.head_dim)
                {
                    return Err(err(format!(
                        "{op}: nq {nq}, nkv {nkv}, head_dim {} do not fit the rope epilogue of a {n}-row fused weight",
                        g.head_dim
                    )));
                }
                need(q, Elem::F32, m * nq, op, "q")?;
                need(kv.positions, Elem::U32, m, op, "positions")?;
                need(kv.slots, Elem::U32, m, op, "slots")?;
                need(kv.inv_freq, Elem::F32, g.head_dim / 2, op, "inv_freq")?;
                let bf16 = need_kv(kv.k_cache, kv.v_cache, g, op)? == 1;
                let ptr = |b: &CudaBuf| b.mem.device_ptr(&self.stream).0;
                rope = RopeKvArg {
                    positions: ptr(kv.positions),
                    inv_freq: ptr(kv.inv_freq),
                    slots: ptr(kv.slots),
                    k_cache: ptr(kv.k_cache),
                    v_cache: ptr(kv.v_cache),
                    num_slots: g.slots() as u64,
                    head_dim: i32_of(g.head_dim, op, "head_dim")?,
                    cache_bf16: bf16 as i32,
                };
                l.arg(&mut *q.mem).arg(&null).arg(&null);
                (epi, en0, en1) = (EPI_QKV_ROPE, i32_of(nq, op, "nq")?, i32_of(nkv, op, "nkv")?);
            }
            GemmOut::Qkv { q, k: kb, v, nq, nkv } => {
                if nq + 2 * nkv != n {
                    return Err(err(format!("{op}: nq {nq} + 2 nkv {nkv} != the fused weight's {n} rows")));
                }
                need(q, Elem::F32, m * nq, op, "q")?;
                need(kb, Elem::F32, m * nkv, op, "k")?;
                need(v, Elem::F32, m * nkv, op, "v")?;
                l.arg(&mut *q.mem).arg(&mut *kb.mem).arg(&mut *v.mem);
                (epi, en0, en1) = (EPI_QKV, i32_of(nq, op, "nq")?, i32_of(nkv, op, "nkv")?);
            }
            GemmOut::GateUp { out, inter, act } => {
                if fuse_gate_up_rows(inter) != n || bias_code != 0 {
                    return Err(err(format!(
                        "{op}: the fused gate/up weight has {n} rows, {inter} outputs need {} (and no bias)",
                        fuse_gate_up_rows(inter)
                    )));
                }
                act16 = act_out(out, m * inter, "out")?;
                l.arg(&mut *out.mem).arg(&null).arg(&null);
                let code = match act {
                    Activation::Silu => EPI_SILU,
                    Activation::GeluTanh => EPI_GEGLU,
                };
                (epi, en0, en1) = (code, i32_of(inter, op, "inter")?, 0);
            }
        }
        l.arg(&epi).arg(&en0).arg(&en1).arg(ep_gamma).arg(&ep_gamma_code).arg(&act16);
        if let Some((_, _, _, grid)) = wg {
            l.arg(&mi).arg(&ni).arg(&ki).arg(&li).arg(&rope);
            let launch =
                LaunchConfig { grid_dim: grid, block_dim: (WGMMA_THREADS, 1, 1), shared_mem_bytes: WGMMA_SMEM };
            // SAFETY: the argument list matches matmul_wgmma_<dt>'s; the tensor maps cover x
            // [m, k] and w [n, k] (checked above); each output holds what its epilogue writes.
            let r = unsafe { l.launch(launch) };
            return self.launched(kern.name, r);
        }
        match part.as_mut().filter(|_| split) {
            Some(p) => l.arg(p),
            // Not split: the kernel never touches `part`; any valid pointer does.
            None => l.arg(&*xa),
        };
        l.arg(&mut *counters);
        l.arg(&mi).arg(&ni).arg(&ki).arg(&kpi).arg(&li).arg(&si);
        let norm_eps = norm.map_or(0.0f32, |nm| nm.eps);
        match norm {
            Some(nm) => l.arg(&*nm.gamma.mem),
            None => l.arg(&*w.mem),
        };
        l.arg(&norm_code).arg(&norm_eps).arg(&rope);
        let launch = LaunchConfig { grid_dim: grid, block_dim: (g.threads, 1, 1), shared_mem_bytes: smem };
        // SAFETY: the argument list matches the kernel's; dynamic shared memory as its
        // GemmShape expects; part (when split) holds slices * m * n floats and counters one
        // word per output tile (both checked above); each output holds what its epilogue writes.
        let r = unsafe { l.launch(launch) };
        self.launched(kern.name, r)
    }
}

#[cfg(test)]
mod matmul_tests {
    use super::*;

    /// The fused gate/up layout: each 64-row tile is 32 gate rows then the same 32 up rows;
    /// a short last tile is padded, and every part row appears exactly once.
    #[test]
    fn gate_up_rows_interleave_in_blocks_of_32() {
        assert_eq!(fuse_gate_up_rows(64), 128);
        assert_eq!(fuse_gate_up_rows(70), 192);
        assert_eq!(gate_up_source(0, 70), Some((false, 0)));
        assert_eq!(gate_up_source(31, 70), Some((false, 31)));
        assert_eq!(gate_up_source(32, 70), Some((true, 0)));
        assert_eq!(gate_up_source(64, 70), Some((false, 32)));
        assert_eq!(gate_up_source(128 + 5, 70), Some((false, 69)));
        assert_eq!(gate_up_source(128 + 6, 70), None);
        assert_eq!(gate_up_source(128 + 32 + 5, 70), Some((true, 69)));
        for inter in [1, 31, 32, 33, 70, 14336] {
            let mut seen = vec![[0u8; 2]; inter];
            for r in 0..fuse_gate_up_rows(inter) {
                if let Some((up, row)) = gate_up_source(r, inter) {
                    seen[row][up as usize] += 1;
                }
            }
            assert!(seen.iter().all(|s| *s == [1, 1]), "inter {inter}");
        }
    }

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
        assert!(!GEMM_DEFAULT_VARIANTS.wgmma, "the wgmma kernel is off by default");
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
                    let (narrow, wide) = (gemm_plan(m, n, k, GEMM_BN), gemm_plan(m, n, k, GEMM_BN_WIDE));
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
            (gemm_plan(1, 6144, 4096, GEMM_BN_WIDE).slices, gemm_plan(1, 6144, 4096, GEMM_BN_WIDE).slice_len),
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

    /// Which head_dims the rope epilogue serves, and on which tile width.
    #[test]
    fn rope_epilogue_head_dims() {
        for hd in [2, 4, 8, 16, 32, 64] {
            assert!(rope_in_epilogue(hd) && rope_tile_cols(hd) == GEMM_BN, "{hd}");
        }
        assert!(rope_in_epilogue(128) && rope_tile_cols(128) == GEMM_BN_WIDE);
        for hd in [0, 1, 3, 48, 80, 96, 192, 256] {
            assert!(!rope_in_epilogue(hd), "{hd}");
        }
    }
}
