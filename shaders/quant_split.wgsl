// quant_split: the decoders of quantized weights in the split layout (crates/wgpu/src/quant_split.rs):
// a row's block quants first, each a whole number of 16-byte units, then its blocks' headers
// packed tight, the rows tiled in a texture. The pipeline puts this text (and
// shaders/quant_fp8.wgsl) after a prelude from `Prelude::quant_split`, which defines
// BLOCK_ELEMS, QU (sub-blocks a block: units of quants that decode to VJ groups of four
// values), QS (units a block stores: QU, then Q5_K's / Q6_K's high bits and Q6_K's scales),
// HH (16-bit halves of a header), VJ, HIGH_UNITS (whether a sub-block's high bits sit in a unit
// of their own: unit QU + u / SUBS_PER_HIGH of its block), SCALE_UNIT (whether the sub-block
// scales sit in the block's last unit, Q6_K's, rather than in the header), `split_head(h, i)`,
// `split_sub(h, hv, u)`, `split_bits(h, i)`, `split_high(hb, a, u)` and `split4(hv, hx, t, j)`
// naming the functions below.
//
// split_head_X(h, i): the values a block's header holds, from the unit `h` holding it, whose
// half `i` it starts at: (scale, 0), (d, m) or (scale, zero point).
// split_sub_X(h, hv, u): those of the block's sub-block `u` (0..QU), given the unit `h` holding
// the sub-block scales (the header's, or Q6_K's scales unit) and split_head's `hv`: `hv` itself
// where one scale serves the block; Q4_K's and Q5_K's sub-block (d * sc, dmin * m); Q6_K's
// (d * sc) of the sub-block's two halves.
// split_bits_X(h, i): the header's bits that are not scales (Q5_0's fifth bits), `hb`.
// split_high_X(hb, a, u): the high bits of sub-block u, `hx`: (hb, 0) where they are the
// header's (Q5_0 / Q5_1) or absent, else from `a`, the unit holding them (HIGH_UNITS).
// split4_X(hv, t, j): values 4j..4j+3 of the unit of quants `t`. The arithmetic is
// shaders/quant_block.wgsl's (and quant_fp8.wgsl's, quant_int4.wgsl's) for the same bytes, so a
// weight decodes to the same bits in either layout.

// The four bytes of `v`, each masked.
fn unit_bytes4(v: u32, mask: u32) -> vec4<u32> {
    return vec4<u32>(v, v >> 8u, v >> 16u, v >> 24u) & vec4<u32>(mask);
}

// One f16 scale a block (Q8_0, Q4_0).
fn split_head_f16(h: vec4<u32>, i: u32) -> vec2<f32> {
    return vec2<f32>(unpack2x16float(h[i >> 1u])[i & 1u], 0.0);
}

// Q4_1: f16 d then f16 m, one word.
fn split_head_f16x2(h: vec4<u32>, i: u32) -> vec2<f32> {
    return unpack2x16float(h[i >> 1u]);
}

// FP8: an f32 scale.
fn split_head_f32(h: vec4<u32>, i: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(h[i >> 1u]), 0.0);
}

// Int4: an f32 scale, then the zero point in the low byte of the next word.
fn split_head_int4(h: vec4<u32>, i: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(h[i >> 1u]), f32(h[(i >> 1u) + 1u] & 0xffu));
}

// One scale (or scale and min, or scale and zero point) for the whole block.
fn split_sub_block(h: vec4<u32>, hv: vec2<f32>, u: u32) -> vec2<f32> {
    return hv;
}

// Byte i of Q4_K's 12 bytes of scales and mins, which follow d and dmin in the header's unit.
fn k4_byte(h: vec4<u32>, i: u32) -> u32 {
    return (h[1u + (i >> 2u)] >> ((i & 3u) * 8u)) & 0xffu;
}

