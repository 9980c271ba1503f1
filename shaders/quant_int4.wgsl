// quant_int4: the decoder of int4 weights with group scales and zero points (AWQ, GPTQ,
// compressed-tensors `pack-quantized`, converted at load into blocks of our own:
// crates/core/src/int4.rs). The pipeline puts it after quant_block.wgsl whenever a prelude names
// a decoder; `Prelude::quant_block` names this one for `QuantLayout::Int4Group`, with
// BLOCK_ELEMS the group and BLOCK_BYTES = 8 + group / 2.
//
// A block: the f32 scale (bytes 0..4), the zero point (byte 4, then 3 bytes of padding), then
// the nibbles, input 2j in the low nibble of byte j and 2j + 1 in its high nibble. Blocks are
// 4-byte aligned (the group is a multiple of 8), so `base` is a multiple of 4.
//
// decode4_int4(base, e): elements e..e+3 (e a multiple of 4) as (q - z) * s, the difference
// exact in f32 and one rounding in the product: the bits of core's `block_int4`.

fn decode4_int4(base: u32, e: u32) -> vec4<f32> {
    let s = bitcast<f32>(qw[base >> 2u]);
    let z = f32(qw[(base >> 2u) + 1u] & 0xffu);
    // Elements e..e+3 are the 16 bits at byte base + 8 + e / 2, an even offset.
    let o = base + 8u + (e >> 1u);
    let h = qw[o >> 2u] >> ((o & 2u) * 8u);
    let q = vec4<u32>(h, h >> 4u, h >> 8u, h >> 12u) & vec4<u32>(15u);
    return (vec4<f32>(q) - z) * s;
}
