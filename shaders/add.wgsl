// Elementwise arithmetic on the residual stream, over len f32 values, one invocation per
// element (the *4 entries: one per vec4, len % 4 == 0):
//   add:   acc[i] += x[i] (the residual add)
//   scale: xs[i] *= factor (Gemma's embedding times sqrt(hidden)); factor's f32 bits in the
//          parameter block.
// Check: cargo test -p tandem-wgpu --test wgpu ops::add (ops::scale)

struct Params {
    len: u32,
    factor_bits: u32, // scale only
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> acc: array<f32>; // [len]
@group(0) @binding(2) var<storage, read> x: array<f32>;         // [len]

@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len) {
        return;
    }
    acc[i] = acc[i] + x[i];
}

// add4: the same over len / 4 vec4s (len % 4 == 0): a quarter of the load instructions,
// which is what a CPU-side Vulkan pays for.
@group(0) @binding(1) var<storage, read_write> acc4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> x4: array<vec4<f32>>;

@compute @workgroup_size(64)
fn add4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / 4u) {
        return;
    }
    acc4[i] = acc4[i] + x4[i];
}

@group(0) @binding(1) var<storage, read_write> xs: array<f32>;
@group(0) @binding(1) var<storage, read_write> xs4: array<vec4<f32>>;

@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len) {
        return;
    }
    xs[i] = xs[i] * bitcast<f32>(p.factor_bits);
}

@compute @workgroup_size(64)
fn scale4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / 4u) {
        return;
    }
    xs4[i] = xs4[i] * bitcast<f32>(p.factor_bits);
}