// Q4_K: the unit of quants s is sub-block s; its 6-bit (scale, min) as quant_block.wgsl's
// scale_min_k4, then (d * sc, dmin * m), ggml's order.
fn split_sub_k4(h: vec4<u32>, hv: vec2<f32>, s: u32) -> vec2<f32> {
    var sm: vec2<u32>;
    if (s < 4u) {
        sm = vec2<u32>(k4_byte(h, s) & 63u, k4_byte(h, s + 4u) & 63u);
    } else {
        let b = k4_byte(h, s + 4u);
        sm = vec2<u32>((b & 15u) | ((k4_byte(h, s - 4u) >> 6u) << 4u), (b >> 4u) | ((k4_byte(h, s) >> 6u) << 4u));
    }
    return vec2<f32>(hv.x * f32(sm.x), hv.y * f32(sm.y));
}

// Q6_K: the i8 scales of sub-block s's two halves of 16 values (bytes 2s, 2s + 1 of the scales
// unit `h`), times d, as quant_block.wgsl's decode4_q6_k.
fn split_sub_q6_k(h: vec4<u32>, hv: vec2<f32>, s: u32) -> vec2<f32> {
    let w = h[s >> 1u] << (16u - (s & 1u) * 16u);
    let sc = vec2<i32>(bitcast<i32>(w << 8u), bitcast<i32>(w)) >> vec2<u32>(24u);
    return vec2<f32>(hv.x * f32(sc.x), hv.x * f32(sc.y));
}

// No high bits apart from the header's.
fn split_high_head(hb: u32, a: vec4<u32>, u: u32) -> vec2<u32> {
    return vec2<u32>(hb, 0u);
}

// Q5_K: sub-block u's 32 fifth bits are word u % 4 of its unit, bit l for element l.
fn split_high_q5_k(hb: u32, a: vec4<u32>, u: u32) -> vec2<u32> {
    return vec2<u32>(a[u & 3u], 0u);
}

// Q6_K: sub-block u's 2-bit highs are 8 bytes of its unit, from byte 8 * (u % 2); byte j holds
// elements 4j..4j+3, two bits each.
fn split_high_q6_k(hb: u32, a: vec4<u32>, u: u32) -> vec2<u32> {
    let w = (u & 1u) * 2u;
    return vec2<u32>(a[w], a[w + 1u]);
}

// Q5_0: the u32 of fifth bits after the f16 d, at half i + 1 of its 8-byte slot (unaligned).
fn split_bits_q5_0(h: vec4<u32>, i: u32) -> u32 {
    let w = i >> 1u;
    return (h[w] >> 16u) | (h[w + 1u] << 16u);
}

// Q8_0: 16 signed bytes a unit, element e in byte e.
fn split4_q8_0(hv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    let v = t[j];
    let q = vec4<i32>(bitcast<i32>(v << 24u), bitcast<i32>(v << 16u), bitcast<i32>(v << 8u), bitcast<i32>(v)) >> vec4<u32>(24u);
    return hv.x * vec4<f32>(q);
}

// Q4_0 / Q4_1: the block's 16 nibble bytes are one unit; byte j holds element j (low nibble)
// and j + 16 (high).
fn split_nib4(t: vec4<u32>, j: u32) -> vec4<u32> {
    return unit_bytes4(t[j & 3u] >> ((j >> 2u) * 4u), 15u);
}

fn split4_q4_0(hv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    return hv.x * (vec4<f32>(split_nib4(t, j)) - 8.0);
}

fn split4_q4_1(hv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    return hv.x * vec4<f32>(split_nib4(t, j)) + hv.y;
}

// Q5_0 / Q5_1: Q4_0's nibbles, and element e's fifth bit is bit e of `hb`.
fn split_q5(t: vec4<u32>, j: u32, hb: u32) -> vec4<u32> {
    let h = hb >> (4u * j);
    return split_nib4(t, j) | ((vec4<u32>(h, h >> 1u, h >> 2u, h >> 3u) & vec4<u32>(1u)) << vec4<u32>(4u));
}

// x = d * (q - 16), as quant_block.wgsl's decode4_q5_0.
fn split4_q5_0(hv: vec2<f32>, t: vec4<u32>, j: u32, hb: u32) -> vec4<f32> {
    return hv.x * (vec4<f32>(split_q5(t, j, hb)) - 16.0);
}

