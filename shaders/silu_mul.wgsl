// The gated MLP activations over len f32 values, one invocation per element (the *4 entries:
// one per vec4, len % 4 == 0, a quarter of the load instructions):
//   silu_mul:      out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) (SwiGLU)
//   gelu_tanh_mul: out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU: Gemma), PyTorch's
//                  gelu(approximate="tanh"): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
// For very negative g, exp(-g) overflows to +inf and g / inf is -0: the right limit.
// tanh's argument is clamped to [-10, 10]: tanh(10) rounds to 1.0 in f32 (so nothing changes),
// and a driver that computes tanh as (e^2x - 1) / (e^2x + 1) would give inf / inf = NaN past it.
// The scalar kernels take silu and gelu_tanh from the prelude (shaders.rs GATED_ACTS), the
// functions matmul.wgsl's fused gate/up epilogue applies; the vec4 ones are the same per lane.
// Check: cargo test -p tandem-wgpu --test wgpu ops::silu_mul (ops::gelu_tanh_mul)

struct Params {
    len: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gate: array<f32>;      // [len]
@group(0) @binding(2) var<storage, read> up: array<f32>;        // [len]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [len]

@compute @workgroup_size(64)
fn silu_mul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len) {
        return;
    }
    out[i] = silu(gate[i]) * up[i];
}

// silu_mul4: the same over len / 4 vec4s.
@group(0) @binding(1) var<storage, read> gate4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> up4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out4: array<vec4<f32>>;

@compute @workgroup_size(64)
fn silu_mul4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / 4u) {
        return;
    }
    let g = gate4[i];
    out4[i] = g / (vec4<f32>(1.0) + exp(-g)) * up4[i];
}

fn gelu_tanh4(g: vec4<f32>) -> vec4<f32> {
    let inner = clamp(0.7978846 * (g + 0.044715 * g * g * g), vec4<f32>(-10.0), vec4<f32>(10.0));
    return 0.5 * g * (vec4<f32>(1.0) + tanh(inner));
}

@compute @workgroup_size(64)
fn gelu_tanh_mul(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len) {
        return;
    }
    out[i] = gelu_tanh(gate[i]) * up[i];
}

@compute @workgroup_size(64)
fn gelu_tanh_mul4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / 4u) {
        return;
    }
    out4[i] = gelu_tanh4(gate4[i]) * up4[i];
}
