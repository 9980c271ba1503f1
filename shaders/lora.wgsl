// lora: each row's own LoRA adapter update from stacked per-slot factors, Punica's BGMV as two
// passes (crates/core/src/lora/segmented.rs is the definition and its host loop `lora_rows`).
//   lora_shrink: shrink[t, j] = Σ_k x̃[t, k] · A[s, j, k], k ascending   (one invocation per (t, j))
//   lora_expand: y[t, o] = y[t, o] + scale[s] · Σ_j shrink[t, j] · B[s, o, j], j ascending
//                                                                      (one invocation per (t, o))
// s = slots[t]; a row whose slot is >= max_loras (NO_SLOT) is left as it is. x̃ is x rounded to
// bf16 (round to nearest even) when `operand` is 1. x f32 [rows, in], A f32 [max_loras,
// max_rank, in], B f32 [max_loras, out, max_rank], shrink f32 [rows, max_rank], y f32 [rows, out].
// Every element's sum runs in one order fixed by the shapes: a row's bits never depend on the
// other rows (batch invariance).
// lora_shrink4 and lora_expand4 are the same sums read four f32 at a time (one vec4 load where
// the others make four scalar ones, which lavapipe runs lane by lane: shaders/README.md), for
// `in` (shrink) and `max_rank` (expand) a multiple of 4; each vec4's components are added one
// after another in k (j) order, so the bits are those of the scalar loops.
// Check: cargo test -p tandem-cli --test cli -- ops_wgpu (the conformance suite's lora cases);
//        cargo test -p tandem-wgpu --test wgpu lora

struct Params {
    rows: u32,
    inp: u32,
    out: u32,
    max_loras: u32,
    max_rank: u32,
    operand: u32, // 0: f32 (no rounding), 1: bf16
}

@group(0) @binding(0) var<uniform> p: Params;

fn round_bf16(v: f32) -> f32 {
    let b = bitcast<u32>(v);
    if ((b & 0x7f800000u) == 0x7f800000u) {
        return v; // inf and NaN as they are
    }
    return bitcast<f32>((b + 0x7fffu + ((b >> 16u) & 1u)) & 0xffff0000u);
}

fn round_bf16_4(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(round_bf16(v.x), round_bf16(v.y), round_bf16(v.z), round_bf16(v.w));
}

@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> a: array<f32>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> shrink: array<f32>;

@compute @workgroup_size(64)
fn lora_shrink(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.rows * p.max_rank) {
        return;
    }
    let t = i / p.max_rank;
    let j = i % p.max_rank;
    let s = slots[t];
    if (s >= p.max_loras) {
        shrink[i] = 0.0;
        return;
    }
    let xb = t * p.inp;
    let ab = (s * p.max_rank + j) * p.inp;
    var acc = 0.0;
    for (var k = 0u; k < p.inp; k++) {
        var xv = x[xb + k];
        if (p.operand == 1u) {
            xv = round_bf16(xv);
        }
        acc = acc + xv * a[ab + k];
    }
    shrink[i] = acc;
}

@group(0) @binding(1) var<storage, read> shrunk: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> scales: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn lora_expand(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.rows * p.out) {
        return;
    }
    let t = i / p.out;
    let o = i % p.out;
    let s = slots[t];
    if (s >= p.max_loras) {
        return;
    }
    let ub = t * p.max_rank;
    let bb = (s * p.out + o) * p.max_rank;
    var acc = 0.0;
    for (var j = 0u; j < p.max_rank; j++) {
        acc = acc + shrunk[ub + j] * b[bb + j];
    }
    y[i] = y[i] + scales[s] * acc;
}

@group(0) @binding(1) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> a4: array<vec4<f32>>;

// lora_shrink with x and A read a vec4 at a time; needs p.inp % 4 == 0.
@compute @workgroup_size(64)
fn lora_shrink4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.rows * p.max_rank) {
        return;
    }
    let t = i / p.max_rank;
    let j = i % p.max_rank;
    let s = slots[t];
    if (s >= p.max_loras) {
        shrink[i] = 0.0;
        return;
    }
    let n4 = p.inp / 4u;
    let xb = t * n4;
    let ab = (s * p.max_rank + j) * n4;
    var acc = 0.0;
    for (var k = 0u; k < n4; k++) {
        var xv = x4[xb + k];
        if (p.operand == 1u) {
            xv = round_bf16_4(xv);
        }
        let av = a4[ab + k];
        acc = acc + xv.x * av.x;
        acc = acc + xv.y * av.y;
        acc = acc + xv.z * av.z;
        acc = acc + xv.w * av.w;
    }
    shrink[i] = acc;
}

@group(0) @binding(1) var<storage, read> shrunk4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> b4: array<vec4<f32>>;

// lora_expand with the shrink row and B read a vec4 at a time; needs p.max_rank % 4 == 0.
@compute @workgroup_size(64)
fn lora_expand4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 64u + li;
    if (i >= p.rows * p.out) {
        return;
    }
    let t = i / p.out;
    let o = i % p.out;
    let s = slots[t];
    if (s >= p.max_loras) {
        return;
    }
    let n4 = p.max_rank / 4u;
    let ub = t * n4;
    let bb = (s * p.out + o) * n4;
    var acc = 0.0;
    for (var j = 0u; j < n4; j++) {
        let uv = shrunk4[ub + j];
        let bv = b4[bb + j];
        acc = acc + uv.x * bv.x;
        acc = acc + uv.y * bv.y;
        acc = acc + uv.z * bv.z;
        acc = acc + uv.w * bv.w;
    }
    y[i] = y[i] + scales[s] * acc;
}
