// paged_attention: causal attention over the paged KV cache, for a flattened batch of query
// tokens from many sequences (decode tokens and prefill chunks alike).
//   q f32 [T, num_heads, head_dim]; k_cache, v_cache f32 [num_blocks * block_size, kv_heads,
//   head_dim]; positions, token_seq u32 [T]; block_tables u32 [num_seqs, max_blocks];
//   out f32 [T, num_heads, head_dim].
// Query token t (sequence s = token_seq[t], position P = positions[t]) with head h attends to
// the keys of s at positions 0..=P with kv head h / (num_heads / kv_heads); the key at
// position j lives in slot block_tables[s, j / block_size] * block_size + j % block_size.
//
// One workgroup of 64 per (token, head). Keys go in tiles of 64: lane j scores key
// tile + j (a dot product over head_dim) into workgroup memory; then each lane, owning output
// dimensions li, li + 64, ..., folds the tile into its running (max, sum, acc) with the online
// softmax. Two barriers per tile of 64 keys. head_dim <= 256.
// Check: cargo test -p tandem-wgpu --test ops -- paged_attention

struct Params {
    num_tokens: u32,
    num_heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_seqs: u32,
    num_slots: u32,
    scale: f32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;             // [T, num_heads, head_dim]
@group(0) @binding(2) var<storage, read> k_cache: array<f32>;       // [slots, kv_heads, head_dim]
@group(0) @binding(3) var<storage, read> v_cache: array<f32>;       // [slots, kv_heads, head_dim]
@group(0) @binding(4) var<storage, read> positions: array<u32>;     // [T]
@group(0) @binding(5) var<storage, read> token_seq: array<u32>;     // [T]
@group(0) @binding(6) var<storage, read> block_tables: array<u32>;  // [num_seqs, max_blocks]
@group(0) @binding(7) var<storage, read_write> out: array<f32>;     // [T, num_heads, head_dim]

const TILE: u32 = 64u;
const MAX_DIMS_PER_LANE: u32 = 4u; // head_dim <= 4 * 64
const NEG_BIG: f32 = -3.4028235e38;

var<workgroup> scores: array<f32, TILE>;

// Slot of key position j of sequence s, or num_slots when the table does not reach it.
fn key_slot(s: u32, j: u32) -> u32 {
    let b = j / p.block_size;
    if (b >= p.max_blocks) {
        return p.num_slots;
    }
    return block_tables[s * p.max_blocks + b] * p.block_size + j % p.block_size;
}

@compute @workgroup_size(64)
fn paged_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) li: u32) {
    let wid = wg.y * nwg.x + wg.x;
    // Everything below up to the barriers is uniform over the workgroup.
    if (wid >= p.num_tokens * p.num_heads) {
        return;
    }
    let t = wid / p.num_heads;
    let h = wid - t * p.num_heads;
    let kvh = h / (p.num_heads / p.kv_heads);
    let s = min(token_seq[t], p.num_seqs - 1u);
    let n_keys = positions[t] + 1u;
    let hd = p.head_dim;
    let kv_row = p.kv_heads * hd;
    let qo = wid * hd;

    var m = NEG_BIG;
    var l = 0.0;
    var acc: array<f32, MAX_DIMS_PER_LANE>;
    for (var c = 0u; c < MAX_DIMS_PER_LANE; c++) {
        acc[c] = 0.0;
    }

    for (var base = 0u; base < n_keys; base += TILE) {
        let j = base + li;
        var sc = NEG_BIG;
        if (j < n_keys) {
            let slot = key_slot(s, j);
            if (slot < p.num_slots) {
                let ko = slot * kv_row + kvh * hd;
                var dot = 0.0;
                for (var d = 0u; d < hd; d++) {
                    dot += q[qo + d] * k_cache[ko + d];
                }
                sc = dot * p.scale;
            }
        }
        scores[li] = sc;
        workgroupBarrier();

        let cnt = min(TILE, n_keys - base);
        var tmax = m;
        for (var i = 0u; i < cnt; i++) {
            tmax = max(tmax, scores[i]);
        }
        // On the first tile m is NEG_BIG and l, acc are 0, so the rescale is harmless.
        let corr = exp(m - tmax);
        l *= corr;
        for (var c = 0u; c < MAX_DIMS_PER_LANE; c++) {
            acc[c] *= corr;
        }
        for (var i = 0u; i < cnt; i++) {
            let slot = key_slot(s, base + i);
            if (slot >= p.num_slots) {
                continue;
            }
            let pr = exp(scores[i] - tmax);
            l += pr;
            let vo = slot * kv_row + kvh * hd;
            for (var c = 0u; c < MAX_DIMS_PER_LANE; c++) {
                let d = li + c * 64u;
                if (d < hd) {
                    acc[c] += pr * v_cache[vo + d];
                }
            }
        }
        m = tmax;
        workgroupBarrier();
    }

    let inv = select(0.0, 1.0 / l, l > 0.0);
    for (var c = 0u; c < MAX_DIMS_PER_LANE; c++) {
        let d = li + c * 64u;
        if (d < hd) {
            out[qo + d] = acc[c] * inv;
        }
    }
}

