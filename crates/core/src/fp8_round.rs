//! Rounding f32 to FP8: the one rounding an fp8 KV cache does, on every backend.
//!
//! vLLM's `--kv-cache-dtype fp8` (`fp8_e4m3`) and `fp8_e5m2` write `x / scale` through CUDA's
//! `__nv_cvt_float_to_fp8(.., __NV_SATFINITE, ..)`: round to nearest, ties to even, and a
//! magnitude past the largest finite value (infinity included) saturates to it (448 for e4m3fn,
//! 57344 for e5m2). A NaN stays a NaN. Reading multiplies the byte's value by the same scale,
//! in f32. This file is that rounding, exactly, for the reference (the oracle) and for tests of
//! the backends that do it in a kernel or shader.
//!
//! The scale is per tensor (one for K, one for V, per layer) as vLLM's: 1.0 ([`KV_SCALE`])
//! unless a checkpoint brings `k_scale` / `v_scale` ([`crate::kv_scales`]).

use crate::fp8::Fp8Format;

/// The K and V scale an fp8 KV cache uses: vLLM's default where a checkpoint brings none.
pub const KV_SCALE: f32 = 1.0;

/// Mantissa bits, exponent bias and the largest finite magnitude of `format`.
fn params(format: Fp8Format) -> (u32, i32, f32) {
    match format {
        Fp8Format::E4M3 => (3, 7, 448.0),
        Fp8Format::E5M2 => (2, 15, 57344.0),
    }
}

/// `x` as the nearest `format` byte, ties to even, saturated to the largest finite value.
pub fn encode(format: Fp8Format, x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return 0x7f | sign;
    }
    let (man_bits, bias, max) = params(format);
    // Saturating first gives what rounding then saturating gives: max is representable.
    let a = x.abs().min(max);
    let min_normal = 2f32.powi(1 - bias);
    if a < min_normal {
        // Subnormals (and the smallest normal, where they round up to it): multiples of
        // 2^(1 - bias - man_bits); the product is exact, so is its rounding.
        let q = (a * 2f32.powi(bias - 1 + man_bits as i32)).round_ties_even() as u8;
        return sign | q;
    }
    // A normal: round f32's 23-bit mantissa to man_bits, ties to even; a carry moves the
    // exponent up, as it should (never past max, which is representable).
    let shift = 23 - man_bits;
    let bits = a.to_bits();
    let lsb = (bits >> shift) & 1;
    let r = (bits + (1 << (shift - 1)) - 1 + lsb) & !((1 << shift) - 1);
    let e = ((r >> 23) as i32 - 127 + bias) as u8;
    let m = ((r >> shift) & ((1 << man_bits) - 1)) as u8;
    sign | (e << man_bits) | m
}

/// `x / scale` as a cache byte (what a KV write stores).
pub fn quantize(format: Fp8Format, x: f32, scale: f32) -> u8 {
    encode(format, x / scale)
}

/// A cache byte's value times `scale` (what attention reads).
pub fn dequantize(format: Fp8Format, b: u8, scale: f32) -> f32 {
    format.decode(b) * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a search over every byte: the nearest finite value, ties to the even byte.
    fn nearest(format: Fp8Format, x: f32) -> u8 {
        let (_, _, max) = params(format);
        let a = x.abs().min(max) as f64;
        let mut best = 0u8;
        for b in 0u8..0x80 {
            let v = format.decode(b);
            if !v.is_finite() {
                continue;
            }
            let (d, db) = ((v as f64 - a).abs(), (format.decode(best) as f64 - a).abs());
            if d < db || (d == db && b % 2 == 0) {
                best = b;
            }
        }
        best | if x.is_sign_negative() { 0x80 } else { 0 }
    }

    #[test]
    fn every_byte_round_trips() {
        for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for b in 0..=255u8 {
                let v = f.decode(b);
                if v.is_finite() {
                    assert_eq!(encode(f, v), b, "{} byte {b:#04x} ({v})", f.name());
                }
            }
        }
    }

    #[test]
    fn rounding_is_nearest_even_and_saturates() {
        let f = Fp8Format::E4M3;
        // 1.0625 is halfway between 1.0 (0x38, even) and 1.125 (0x39): to 1.0.
        assert_eq!(encode(f, 1.0625), 0x38);
        // 1.1875 is halfway between 1.125 (odd) and 1.25 (0x3a): to 1.25.
        assert_eq!(encode(f, 1.1875), 0x3a);
        assert_eq!(encode(f, 1.07), 0x39);
        // Past 448, infinity included, saturates; NaN stays NaN.
        for x in [449.0, 480.0, 1e9, f32::INFINITY] {
            assert_eq!(encode(f, x), 0x7e, "{x}");
            assert_eq!(encode(f, -x), 0xfe, "{x}");
        }
        assert!(f.decode(encode(f, f32::NAN)).is_nan());
        assert_eq!(encode(Fp8Format::E5M2, 1e9), 0x7b);
        // Half the smallest subnormal is a tie to zero; just above it, the subnormal.
        assert_eq!(encode(f, 2f32.powi(-10)), 0x00);
        assert_eq!(encode(f, 2f32.powi(-10) * 1.01), 0x01);
        // The largest subnormal's upper tie goes to the smallest normal (even).
        assert_eq!(encode(f, 7.5 * 2f32.powi(-9)), 0x08);
    }

    #[test]
    fn encode_is_the_nearest_value_over_a_sweep() {
        for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
            // Every f32 bit pattern stepping by a prime covers signs, binades, ties and overflow.
            let mut bits = 0u32;
            while let Some(next) = bits.checked_add(65_521) {
                let x = f32::from_bits(bits);
                if !x.is_nan() {
                    assert_eq!(encode(f, x), nearest(f, x), "{} {x:e}", f.name());
                }
                bits = next;
            }
            // Midpoints between neighbours: exact ties.
            for b in 0u8..0x7e {
                let (lo, hi) = (f.decode(b), f.decode(b + 1));
                if hi.is_finite() {
                    let mid = (lo + hi) / 2.0;
                    assert_eq!(encode(f, mid), if b % 2 == 0 { b } else { b + 1 }, "{} tie {mid}", f.name());
                }
            }
        }
    }

    #[test]
    fn scale_divides_on_write_and_multiplies_on_read() {
        let f = Fp8Format::E4M3;
        assert_eq!(quantize(f, 3.0, 2.0), encode(f, 1.5));
        assert_eq!(dequantize(f, quantize(f, 3.0, 2.0), 2.0), 3.0);
        assert_eq!(dequantize(f, quantize(f, 1000.0, 2.0), 2.0), 896.0);
    }
}
