//! The tensor-core and f32 matmul launchers of [`CudaBackend`] (kernels/matmul.cu): the plain
//! projection (`Ops::matmul`) and the fused q/k/v and gate/up projections
//! (`FusedOps::fuse_qkv` / `qkv_proj`, `fuse_gate_up` / `gate_up_act`), the residual add
//! (`matmul_residual`) and the input norm (`NormIn`) where `fuses_norm` says so, one GEMM
//! launch each for m <= 128 (x read in-kernel, split K folded in-kernel), two above
//! (matmul_x first).

use cudarc::driver::{DevicePtr, DeviceRepr, LaunchConfig};
use tandem_core::backend::{DType, KvDest, NormIn};
use tandem_core::config::Activation;
use tandem_core::weights::TensorView;
use tandem_core::Result;

use crate::buf::{need, need_act, need_kv, need_weight, CudaBuf, Elem, KV_BF16, KV_F32};
use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::gemm::*;
use crate::launch::{cfg, i32_of, u32_of};
use crate::workspace::MatmulScratch;

/// A CUtensorMap (128 opaque bytes, 64-byte aligned), passed to the kernel by value.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TmaArg([u64; 16]);
// SAFETY: plain bytes, laid out as the kernel's `TmaMap` parameter.
unsafe impl DeviceRepr for TmaArg {}
impl crate::launch::Plain for TmaArg {}

/// cuTensorMapEncodeTiled for a row-major 16-bit matrix [rows, cols] with row pitch `pitch`
/// elements: boxes of 64 columns (128 bytes, the 128-byte swizzle's width) x `box_rows` rows
/// (128, or 256 for the wide tiles' weights), out of bounds read as zeros.
fn tma_map(op: &str, addr: u64, bf16: bool, rows: usize, cols: usize, pitch: usize, box_rows: u32) -> Result<TmaArg> {
    use cudarc::driver::sys;
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [(pitch * 2) as u64];
    let bx: [u32; 2] = [64, box_rows];
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
impl crate::launch::Plain for RopeKvArg {}

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
        if let Elem::Quant(layout) = w.elem {
            return self.quant_gemm(op, x, w, layout, bias, dst, m, n, k, norm);
        }
        // TANDEM_CUDA_GEMM=cublaslt: a plain 16-bit projection without bias or norm goes to
        // cuBLASLt; the rest (biases, f32 weights, the epilogues) stays on our kernels.
        let dst = match (dst, &self.cublaslt, bias, &norm, w.elem) {
            (GemmOut::Plain(out), Some(lt), None, None, Elem::BF16 | Elem::F16) => {
                return self.cublaslt_gemm(lt, op, x, w, out, m, n, k)
            }
            (dst, ..) => dst,
        };
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
        let GemmPlan { kernel: g, slices, slice_len, split, direct, grid, smem } =
            gemm_plan(m, n, k, cols, &self.switches.gemm);
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
        // TANDEM_CUDA_GEMM_LARGE=wgmma_ws: the persistent kernels, 128 x 256 tiles where the
        // GEMM has one K slice, one block an SM at most.
        let wg = if !wgmma_applies(m, k, norm.is_some()) {
            None
        } else if let Some(kerns) = &self.wgmma {
            let kern = &kerns[wi - 1];
            // kp == k here (k % 8 == 0): xa (or x stored in 16 bits) is [m, k].
            let x_addr = if x16 { x.mem.device_ptr(&self.stream).0 } else { xa.device_ptr(&self.stream).0 };
            let xm = tma_map(op, x_addr, wi == 1, m, k, k, WGMMA_TILE as u32)?;
            let wm = tma_map(op, w.mem.device_ptr(&self.stream).0, wi == 1, n, k, k, WGMMA_TILE as u32)?;
            let grid =
                (u32_of(n.div_ceil(WGMMA_TILE), op, "blocks")?, u32_of(m.div_ceil(WGMMA_TILE), op, "blocks")?, 1);
            if grid.1 > 65535 {
                return Err(err(format!("{op}: m = {m} needs more than 65535 row tiles")));
            }
            Some((kern, xm, wm, grid, WGMMA_SMEM))
        } else if let Some(ws) = &self.wgmma_ws {
            let wide = wgmma_ws_wide(n, k);
            let kern = if wide { &ws.wide[wi - 1] } else { &ws.tile[wi - 1] };
            let x_addr = if x16 { x.mem.device_ptr(&self.stream).0 } else { xa.device_ptr(&self.stream).0 };
            let xm = tma_map(op, x_addr, wi == 1, m, k, k, WGMMA_TILE as u32)?;
            let box_rows = if wide { 2 * WGMMA_TILE } else { WGMMA_TILE } as u32;
            let wm = tma_map(op, w.mem.device_ptr(&self.stream).0, wi == 1, n, k, k, box_rows)?;
            // The kernel counts tiles in i32.
            i32_of(m.div_ceil(WGMMA_TILE) * n.div_ceil(box_rows as usize), op, "tiles")?;
            let grid = (u32_of(wgmma_ws_grid(m, n, wide, ws.sms), op, "blocks")?, 1, 1);
            Some((kern, xm, wm, grid, WGMMA_WS_SMEM[usize::from(wide)]))
        } else {
            None
        };
        // A null pointer where the kernel reads nothing: x when it reads xa, unused outputs.
        let null = 0u64;
        let kern = match &wg {
            Some((kern, ..)) => *kern,
            None => &self.kernels.matmul_tc[wi - 1][g.index],
        };
        let (li, si) = (i32_of(slice_len, op, "slice_len")?, i32_of(slices, op, "slices")?);
        let mut l = self.launch_args(&kern.f);
        if let Some((_, xm, wm, ..)) = &wg {
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
                let bf16 = match need_kv(kv.k_cache, kv.v_cache, g, op)? {
                    KV_F32 => false,
                    KV_BF16 => true,
                    _ => return Err(err(format!("{op}: the rope epilogue stores an f32 or bf16 cache, not fp8"))),
                };
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
        if let Some((_, _, _, grid, smem)) = wg {
            l.arg(&mi).arg(&ni).arg(&ki).arg(&li).arg(&rope);
            let launch = LaunchConfig { grid_dim: grid, block_dim: (WGMMA_THREADS, 1, 1), shared_mem_bytes: smem };
            // SAFETY: the argument list matches matmul_wgmma_<dt>'s (and matmul_wgmma_ws*'s,
            // the same list); the tensor maps cover x
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
