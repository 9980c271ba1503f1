//! ggml tensor types and dequantisation to f32.
//!
//! Supported: F32, F16, BF16, Q8_0, Q4_1. Block layouts (little-endian, 32 values a block):
//! - Q8_0 (34 bytes): f16 scale `d`, 32 x i8 `q`;           x[i] = d * q[i]
//! - Q4_1 (20 bytes): f16 scale `d`, f16 min `m`, 16 bytes;  byte j holds element j in its low
//!   nibble and element j + 16 in its high nibble;          x[i] = d * q[i] + m
//!
//! Other types are known by name and size (so a file using them still opens and is listed), but
//! asking for their values is an error naming the type.

use half::{bf16, f16};

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
            Other(id) => return format!("ggml type id {id}"),
        }
        .to_string()
    }

    /// (elements per block, bytes per block), when known.
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
            Other(_) => return None,
        })
    }

    /// Bytes that `numel` elements of this type occupy.
    pub fn byte_size(self, numel: u64) -> Result<u64, String> {
        let (block, bytes) = self.block_layout().ok_or_else(|| format!("type {} has no known block layout", self.name()))?;
        if numel % block != 0 {
            return Err(format!("{numel} elements is not a whole number of {} blocks ({block} elements each)", self.name()));
        }
        (numel / block).checked_mul(bytes).ok_or_else(|| format!("{numel} elements of {} overflow a byte count", self.name()))
    }
}

/// `numel` values of type `ty` from `bytes`, as f32. The caller names the tensor in errors.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>, String> {
    let need = ty.byte_size(numel as u64)?;
    if bytes.len() as u64 != need {
        return Err(format!("{numel} elements of {} need {need} bytes, got {}", ty.name(), bytes.len()));
    }
    Ok(match ty {
        GgmlType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::BF16 => bytes.chunks_exact(2).map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        GgmlType::Q8_0 => {
            let mut out = Vec::with_capacity(numel);
            for b in bytes.chunks_exact(34) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                out.extend(b[2..34].iter().map(|&q| d * (q as i8) as f32));
            }
            out
        }
        GgmlType::Q4_1 => {
            let mut out = vec![0f32; numel];
            for (b, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
                let m = f16::from_le_bytes([b[2], b[3]]).to_f32();
                for (j, &q) in b[4..20].iter().enumerate() {
                    o[j] = d * (q & 0x0f) as f32 + m;
                    o[j + 16] = d * (q >> 4) as f32 + m;
                }
            }
            out
        }
        other => {
            return Err(format!(
                "ggml type {} cannot be dequantised by this converter (supported: F32, F16, BF16, Q8_0, Q4_1)",
                other.name()
            ))
        }
    })
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
        let e = dequantize(GgmlType::Q4K, &[0u8; 144], 256).unwrap_err();
        assert!(e.contains("Q4_K"), "{e}");
        let e = dequantize(GgmlType::from_id(99), &[0u8; 4], 1).unwrap_err();
        assert!(e.contains("99"), "{e}");
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
    }
}
