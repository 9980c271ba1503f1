// paged_attention: causal attention over the paged KV cache, for a flattened batch of query
// tokens from many sequences (decode tokens and prefill chunks alike).
//   q f32 [T, num_heads, head_dim]; k_cache, v_cache f32 [num_blocks * block_size, kv_heads,
//   head_dim]; positions, token_seq u32 [T]; block_tables u32 [num_seqs, max_blocks];
//   out f32 [T, num_heads, head_dim].
// Query token t (sequence s = token_seq[t], position P = positions[t]) with head h attends to
// the keys of s at positions lo..=P with kv head h / (num_heads / kv_heads), where lo = 0, or
// max(0, P + 1 - window) with a sliding window (HF: key j seen when j > P - window); the key at
// position j lives in slot block_tables[s, j / block_size] * block_size + j % block_size.
//
// One workgroup of 64 per (token, head). Keys go in tiles of 64: lane j scores key
// tile + j (a dot product over head_dim) into workgroup memory; then each lane, owning output
// dimensions li, li + 64, ..., folds the tile into its running (max, sum, acc) with the online
// softmax. Two barriers per tile of 64 keys. head_dim <= 256.
// Both kernels read the caches through the prelude's k_at / v_at / k4_at / v4_at
// (Prelude::kv_cache): the storage buffers declared here, or textures the prelude declares, or
// an fp8 cache's u32 words (Prelude::kv_cache_fp8), decoded and scaled.
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
    window: u32, // keys a token sees, its own included; 0: the whole context
    k_scale: f32, // an fp8 cache's scales (the prelude's k_at / k4_at multiply by them)
    v_scale: f32,
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

// The first key position a token with n_keys keys of context sees.
fn first_key(n_keys: u32) -> u32 {
    return select(0u, n_keys - p.window, p.window > 0u && n_keys > p.window);
}

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

    for (var base = first_key(n_keys); base < n_keys; base += TILE) {
        let j = base + li;
        var sc = NEG_BIG;
        if (j < n_keys) {
            let slot = key_slot(s, j);
            if (slot < p.num_slots) {
                let ko = slot * kv_row + kvh * hd;
                var dot = 0.0;
                for (var d = 0u; d < hd; d++) {
                    dot += q[qo + d] * k_at(ko + d);
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
                    acc[c] += pr * v_at(vo + d);
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
// lavapipe) per (token, group of GQ query heads that share one kv head): lane s walks keys
// s, s + 8, ... alone with the online softmax and 16-byte loads, each K and V load serving the
// GQ heads, then the 8 partial results are merged through workgroup memory (one barrier).
// Chosen on CPU adapters, where barriers are coroutine switches and every load is paid per
// lane, so the tiled kernel above is slower; splitting keys fills every lane even when a
// decode step has fewer heads than a vector has lanes. Needs head_dim % 4 == 0.
// Prelude constants: HV = head_dim / 4 and GQ (query heads per workgroup, dividing
// num_heads / kv_heads), so every loop over them has a known trip count and q, acc stay out of
// lane-by-lane private-array indexing.
const SPLITS: u32 = 8u;

@group(0) @binding(1) var<storage, read> q4: array<vec4<f32>>;       // [T, num_heads, head_dim / 4]
@group(0) @binding(2) var<storage, read> k4: array<vec4<f32>>;       // [slots, kv_heads, head_dim / 4]
@group(0) @binding(3) var<storage, read> v4: array<vec4<f32>>;       // [slots, kv_heads, head_dim / 4]
@group(0) @binding(7) var<storage, read_write> out4: array<vec4<f32>>; // [T, num_heads, head_dim / 4]

var<workgroup> part_acc: array<vec4<f32>, SPLITS * GQ * HV>; // [SPLITS, GQ, HV]
var<workgroup> part_m: array<f32, SPLITS * GQ>;             // [SPLITS, GQ]
var<workgroup> part_l: array<f32, SPLITS * GQ>;             // [SPLITS, GQ]

@compute @workgroup_size(8)
fn paged_attention_lane(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) li: u32) {
    let wid = wg.y * nwg.x + wg.x;
    let groups = p.num_heads / GQ;
    // Uniform over the workgroup, so the barrier below is reached by all or none.
    if (wid >= p.num_tokens * groups) {
        return;
    }
    let t = wid / groups;
    let h0 = (wid - t * groups) * GQ;
    let kvh = h0 / (p.num_heads / p.kv_heads);
    let s = min(token_seq[t], p.num_seqs - 1u);
    let n_keys = positions[t] + 1u;
    let kv_row = p.kv_heads * HV;
    // The group's heads are consecutive in q and out: [GQ, HV] vec4s from qo.
    let qo = (t * p.num_heads + h0) * HV;

    // Loops over the private arrays are nested GQ x HV, never one loop of GQ * HV: each has a
    // trip count small enough for the compiler to unroll, and an unrolled access keeps the
    // array in registers (a CPU-side Vulkan otherwise spills it to memory it reaches lane by lane).
    var qv: array<vec4<f32>, GQ * HV>;
    var acc: array<vec4<f32>, GQ * HV>;
    for (var g = 0u; g < GQ; g++) {
        for (var d = 0u; d < HV; d++) {
            qv[g * HV + d] = q4[qo + g * HV + d] * p.scale;
            acc[g * HV + d] = vec4<f32>(0.0);
        }
    }
    var m: array<f32, GQ>;
    var l: array<f32, GQ>;
    for (var g = 0u; g < GQ; g++) {
        m[g] = NEG_BIG;
        l[g] = 0.0;
    }
    for (var j = first_key(n_keys) + li; j < n_keys; j += SPLITS) {
        let slot = key_slot(s, j);
        if (slot >= p.num_slots) {
            continue;
        }
        let ko = slot * kv_row + kvh * HV;
        // The prelude's lane_scores / lane_accumulate (Prelude::lane_attention) are the loops
        // over HV and GQ written out.
        let dots = lane_scores(ko, &qv);
        var corr: array<f32, GQ>;
        var pr: array<f32, GQ>;
        for (var g = 0u; g < GQ; g++) {
            let sc = dots[g];
            let m_new = max(m[g], sc);
            corr[g] = exp(m[g] - m_new);
            pr[g] = exp(sc - m_new);
            l[g] = l[g] * corr[g] + pr[g];
            m[g] = m_new;
        }
        lane_accumulate(ko, &acc, corr, pr);
    }
    for (var g = 0u; g < GQ; g++) {
        part_m[li * GQ + g] = m[g];
        part_l[li * GQ + g] = l[g];
    }
    for (var g = 0u; g < GQ; g++) {
        for (var d = 0u; d < HV; d++) {
            part_acc[(li * GQ + g) * HV + d] = acc[g * HV + d];
        }
    }
    workgroupBarrier();
    // A split without keys has m = NEG_BIG, l = 0, acc = 0: its weight below is 0. Lane li
    // writes vec4s li, li + 8, ... of the group's [GQ, HV] output.
    for (var i = li; i < GQ * HV; i += SPLITS) {
        let g = i / HV;
        var gm = NEG_BIG;
        for (var k = 0u; k < SPLITS; k++) {
            gm = max(gm, part_m[k * GQ + g]);
        }
        var gl = 0.0;
        var o = vec4<f32>(0.0);
        for (var k = 0u; k < SPLITS; k++) {
            let wk = exp(part_m[k * GQ + g] - gm);
            gl += part_l[k * GQ + g] * wk;
            o += part_acc[k * GQ * HV + i] * wk;
        }
        out4[qo + i] = o * select(0.0, 1.0 / gl, gl > 0.0);
    }
}
