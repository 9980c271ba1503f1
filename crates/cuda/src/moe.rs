//! The routed mixture of experts of [`CudaBackend`] (kernels/moe.cu, the comment at its top):
//! `FusedOps::moe_prepare` (a device table of the experts' weight pointers, at load) and
//! `FusedOps::moe_routed` (tokens grouped per expert on the device, the experts' GEMMs as one
//! grouped launch each on matmul.cu's tile code, the combine in ascending expert id), picked by
//! `TANDEM_CUDA_MOE` (`routed`, the default, or `dense`: every expert over every token). The
//! launches and their sizes depend on the step's shape only, so decode steps are still captured
//! as graphs; the scratch is reserved at load with the rest of the workspace
//! (`WorkspaceLimits::moe`). kernels/emu/moe_test.h mirrors [`routed_rows`] and the launches.

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};
use tandem_core::backend::{MoeExpert, MoeLimits};
use tandem_core::Result;

use crate::buf::{need, CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::gemm::{k_slices, GEMM_BN};
use crate::launch::{cfg, i32_of, u32_of};
use crate::matmul::fuse_gate_up_rows;

/// Tokens per block of the grouping kernels (kernels/moe.cu MOE_CHUNK).
pub(super) const MOE_CHUNK: usize = 64;

/// Which path a mixture of experts takes on CUDA (`TANDEM_CUDA_MOE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MoePath {
    /// Every expert over every token, added with `moe_accumulate` (layers::Moe).
    Dense,
    /// Each expert over its own tokens (this module).
    Routed,
}

/// The default: routed gives the every-expert path's bits (kernels/emu/moe_test.h, and the
/// fake-driver compares), at top_k / experts of its GEMM work.
pub(super) const MOE_DEFAULT: MoePath = MoePath::Routed;

/// `TANDEM_CUDA_MOE`: `routed` or `dense`; unset or empty gives [`MOE_DEFAULT`].
pub(super) fn moe_path(v: Option<&str>) -> Result<MoePath> {
    match v {
        None | Some("") => Ok(MOE_DEFAULT),
        Some("routed") => Ok(MoePath::Routed),
        Some("dense") => Ok(MoePath::Dense),
        Some(o) => Err(err(format!("TANDEM_CUDA_MOE={o}: expected routed or dense"))),
    }
}

/// The row tile of the grouped GEMM: 16 rows (the m16 kernel) while the experts average at
/// most 16 tokens each, else 64 (m64); f32 weights take the 64-row SIMT tile. Every tile
/// kernel gives a row the same bits (matmul.cu's contract): this only trades padding for
/// occupancy.
pub(super) fn routed_bm(rows: usize, experts: usize, top_k: usize, f32_weights: bool) -> usize {
    if f32_weights || rows * top_k > 16 * experts {
        64
    } else {
        16
    }
}

/// Rows of the padded layout for `rows` tokens: every routed (token, expert) pair, each used
/// expert's segment rounded up to `bm` (at most min(experts, pairs) experts are used), as a
/// multiple of `bm`. A function of the shape only (graph capture).
pub(super) fn routed_rows(rows: usize, experts: usize, top_k: usize, bm: usize) -> usize {
    let pairs = rows * top_k.min(experts);
    (pairs + pairs.min(experts) * (bm - 1)).div_ceil(bm) * bm
}

/// Byte offsets of the routed path's scratch regions in one allocation (each 256-byte aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Layout {
    rank: usize,
    sel: usize,
    cnt: usize,
    base: usize,
    seg: usize,
    tile_expert: usize,
    slot: usize,
    xg: usize,
    gate: usize,
    up: usize,
    act: usize,
    y: usize,
    pub(super) bytes: usize,
}

