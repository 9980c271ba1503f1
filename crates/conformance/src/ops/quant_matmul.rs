//! `out[m, n] = Σ_k x[m, k] · w[n, k]` with `w` kept in a quantized layout (a GGUF block
//! layout, or int4 groups, `tandem_core::quant_layout`): the backend reads the blocks as they
//! are stored.
//!
//! The reference dequantizes each weight row on the fly and dots it in the order its bf16 path
//! uses, so it gives the bits of "dequantize, then multiply" (checked below); a backend that
//! does not run the layout is a counted skip, with the refusal it gives at load.

use std::path::PathBuf;

use tandem_core::backend::Backend;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_core::{DType, Result};

use super::{limits, poisoned, read_guarded, untouched_f32, upload_f32, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

pub struct QuantMatmul {
    pub layout: QuantLayout,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Judged as W8A8 ([`limits::w8a8`]): FP8 weights where the run asked for x quantized to
    /// e4m3 per token ([`w8a8_asked`]).
    pub w8a8: bool,
}

/// Whether this process runs FP8 weights as W8A8 (`TANDEM_CUDA_QUANT_TC=w8a8`, the CUDA
/// backend's switch): the FP8 cases are then judged by [`limits::w8a8`], and say so in their
/// parameters. Unset, every backend is held to the bf16 GEMM's limit.
pub fn w8a8_asked() -> bool {
    std::env::var("TANDEM_CUDA_QUANT_TC").is_ok_and(|v| v == "w8a8")
}

pub struct QuantMatmulInputs {
    x: Vec<f32>, // [m, k]
    w: Vec<u8>,  // n rows of k / block_elems blocks
}

/// Where each GGUF layout keeps its f16 scales (and mins) inside a block: random bytes there
/// would make infinities and NaNs, so they are drawn as small finite values instead.
fn f16_fields(layout: QuantLayout) -> &'static [usize] {
    match layout {
        QuantLayout::Q8_0 | QuantLayout::Q4_0 | QuantLayout::Q5_0 => &[0],
        QuantLayout::Q4_1 | QuantLayout::Q5_1 | QuantLayout::Q4K | QuantLayout::Q5K => &[0, 2],
        QuantLayout::Q6K => &[208],
        QuantLayout::Fp8E4m3(_) | QuantLayout::Int4Group { .. } => &[],
    }
}

