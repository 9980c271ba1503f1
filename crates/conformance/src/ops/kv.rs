//! kv_write: K and V rows into the paged cache at scattered slots, compared through read_kv.
//!
//! The cache starts full of random "old" values (written through kv_write itself, the only way
//! in), then the target slots are poisoned with NaN, then the op under test runs. The written
//! slots must hold the new values and every other slot must still hold its old value.

use tandem_core::backend::{Backend, KvGeometry};
use tandem_core::{Error, Result};

use super::{limits, untouched_f32, untouched_u32, upload_f32, upload_u32, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

/// Both caches of one layer with every slot written: `k`, `v` are `[slots, kv_heads, head_dim]`.
pub(crate) fn filled_cache<B: Backend>(b: &B, g: KvGeometry, k: &[f32], v: &[f32]) -> Result<(B::Buf, B::Buf)> {
    let mut kc = b.alloc_kv(g)?;
    let mut vc = b.alloc_kv(g)?;
    let all: Vec<u32> = (0..g.slots() as u32).collect();
    let (kb, vb, slots) = (upload_f32(b, k)?, upload_f32(b, v)?, upload_u32(b, &all)?);
    b.kv_write(&kb, &vb, &mut kc, &mut vc, &slots, g.slots(), g)?;
    Ok((kc, vc))
}

/// Reads one cache and checks its length, so that a short read is an error, not a panic.
pub(crate) fn read_cache<B: Backend>(b: &B, buf: &B::Buf, g: KvGeometry, what: &str) -> Result<Vec<f32>> {
    let v = b.read_kv(buf, g)?;
    if v.len() != g.layer_elems() {
        return Err(Error::backend(
            b.name(),
            format!("read_kv({what}) gave {} values, want {}", v.len(), g.layer_elems()),
        ));
    }
    Ok(v)
}

pub(crate) fn geometry_params(g: &KvGeometry) -> String {
    format!("blocks={} block_size={} kv_heads={} head_dim={}", g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim)
}

pub struct KvWrite {
    pub geometry: KvGeometry,
    pub tokens: usize,
}

pub struct KvInputs {
    old_k: Vec<f32>, // [slots, kv_heads, head_dim]
    old_v: Vec<f32>,
    k: Vec<f32>, // [T, kv_heads, head_dim]
    v: Vec<f32>,
    slots: Vec<u32>, // [T], distinct, scattered
}

impl Op for KvWrite {
    type Inputs = KvInputs;
    const NAME: &'static str = "kv_write";
    fn params(&self) -> String {
        format!("{} T={}", geometry_params(&self.geometry), self.tokens)
    }
    fn limit(&self) -> f64 {
        limits::KV
    }
    fn cost(&self) -> Cost {
        let row = (self.geometry.num_kv_heads * self.geometry.head_dim) as f64;
        Cost { bytes: 2.0 * 2.0 * 4.0 * row * self.tokens as f64, flops: 0.0 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let g = self.geometry;
        let row = g.num_kv_heads * g.head_dim;
        // Distinct slots: two tokens writing one slot would make the result order-dependent.
        let slots = rng.permutation(g.slots())[..self.tokens.min(g.slots())].iter().map(|&s| s as u32).collect();
        KvInputs {
            old_k: rng.normals(g.slots() * row, 1.0),
            old_v: rng.normals(g.slots() * row, 1.0),
            k: rng.normals(self.tokens * row, 1.0),
            v: rng.normals(self.tokens * row, 1.0),
            slots,
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (g, t) = (self.geometry, self.tokens);
        let row = g.num_kv_heads * g.head_dim;
        let (mut kc, mut vc) = filled_cache(b, g, &x.old_k, &x.old_v)?;
        let slots = upload_u32(b, &x.slots)?;
        let nan = upload_f32(b, &vec![f32::NAN; t * row])?;
        b.kv_write(&nan, &nan, &mut kc, &mut vc, &slots, t, g)?;
        let (k, v) = (upload_f32(b, &x.k)?, upload_f32(b, &x.v)?);
        launch.run(b, || b.kv_write(&k, &v, &mut kc, &mut vc, &slots, t, g))?;
        untouched_f32(b, &k, &x.k, "k")?;
        untouched_f32(b, &v, &x.v, "v")?;
        untouched_u32(b, &slots, &x.slots, "slots")?;

        let mut written = vec![false; g.slots()];
        for &s in &x.slots {
            written[s as usize] = true;
        }
        let mut out = vec![];
        for (name_at, name_rest, cache) in
            [("k_cache[slots]", "k_cache[other]", &kc), ("v_cache[slots]", "v_cache[other]", &vc)]
        {
            let c = read_cache(b, cache, g, name_at)?; // [slots, row]
                                                       // Written rows in token order, so that element i of token t lines up on both sides.
            let at: Vec<f32> = x.slots.iter().flat_map(|&s| c[s as usize * row..][..row].iter().copied()).collect();
            let rest: Vec<f32> =
                (0..g.slots()).filter(|&s| !written[s]).flat_map(|s| c[s * row..][..row].iter().copied()).collect();
            out.push(Output::f32(name_at, at));
            out.push(Output::f32(name_rest, rest));
        }
        Ok(out)
    }
}
