//! The quantized weight layouts, in one table: what each block holds (elements and bytes), and
//! which backends run a weight kept in it. A weight a backend does not run in its stored layout
//! is refused when the model loads ([`QuantLayout::check_backend`]), naming the layout, the
//! weight and the backend, never widened behind the user's back.
//!
//! The GGUF block layouts (ggml's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: the Q4_K_M and
//! Q5_K_M mixes whole) keep every scale inside the block, so a weight is its raw bytes, rows
//! laid out one after another (a block never spans two rows), and [`QuantLayout::dequantize`]
//! turns any run of whole blocks into values with `crate::quant_block`'s decoders. FP8 e4m3
//! (scale per tensor, per output channel or per block) is kept as runs of 32 values of a row,
//! each its f32 scale and its 32 bytes as stored (`crate::fp8::pack_blocks`), so it is a block
//! layout too (36 bytes a block, 1.125 bytes a value). Int4 with group scales and zero points
//! (AWQ, GPTQ, compressed-tensors `pack-quantized`) is converted at load into blocks of our own
//! that hold each group's scale and zero point (`crate::int4`). Both are then decoded block by
//! block like the GGUF layouts.

use crate::error::{Error, Result};
use crate::quant_block::*;

/// Where an FP8 weight's scales apply (`crate::fp8` reads all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Scales {
    Tensor,
    Channel,
    Block,
}

/// A layout a weight may be kept in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantLayout {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4K,
    Q5K,
    Q6K,
    /// e4m3 values, one byte each, in runs of 32 of a row, each run led by the f32 scale the
    /// checkpoint gives it (`crate::fp8::pack_blocks`); the payload says where the checkpoint's
    /// scales applied.
    Fp8E4m3(Fp8Scales),
    /// Eight 4-bit values a u32, with a scale and a zero point per group of `group` input
    /// elements of a row (AWQ, GPTQ, compressed-tensors `pack-quantized`), each group a block
    /// that starts with its f32 scale and its zero point (`crate::int4`).
    Int4Group {
        group: usize,
    },
}

/// The reference backend's name (`Device::name`).
const REFERENCE: &str = "reference";
/// The wgpu backend's name: its kernels read the GGUF blocks (shaders/quant_block.wgsl) and
/// int4 groups (shaders/quant_int4.wgsl) and FP8 runs (shaders/quant_fp8.wgsl).
const WGPU: &str = "wgpu";
/// The CUDA backend's name: kernels/quant_matmul.cu runs every GGUF block layout, FP8 and int4
/// groups of [`QuantLayout::INT4_GROUPS_CUDA`] (a kernel a group size).
const CUDA: &str = "cuda";

impl QuantLayout {
    /// Every GGUF block layout, in the order messages list them.
    pub const GGUF: [QuantLayout; 8] = [
        QuantLayout::Q8_0,
        QuantLayout::Q4_0,
        QuantLayout::Q4_1,
        QuantLayout::Q5_0,
        QuantLayout::Q5_1,
        QuantLayout::Q4K,
        QuantLayout::Q5K,
        QuantLayout::Q6K,
    ];

    /// The int4 group sizes the CUDA backend has kernels for (kernels/quant_matmul.cu
    /// `quant_matmul_int4_g*`): what AWQ and GPTQ checkpoints use.
    pub const INT4_GROUPS_CUDA: [usize; 3] = [32, 64, 128];