/// `blocks` random blocks of `layout`, scaled so that a row's values are O(1 / √k)·O(q).
pub fn random_blocks(layout: QuantLayout, blocks: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    if let QuantLayout::Fp8E4m3(scales) = layout {
        return super::quant_fp8::random_fp8_blocks(scales, blocks, k, rng);
    }
    let bb = layout.block_bytes();
    let mut out: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
    // The largest quantized magnitude is about 2^bits; scale so that weights are ~1 / √k.
    let span = match layout {
        QuantLayout::Q8_0 => 128.0,
        QuantLayout::Q6K => 32.0 * 64.0,
        QuantLayout::Q4K | QuantLayout::Q5K => 32.0 * 63.0,
        _ => 16.0,
    };
    let scale = 1.0 / (span * (k as f32).sqrt());
    for block in out.chunks_exact_mut(bb) {
        if let QuantLayout::Int4Group { .. } = layout {
            // An f32 scale, a zero point in 0..=15 and three bytes of padding (tandem_core::int4).
            block[..4].copy_from_slice(&(scale * rng.uniform(0.25, 1.0)).to_le_bytes());
            block[4] %= 16;
            block[5..8].fill(0);
        }
        for &at in f16_fields(layout) {
            let v = half::f16::from_f32(scale * rng.uniform(0.25, 1.0));
            block[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// The weight as `b` takes it: kept quantized through `upload_weight`, from a [`Weights`] that
/// holds its bytes as a GGUF file's mapping would.
fn quantized_weight<B: Backend>(b: &B, layout: QuantLayout, shape: [usize; 2], bytes: &[u8]) -> Result<B::Buf> {
    let mut ws = Weights::empty();
    ws.insert_quantized("w", layout, &shape, bytes, PathBuf::from("<op suite>"))?;
    b.upload_weight(&ws.get("w", &shape)?)
}

impl Op for QuantMatmul {
    type Inputs = QuantMatmulInputs;
    const NAME: &'static str = "quant_matmul";
    fn params(&self) -> String {
        let x = if self.w8a8 { " x=e4m3" } else { "" };
        format!("w={} m={} n={} k={}{x}", self.layout.name(), self.m, self.n, self.k)
    }
    /// The bf16 GEMM's limit: the weights decode to the same f32 values on both sides, and a
    /// backend may round x to a 16-bit type as its tensor cores take it; W8A8 rounds x to e4m3.
    fn limit(&self) -> f64 {
        if self.w8a8 {
            limits::w8a8()
        } else {
            limits::weight(DType::BF16)
        }
    }
    fn cost(&self) -> Cost {
        let (m, n, k) = (self.m as f64, self.n as f64, self.k as f64);
        let w = n * k / self.layout.block_elems() as f64 * self.layout.block_bytes() as f64;
        Cost { bytes: w + 4.0 * (m * k + m * n), flops: 2.0 * m * n * k }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let blocks = self.n * self.k / self.layout.block_elems();
        let w = random_blocks(self.layout, blocks, self.k, rng);
        QuantMatmulInputs { x: rng.normals(self.m * self.k, 1.0), w }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (m, n, k) = (self.m, self.n, self.k);
        if let Err(e) = self.layout.check_backend(b.name(), "w") {
            launch.skip(e.to_string());
            return Ok(vec![]);
        }
        let xb = upload_f32(b, &x.x)?;
        let w = quantized_weight(b, self.layout, [n, k], &x.w)?;
        let mut out = poisoned(b, m * n)?;
        launch.run(b, || b.matmul(&xb, &w, None, &mut out, m, n, k))?;
        untouched_f32(b, &xb, &x.x, "x")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, m * n, "out")?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Data;
    use tandem_core::backend::prelude::*;
    use tandem_reference::RefBackend;

    /// On the reference, a matmul on the kept blocks gives the bits of the same matmul on an f32
    /// weight holding the dequantized values, for every GGUF layout, FP8 with each scale layout
    /// and int4 groups, at decode and prefill.
    #[test]
    fn the_reference_equals_dequantize_then_multiply_bitwise() {
        use tandem_core::quant_layout::Fp8Scales;
        let b = RefBackend::new();
        let fp8 = [Fp8Scales::Tensor, Fp8Scales::Channel, Fp8Scales::Block].map(QuantLayout::Fp8E4m3);
        let int4 = [QuantLayout::Int4Group { group: 32 }, QuantLayout::Int4Group { group: 128 }];
        for layout in QuantLayout::GGUF.into_iter().chain(fp8).chain(int4) {
            for (m, n, k) in [(1, 7, 512), (5, 3, 256)] {
                let op = QuantMatmul { layout, m, n, k, w8a8: false };
                let inputs = op.generate(&mut Rng::new(11));
                let got = op.exec(&b, &inputs, &mut Launch::once()).unwrap();
                let mut values = vec![0f32; n * k];
                layout.dequantize(&inputs.w, &mut values).unwrap();
                assert!(values.iter().all(|v| v.is_finite()) && values.iter().any(|&v| v != 0.0));
                let w = b.weight_from_f32(DType::F32, &values).unwrap();
                let xb = upload_f32(&b, &inputs.x).unwrap();
                let mut out = b.alloc_f32(m * n).unwrap();
                b.matmul(&xb, &w, None, &mut out, m, n, k).unwrap();
                let want = b.read_f32(&out, m * n).unwrap();
                let Data::F32(got) = &got[0].data else { panic!("an f32 output") };
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "{}", op.params());
            }
        }
    }

    /// An int4 row's result is the same bits alone and in a batch of any size.
    #[test]
    fn an_int4_row_is_the_same_bits_alone_and_batched() {
        let b = RefBackend::new();
        let (n, k) = (45, 256);
        let layout = QuantLayout::Int4Group { group: 64 };
        let mut rng = Rng::new(5);
        let w = quantized_weight(&b, layout, [n, k], &random_blocks(layout, n * k / 64, k, &mut rng)).unwrap();
        let x = rng.normals(37 * k, 1.0);
        let run = |rows: &[f32], m: usize| {
            let xb = upload_f32(&b, rows).unwrap();
            let mut out = b.alloc_f32(m * n).unwrap();
            b.matmul(&xb, &w, None, &mut out, m, n, k).unwrap();
            b.read_f32(&out, m * n).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        let all = run(&x, 37);
        for (row, m) in [(0, 1), (2, 3), (12, 11), (36, 37)] {
            let got = run(&x[(row + 1 - m) * k..(row + 1) * k], m);
            assert_eq!(got[(m - 1) * n..], all[row * n..(row + 1) * n], "row {row} m {m}");
        }
    }

    /// The embedding reads a quantized table's rows as the matmul does.
    #[test]
    fn a_quantized_embedding_table_gives_its_dequantized_rows() {
        let b = RefBackend::new();
        let (rows, hidden) = (5, 256);
        let bytes = random_blocks(QuantLayout::Q6K, rows, hidden, &mut Rng::new(3));
        let table = quantized_weight(&b, QuantLayout::Q6K, [rows, hidden], &bytes).unwrap();
        let ids = super::super::upload_u32(&b, &[4, 0]).unwrap();
        let mut out = b.alloc_f32(2 * hidden).unwrap();
        b.embedding(&table, &ids, &mut out, 2, hidden).unwrap();
        let mut all = vec![0f32; rows * hidden];
        QuantLayout::Q6K.dequantize(&bytes, &mut all).unwrap();
        let got = b.read_f32(&out, 2 * hidden).unwrap();
        assert_eq!(&got[..hidden], &all[4 * hidden..]);
        assert_eq!(&got[hidden..], &all[..hidden]);
    }
}
