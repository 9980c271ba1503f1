// add: acc[i] += x[i] over len f32 values (the residual add).
// One invocation per element.
// Check: cargo test -p tandem-wgpu --test ops -- add

struct Params {
    len: u32,
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
