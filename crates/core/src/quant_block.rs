//! The block decoders of the ggml quantized types: one function per type, each turning one
//! block's bytes into its values. GGUF reading (tandem-model-files) and a backend that keeps the
//! weights quantized (the reference dequantizes a weight row on the fly) share them, so a row
//! dequantized at load and one dequantized in a matmul hold the same bits.
//!
//! Layouts (little-endian) as ggml's ggml-common.h / ggml-quants.c define them; each function
//! documents its own.

use half::f16;

// One block each: `b` is exactly the type's block size in bytes and `o` its element count (the
// caller's `chunks_exact` guarantees both). The arithmetic order is ggml's (ggml-quants.c,
// dequantize_row_*): a sub-block's scale `d * sc` is formed first, then `scale * q - d_min * m`,
// so results are bitwise ggml's (no fused multiply-add).

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q8_0 (34 bytes, 32 values): f16 `d`, 32 x i8 `q`; x = d * q.
pub fn block_q8_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (x, &q) in o.iter_mut().zip(&b[2..34]) {
        *x = d * (q as i8) as f32;
    }
}

/// Q4_0 (18 bytes, 32 values): f16 `d`, 16 bytes; byte j holds element j (low nibble) and
/// j + 16 (high nibble); x = d * (q - 8).
pub fn block_q4_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        o[j] = d * ((q & 0x0f) as i32 - 8) as f32;
        o[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1 (20 bytes, 32 values): f16 `d`, f16 min `m`, 16 bytes as Q4_0's; x = d * q + m.
pub fn block_q4_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        o[j] = d * (q & 0x0f) as f32 + m;
        o[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 5-bit values of Q5_0 / Q5_1: low nibbles as Q4_0's, bit i of the little-endian u32 `qh`
/// is element i's fifth bit.
fn q5_values(qh: &[u8], qs: &[u8]) -> [u8; 32] {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut v = [0u8; 32];
    for j in 0..16 {
        v[j] = (qs[j] & 0x0f) | ((((h >> j) & 1) as u8) << 4);
        v[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    v
}

/// Q5_0 (22 bytes, 32 values): f16 `d`, u32 `qh`, 16 bytes `qs`; x = d * (q - 16).
pub fn block_q5_0(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    for (x, q) in o.iter_mut().zip(q5_values(&b[2..6], &b[6..22])) {
        *x = d * (q as i32 - 16) as f32;
    }
}

/// Q5_1 (24 bytes, 32 values): f16 `d`, f16 min `m`, u32 `qh`, 16 bytes `qs`; x = d * q + m.
pub fn block_q5_1(b: &[u8], o: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (x, q) in o.iter_mut().zip(q5_values(&b[4..8], &b[8..24])) {
        *x = d * q as f32 + m;
    }
}

/// Q2_K (84 bytes, 256 values): 16 scale bytes (low nibble scale, high nibble min, one per 16
/// values), 64 bytes of 2-bit `q`, f16 `d`, f16 `dmin`. Element `h*128 + s*32 + l` (h < 2,
/// s < 4, l < 32) is bits 2s..2s+1 of `qs[h*32 + l]`; x = d * sc * q - dmin * m.
pub fn block_q2_k(b: &[u8], o: &mut [f32]) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
    for (e, x) in o.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let q = (qs[h * 32 + l] >> (2 * s)) & 3;
        let sm = scales[e / 16];
        let dl = d * (sm & 0x0f) as f32;
        let ml = dmin * (sm >> 4) as f32;
        *x = dl * q as f32 - ml;
    }
}

/// Q3_K (110 bytes, 256 values): 32 bytes `hmask`, 64 bytes of 2-bit `q` (laid out as Q2_K's),
/// 12 bytes of sixteen 6-bit scales, f16 `d`. Element e's third bit is bit e/32 of
/// `hmask[e % 32]`; a clear bit subtracts 4. Scale i: low 4 bits are nibble i/8 of byte i % 8,
/// high 2 bits are bits 2(i/4).. of byte 8 + i % 4; stored with +32. x = d * (sc - 32) * q.
pub fn block_q3_k(b: &[u8], o: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16_at(b, 108);
    for (e, x) in o.iter_mut().enumerate() {
        let i = e / 16;
        let lo = (sc[i % 8] >> (4 * (i / 8))) & 0x0f;
        let hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        let scale = (lo | (hi << 4)) as i32 - 32;
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((qs[h * 32 + l] >> (2 * s)) & 3) as i32;
        let high = (hmask[l] >> (e / 32)) & 1;
        let q = low - if high == 0 { 4 } else { 0 };
        let dl = d * scale as f32;
        *x = dl * q as f32;
    }
}

/// The eight 6-bit (scale, min) pairs of Q4_K / Q5_K from their 12 bytes: pairs 0..4 are the low
/// 6 bits of bytes j and j + 4; pairs 4..8 take their low 4 bits from byte j + 4's nibbles
/// (scale low, min high) and their high 2 bits from the top of bytes j - 4 and j.
fn scale_min_k4(sc: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        ((sc[j + 4] & 0x0f) | ((sc[j - 4] >> 6) << 4), (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4))
    }
}

/// Q4_K (144 bytes, 256 values): f16 `d`, f16 `dmin`, 12 bytes of scales and mins, 128 bytes of
/// nibbles. Sub-block s (32 values) is the low (s even) or high (s odd) nibbles of
/// `qs[(s/2)*32 .. +32]`; x = d * sc[s] * q - dmin * m[s].
pub fn block_q4_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, qs) = (&b[4..16], &b[16..144]);
    for (s, os) in o.chunks_exact_mut(32).enumerate() {
        let (scale, min) = scale_min_k4(sc, s);
        let (d1, m1) = (d * scale as f32, dmin * min as f32);
        for (l, x) in os.iter_mut().enumerate() {
            let q = (qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0x0f;
            *x = d1 * q as f32 - m1;
        }
    }
}

