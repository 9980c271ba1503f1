//! What one element of the paged KV cache is stored as: f32, bf16 or FP8 (e4m3, e5m2).

/// What one element of the KV cache is stored as. The cache's layout belongs to the backend;
/// this is the one fact about it the rest of the engine needs (the pool's bytes per token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// Bit for bit what kv_write was given (the reference's, and a check mode on CUDA).
    F32,
    /// Rounded to bf16, nearest even: half the bytes, a relative error of at most 2^-8 per
    /// element (8 significant bits).
    Bf16,
    /// FP8 e4m3fn, vLLM's `fp8` / `fp8_e4m3`: one byte, `x / scale` rounded to nearest even and
    /// saturated to +-448, read back as the byte's value times the scale
    /// ([`crate::fp8_round`]): 4 significant bits, a relative error of at most 2^-4 per normal
    /// element.
    Fp8E4m3,
    /// FP8 e5m2, vLLM's `fp8_e5m2`: as [`KvDtype::Fp8E4m3`] with 3 significant bits and a range
    /// to +-57344.
    Fp8E5m2,
}

impl KvDtype {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::Bf16 => 2,
            KvDtype::Fp8E4m3 | KvDtype::Fp8E5m2 => 1,
        }
    }
    /// `f32`, `bf16`, `fp8_e4m3` or `fp8_e5m2` (what reports and messages print; vLLM's
    /// `--kv-cache-dtype` spellings).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8E4m3 => "fp8_e4m3",
            KvDtype::Fp8E5m2 => "fp8_e5m2",
        }
    }
    /// The FP8 format of an fp8 cache, None for the others.
    pub fn fp8(self) -> Option<crate::fp8::Fp8Format> {
        match self {
            KvDtype::Fp8E4m3 => Some(crate::fp8::Fp8Format::E4M3),
            KvDtype::Fp8E5m2 => Some(crate::fp8::Fp8Format::E5M2),
            KvDtype::F32 | KvDtype::Bf16 => None,
        }
    }
}