    /// The layout of ggml type id `id` (GGUF's tensor directory), for the ids kept quantized.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            2 => QuantLayout::Q4_0,
            3 => QuantLayout::Q4_1,
            6 => QuantLayout::Q5_0,
            7 => QuantLayout::Q5_1,
            8 => QuantLayout::Q8_0,
            12 => QuantLayout::Q4K,
            13 => QuantLayout::Q5K,
            14 => QuantLayout::Q6K,
            _ => return None,
        })
    }

    /// The name llama.cpp, vLLM or the checkpoint's config gives the layout.
    pub fn name(self) -> String {
        match self {
            QuantLayout::Q8_0 => "Q8_0".into(),
            QuantLayout::Q4_0 => "Q4_0".into(),
            QuantLayout::Q4_1 => "Q4_1".into(),
            QuantLayout::Q5_0 => "Q5_0".into(),
            QuantLayout::Q5_1 => "Q5_1".into(),
            QuantLayout::Q4K => "Q4_K".into(),
            QuantLayout::Q5K => "Q5_K".into(),
            QuantLayout::Q6K => "Q6_K".into(),
            QuantLayout::Fp8E4m3(s) => format!("FP8 e4m3 ({} scales)", s.name()),
            QuantLayout::Int4Group { group } => format!("int4 (groups of {group})"),
        }
    }

    /// Elements in one block (a group, for int4; a run of 32, for FP8).
    pub fn block_elems(self) -> usize {
        match self {
            QuantLayout::Q8_0 | QuantLayout::Q4_0 | QuantLayout::Q4_1 | QuantLayout::Q5_0 | QuantLayout::Q5_1 => 32,
            QuantLayout::Q4K | QuantLayout::Q5K | QuantLayout::Q6K => 256,
            QuantLayout::Fp8E4m3(_) => crate::fp8::BLOCK_ELEMS,
            QuantLayout::Int4Group { group } => group,
        }
    }

    /// Bytes one block takes in the weight tensor itself (the in-block scales included: GGUF's,
    /// FP8's scale leading each run, int4's scale and zero point leading each group).
    pub fn block_bytes(self) -> usize {
        match self {
            QuantLayout::Q8_0 => 34,
            QuantLayout::Q4_0 => 18,
            QuantLayout::Q4_1 => 20,
            QuantLayout::Q5_0 => 22,
            QuantLayout::Q5_1 => 24,
            QuantLayout::Q4K => 144,
            QuantLayout::Q5K => 176,
            QuantLayout::Q6K => 210,
            QuantLayout::Fp8E4m3(_) => crate::fp8::BLOCK_BYTES,
            QuantLayout::Int4Group { group } => crate::int4::HEADER_BYTES + group / 2,
        }
    }

    /// The backends (by `Device::name`) that run a weight kept in this layout.
    pub fn backends(self) -> &'static [&'static str] {
        match self {
            QuantLayout::Q8_0
            | QuantLayout::Q4_0
            | QuantLayout::Q4_1
            | QuantLayout::Q5_0
            | QuantLayout::Q5_1
            | QuantLayout::Q4K
            | QuantLayout::Q5K
            | QuantLayout::Q6K => &[REFERENCE, WGPU, CUDA],
            QuantLayout::Fp8E4m3(_) => &[REFERENCE, WGPU, CUDA],
            QuantLayout::Int4Group { group } if Self::INT4_GROUPS_CUDA.contains(&group) => &[REFERENCE, WGPU, CUDA],
            QuantLayout::Int4Group { .. } => &[REFERENCE, WGPU],
        }
    }

    /// `Err` naming the layout, the weight and the backend where `backend` does not run
    /// `weight` kept in this layout.
    pub fn check_backend(self, backend: &'static str, weight: &str) -> Result<()> {
        let runs = self.backends();
        if runs.contains(&backend) {
            return Ok(());
        }
        let elsewhere = if runs.is_empty() { "no backend yet".to_string() } else { runs.join(", ") };
        Err(Error::backend(
            backend,
            format!(
                "weight `{weight}` is stored as {}, which the {backend} backend does not run kept quantized \
                 ({} runs on: {elsewhere})",
                self.name(),
                self.name()
            ),
        ))
    }

    /// Bytes of a row of `cols` elements, or why `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> std::result::Result<usize, String> {
        let block = self.block_elems();
        if block == 0 || !cols.is_multiple_of(block) {
            return Err(format!(
                "rows of {cols} elements are not a whole number of {} blocks ({block} each)",
                self.name()
            ));
        }
        Ok(cols / block * self.block_bytes())
    }

    /// The values of whole blocks: `bytes` holds `dst.len() / block_elems()` blocks. Every
    /// layout keeps its scales in the block (GGUF's, FP8's runs, int4's groups) and is decoded
    /// here; a length that is not a whole number of blocks is an error.
    pub fn dequantize(self, bytes: &[u8], dst: &mut [f32]) -> std::result::Result<(), String> {
        let f: fn(&[u8], &mut [f32]) = match self {
            QuantLayout::Q8_0 => block_q8_0,
            QuantLayout::Q4_0 => block_q4_0,
            QuantLayout::Q4_1 => block_q4_1,
            QuantLayout::Q5_0 => block_q5_0,
            QuantLayout::Q5_1 => block_q5_1,
            QuantLayout::Q4K => block_q4_k,
            QuantLayout::Q5K => block_q5_k,
            QuantLayout::Q6K => block_q6_k,
            QuantLayout::Int4Group { group } if group > 0 && group.is_multiple_of(8) => crate::int4::block_int4,
            QuantLayout::Fp8E4m3(_) => crate::fp8::decode_block,
            other => {
                return Err(format!("{} keeps its scales beside the weight: not decoded block by block", other.name()))
            }
        };
        let need = self.row_bytes(dst.len())?;
        if bytes.len() != need {
            return Err(format!("{} values of {} need {need} bytes, got {}", dst.len(), self.name(), bytes.len()));
        }
        for (b, o) in bytes.chunks_exact(self.block_bytes()).zip(dst.chunks_exact_mut(self.block_elems())) {
            f(b, o);
        }
        Ok(())
    }
}