// paged_attention_lane: the same result with a workgroup of 8 lanes (one SIMD vector on
// lavapipe) per (token, head): lane s walks keys s, s + 8, ... alone with the online softmax
// and 16-byte loads, then the 8 partial results are merged through workgroup memory (one
// barrier). Chosen on CPU adapters, where barriers are coroutine switches and every load is
// paid per lane, so the tiled kernel above is slower; splitting keys fills every lane even when
// a decode step has fewer heads than a vector has lanes. Needs head_dim % 4 == 0.
const MAX_VEC4: u32 = 64u; // head_dim <= 256
const SPLITS: u32 = 8u;

@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;       // [T, num_heads, head_dim / 4]
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;       // [slots, kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;       // [slots, kv_heads, head_dim / 4]
@group(0) @binding(7) var<storage, read_write> out4: array<vec4<f32>>; // [T, num_heads, head_dim / 4]

var<workgroup> part_acc: array<vec4<f32>, 512>; // [SPLITS, MAX_VEC4]
var<workgroup> part_m: array<f32, 8>;           // [SPLITS]
var<workgroup> part_l: array<f32, 8>;           // [SPLITS]

@compute @workgroup_size(8)
fn paged_attention_lane(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) li: u32) {
    let wid = wg.y * nwg.x + wg.x;
    // Uniform over the workgroup, so the barrier below is reached by all or none.
    if (wid >= p.num_tokens * p.num_heads) {
        return;
    }
    let t = wid / p.num_heads;
    let h = wid - t * p.num_heads;
    let kvh = h / (p.num_heads / p.kv_heads);
    let s = min(token_seq[t], p.num_seqs - 1u);
    let n_keys = positions[t] + 1u;
    // HV = head_dim / 4, a constant of the pipeline (the prelude's): the loops over it have a
    // known trip count, so the compiler can keep q and acc in registers instead of indexing
    // private arrays (which a CPU-side Vulkan does one lane at a time).
    let hv = HV;
    let kv_row = p.kv_heads * hv;
    let qo = wid * hv;

    var qv: array<vec4<f32>, HV>;
    var acc: array<vec4<f32>, HV>;
    for (var d = 0u; d < hv; d++) {
        qv[d] = q4[qo + d] * p.scale;
        acc[d] = vec4<f32>(0.0);
    }
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = li; j < n_keys; j += SPLITS) {
        let slot = key_slot(s, j);
        if (slot >= p.num_slots) {
            continue;
        }
        let ko = slot * kv_row + kvh * hv;
        var dot4 = vec4<f32>(0.0);
        for (var d = 0u; d < hv; d++) {
            dot4 += qv[d] * k4[ko + d];
        }
        let sc = dot4.x + dot4.y + dot4.z + dot4.w;
        let m_new = max(m, sc);
        let corr = exp(m - m_new);
        let pr = exp(sc - m_new);
        l = l * corr + pr;
        for (var d = 0u; d < hv; d++) {
            acc[d] = acc[d] * corr + pr * v4[ko + d];
        }
        m = m_new;
    }
    part_m[li] = m;
    part_l[li] = l;
    for (var d = 0u; d < hv; d++) {
        part_acc[li * MAX_VEC4 + d] = acc[d];
    }
    workgroupBarrier();
    // A split without keys has m = NEG_BIG, l = 0, acc = 0: its weight below is 0.
    var gm = NEG_BIG;
    for (var i = 0u; i < SPLITS; i++) {
        gm = max(gm, part_m[i]);
    }
    var gl = 0.0;
    for (var i = 0u; i < SPLITS; i++) {
        gl += part_l[i] * exp(part_m[i] - gm);
    }
    let inv = select(0.0, 1.0 / gl, gl > 0.0);
    for (var d = li; d < hv; d += SPLITS) {
        var o = vec4<f32>(0.0);
        for (var i = 0u; i < SPLITS; i++) {
            o += part_acc[i * MAX_VEC4 + d] * exp(part_m[i] - gm);
        }
        out4[qo + d] = o * inv;
    }
}
