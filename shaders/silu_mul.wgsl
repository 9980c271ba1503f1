// silu_mul: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)); len f32 values.
// For very negative g, exp(-g) overflows to +inf and g / inf is -0: the right limit.
// One invocation per element.
// Check: cargo test -p tandem-wgpu --test ops -- silu_mul

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
    let g = gate[i];
    out[i] = g / (1.0 + exp(-g)) * up[i];
}

// silu_mul4: the same over len / 4 vec4s (len % 4 == 0), a quarter of the load instructions.
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
