// Elementwise arithmetic on the residual stream, over len f32 values, one invocation per
// element of the prelude's `elem_t` (Prelude::elems): f32, or vec4<f32> (len % 4 == 0: one
// invocation per vec4, a quarter of the load instructions, which is what a CPU-side Vulkan
// pays for); ELEMS values an element.
//   add:   acc[i] += x[i] (the residual add)
//   scale: xs[i] *= factor (Gemma's embedding times sqrt(hidden)); factor's f32 bits in the
//          parameter block.
// Check: cargo test -p tandem-wgpu --test wgpu ops::add (ops::scale)

struct Params {
    len: u32,
    factor_bits: u32, // scale only
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> acc: array<elem_t>; // [len / ELEMS]
@group(0) @binding(2) var<storage, read> x: array<elem_t>;         // [len / ELEMS]

@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / ELEMS) {
        return;
    }
    acc[i] = acc[i] + x[i];
}

@group(0) @binding(1) var<storage, read_write> xs: array<elem_t>; // [len / ELEMS]

@compute @workgroup_size(64)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.len / ELEMS) {
        return;
    }
    xs[i] = xs[i] * bitcast<f32>(p.factor_bits);
}
