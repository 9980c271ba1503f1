//! The fused attention-input ops, against the same work done by the plain ops on the reference:
//! `rope_kv_write` (rope, then K and V into the paged cache) and `qkv_rope_kv_write` (the q/k/v
//! projection, rope and the cache write). A backend that does not fuse runs the trait's
//! defaults, so on the reference these cases check the defaults against themselves; on wgpu
//! they check its fused kernels (one dispatch, or the projection's epilogue) against the CPU.
//!
//! The cache starts full of old values; the outputs are q, the written slots and every other
//! slot (which must keep its old value).

use tandem_core::backend::{Backend, KvDest, KvGeometry};
use tandem_core::weights::Weights;
use tandem_core::{DType, Result};

use super::kv::{filled_cache, geometry_params, read_cache};
use super::{limits, poisoned, read_guarded, round_to, untouched_u32, upload_f32, upload_u32, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

/// Inputs shared by both ops: the rope angles, the cache and where the tokens go.
pub struct CacheInputs {
    positions: Vec<u32>, // [T]
    inv_freq: Vec<f32>,  // [head_dim / 2]
    slots: Vec<u32>,     // [T], distinct
    old_k: Vec<f32>,     // [slots, kv_heads, head_dim]
    old_v: Vec<f32>,
}

fn cache_inputs(rng: &mut Rng, g: KvGeometry, tokens: usize, max_pos: usize) -> CacheInputs {
    let row = g.num_kv_heads * g.head_dim;
    let half = g.head_dim / 2;
    CacheInputs {
        positions: (0..tokens).map(|_| rng.below(max_pos) as u32).collect(),
        inv_freq: (0..half).map(|i| 10_000f64.powf(-2.0 * i as f64 / g.head_dim as f64) as f32).collect(),
        slots: rng.permutation(g.slots())[..tokens.min(g.slots())].iter().map(|&s| s as u32).collect(),
        old_k: rng.normals(g.slots() * row, 1.0),
        old_v: rng.normals(g.slots() * row, 1.0),
    }
}

/// q, then each cache split into the written slots (in token order) and the others.
fn cache_outputs<B: Backend>(
    b: &B,
    g: KvGeometry,
    q: &B::Buf,
    q_len: usize,
    kc: &B::Buf,
    vc: &B::Buf,
    slots: &[u32],
) -> Result<Vec<Output>> {
    let row = g.num_kv_heads * g.head_dim;
    let mut written = vec![false; g.slots()];
    for &s in slots {
        written[s as usize] = true;
    }
    let mut out = vec![Output::f32("q", read_guarded(b, q, q_len, "q")?)];
    for (name_at, name_rest, cache) in
        [("k_cache[slots]", "k_cache[other]", kc), ("v_cache[slots]", "v_cache[other]", vc)]
    {
        let c = read_cache(b, cache, g, name_at)?;
        out.push(Output::f32(
            name_at,
            slots.iter().flat_map(|&s| c[s as usize * row..][..row].iter().copied()).collect(),
        ));
        out.push(Output::f32(
            name_rest,
            (0..g.slots()).filter(|&s| !written[s]).flat_map(|s| c[s * row..][..row].iter().copied()).collect(),
        ));
    }
    Ok(out)
}

pub struct RopeKvWrite {
    pub geometry: KvGeometry,
    pub q_heads: usize,
    pub tokens: usize,
    pub max_pos: usize,
}

pub struct RopeKvInputs {
    q: Vec<f32>, // [T, q_heads, head_dim]
    k: Vec<f32>, // [T, kv_heads, head_dim]
    v: Vec<f32>,
    cache: CacheInputs,
}

impl Op for RopeKvWrite {
    type Inputs = RopeKvInputs;
    const NAME: &'static str = "rope_kv_write";
    fn params(&self) -> String {
        format!(
            "{} q_heads={} T={} max_pos={}",
            geometry_params(&self.geometry),
            self.q_heads,
            self.tokens,
            self.max_pos
        )
    }
    fn limit(&self) -> f64 {
        // The cache dtype is the backend's choice (a bf16 cache is honest): the KV limit,
        // above rope's own.
        limits::KV.max(limits::ROPE)
    }
    fn cost(&self) -> Cost {
        let g = self.geometry;
        let n = (self.tokens * (self.q_heads + 2 * g.num_kv_heads) * g.head_dim) as f64;
        Cost { bytes: 8.0 * n, flops: 3.0 * n }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let g = self.geometry;
        let row = g.num_kv_heads * g.head_dim;
        RopeKvInputs {
            q: rng.normals(self.tokens * self.q_heads * g.head_dim, 1.0),
            k: rng.normals(self.tokens * row, 1.0),
            v: rng.normals(self.tokens * row, 1.0),
            cache: cache_inputs(rng, g, self.tokens, self.max_pos),
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (g, t) = (self.geometry, self.tokens);
        let c = &x.cache;
        let (mut kc, mut vc) = filled_cache(b, g, None, &c.old_k, &c.old_v)?;
        let (mut k, v) = (upload_f32(b, &x.k)?, upload_f32(b, &x.v)?);
        let (positions, inv_freq, slots) =
            (upload_u32(b, &c.positions)?, upload_f32(b, &c.inv_freq)?, upload_u32(b, &c.slots)?);
        // In place on q: every launch rotates it again (perf mode discards the outputs).
        let mut q = super::upload_guarded(b, &x.q)?;
        launch.run(b, || {
            b.rope_kv_write(&mut q, &mut k, &v, &mut kc, &mut vc, &positions, &inv_freq, &slots, t, self.q_heads, g)
        })?;
        untouched_u32(b, &slots, &c.slots, "slots")?;
        cache_outputs(b, g, &q, x.q.len(), &kc, &vc, &c.slots)
    }
}

pub struct QkvRopeKvWrite {
    pub dtype: DType,
    pub geometry: KvGeometry,
    pub q_heads: usize,
    pub hidden: usize,
    pub tokens: usize,
    pub bias: bool,
}

pub struct QkvInputs {
    x: Vec<f32>,                 // [T, hidden]
    w: [Vec<f32>; 3],            // q [nq, hidden], k and v [nkv, hidden], rounded to dtype
    bias: Option<[Vec<f32>; 3]>, // f32
    cache: CacheInputs,
}

impl QkvRopeKvWrite {
    fn dims(&self) -> (usize, usize) {
        (self.q_heads * self.geometry.head_dim, self.geometry.num_kv_heads * self.geometry.head_dim)
    }
}

impl Op for QkvRopeKvWrite {
    type Inputs = QkvInputs;
    const NAME: &'static str = "qkv_rope_kv_write";
    fn params(&self) -> String {
        format!(
            "w={} {} q_heads={} hidden={} T={} bias={}",
            self.dtype.name(),
            geometry_params(&self.geometry),
            self.q_heads,
            self.hidden,
            self.tokens,
            if self.bias { "yes" } else { "no" }
        )
    }
    fn limit(&self) -> f64 {
        limits::weight(self.dtype).max(limits::KV)
    }
    fn cost(&self) -> Cost {
        let (nq, nkv) = self.dims();
        let n = (nq + 2 * nkv) as f64;
        Cost {
            bytes: n * self.hidden as f64 * self.dtype.size() as f64,
            flops: 2.0 * n * (self.hidden * self.tokens) as f64,
        }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let (nq, nkv) = self.dims();
        let h = self.hidden;
        let scale = 1.0 / (h as f32).sqrt();
        let w = [nq, nkv, nkv].map(|rows| round_to(self.dtype, rng.normals(rows * h, scale)));
        QkvInputs {
            x: rng.normals(self.tokens * h, 1.0),
            w,
            bias: self.bias.then(|| [nq, nkv, nkv].map(|rows| rng.normals(rows, 0.5))),
            cache: cache_inputs(rng, self.geometry, self.tokens, 4096),
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (g, t, h) = (self.geometry, self.tokens, self.hidden);
        let (nq, nkv) = self.dims();
        let c = &x.cache;
        // The parts as a checkpoint holds them; the backend fuses them if it can.
        let mut ws = Weights::empty();
        for (i, (name, rows)) in [("q", nq), ("k", nkv), ("v", nkv)].into_iter().enumerate() {
            ws.replace(name, self.dtype, &[rows, h], &x.w[i])?;
            if let Some(bias) = &x.bias {
                ws.replace(&format!("{name}.bias"), DType::F32, &[rows], &bias[i])?;
            }
        }
        let (qv, kv, vv) = (ws.get("q", &[nq, h])?, ws.get("k", &[nkv, h])?, ws.get("v", &[nkv, h])?);
        let biases = match x.bias {
            Some(_) => Some([ws.get("q.bias", &[nq])?, ws.get("k.bias", &[nkv])?, ws.get("v.bias", &[nkv])?]),
            None => None,
        };
        // Fused where the backend fuses (one weight, one op); else the three parts and the plain ops.
        enum Proj<Buf> {
            Fused(Buf, Option<Buf>),
            Parts([Buf; 3], Option<[Buf; 3]>),
        }
        let proj = match b.fuse_qkv(&qv, &kv, &vv, biases.as_ref().map(|[bq, bk, bv]| [bq, bk, bv]))? {
            Some((w, wb)) => Proj::Fused(w, wb),
            None => {
                let up = |t: &tandem_core::weights::TensorView| b.upload_weight(t);
                let bias = match &biases {
                    Some([bq, bk, bv]) => Some([up(bq)?, up(bk)?, up(bv)?]),
                    None => None,
                };
                Proj::Parts([up(&qv)?, up(&kv)?, up(&vv)?], bias)
            }
        };
        let (mut kc, mut vc) = filled_cache(b, g, None, &c.old_k, &c.old_v)?;
        let xb = upload_f32(b, &x.x)?;
        let (positions, inv_freq, slots) =
            (upload_u32(b, &c.positions)?, upload_f32(b, &c.inv_freq)?, upload_u32(b, &c.slots)?);
        let (mut q, mut k, mut v) = (poisoned(b, t * nq)?, poisoned(b, t * nkv)?, poisoned(b, t * nkv)?);
        launch.run(b, || {
            match &proj {
                Proj::Fused(w, wb) => {
                    let kv = KvDest {
                        k_cache: &mut kc,
                        v_cache: &mut vc,
                        positions: &positions,
                        inv_freq: &inv_freq,
                        slots: &slots,
                        geometry: g,
                    };
                    b.qkv_rope_kv_write(&xb, w, wb.as_ref(), &mut q, &mut k, &mut v, t, nq, h, None, kv)?;
                }
                Proj::Parts(w, wb) => {
                    let bias = |i: usize| wb.as_ref().map(|bs| &bs[i]);
                    b.matmul(&xb, &w[0], bias(0), &mut q, t, nq, h)?;
                    b.matmul(&xb, &w[1], bias(1), &mut k, t, nkv, h)?;
                    b.matmul(&xb, &w[2], bias(2), &mut v, t, nkv, h)?;
                    b.rope_kv_write(
                        &mut q,
                        &mut k,
                        &v,
                        &mut kc,
                        &mut vc,
                        &positions,
                        &inv_freq,
                        &slots,
                        t,
                        self.q_heads,
                        g,
                    )?;
                }
            }
            Ok(())
        })?;
        untouched_u32(b, &slots, &c.slots, "slots")?;
        cache_outputs(b, g, &q, t * nq, &kc, &vc, &c.slots)
    }
}
