//! ggml tensor types and dequantisation to f32.
//!
//! Supported: F32, F16, BF16, the 32-value block types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, and the
//! 256-value K-quant super-blocks Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (what llama.cpp's Q*_K_M / Q*_K_S
//! files hold) and Q8_K. The block decoders live in `tandem_core::quant_block` (shared with the
//! backends that keep weights quantized), each documenting its layout (little-endian; learnt
//! from ggml's ggml-common.h / ggml-quants.c and the `gguf` Python package's quants.py, written
//! here from the layout). tests/quant_fixtures.rs checks every type bitwise against the `gguf`
//! package's numpy dequantisers (fixtures made by tests/fixtures/gguf-quants/make.py).
//!
//! Other types (the IQ*, TQ* and FP4 families, Q8_1) are known by name and block size (so a file
//! using them still opens and is listed), but asking for their values is an error naming the
//! type and the supported list; an id unknown here makes the file fail to open.

use half::{bf16, f16};
use tandem_core::quant_block::*;

/// A ggml tensor type, by its id in the GGUF tensor directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    /// An id this reader has no layout for (the IQ* family and newer types).
    Other(u32),
}

impl GgmlType {
    pub fn from_id(id: u32) -> Self {
        use GgmlType::*;
        match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2K,
            11 => Q3K,
            12 => Q4K,
            13 => Q5K,
            14 => Q6K,
            15 => Q8K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            other => Other(other),
        }
    }

    pub fn name(self) -> String {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            BF16 => "BF16",
            Other(id) => {
                return match other_type(id) {
                    Some((n, _)) => format!("{n} (ggml type id {id})"),
                    None => format!("ggml type id {id}"),
                }
            }
        }
        .to_string()
    }

    /// (elements per block, bytes per block), when known (also for the types [`dequantize`]
    /// refuses, so that their tensors' bounds are checked when a file opens).
    pub fn block_layout(self) -> Option<(u64, u64)> {
        use GgmlType::*;
        Some(match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Other(id) => return other_type(id).map(|(_, layout)| layout),
        })
    }

    /// Bytes that `numel` elements of this type occupy.
    pub fn byte_size(self, numel: u64) -> Result<u64, String> {
        let (block, bytes) =
            self.block_layout().ok_or_else(|| format!("type {} has no known block layout", self.name()))?;
        if !numel.is_multiple_of(block) {
            return Err(format!(
                "{numel} elements is not a whole number of {} blocks ({block} elements each)",
                self.name()
            ));
        }
        (numel / block)
            .checked_mul(bytes)
            .ok_or_else(|| format!("{numel} elements of {} overflow a byte count", self.name()))
    }
}

/// Name and (elements, bytes) per block of the ggml types this converter cannot dequantise
/// (ggml.h's `ggml_type`, sizes as the `gguf` package's GGML_QUANT_SIZES): known so that a file
/// holding them opens, its tensors' bounds are checked, and the refusal names the type.
fn other_type(id: u32) -> Option<(&'static str, (u64, u64))> {
    Some(match id {
        16 => ("IQ2_XXS", (256, 66)),
        17 => ("IQ2_XS", (256, 74)),
        18 => ("IQ3_XXS", (256, 98)),
        19 => ("IQ1_S", (256, 50)),
        20 => ("IQ4_NL", (32, 18)),
        21 => ("IQ3_S", (256, 110)),
        22 => ("IQ2_S", (256, 82)),
        23 => ("IQ4_XS", (256, 136)),
        29 => ("IQ1_M", (256, 56)),
        34 => ("TQ1_0", (256, 54)),
        35 => ("TQ2_0", (256, 66)),
        39 => ("MXFP4", (32, 17)),
        40 => ("NVFP4", (64, 36)),
        41 => ("Q1_0", (128, 18)),
        _ => return None,
    })
}

/// The types [`dequantize`] reads, in the order error messages list them.
pub const SUPPORTED: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K";