/// The scratch of `rows` tokens: f32 weights need gate, up and act f32 `[padded, inter]`,
/// 16-bit ones only the silu output in 16 bits.
pub(super) fn layout(
    rows: usize,
    experts: usize,
    top_k: usize,
    hidden: usize,
    inter: usize,
    f32_weights: bool,
) -> Layout {
    let bm = routed_bm(rows, experts, top_k, f32_weights);
    let padded = routed_rows(rows, experts, top_k, bm);
    let chunks = rows.div_ceil(MOE_CHUNK);
    let mut at = 0usize;
    let mut take = |bytes: usize| {
        let o = at;
        at += bytes.max(4).div_ceil(256) * 256;
        o
    };
    let (xg_bytes, act_bytes) = if f32_weights {
        (padded * hidden * 4, padded * inter * 4)
    } else {
        (padded * hidden.div_ceil(8) * 8 * 2, padded * inter * 2)
    };
    let rank = take(rows * experts * 4);
    let sel = take(rows * top_k * 4);
    let cnt = take(chunks * experts * 4);
    let base = take(chunks * experts * 4);
    let seg = take(2 * experts * 4);
    let tile_expert = take(padded / bm * 4);
    let slot = take(rows * top_k * 4);
    let xg = take(xg_bytes);
    let gate = take(if f32_weights { act_bytes } else { 0 });
    let up = take(if f32_weights { act_bytes } else { 0 });
    let act = take(act_bytes);
    let y = take(padded * hidden * 4);
    Layout { rank, sel, cnt, base, seg, tile_expert, slot, xg, gate, up, act, y, bytes: at }
}

/// Bytes to reserve for the largest step (`max_tokens`): the larger of the two weight kinds
/// (f32 weights need more), so the reservation never depends on which the model holds.
pub(super) fn workspace(max_tokens: usize, m: Option<&MoeLimits>) -> usize {
    match m {
        Some(m) if max_tokens > 0 && m.experts > 0 => {
            let (a, b) = (
                layout(max_tokens, m.experts, m.top_k, m.hidden, m.inter, true),
                layout(max_tokens, m.experts, m.top_k, m.hidden, m.inter, false),
            );
            a.bytes.max(b.bytes)
        }
        _ => 0,
    }
}

/// The routed path's scratch: one allocation, reserved at load (`fixed`) or grown on demand.
#[derive(Default)]
pub(super) struct MoeScratch {
    pub(super) mem: Option<CudaSlice<u8>>,
    pub(super) fixed: bool,
}

