//! The launchers of kernels/quant_matmul.cu: a matmul and an embedding on a weight kept in a
//! GGUF block layout, as FP8 e4m3 runs with their scales or as int4 groups with their scales
//! and zero points (`tandem_core::quant_layout`), its bytes on the device as the loader keeps
//! them. Such a buffer is [`Elem::Quant`], its length counted in bytes; [`CudaBackend::gemm`]
//! and the embedding hand it here. Only the plain epilogue (out f32, optional bias) exists for
//! it: the model fuses q/k/v and gate/up only for 16-bit weights (`fuse_qkv` gives none for a
//! quantized one), so a quantized layer runs plain matmuls.
//!
//! Every row of a matmul is computed by the same warp-local sequence whatever m is (the
//! kernel's header), so batch invariance holds as it does for the bf16 GEMM. With
//! `TANDEM_CUDA_QUANT_TC=1`, FP8, int4 and every GGUF layout take kernels/quant_mma.cu's
//! tensor-core kernels instead (quant_mma.rs): batch-invariant too, with other bits.

use tandem_core::backend::NormIn;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::Result;

use crate::buf::{need, need_weight, CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::err;
use crate::launch::{cfg, i32_of, u32_of};
use crate::matmul::GemmOut;

/// Output columns a block (a warp each) and x rows a block (kernels/quant_matmul.cu
/// `QM_WARPS`, `QM_ROWS`).
pub(crate) const QM_WARPS: usize = 4;
pub(crate) const QM_ROWS: usize = 8;

#[cfg(test)]
/// The kernels' suffixes, in [`QuantLayout::GGUF`]'s order, then FP8, then int4 by group (the
/// index of [`quant_index`]).
pub(crate) const QUANT_SUFFIXES: [&str; crate::kernels::QUANT_KINDS] =
    ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k", "fp8", "int4_g32", "int4_g64", "int4_g128"];

/// Where `layout`'s kernels are in [`crate::kernels::Kernels`]' quant arrays; None for a layout
/// CUDA does not run kept quantized (int4 groups other than
/// [`QuantLayout::INT4_GROUPS_CUDA`]).
pub(crate) fn quant_index(layout: QuantLayout) -> Option<usize> {
    match layout {
        QuantLayout::Fp8E4m3(_) => Some(QuantLayout::GGUF.len()),
        QuantLayout::Int4Group { group } => {
            QuantLayout::INT4_GROUPS_CUDA.iter().position(|&g| g == group).map(|i| QuantLayout::GGUF.len() + 1 + i)
        }
        _ => QuantLayout::GGUF.iter().position(|&l| l == layout),
    }
}

/// Bytes of `rows` rows of `cols` values in `layout`, or an error naming the op and the shape.
fn weight_bytes(layout: QuantLayout, rows: usize, cols: usize, op: &str, what: &str) -> Result<usize> {
    let row = layout.row_bytes(cols).map_err(|m| err(format!("{op}: `{what}`: {m}")))?;
    Ok(rows * row)
}

/// The index of `layout`'s kernels, or an error naming it.
fn kernel_index(layout: QuantLayout, op: &str, what: &str) -> Result<usize> {
    quant_index(layout).ok_or_else(|| {
        err(format!("{op}: `{what}` is kept as {}, which the cuda backend does not run quantized", layout.name()))
    })
}

impl CudaBackend {
    /// `out [m, n] = x [m, k] · wᵀ (+ bias)` with `w` kept in `layout`; the one epilogue is
    /// [`GemmOut::Plain`], and the input norm is never fused into it.
    #[allow(clippy::too_many_arguments)] // the GEMM's own argument list, as `gemm` takes it
    pub(crate) fn quant_gemm(
        &self,
        op: &str,
        x: &CudaBuf,
        w: &CudaBuf,
        layout: QuantLayout,
        bias: Option<&CudaBuf>,
        dst: GemmOut<'_>,
        m: usize,
        n: usize,
        k: usize,
        norm: Option<NormIn<'_, CudaBuf>>,
    ) -> Result<()> {
        let GemmOut::Plain(out) = dst else {
            return Err(err(format!(
                "{op}: weights kept as {} have no fused epilogue (fuse_qkv / fuse_gate_up give none for them)",
                layout.name()
            )));
        };
        if norm.is_some() {
            return Err(err(format!("{op}: the input norm is not fused for weights kept as {}", layout.name())));
        }
        let ki = kernel_index(layout, op, "w")?;
        let bytes = weight_bytes(layout, n, k, op, "w")?;
        if w.len < bytes {
            return Err(err(format!("{op}: `w` holds {} bytes of {}, [{n}, {k}] needs {bytes}", w.len, layout.name())));
        }
        let x_code = match x.elem {
            Elem::F32 | Elem::BF16 | Elem::F16 => x.elem.bias_code(),
            other => return Err(err(format!("{op}: `x` holds {other:?}, expected f32, bf16 or f16"))),
        };
        need(x, x.elem, m * k, op, "x")?;
        need(out, Elem::F32, m * n, op, "out")?;
        let bias_code = match bias {
            Some(b) => {
                need_weight(b, n, op, "bias")?;
                b.elem.bias_code()
            }
            None => 0,
        };
        let (mi, ni, kk) = (i32_of(m, op, "m")?, i32_of(n, op, "n")?, i32_of(k, op, "k")?);
        i32_of(m * n, op, "m*n")?;
        // The tensor-core kernels (TANDEM_CUDA_QUANT_TC=1, quant_mma.rs' layouts) take the GEMV's
        // argument list; only the kernel and the grid differ.
        let (kern, grid, block) = match self.quant_mma_plan(op, layout, m, n)? {
            Some(plan) => plan,
            None => {
                let grid = (u32_of(n.div_ceil(QM_WARPS), op, "blocks")?, u32_of(m.div_ceil(QM_ROWS), op, "blocks")?, 1);
                if grid.1 > 65535 {
                    return Err(err(format!("{op}: m = {m} needs more than 65535 row blocks")));
                }
                (&self.kernels.quant_matmul[ki], grid, (32 * QM_WARPS) as u32)
            }
        };
        // Without a bias the kernel never reads the pointer; pass w to have a valid one.
        let bias_mem = bias.map(|b| &*b.mem).unwrap_or(&*w.mem);
        let mut l = self.launch_args(&kern.f);
        l.arg(&*w.mem).arg(&*x.mem).arg(&x_code).arg(bias_mem).arg(&bias_code).arg(&mut *out.mem);
        l.arg(&mi).arg(&ni).arg(&kk);
        // SAFETY: the argument list matches quant_matmul_<layout>'s and quant_mma_<layout>_m<BM>'s
        // signature; w holds n rows of k values, x m * k, out m * n (checked above).
        let r = unsafe { l.launch(cfg(grid, block)) };
        self.launched(kern.name, r)
    }

    /// `out[t, :]` = row `ids[t]` of `table`, kept in `layout`, decoded to f32.
    pub(crate) fn quant_embedding(
        &self,
        table: &CudaBuf,
        layout: QuantLayout,
        ids: &CudaBuf,
        out: &mut CudaBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        const OP: &str = "embedding";
        let ki = kernel_index(layout, OP, "table")?;
        let row = weight_bytes(layout, 1, hidden, OP, "table")?;
        if !table.len.is_multiple_of(row) {
            return Err(err(format!(
                "{OP}: table holds {} bytes of {}, not a whole number of {row}-byte rows of hidden = {hidden}",
                table.len,
                layout.name()
            )));
        }
        need(ids, Elem::U32, num_tokens, OP, "ids")?;
        need(out, Elem::F32, num_tokens * hidden, OP, "out")?;
        let (t, h, v) = (
            i32_of(num_tokens, OP, "num_tokens")?,
            i32_of(hidden, OP, "hidden")?,
            i32_of(table.len / row, OP, "vocab")?,
        );
        let kern = &self.kernels.quant_embedding[ki];
        let mut l = self.launch_args(&kern.f);
        l.arg(&*table.mem).arg(&*ids.mem).arg(&mut *out.mem).arg(&t).arg(&h).arg(&v);
        // SAFETY: argument list matches quant_embedding_<layout>'s signature; lengths checked above.
        let r = unsafe { l.launch(cfg((t as u32, 1, 1), 256)) };
        self.launched(kern.name, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The suffixes follow QuantLayout::GGUF, then FP8 and int4 by group (the kernels' names are
    /// built from them), exactly the int4 groups the layout table lists for cuda, and the
    /// kernel's tile constants match.
    #[test]
    fn suffixes_follow_the_gguf_order() {
        for (i, l) in QuantLayout::GGUF.into_iter().enumerate() {
            assert_eq!(QUANT_SUFFIXES[i], l.name().to_lowercase(), "{l:?}");
            assert_eq!(quant_index(l), Some(i));
        }
        let src = include_str!("../../../kernels/quant_matmul.cu");
        assert!(src.contains(&format!("#define QM_WARPS {QM_WARPS}\n")));
        assert!(src.contains(&format!("#define QM_ROWS {QM_ROWS}\n")));
        let fp8 = quant_index(QuantLayout::Fp8E4m3(tandem_core::quant_layout::Fp8Scales::Block));
        assert_eq!(fp8.map(|i| QUANT_SUFFIXES[i]), Some("fp8"));
        for group in QuantLayout::INT4_GROUPS_CUDA {
            let i = quant_index(QuantLayout::Int4Group { group });
            assert_eq!(i.map(|i| QUANT_SUFFIXES[i]), Some(format!("int4_g{group}").as_str()));
            assert!(QuantLayout::Int4Group { group }.backends().contains(&"cuda"), "{group}");
            // The kernel's block size is the layout's.
            let bytes = QuantLayout::Int4Group { group }.block_bytes();
            assert!(src.contains(&format!("template <> struct QLayout<QL_INT4_G{group}> : QInt4<{group}> {{}};")));
            assert_eq!(bytes, 8 + group / 2);
        }
        for group in [8, 16, 256] {
            assert_eq!(quant_index(QuantLayout::Int4Group { group }), None, "{group}");
            assert!(!QuantLayout::Int4Group { group }.backends().contains(&"cuda"), "{group}");
        }
    }
}