impl GgmlType {
    /// Whether [`dequantize`] reads this type.
    pub fn dequantizable(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Q8K)
    }

    /// `Err` naming the type and the supported list when [`dequantize`] cannot read it.
    pub fn check_dequantizable(self) -> Result<(), String> {
        if self.dequantizable() {
            Ok(())
        } else {
            Err(format!("ggml type {} cannot be dequantised by this converter (supported: {SUPPORTED})", self.name()))
        }
    }
}

/// `numel` values of type `ty` from `bytes`, as f32. The caller names the tensor in errors.
///
/// The length is checked against the type's block layout before any block is read, and every
/// block is then a `chunks_exact` slice of exactly its size: malformed input is an `Err`, never
/// a panic.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>, String> {
    ty.check_dequantizable()?;
    let need = ty.byte_size(numel as u64)?;
    if bytes.len() as u64 != need {
        return Err(format!("{numel} elements of {} need {need} bytes, got {}", ty.name(), bytes.len()));
    }
    let f: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => {
            return Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
        }
        GgmlType::F16 => return Ok(bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        GgmlType::BF16 => {
            return Ok(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
        }
        GgmlType::Q8_0 => block_q8_0,
        GgmlType::Q4_0 => block_q4_0,
        GgmlType::Q4_1 => block_q4_1,
        GgmlType::Q5_0 => block_q5_0,
        GgmlType::Q5_1 => block_q5_1,
        GgmlType::Q2K => block_q2_k,
        GgmlType::Q3K => block_q3_k,
        GgmlType::Q4K => block_q4_k,
        GgmlType::Q5K => block_q5_k,
        GgmlType::Q6K => block_q6_k,
        GgmlType::Q8K => block_q8_k,
        other => return Err(format!("ggml type {} has no dequantiser", other.name())),
    };
    let (block, size) = ty.block_layout().ok_or_else(|| format!("type {} has no known block layout", ty.name()))?;
    let mut out = vec![0f32; numel];
    for (b, o) in bytes.chunks_exact(size as usize).zip(out.chunks_exact_mut(block as usize)) {
        f(b, o);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q8_0_block_by_hand() {
        // Two blocks with different scales; q covers the i8 extremes.
        let mut bytes = vec![];
        bytes.extend(h(0.5));
        bytes.extend((0..32).map(|i| [-128i8, -1, 0, 1, 127][i % 5] as u8));
        bytes.extend(h(-2.0));
        bytes.extend((0..32).map(|i| i as u8));
        let x = dequantize(GgmlType::Q8_0, &bytes, 64).unwrap();
        assert_eq!(&x[..5], &[-64.0, -0.5, 0.0, 0.5, 63.5]);
        assert_eq!(x[31], 0.5 * [-128.0, -1.0, 0.0, 1.0, 127.0][31 % 5]);
        assert_eq!(x[32], 0.0);
        assert_eq!(x[33], -2.0);
        assert_eq!(x[63], -62.0);
    }

    #[test]
    fn q4_1_nibble_order_by_hand() {
        // Byte j = (hi << 4) | lo with lo = j, hi = 15 - j: element j gets j, element j + 16 gets 15 - j.
        let mut bytes = vec![];
        bytes.extend(h(0.25));
        bytes.extend(h(-1.0));
        bytes.extend((0..16u8).map(|j| ((15 - j) << 4) | j));
        let x = dequantize(GgmlType::Q4_1, &bytes, 32).unwrap();
        for j in 0..16 {
            assert_eq!(x[j], 0.25 * j as f32 - 1.0, "element {j}");
            assert_eq!(x[j + 16], 0.25 * (15 - j) as f32 - 1.0, "element {}", j + 16);
        }
    }

    #[test]
    fn float_types() {
        let f: Vec<u8> = [1.5f32, -0.0, f32::MAX].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(dequantize(GgmlType::F32, &f, 3).unwrap(), vec![1.5, -0.0, f32::MAX]);
        let f: Vec<u8> = [h(1.5), h(-3.0)].concat();
        assert_eq!(dequantize(GgmlType::F16, &f, 2).unwrap(), vec![1.5, -3.0]);
        let f: Vec<u8> = [bf16::from_f32(1.5).to_le_bytes(), bf16::from_f32(-256.0).to_le_bytes()].concat();
        assert_eq!(dequantize(GgmlType::BF16, &f, 2).unwrap(), vec![1.5, -256.0]);
    }

    #[test]
    fn unsupported_and_malformed_inputs_are_errors() {
        for (id, name) in [(16, "IQ2_XXS"), (20, "IQ4_NL"), (23, "IQ4_XS"), (29, "IQ1_M"), (9, "Q8_1")] {
            let e = dequantize(GgmlType::from_id(id), &[0u8; 64], 32).unwrap_err();
            assert!(e.contains(name) && e.contains(SUPPORTED), "{e}");
        }
        let e = dequantize(GgmlType::from_id(99), &[0u8; 4], 1).unwrap_err();
        assert!(e.contains("99") && e.contains("supported"), "{e}");
        // Every K-quant: one byte short, one byte long, and a count that is not whole super-blocks.
        for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Q8K] {
            let (_, size) = ty.block_layout().unwrap();
            let size = size as usize;
            for len in [0, size - 1, size + 1, 2 * size - 1] {
                let e = dequantize(ty, &vec![0u8; len], 256).unwrap_err();
                assert!(e.contains(&format!("need {size} bytes")) && e.contains(&ty.name()), "{e}");
            }
            let e = dequantize(ty, &vec![0u8; size], 128).unwrap_err();
            assert!(e.contains("whole number"), "{e}");
            assert_eq!(dequantize(ty, &vec![0u8; 2 * size], 512).unwrap(), vec![0.0; 512]);
        }
        let e = dequantize(GgmlType::Q8_0, &[0u8; 33], 32).unwrap_err();
        assert!(e.contains("34 bytes") && e.contains("33"), "{e}");
        let e = dequantize(GgmlType::Q4_1, &[0u8; 20], 31).unwrap_err();
        assert!(e.contains("whole number"), "{e}");
    }

    #[test]
    fn layouts() {
        assert_eq!(GgmlType::from_id(3), GgmlType::Q4_1);
        assert_eq!(GgmlType::Q4_1.byte_size(64).unwrap(), 40);
        assert_eq!(GgmlType::Q8_0.byte_size(32 * 3).unwrap(), 102);
        assert_eq!(GgmlType::BF16.byte_size(5).unwrap(), 10);
        assert_eq!(GgmlType::from_id(30), GgmlType::BF16);
        assert_eq!(GgmlType::from_id(12), GgmlType::Q4K);
        assert_eq!(GgmlType::Q4K.byte_size(512).unwrap(), 288);
        assert_eq!(GgmlType::Q6K.byte_size(256).unwrap(), 210);
        assert_eq!(GgmlType::from_id(23).name(), "IQ4_XS (ggml type id 23)");
        assert_eq!(GgmlType::from_id(23).byte_size(512).unwrap(), 272);
        assert_eq!(GgmlType::from_id(99).block_layout(), None);
    }

    #[test]
    fn q8_k_by_hand() {
        // f32 d = -0.25, q = i - 128 over the block; the 32 bytes of block sums are ignored.
        let mut bytes = (-0.25f32).to_le_bytes().to_vec();
        bytes.extend((0..256).map(|i| (i - 128) as i8 as u8));
        bytes.extend([0xa5u8; 32]);
        let x = dequantize(GgmlType::Q8K, &bytes, 256).unwrap();
        for (i, v) in x.iter().enumerate() {
            assert_eq!(*v, -0.25 * (i as f32 - 128.0), "element {i}");
        }
    }
}
