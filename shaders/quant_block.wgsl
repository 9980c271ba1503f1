// quant_block: the GGUF block decoders the quantized kernels share (quant_matmul.wgsl,
// quant_embedding.wgsl). The prelude (`Prelude::quant_block`) puts this text before the kernel
// with BLOCK_BYTES, BLOCK_ELEMS and `decode4`, which names one of the decode4_* below. The kernel
// declares the weight's words as `qw: array<u32>`: the file's blocks as they are stored, rows one
// after another (a block never spans two rows), bound with at least one word past the last
// block (q32 may read it).
//
// decode4_X(base, e): the values of elements e..e+3 (e a multiple of 4) of the block whose first
// byte is at byte offset `base`. Layouts and arithmetic are those of crates/core/src/quant_block.rs
// (ggml's): a sub-block's scale d * sc first, then scale * q - dmin * m.

// Byte `o`.
fn qb(o: u32) -> u32 {
    return (qw[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;
}

// Four bytes from `o` (any alignment), little-endian.
fn q32(o: u32) -> u32 {
    let s = (o & 3u) * 8u;
    let lo = qw[o >> 2u];
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (qw[(o >> 2u) + 1u] << (32u - s));
}

// The f16 at `o` (every f16 of a block lies at an even offset, and blocks have even sizes).
fn qf16(o: u32) -> f32 {
    return unpack2x16float(qw[o >> 2u] >> ((o & 2u) * 8u)).x;
}

// The four bytes of `v`, each masked.
fn bytes4(v: u32, mask: u32) -> vec4<u32> {
    return vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(mask);
}

// Elements e..e+3 of a 32-value run of nibbles at `o`: byte j holds element j (low nibble) and
// j + 16 (high nibble).
fn nib32(o: u32, e: u32) -> vec4<u32> {
    return bytes4(q32(o + (e & 15u)) >> ((e >> 4u) * 4u), 15u);
}

// The fifth bits of Q5_0 / Q5_1: bit e of the little-endian u32 at `o`.
fn fifth32(o: u32, e: u32) -> vec4<u32> {
    let h = q32(o) >> e;
    return (vec4<u32>(h, h >> 1u, h >> 2u, h >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u);
}

fn decode4_q8_0(base: u32, e: u32) -> vec4<f32> {
    let v = q32(base + 2u + e);
    let q = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u), bitcast<i32>(v)) >> vec4<u32>(24u);
    return qf16(base) * vec4<f32>(q);
}

fn decode4_q4_0(base: u32, e: u32) -> vec4<f32> {
    return qf16(base) * (vec4<f32>(nib32(base + 2u, e)) - 8.0);
}

fn decode4_q4_1(base: u32, e: u32) -> vec4<f32> {
    return qf16(base) * vec4<f32>(nib32(base + 4u, e)) + qf16(base + 2u);
}

fn decode4_q5_0(base: u32, e: u32) -> vec4<f32> {
    let q = nib32(base + 6u, e) | fifth32(base + 2u, e);
    return qf16(base) * (vec4<f32>(q) - 16.0);
}

fn decode4_q5_1(base: u32, e: u32) -> vec4<f32> {
    let q = nib32(base + 8u, e) | fifth32(base + 4u, e);
    return qf16(base) * vec4<f32>(q) + qf16(base + 2u);
}

// Q4_K / Q5_K: the 6-bit (scale, min) of sub-block j from the 12 bytes at `o`.
fn scale_min_k4(o: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(qb(o + j) & 63u, qb(o + j + 4u) & 63u);
    }
    let b = qb(o + j + 4u);
    return vec2<u32>((b & 15u) | ((qb(o + j - 4u) >> 6u) << 4u), (b >> 4u) | ((qb(o + j) >> 6u) << 4u));
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes; sub-block s (32 values)
// is the low (s even) or high (s odd) nibbles of bytes (s / 2) * 32...
fn decode4_q4_k(base: u32, e: u32) -> vec4<f32> {
    let s = e >> 5u;
    let l = e & 31u;
    let sm = scale_min_k4(base + 4u, s);
    let d1 = qf16(base) * f32(sm.x);
    let m1 = qf16(base + 2u) * f32(sm.y);
    let q = bytes4(q32(base + 16u + (s >> 1u) * 32u + l) >> ((s & 1u) * 4u), 15u);
    return d1 * vec4<f32>(q) - m1;
}

// Q5_K (176 bytes): Q4_K's header, 32 bytes qh (bit s of byte l: sub-block s's element l's
// fifth bit), 128 nibble bytes.
fn decode4_q5_k(base: u32, e: u32) -> vec4<f32> {
    let s = e >> 5u;
    let l = e & 31u;
    let sm = scale_min_k4(base + 4u, s);
    let d1 = qf16(base) * f32(sm.x);
    let m1 = qf16(base + 2u) * f32(sm.y);
    let lo = bytes4(q32(base + 48u + (s >> 1u) * 32u + l) >> ((s & 1u) * 4u), 15u);
    let hi = bytes4(q32(base + 16u + l) >> s, 1u) << vec4<u32>(4u);
    return d1 * vec4<f32>(lo | hi) - m1;
}

// Q6_K (210 bytes): 128 bytes ql, 64 bytes qh, 16 i8 scales (one per 16 values), f16 d.
// Element h*128 + s*32 + l takes nibble s/2 of ql[h*64 + (s%2)*32 + l] and bits 2s.. of
// qh[h*32 + l]; x = d * sc * (q - 32).
fn decode4_q6_k(base: u32, e: u32) -> vec4<f32> {
    let h = e >> 7u;
    let s = (e >> 5u) & 3u;
    let l = e & 31u;
    let lo = bytes4(q32(base + h * 64u + (s & 1u) * 32u + l) >> ((s >> 1u) * 4u), 15u);
    let hi = bytes4(q32(base + 128u + h * 32u + l) >> (2u * s), 3u) << vec4<u32>(4u);
    let sc = bitcast<i32>(qb(base + 192u + (e >> 4u)) << 24u) >> 24u;
    let dl = qf16(base + 208u) * f32(sc);
    return dl * (vec4<f32>(lo | hi) - 32.0);
}

// FP8 e4m3 (36 bytes): the f32 scale, then 32 bytes, one a value (shaders/quant_fp8.wgsl).
fn decode4_fp8(base: u32, e: u32) -> vec4<f32> {
    let s = bitcast<f32>(qw[base >> 2u]);
    let v = bytes4(qw[(base + 4u + e) >> 2u], 255u);
    return vec4<f32>(
        bf16_round(fp8_e4m3(v.x) * s),
        bf16_round(fp8_e4m3(v.y) * s),
        bf16_round(fp8_e4m3(v.z) * s),
        bf16_round(fp8_e4m3(v.w) * s),
    );
}

// Values kk..kk+3 (kk a multiple of 4) of the row of blocks starting at byte `base`
// (quant_tile.wgsl's weight in a buffer).
fn block_row4(base: u32, kk: u32) -> vec4<f32> {
    let b = kk / BLOCK_ELEMS;
    return decode4(base + b * BLOCK_BYTES, kk - b * BLOCK_ELEMS);
}
