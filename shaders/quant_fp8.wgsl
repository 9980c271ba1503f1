// quant_fp8: the values of FP8 e4m3 weights kept in 8 bits (crates/core/src/fp8.rs
// `pack_blocks`): a row is runs of 32 values, each run its f32 scale (4 bytes, little-endian)
// then its 32 e4m3 bytes as the checkpoint stores them, so a block is 36 bytes and every block
// starts at a multiple of 4. The pipeline puts this text after the block decoders
// (shaders/quant_block.wgsl's `decode4_fp8`, shaders/quant_split.wgsl's `split4_fp8`), which
// call the functions here.
//
// A value is crates/core/src/fp8.rs `decode_block`'s: the byte's e4m3 value (exact in f32) times
// the run's scale, one f32 multiply, rounded to the nearest bf16 (ties to even), the bits the
// widened weight holds.

// The e4m3fn value of byte `b`: bias 7, subnormals at exponent 0, S.1111.111 is NaN.
fn fp8_e4m3(b: u32) -> f32 {
    let e = (b >> 3u) & 15u;
    let m = b & 7u;
    if (e == 15u && m == 7u) {
        return bitcast<f32>(0x7fc00000u | ((b & 0x80u) << 24u));
    }
    var v: f32;
    if (e == 0u) {
        v = f32(m) * 0.001953125;
    } else {
        v = bitcast<f32>(((e + 120u) << 23u) | (m << 20u));
    }
    if ((b & 0x80u) != 0u) {
        v = -v;
    }
    return v;
}

// `x` rounded to the nearest bf16 (ties to even), as f32; NaN stays NaN.
fn bf16_round(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return x;
    }
    return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}

// Four bytes' values times `s`, each rounded to bf16: `bf16_round(fp8_e4m3(v[i]) * s)` for each
// lane of `v`, in vector operations without branches (the split decoder's inner loop).
fn fp8_e4m3_scaled4(v: vec4<u32>, s: f32) -> vec4<f32> {
    let mag = v & vec4<u32>(0x7fu);
    let normal = bitcast<vec4<f32>>((mag << vec4<u32>(20u)) + vec4<u32>(120u << 23u));
    let sub = vec4<f32>(v & vec4<u32>(7u)) * 0.001953125;
    var x = select(normal, sub, (v & vec4<u32>(0x78u)) == vec4<u32>(0u));
    x = select(x, -x, (v & vec4<u32>(0x80u)) != vec4<u32>(0u));
    let nan = bitcast<vec4<f32>>(vec4<u32>(0x7fc00000u) | ((v & vec4<u32>(0x80u)) << vec4<u32>(24u)));
    x = select(x, nan, mag == vec4<u32>(0x7fu)) * s;
    let u = bitcast<vec4<u32>>(x);
    let r = (u + vec4<u32>(0x7fffu) + ((u >> vec4<u32>(16u)) & vec4<u32>(1u))) & vec4<u32>(0xffff0000u);
    return select(bitcast<vec4<f32>>(r), x, (u & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u));
}
