// gather_rows: out[i, :] = src[rows[i], :]
//   src f32 [src_rows, dim], rows u32 [n], out f32 [n, dim].
// One invocation per output element; a row index past src leaves its output row unwritten.
// Check: cargo test -p tandem-wgpu --test ops -- gather_rows

struct Params {
    n: u32,
    dim: u32,
    src_rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;       // [src_rows, dim]
@group(0) @binding(2) var<storage, read> rows: array<u32>;      // [n]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [n, dim]

@compute @workgroup_size(64)
fn gather_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.n * p.dim) {
        return;
    }
    let r = i / p.dim;
    let d = i - r * p.dim;
    let s = rows[r];
    if (s >= p.src_rows) {
        return;
    }
    out[i] = src[s * p.dim + d];
}
