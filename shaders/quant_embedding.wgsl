// quant_embedding: out[t, :] = table[ids[t], :] with the table kept in a GGUF block layout
// (quant_block.wgsl decodes it; the prelude picks the layout).
//   qw the table's bytes as u32 words, row r's blocks from byte r * p.row_bytes; ids u32 [T];
//   out f32 [T, hidden] (hidden a multiple of the block, so of 32).
// A table larger than one storage binding is bound in row chunks: this dispatch sees rows
// [row0, row0 + rows) and writes only the tokens whose id falls there.
// One invocation per four output elements (one decode4).
// Check: cargo test -p tandem-wgpu --test ops -- quant

struct Params {
    num_tokens: u32,
    hidden: u32,
    row0: u32, // this dispatch's first table row (a table larger than one binding is bound in row chunks)
    rows: u32,
    row_bytes: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qw: array<u32>;         // the table's blocks
@group(0) @binding(2) var<storage, read> ids: array<u32>;        // [T]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [T, hidden]

@compute @workgroup_size(64)
fn quant_embedding(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let i = ((wg.y * nwg.x + wg.x) * 64u + li) * 4u;
    if (i >= p.num_tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let d = i - t * p.hidden;
    let id = ids[t];
    // ids were validated on the host; the range test also keeps a bad id from reading past the table.
    if (id < p.row0 || id >= p.row0 + p.rows) {
        return;
    }
    let v = decode4((id - p.row0) * p.row_bytes + (d / BLOCK_ELEMS) * BLOCK_BYTES, d % BLOCK_ELEMS);
    out[i] = v.x;
    out[i + 1u] = v.y;
    out[i + 2u] = v.z;
    out[i + 3u] = v.w;
}