impl Fp8Scales {
    pub fn name(self) -> &'static str {
        match self {
            Fp8Scales::Tensor => "tensor",
            Fp8Scales::Channel => "channel",
            Fp8Scales::Block => "block",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_ggml_s() {
        let sizes: Vec<(usize, usize)> = QuantLayout::GGUF.iter().map(|l| (l.block_elems(), l.block_bytes())).collect();
        assert_eq!(sizes, [(32, 34), (32, 18), (32, 20), (32, 22), (32, 24), (256, 144), (256, 176), (256, 210)]);
        for id in [2, 3, 6, 7, 8, 12, 13, 14] {
            assert!(QuantLayout::from_ggml_id(id).is_some(), "ggml id {id}");
        }
        assert_eq!(QuantLayout::from_ggml_id(10), None, "Q2_K is not kept quantized");
    }

    #[test]
    fn a_backend_without_the_layout_is_refused_naming_both() {
        assert!(QuantLayout::Q4K.check_backend("reference", "w").is_ok());
        for l in QuantLayout::GGUF {
            assert!(l.check_backend("wgpu", "w").is_ok(), "{}", l.name());
            assert!(l.check_backend("cuda", "w").is_ok(), "{}", l.name());
        }
        let e = QuantLayout::Q4K.check_backend("metal", "model.layers.0.mlp.up_proj.weight").unwrap_err().to_string();
        assert!(e.contains("Q4_K") && e.contains("metal") && e.contains("up_proj") && e.contains("reference"), "{e}");
        let int4 = QuantLayout::Int4Group { group: 128 };
        assert!(int4.check_backend("reference", "w").is_ok());
        let e = int4.check_backend("metal", "w").unwrap_err().to_string();
        assert!(e.contains("int4 (groups of 128)") && e.contains("runs on: reference, wgpu, cuda"), "{e}");
        for group in [32, 64, 128] {
            assert!(QuantLayout::Int4Group { group }.check_backend("cuda", "w").is_ok(), "groups of {group}");
        }
        let e = QuantLayout::Int4Group { group: 256 }.check_backend("cuda", "w").unwrap_err().to_string();
        assert!(e.contains("int4 (groups of 256)") && e.contains("cuda backend does not run"), "{e}");
        assert!(e.ends_with("runs on: reference, wgpu)"), "{e}");
        for backend in ["reference", "wgpu", "cuda"] {
            assert!(QuantLayout::Fp8E4m3(Fp8Scales::Tensor).check_backend(backend, "w").is_ok(), "FP8 on {backend}");
        }
    }

    #[test]
    fn dequantize_checks_lengths() {
        let mut out = [0f32; 32];
        let mut block = [0u8; 34];
        block[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        block[2] = 4;
        block[3] = (-6i8) as u8;
        QuantLayout::Q8_0.dequantize(&block, &mut out).unwrap();
        assert_eq!((out[0], out[1], out[2]), (2.0, -3.0, 0.0));
        assert!(QuantLayout::Q8_0.dequantize(&block[..33], &mut out).is_err());
        assert!(QuantLayout::Q8_0.dequantize(&block, &mut out[..16]).is_err());
    }
}
