//! The fp8 codec in WGSL: what an fp8 KV cache's kernels call to write and read its bytes.
//!
//! WGSL has no 8-bit type, so an fp8 cache holds 4 elements a u32 (element `4i + j` in byte `j`,
//! little end first, as the reference's byte buffer reinterpreted). Both directions work on the
//! f32's bits with integer arithmetic so that every device gives the reference's value exactly:
//! `fp8_encode` is `tandem_core::fp8_round::encode` (round to nearest, ties to even, saturate to
//! the largest finite value, NaN stays NaN) and `fp8_decode` is `Fp8Format::decode`. The scale
//! (1.0, or a checkpoint's `k_scale` / `v_scale`: `tandem_core::kv_scales`) is the caller's: divide before encoding, multiply after
//! decoding; `div_rn` divides as the reference's f32 `/` does (WGSL's `/` may be 2.5 ulp off).

use tandem_core::fp8::Fp8Format;

/// Mantissa bits, exponent bias, the largest finite magnitude's f32 bits and its byte.
fn params(format: Fp8Format) -> (u32, u32, u32, u32) {
    match format {
        Fp8Format::E4M3 => (3, 7, 448f32.to_bits(), 0x7e),
        Fp8Format::E5M2 => (2, 15, 57344f32.to_bits(), 0x7b),
    }
}

/// `div_rn(x, s)`: `x / s` rounded to nearest even, as IEEE division gives it, for a positive
/// normal `s`, by long division of the significands in integers (WGSL's `/` need only be within
/// 2.5 ulp, and one ulp moves a tie of the fp8 rounding). Where the quotient is not an f32
/// normal it is what the fp8 rounding makes of it alike: below 2^-126 a signed zero (every fp8
/// format rounds it to zero), past the f32 range a signed infinity (which saturates). A
/// subnormal x counts as zero (devices may flush it; its quotient rounds to zero either way for
/// any scale above 2^-100); infinity and NaN pass through. `div4_rn` is its vec4 form.
const DIV_RN: &str = "fn div_rn(x: f32, s: f32) -> f32 {\n\
\x20   let xb = bitcast<u32>(x);\n\
\x20   let sign = xb & 0x80000000u;\n\
\x20   let ax = xb & 0x7fffffffu;\n\
\x20   if (ax >= 0x7f800000u) { return x; }\n\
\x20   if (ax < 0x00800000u) { return bitcast<f32>(sign); }\n\
\x20   let sb = bitcast<u32>(s);\n\
\x20   let ms = (sb & 0x7fffffu) | 0x800000u;\n\
\x20   var n = (ax & 0x7fffffu) | 0x800000u;\n\
\x20   var e = i32(ax >> 23u) - i32(sb >> 23u) + 127;\n\
\x20   if (n < ms) { n = n << 1u; e = e - 1; }\n\
\x20   // n / ms in [1, 2): 24 bits of quotient and a guard bit, the remainder for the sticky bit.\n\
\x20   var q = 0u;\n\
\x20   for (var i = 0u; i < 25u; i++) {\n\
\x20       q = q << 1u;\n\
\x20       if (n >= ms) { n = n - ms; q = q | 1u; }\n\
\x20       n = n << 1u;\n\
\x20   }\n\
\x20   let guard = q & 1u;\n\
\x20   q = q >> 1u;\n\
\x20   if (guard == 1u && (n != 0u || (q & 1u) == 1u)) {\n\
\x20       q = q + 1u;\n\
\x20       if (q == 0x1000000u) { q = q >> 1u; e = e + 1; }\n\
\x20   }\n\
\x20   if (e <= 0) { return bitcast<f32>(sign); }\n\
\x20   if (e >= 255) { return bitcast<f32>(sign | 0x7f800000u); }\n\
\x20   return bitcast<f32>(sign | (u32(e) << 23u) | (q & 0x7fffffu));\n\
}\n\
fn div4_rn(x: vec4<f32>, s: f32) -> vec4<f32> {\n\
\x20   return vec4<f32>(div_rn(x.x, s), div_rn(x.y, s), div_rn(x.z, s), div_rn(x.w, s));\n\
}\n";

