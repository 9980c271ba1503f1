// quant_split_embedding: out[t, :] = table[ids[t], :] with the table kept quantized in the split
// layout (crates/wgpu/src/quant_split.rs; shaders/quant_split.wgsl decodes it), held in a
// texture (the prelude declares it and `q_unit(i)`).
//   ids u32 [T]; out f32 [T, hidden] (hidden a multiple of the block).
// One invocation per four output elements: the block's header unit and one unit of quants
// (and Q6_K's scales unit, Q5_K's / Q6_K's unit of high bits).
// Check: cargo test -p tandem-wgpu --test wgpu quant::

struct Params {
    num_tokens: u32,
    hidden: u32,
    rows: u32,    // table rows
    units: u32,   // units of a split row
    q_units: u32, // units of a row's quants
}

@group(0) @binding(0) var<uniform> p: Params;
// binding 1: qw, the texture (prelude)
@group(0) @binding(2) var<storage, read> ids: array<u32>;        // [T]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;  // [T, hidden]

fn unit_at(r: u32, u: u32) -> vec4<u32> {
    return q_unit((((r >> 6u) * p.units + u) << 6u) | (r & 63u));
}

@compute @workgroup_size(64)
fn quant_split_embedding(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) li: u32) {
    let i = ((wg.y * nwg.x + wg.x) * 64u + li) * 4u;
    if (i >= p.num_tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let d = i - t * p.hidden;
    let id = ids[t];
    // ids were validated on the host; this keeps a bad id from reading another row.
    if (id >= p.rows) {
        return;
    }
    let b = d / BLOCK_ELEMS;
    let g = (d % BLOCK_ELEMS) / 4u; // group of four in the block
    let hh = b * HH;
    let h = unit_at(id, p.q_units + (hh >> 3u));
    let u = g / VJ;
    var hs = h;
    if (SCALE_UNIT) {
        hs = unit_at(id, b * QS + QS - 1u);
    }
    var a = vec4<u32>();
    if (HIGH_UNITS) {
        a = unit_at(id, b * QS + QU + u / SUBS_PER_HIGH);
    }
    let hx = split_high(split_bits(h, hh & 7u), a, u);
    let v = split4(split_sub(hs, split_head(h, hh & 7u), u), hx, unit_at(id, b * QS + u), g % VJ);
    out[i] = v.x;
    out[i + 1u] = v.y;
    out[i + 2u] = v.z;
    out[i + 3u] = v.w;
}