impl CudaBackend {
    pub(super) fn moe_table(
        &self,
        experts: &[MoeExpert<'_, CudaBuf>],
        hidden: usize,
        inter: usize,
    ) -> Result<Option<CudaBuf>> {
        const OP: &str = "moe_prepare";
        if self.moe_path == MoePath::Dense || experts.is_empty() {
            return Ok(None);
        }
        let e0 = &experts[0];
        let elem = e0.down.elem;
        // 16-bit: the fused gate/up weight (fuse_gate_up gives one for every 16-bit MLP);
        // f32: gate and up apart. Anything else (mixed types) runs every expert.
        let fused =
            elem != Elem::F32 && experts.iter().all(|x| x.up.is_none() && x.gate.elem == elem && x.down.elem == elem);
        let split = elem == Elem::F32
            && experts
                .iter()
                .all(|x| x.up.is_some_and(|u| u.elem == elem) && x.gate.elem == elem && x.down.elem == elem);
        if !fused && !split {
            tracing::info!("cuda: a mixture of experts with mixed weight types runs every expert over every token");
            return Ok(None);
        }
        let gate_rows = if fused { fuse_gate_up_rows(inter) } else { inter };
        let mut ptrs: Vec<u64> = Vec::with_capacity(3 * experts.len());
        let ptr = |b: &CudaBuf| b.mem.device_ptr(&self.stream).0;
        for x in experts {
            need(x.gate, elem, gate_rows * hidden, OP, "gate")?;
            ptrs.push(ptr(x.gate));
        }
        if let (true, Some(_)) = (split, e0.up) {
            for x in experts {
                let Some(u) = x.up else { return Err(err(format!("{OP}: an f32 expert without its up weight"))) };
                need(u, elem, inter * hidden, OP, "up")?;
                ptrs.push(ptr(u));
            }
        }
        for x in experts {
            need(x.down, elem, hidden * inter, OP, "down")?;
            ptrs.push(ptr(x.down));
        }
        let bytes: Vec<u8> = ptrs.iter().flat_map(|p| p.to_le_bytes()).collect();
        Ok(Some(self.upload_bytes(Elem::U32, &bytes)?))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_routed_impl(
        &self,
        table: &CudaBuf,
        experts: &[MoeExpert<'_, CudaBuf>],
        x: &CudaBuf,
        weights: &CudaBuf,
        out: &mut CudaBuf,
        rows: usize,
        hidden: usize,
        inter: usize,
        top_k: usize,
    ) -> Result<()> {
        const OP: &str = "moe_routed";
        let ne = experts.len();
        if rows == 0 || hidden == 0 {
            return Ok(());
        }
        if ne == 0 || top_k == 0 || inter == 0 {
            return Err(err(format!("{OP}: {ne} experts, top_k {top_k}, inter {inter}")));
        }
        let k = top_k.min(ne);
        let elem = experts[0].down.elem;
        let f32w = elem == Elem::F32;
        need(table, Elem::U32, (if f32w { 3 } else { 2 }) * ne * 2, OP, "table")?;
        need(weights, Elem::F32, rows * ne, OP, "weights")?;
        need(out, Elem::F32, rows * hidden, OP, "out")?;
        let x16 = x.elem != Elem::F32;
        if x16 && (f32w || x.elem != elem) {
            return Err(err(format!(
                "{OP}: x holds {:?}, but {elem:?} weights take f32 x or x of their own type",
                x.elem
            )));
        }
        need(x, x.elem, rows * hidden, OP, "x")?;
        let bm = routed_bm(rows, ne, k, f32w);
        let padded = routed_rows(rows, ne, k, bm);
        let tiles = padded / bm;
        let chunks = rows.div_ceil(MOE_CHUNK);
        let lay = layout(rows, ne, k, hidden, inter, f32w);
        let (ri, ei, ki, di, ii) = (
            i32_of(rows, OP, "rows")?,
            i32_of(ne, OP, "experts")?,
            i32_of(k, OP, "top_k")?,
            i32_of(hidden, OP, "hidden")?,
            i32_of(inter, OP, "inter")?,
        );
        i32_of(rows * ne, OP, "rows * experts")?;
        i32_of(padded * hidden.max(inter).div_ceil(8) * 8, OP, "padded rows * width")?;
        let (ci, bmi, ti) = (i32_of(chunks, OP, "chunks")?, i32_of(bm, OP, "bm")?, i32_of(tiles, OP, "tiles")?);
        if tiles > 65535 {
            return Err(err(format!("{OP}: {rows} tokens need {tiles} row tiles, beyond the launch grid")));
        }
        let mut s =
            self.moe_scratch.lock().map_err(|_| err(format!("{OP}: scratch lock poisoned by an earlier panic")))?;
        if s.mem.as_ref().is_none_or(|m| m.len() < lay.bytes) {
            if s.fixed {
                return Err(err(format!("{OP}: {rows} tokens need {} bytes of scratch, beyond the workspace reserved at load (max_num_batched_tokens?)", lay.bytes)));
            }
            s.mem = None;
            // SAFETY: every kernel below writes what a later one reads (the grouping kernels
            // every word of their outputs; gather every row a GEMM reads; the GEMMs every row
            // below seg_end, all the combine reads).
            s.mem = Some(
                unsafe { self.stream.alloc::<u8>(lay.bytes) }
                    .map_err(drv(&format!("{OP}: scratch of {} bytes", lay.bytes)))?,
            );
        }
        let Some(mem) = s.mem.as_ref() else { return Err(err(format!("{OP}: scratch missing after allocation"))) };
        let base = mem.device_ptr(&self.stream).0;
        let at = |o: usize| base + o as u64;
        let (rank, sel, cnt, bse, seg, tile_expert, slot) =
            (at(lay.rank), at(lay.sel), at(lay.cnt), at(lay.base), at(lay.seg), at(lay.tile_expert), at(lay.slot));
        let (xg, gate, up, act, y) = (at(lay.xg), at(lay.gate), at(lay.up), at(lay.act), at(lay.y));
        let seg_end = seg + 4 * ne as u64;
        let tab = table.mem.device_ptr(&self.stream).0;
        let kr = &self.kernels.moe;

        // 1-4: the grouping.
        let mut l = self.stream.launch_builder(&kr.select.f);
        l.arg(&*weights.mem).arg(&rank).arg(&sel).arg(&ri).arg(&ei).arg(&ki);
        // SAFETY: argument lists match kernels/moe.cu; every buffer holds what its kernel
        // indexes (the layout above, sized for this shape; weights and x checked).
        self.launched(kr.select.name, unsafe { l.launch(cfg((u32_of(rows.div_ceil(64), OP, "blocks")?, 1, 1), 64)) })?;
        let mut l = self.stream.launch_builder(&kr.count.f);
        l.arg(&rank).arg(&cnt).arg(&ri).arg(&ei);
        // SAFETY: as above.
        self.launched(kr.count.name, unsafe { l.launch(cfg((chunks as u32, 1, 1), 128)) })?;
        let mut l = self.stream.launch_builder(&kr.offsets.f);
        l.arg(&cnt).arg(&bse).arg(&seg).arg(&tile_expert).arg(&ci).arg(&ei).arg(&bmi).arg(&ti);
        // SAFETY: as above.
        self.launched(kr.offsets.name, unsafe { l.launch(cfg((1, 1, 1), 128)) })?;
        let mut l = self.stream.launch_builder(&kr.scatter.f);
        l.arg(&rank).arg(&bse).arg(&slot).arg(&ri).arg(&ei).arg(&ki);
        // SAFETY: as above.
        self.launched(kr.scatter.name, unsafe { l.launch(cfg((chunks as u32, 1, 1), 128)) })?;
        // 5: x's rows to their slots, in the tile kernel's operand format.
        let kp = if f32w { hidden } else { hidden.div_ceil(8) * 8 };
        let fmt: i32 = match elem {
            Elem::BF16 => 1,
            Elem::F16 => 2,
            _ => 0,
        };
        let (x16i, kpi) = (x16 as i32, i32_of(kp, OP, "kp")?);
        let mut l = self.stream.launch_builder(&kr.gather.f);
        l.arg(&*x.mem).arg(&x16i).arg(&xg).arg(&sel).arg(&slot).arg(&di).arg(&kpi).arg(&ki).arg(&fmt);
        // SAFETY: as above.
        self.launched(kr.gather.name, unsafe { l.launch(cfg((u32_of(rows, OP, "blocks")?, 1, 1), 256)) })?;
        // 6: the grouped GEMMs.
        let grid = |n: usize, w: usize| -> Result<(u32, u32, u32)> {
            Ok((u32_of(n.div_ceil(w), OP, "blocks")?, tiles as u32, 1))
        };
        if f32w {
            let (tg, tu, td) = (tab, tab + 8 * ne as u64, tab + 16 * ne as u64);
            for (t, dst) in [(tg, gate), (tu, up)] {
                let mut l = self.stream.launch_builder(&kr.gemm_f32.f);
                l.arg(&xg).arg(&t).arg(&tile_expert).arg(&seg_end).arg(&dst).arg(&ii).arg(&di);
                // SAFETY: as above; the table holds 3 * experts pointers to [inter, hidden] and [hidden, inter] f32 weights (moe_table).
                self.launched(kr.gemm_f32.name, unsafe { l.launch(cfg(grid(inter, 64)?, 256)) })?;
            }
            let len = (padded * inter) as u64;
            let code = 1i32;
            let mut l = self.stream.launch_builder(&self.kernels.silu_mul.f);
            l.arg(&gate).arg(&up).arg(&act).arg(&code).arg(&len);
            // SAFETY: gate, up and act hold padded * inter floats.
            self.launched(self.kernels.silu_mul.name, unsafe { l.launch(Self::elementwise_cfg(padded * inter, OP)?) })?;
            let mut l = self.stream.launch_builder(&kr.gemm_f32.f);
            l.arg(&act).arg(&td).arg(&tile_expert).arg(&seg_end).arg(&y).arg(&di).arg(&ii);
            // SAFETY: as above.
            self.launched(kr.gemm_f32.name, unsafe { l.launch(cfg(grid(hidden, 64)?, 256)) })?;
        } else {
            let g = &kr.gemm_tc[if elem == Elem::BF16 { 0 } else { 1 }][if bm == 16 { 0 } else { 1 }];
            let (threads, smem) = if bm == 16 {
                (crate::gemm::GEMM_M16.threads, crate::gemm::GEMM_M16.smem)
            } else {
                (crate::gemm::GEMM_M64.threads, crate::gemm::GEMM_M64.smem)
            };
            let nf = fuse_gate_up_rows(inter);
            let (s_gu, l_gu) = k_slices(nf, hidden);
            let (s_d, l_d) = k_slices(hidden, inter);
            let (td, one) = (tab + 8 * ne as u64, 1i32);
            let (epi_silu, epi_plain, zero) = (crate::matmul::EPI_SILU, crate::matmul::EPI_PLAIN, 0i32);
            let nfi = i32_of(nf, OP, "gate/up rows")?;
            let (lgu, sgu, ld, sd) = (
                i32_of(l_gu, OP, "slice")?,
                i32_of(s_gu, OP, "slices")?,
                i32_of(l_d, OP, "slice")?,
                i32_of(s_d, OP, "slices")?,
            );
            let mut l = self.stream.launch_builder(&g.f);
            l.arg(&xg)
                .arg(&tab)
                .arg(&tile_expert)
                .arg(&seg_end)
                .arg(&act)
                .arg(&epi_silu)
                .arg(&ii)
                .arg(&one)
                .arg(&nfi)
                .arg(&di)
                .arg(&kpi)
                .arg(&lgu)
                .arg(&sgu);
            // SAFETY: as above; dynamic shared memory as the tile's GemmShape expects (under 48 KiB).
            self.launched(g.name, unsafe {
                l.launch(LaunchConfig {
                    grid_dim: grid(nf, GEMM_BN)?,
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem,
                })
            })?;
            let mut l = self.stream.launch_builder(&g.f);
            l.arg(&act)
                .arg(&td)
                .arg(&tile_expert)
                .arg(&seg_end)
                .arg(&y)
                .arg(&epi_plain)
                .arg(&zero)
                .arg(&zero)
                .arg(&di)
                .arg(&ii)
                .arg(&ii)
                .arg(&ld)
                .arg(&sd);
            // SAFETY: as above.
            self.launched(g.name, unsafe {
                l.launch(LaunchConfig {
                    grid_dim: grid(hidden, GEMM_BN)?,
                    block_dim: (threads, 1, 1),
                    shared_mem_bytes: smem,
                })
            })?;
        }
        // 7: the combine.
        let mut l = self.stream.launch_builder(&kr.combine.f);
        l.arg(&mut *out.mem).arg(&y).arg(&*weights.mem).arg(&sel).arg(&slot).arg(&di).arg(&ei).arg(&ki);
        // SAFETY: as above.
        self.launched(kr.combine.name, unsafe { l.launch(cfg((u32_of(rows, OP, "blocks")?, 1, 1), 256)) })
    }
}

#[cfg(test)]
mod moe_tests {
    use super::*;

    #[test]
    fn env_switch_names_both_paths() {
        assert_eq!(moe_path(None).unwrap(), MOE_DEFAULT);
        assert_eq!(moe_path(Some("")).unwrap(), MOE_DEFAULT);
        assert_eq!(moe_path(Some("dense")).unwrap(), MoePath::Dense);
        assert_eq!(moe_path(Some("routed")).unwrap(), MoePath::Routed);
        assert!(moe_path(Some("sparse")).unwrap_err().to_string().contains("routed or dense"));
    }

    /// The padded layout holds every routed pair in the worst case: each used expert's
    /// segment rounded up to the tile, whatever the routing.
    #[test]
    fn padded_rows_cover_every_routing() {
        for (rows, experts, top_k) in [(1, 8, 2), (37, 8, 2), (3, 128, 8), (8192, 128, 8), (5, 4, 8), (64, 1, 1)] {
            for bm in [16, 64] {
                let p = routed_rows(rows, experts, top_k, bm);
                assert_eq!(p % bm, 0);
                let k = top_k.min(experts);
                // Worst case: the pairs spread over as many experts as possible, each one token
                // past a tile boundary.
                let used = (rows * k).min(experts);
                let mut worst = 0;
                for e in 0..used {
                    let n = rows * k / used + usize::from(e < rows * k % used);
                    worst += n.div_ceil(bm) * bm;
                }
                assert!(worst <= p, "rows {rows} experts {experts} top_k {top_k} bm {bm}: {worst} > {p}");
            }
        }
        assert_eq!(routed_bm(1, 128, 8, false), 16);
        assert_eq!(routed_bm(4096, 128, 8, false), 64);
        assert_eq!(routed_bm(1, 128, 8, true), 64);
    }

    /// The reservation covers every step up to its token count, for either weight kind.
    #[test]
    fn workspace_covers_smaller_steps() {
        let m = MoeLimits { experts: 128, top_k: 8, hidden: 2048, inter: 768 };
        let w = workspace(2048, Some(&m));
        for t in [1, 2, 17, 300, 2048] {
            for f32w in [false, true] {
                assert!(layout(t, 128, 8, 2048, 768, f32w).bytes <= w, "{t} tokens");
            }
        }
        assert_eq!(workspace(2048, None), 0);
    }
}