// x = d * q + m, as quant_block.wgsl's decode4_q5_1.
fn split4_q5_1(hv: vec2<f32>, t: vec4<u32>, j: u32, hb: u32) -> vec4<f32> {
    return hv.x * vec4<f32>(split_q5(t, j, hb)) + hv.y;
}

// Q4_K: a unit is one sub-block's nibbles in Q4_0's arrangement (crates/wgpu/src/quant_split.rs
// moves them so); x = d1 * q - m1 with split_sub's (d1, m1), as quant_block.wgsl's decode4_q4_k.
fn split4_q4_k(sv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    return sv.x * vec4<f32>(split_nib4(t, j)) - sv.y;
}

// Q5_K: Q4_K's unit and sub-block scales, and element e's fifth bit is bit e of `hb` (its
// sub-block's word); x = d1 * q - m1, as quant_block.wgsl's decode4_q5_k.
fn split4_q5_k(sv: vec2<f32>, t: vec4<u32>, j: u32, hb: u32) -> vec4<f32> {
    return sv.x * vec4<f32>(split_q5(t, j, hb)) - sv.y;
}

// Q6_K: a unit is one sub-block's low nibbles in Q4_0's arrangement, `hx` its 2-bit highs
// (split_high_q6_k); x = d * sc * (q - 32) with the half's d * sc from split_sub_q6_k, as
// quant_block.wgsl's decode4_q6_k.
fn split4_q6_k(sv: vec2<f32>, hx: vec2<u32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    let v = hx[j >> 2u] >> ((j & 3u) * 8u);
    let hi = vec4<u32>(v, v >> 2u, v >> 4u, v >> 6u) & vec4<u32>(3u);
    let dl = select(sv.x, sv.y, j >= 4u);
    return dl * (vec4<f32>(split_nib4(t, j) | (hi << vec4<u32>(4u))) - 32.0);
}

// FP8 e4m3: 16 bytes a unit, element e in byte e; the value rounded to bf16 (quant_fp8.wgsl).
fn split4_fp8(hv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    return fp8_e4m3_scaled4(unit_bytes4(t[j], 255u), hv.x);
}

// Int4: 32 nibbles a unit, element 2b in the low nibble of byte b and 2b + 1 in the high one.
fn split4_int4(hv: vec2<f32>, t: vec4<u32>, j: u32) -> vec4<f32> {
    let h = t[j >> 1u] >> ((j & 1u) * 16u);
    let q = vec4<u32>(h, h >> 4u, h >> 8u, h >> 12u) & vec4<u32>(15u);
    return (vec4<f32>(q) - hv.y) * hv.x;
}

// Values kk..kk+3 (kk a multiple of 4) of split row r of a weight whose split rows have
// `units` units, the first `q_units` of them quants, rows tiled 64 a tile
// (crates/wgpu/src/buffer.rs `Tiled`; quant_tile.wgsl's weight in a texture). The header and
// the unit are quant_split_matmul.wgsl's, decoded by the same functions.
fn split_row4(r: u32, kk: u32, units: u32, q_units: u32) -> vec4<f32> {
    let tile = (r >> 6u) * units;
    let lane = r & 63u;
    let b = kk / BLOCK_ELEMS;
    let hh = b * HH;
    let h = q_unit(((tile + q_units + (hh >> 3u)) << 6u) | lane);
    let u = kk / (4u * VJ) - b * QU;
    var hs = h;
    if (SCALE_UNIT) {
        hs = q_unit(((tile + b * QS + QS - 1u) << 6u) | lane);
    }
    var a = vec4<u32>();
    if (HIGH_UNITS) {
        a = q_unit(((tile + b * QS + QU + u / SUBS_PER_HIGH) << 6u) | lane);
    }
    let sv = split_sub(hs, split_head(h, hh & 7u), u);
    let hx = split_high(split_bits(h, hh & 7u), a, u);
    return split4(sv, hx, q_unit(((tile + b * QS + u) << 6u) | lane), (kk >> 2u) % VJ);
}