/// Q5_K (176 bytes, 256 values): Q4_K's header and nibbles, with 32 bytes `qh` (before the
/// nibbles) whose bit s of byte l is the fifth bit of sub-block s's element l.
pub fn block_q5_k(b: &[u8], o: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for (s, os) in o.chunks_exact_mut(32).enumerate() {
        let (scale, min) = scale_min_k4(sc, s);
        let (d1, m1) = (d * scale as f32, dmin * min as f32);
        for (l, x) in os.iter_mut().enumerate() {
            let q = ((qs[(s / 2) * 32 + l] >> (4 * (s % 2))) & 0x0f) | (((qh[l] >> s) & 1) << 4);
            *x = d1 * q as f32 - m1;
        }
    }
}

/// Q6_K (210 bytes, 256 values): 128 bytes `ql` (low nibbles), 64 bytes `qh` (2 high bits),
/// 16 x i8 scales (one per 16 values), f16 `d`. In each half h of 128 values, element
/// `h*128 + s*32 + l` (s < 4) takes nibble s/2 of `ql[h*64 + (s%2)*32 + l]` and bits 2s..2s+1 of
/// `qh[h*32 + l]`; x = d * sc * (q - 32).
pub fn block_q6_k(b: &[u8], o: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for (e, x) in o.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = (ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0x0f;
        let high = (qh[h * 32 + l] >> (2 * s)) & 3;
        let q = (low | (high << 4)) as i32 - 32;
        let dl = d * (sc[e / 16] as i8) as f32;
        *x = dl * q as f32;
    }
}

/// Q8_K (292 bytes, 256 values; llama.cpp's internal dot-product type): f32 `d`, 256 x i8 `q`,
/// 16 x i16 block sums (not needed here); x = d * q.
pub fn block_q8_k(b: &[u8], o: &mut [f32]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (x, &q) in o.iter_mut().zip(&b[4..260]) {
        *x = d * (q as i8) as f32;
    }
}
