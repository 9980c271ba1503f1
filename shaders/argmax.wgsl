// argmax: out[r] = index of the largest value in logits[r, :] (lowest index on ties; a NaN
// never wins unless the row has nothing else).
//   logits f32 [rows, vocab], out u32 [rows].
// One workgroup of 256 per row: each lane scans a strided slice, then lane 0 merges the 256
// candidates in index order.
// Check: cargo test -p tandem-wgpu --test ops -- argmax

struct Params {
    rows: u32,
    vocab: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;    // [rows, vocab]
@group(0) @binding(2) var<storage, read_write> out: array<u32>; // [rows]

var<workgroup> best_val: array<f32, 256>;
var<workgroup> best_idx: array<u32, 256>;

// a beats b: larger, or equal with a lower index. Written so that a NaN `a` never beats.
fn beats(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return av > bv || (av == bv && ai < bi);
}

@compute @workgroup_size(256)
fn argmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.vocab;
    // -inf is not writable in WGSL; -3.4e38 loses only to nothing a real logit would be.
    var bv = -3.4028235e38;
    var bi = 0xffffffffu;
    for (var i = li; i < p.vocab; i += 256u) {
        let v = logits[base + i];
        if (bi == 0xffffffffu || v > bv) {
            if (!(v != v)) { // skip NaN (v != v holds only for NaN)
                bv = v;
                bi = i;
            }
        }
    }
    best_val[li] = bv;
    best_idx[li] = bi;
    workgroupBarrier();
    if (li == 0u) {
        var v = best_val[0];
        var ix = best_idx[0];
        for (var j = 1u; j < 256u; j++) {
            let cj = best_idx[j];
            if (cj != 0xffffffffu && (ix == 0xffffffffu || beats(best_val[j], cj, v, ix))) {
                v = best_val[j];
                ix = cj;
            }
        }
        // A row of NaNs only: answer the last index, as the CPU argmax does.
        out[row] = select(ix, p.vocab - 1u, ix == 0xffffffffu);
    }
}