/// WGSL functions for `format`: `fp8_encode(x: f32) -> u32` (one byte, in the low 8 bits),
/// `fp8_decode(b: u32) -> f32` (the low 8 bits of `b`), the packed forms
/// `fp8x4_encode(x: vec4<f32>) -> u32` / `fp8x4_decode(w: u32) -> vec4<f32>`, and [`DIV_RN`]'s
/// `div_rn` / `div4_rn`.
pub fn wgsl(format: Fp8Format) -> String {
    let (man, bias, max_bits, max_byte) = params(format);
    let shift = 23 - man;
    let man_mask = (1u32 << man) - 1;
    // Below the smallest normal a value is a multiple of 2^(1 - bias - man): scaled by the
    // inverse it is an integer (exactly: a power-of-two product), rounded ties to even.
    let min_normal_bits = ((127 + 1 - bias as i32) as u32) << 23;
    let sub_up = 2f32.powi(bias as i32 - 1 + man as i32).to_bits();
    let sub_down = 2f32.powi(1 - bias as i32 - man as i32).to_bits();
    let special = match format {
        // e4m3fn: only S.1111.111 is special (NaN); there is no infinity.
        Fp8Format::E4M3 => "if ((b & 0x7fu) == 0x7fu) { return bitcast<f32>(0x7fc00000u); }\n".to_string(),
        // e5m2: an all-ones exponent is infinity (mantissa 0) or NaN, as in IEEE.
        Fp8Format::E5M2 => "if ((b & 0x7cu) == 0x7cu) {\n\
             \x20   if ((b & 3u) == 0u) { return bitcast<f32>(sign | 0x7f800000u); }\n\
             \x20   return bitcast<f32>(0x7fc00000u);\n\
             }\n"
        .to_string(),
    };
    format!(
        "fn fp8_encode(x: f32) -> u32 {{\n\
         \x20   let bits = bitcast<u32>(x);\n\
         \x20   let sign = (bits >> 24u) & 0x80u;\n\
         \x20   let abs_bits = bits & 0x7fffffffu;\n\
         \x20   if (abs_bits > 0x7f800000u) {{ return sign | 0x7fu; }}\n\
         \x20   if (abs_bits >= {max_bits}u) {{ return sign | {max_byte}u; }}\n\
         \x20   if (abs_bits < {min_normal_bits}u) {{\n\
         \x20       return sign | u32(round(bitcast<f32>(abs_bits) * bitcast<f32>({sub_up:#x}u)));\n\
         \x20   }}\n\
         \x20   let lsb = (abs_bits >> {shift}u) & 1u;\n\
         \x20   let r = (abs_bits + {half}u + lsb) & {keep}u;\n\
         \x20   let e = (r >> 23u) - {exp_off}u;\n\
         \x20   return sign | (e << {man}u) | ((r >> {shift}u) & {man_mask}u);\n\
         }}\n\
         fn fp8_decode(w: u32) -> f32 {{\n\
         \x20   let b = w & 0xffu;\n\
         \x20   let sign = (b & 0x80u) << 24u;\n\
         \x20   {special}\
         \x20   let e = (b & 0x7fu) >> {man}u;\n\
         \x20   let m = b & {man_mask}u;\n\
         \x20   if (e == 0u) {{ return bitcast<f32>(sign | bitcast<u32>(f32(m) * bitcast<f32>({sub_down:#x}u))); }}\n\
         \x20   return bitcast<f32>(sign | ((e + {exp_off}u) << 23u) | (m << {shift}u));\n\
         }}\n\
         fn fp8x4_encode(x: vec4<f32>) -> u32 {{\n\
         \x20   return fp8_encode(x.x) | (fp8_encode(x.y) << 8u) | (fp8_encode(x.z) << 16u) | (fp8_encode(x.w) << 24u);\n\
         }}\n\
         fn fp8x4_decode(w: u32) -> vec4<f32> {{\n\
         \x20   return vec4<f32>(fp8_decode(w), fp8_decode(w >> 8u), fp8_decode(w >> 16u), fp8_decode(w >> 24u));\n\
         }}\n",
        half = (1u32 << (shift - 1)) - 1,
        keep = !((1u32 << shift) - 1),
        exp_off = 127 - bias,
    ) + DIV_RN
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::fp8_round;
    use wgpu::util::DeviceExt;

    /// Runs `out[i] = f(inp[i])` for the WGSL expression `body` over u32 words on the device.
    fn run(gpu: &crate::adapter::Gpu, prelude: &str, body: &str, inp: &[u32]) -> Vec<u32> {
        let src = format!(
            "{prelude}\n@group(0) @binding(0) var<storage, read> inp: array<u32>;\n\
             @group(0) @binding(1) var<storage, read_write> out: array<u32>;\n\
             @compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {{\n\
             \x20   let i = g.x + g.y * 4194240u;\n\
             \x20   if (i < arrayLength(&inp)) {{ let w = inp[i]; out[i] = {body}; }}\n\
             }}\n"
        );
        let d = &gpu.device;
        let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("fp8_codec test"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let bytes: Vec<u8> = inp.iter().flat_map(|w| w.to_le_bytes()).collect();
        let size = bytes.len() as u64;
        let a = d.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: None,
            contents: &bytes,
            usage: wgpu::BufferUsages::STORAGE,
        });
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC;
        let b = d.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let r = d.create_buffer(&wgpu::BufferDescriptor { label: None, size, usage, mapped_at_creation: false });
        let bind = d.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: a.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: b.as_entire_binding() },
            ],
        });
        let mut enc = d.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            let groups = inp.len().div_ceil(64) as u32;
            pass.dispatch_workgroups(groups.min(65_535), groups.div_ceil(65_535), 1);
        }
        enc.copy_buffer_to_buffer(&b, 0, &r, 0, size);
        gpu.queue.submit([enc.finish()]);
        r.map_async(wgpu::MapMode::Read, 0..size, |res| res.expect("map the readback buffer"));
        d.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        let view = r.get_mapped_range(0..size).expect("read the readback buffer");
        view.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    #[test]
    fn codec_equals_the_reference_rounding_on_the_device() {
        let gpu = match crate::adapter::open() {
            Ok(g) => g,
            Err(e) => {
                eprintln!("skipping: no wgpu adapter ({e})");
                return;
            }
        };
        // Inputs: every f32 bit pattern stepping by a prime (signs, binades, ties, overflow),
        // the midpoints between neighbouring fp8 values (exact ties) and every byte's value.
        let mut xs: Vec<u32> = (0..=u32::MAX / 9_973).map(|k| k * 9_973).collect();
        for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
            for b in 0u8..0x7e {
                let (lo, hi) = (f.decode(b), f.decode(b + 1));
                if hi.is_finite() {
                    xs.extend([((lo + hi) / 2.0).to_bits(), (-(lo + hi) / 2.0).to_bits()]);
                }
            }
            xs.extend((0..=255u8).map(|b| f.decode(b).to_bits()));
        }
        let bytes: Vec<u32> = (0..=255).collect();
        for f in [Fp8Format::E4M3, Fp8Format::E5M2] {
            let prelude = wgsl(f);
            let enc = run(&gpu, &prelude, "fp8_encode(bitcast<f32>(w))", &xs);
            for (x, got) in xs.iter().zip(&enc) {
                let x = f32::from_bits(*x);
                let want = fp8_round::encode(f, x) as u32;
                // A NaN encodes to some NaN byte; f32 subnormal inputs may be flushed to zero
                // by the device, which changes nothing: they round to zero either way.
                if x.is_nan() {
                    assert!(f.decode(*got as u8).is_nan(), "{} NaN -> {got:#x}", f.name());
                } else {
                    assert_eq!(*got, want, "{} encode {x:e}", f.name());
                }
            }
            let dec = run(&gpu, &prelude, "bitcast<u32>(fp8_decode(w))", &bytes);
            for (b, got) in bytes.iter().zip(&dec) {
                let want = f.decode(*b as u8);
                let got = f32::from_bits(*got);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{} decode {b:#04x}: {got} != {want}",
                    f.name()
                );
            }
            // Division by a scale, bit for bit IEEE's (the reference's `x / scale`).
            for scale in [1.0f32, 0.37, 3.0, 0.0123, 17.25, 1.0e-3] {
                let body = format!("bitcast<u32>(div_rn(bitcast<f32>(w), bitcast<f32>({:#x}u)))", scale.to_bits());
                let got = run(&gpu, &prelude, &body, &xs);
                for (x, got) in xs.iter().zip(&got) {
                    let (x, got) = (f32::from_bits(*x), f32::from_bits(*got));
                    // The fp8 rounding is what must agree: a quotient below f32's normals is a
                    // zero here, and a subnormal x counts as zero.
                    let want = if x.is_subnormal() { 0.0 * x.signum() } else { x / scale };
                    if want.is_nan() {
                        assert!(got.is_nan(), "{x:e} / {scale}: {got}");
                    } else {
                        assert_eq!(fp8_round::encode(f, got), fp8_round::encode(f, want), "{x:e} / {scale}");
                        if want.is_normal() || want.is_infinite() {
                            assert_eq!(got.to_bits(), want.to_bits(), "{x:e} / {scale}");
                        }
                    }
                }
            }
            // The packed forms: byte j of a word is lane j.
            let words = [0x3a39_3800u32, 0xfe7e_80b8, 0x0108_7f01];
            let dec4 = run(&gpu, &prelude, "fp8x4_encode(fp8x4_decode(w))", &words);
            for (w, got) in words.iter().zip(&dec4) {
                for j in 0..4 {
                    let (b, g) = ((w >> (8 * j)) as u8, (got >> (8 * j)) as u8);
                    if f.decode(b).is_nan() {
                        assert!(f.decode(g).is_nan());
                    } else {
                        assert_eq!(g, b, "{} word {w:#010x} lane {j}", f.name());
                    }
                }
            }
        }
    }
}
