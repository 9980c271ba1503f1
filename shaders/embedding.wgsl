// embedding: out[t, :] = table[ids[t], :]
//   table [vocab, hidden] weight (bf16/f16/f32, row-major or tiled, via the prelude's
//   `w_at_rc(row, col, hidden)`), ids u32 [T],
//   out f32 [T, hidden].
// A table larger than one storage binding is bound in row chunks: this dispatch sees rows
// [row0, row0 + rows) of the table and writes only the tokens whose id falls there.
// One invocation per output element.
// Check: cargo test -p tandem-wgpu --test ops -- embedding

struct Params {
    num_tokens: u32,
    hidden: u32,
    row0: u32,
    rows: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 1: w [rows, hidden] (this chunk), declared by the prelude (a buffer or a texture)
@group(0) @binding(2) var<storage, read> ids: array<u32>;     // [T]
@group(0) @binding(3) var<storage, read_write> out: array<f32>; // [T, hidden]

@compute @workgroup_size(64)
fn embedding(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.num_tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let d = i - t * p.hidden;
    let id = ids[t];
    // ids were validated on the host; the range test also keeps a bad id from reading past the chunk.
    if (id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    out[i] = w_at_rc(id - p.row0, d, p.hidden);
}
