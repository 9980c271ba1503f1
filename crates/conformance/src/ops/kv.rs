//! kv_write: K and V rows into the paged cache at scattered slots, compared through read_kv.
//!
//! The cache starts full of random "old" values (written through kv_write itself, the only way
//! in), then the target slots are poisoned with NaN, then the op under test runs. The written
//! slots must hold the new values and every other slot must still hold its old value.

use tandem_core::backend::{Backend, KvDtype, KvGeometry};
use tandem_core::{Error, Result};

use super::{limits, untouched_f32, untouched_u32, upload_f32, upload_u32, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

/// Both caches of one layer with every slot written: `k`, `v` are `[slots, kv_heads, head_dim]`;
/// in `dtype` (`None`: the backend's default, `alloc_kv`).
pub(crate) fn filled_cache<B: Backend>(
    b: &B,
    g: KvGeometry,
    dtype: Option<KvDtype>,
    k: &[f32],
    v: &[f32],
) -> Result<(B::Buf, B::Buf)> {
    let alloc = || match dtype {
        Some(d) => b.alloc_kv_as(g, d),
        None => b.alloc_kv(g),
    };
    let (mut kc, mut vc) = (alloc()?, alloc()?);
    let all: Vec<u32> = (0..g.slots() as u32).collect();
    let (kb, vb, slots) = (upload_f32(b, k)?, upload_f32(b, v)?, upload_u32(b, &all)?);
    b.kv_write(&kb, &vb, &mut kc, &mut vc, &slots, g.slots(), g)?;
    Ok((kc, vc))
}

/// Why a case whose cache is `dtype` cannot run on `b` (a type it does not store), if so.
pub(crate) fn kv_unsupported<B: Backend>(b: &B, dtype: Option<KvDtype>) -> Option<String> {
    let d = dtype?;
    (!b.kv_dtypes().contains(&d)).then(|| format!("{} stores no {} KV cache", b.name(), d.name()))
}

/// ` kv=<dtype>` for a case with a cache type of its own (nothing for the default, so that
/// the default cases keep their labels and seeds).
pub(crate) fn kv_param(dtype: Option<KvDtype>) -> String {
    dtype.map_or(String::new(), |d| format!(" kv={}", d.name()))
}

/// What a case reads of one cache: its values at `slots` (in token order) and at every other
/// slot, compared by NMSE (and poison); for an fp8 cache also the whole cache's bits, compared
/// exactly (every backend rounds as `tandem_core::fp8_round` does).
pub(crate) fn cache_outputs(
    names: [&'static str; 3],
    dtype: Option<KvDtype>,
    c: &[f32],
    g: KvGeometry,
    slots: &[u32],
) -> Vec<Output> {
    let row = g.num_kv_heads * g.head_dim;
    let mut written = vec![false; g.slots()];
    for &s in slots {
        written[s as usize] = true;
    }
    let at: Vec<f32> = slots.iter().flat_map(|&s| c[s as usize * row..][..row].iter().copied()).collect();
    let rest: Vec<f32> =
        (0..g.slots()).filter(|&s| !written[s]).flat_map(|s| c[s * row..][..row].iter().copied()).collect();
    let mut out = vec![Output::f32(names[0], at), Output::f32(names[1], rest)];
    if dtype.and_then(KvDtype::fp8).is_some() {
        out.push(Output::u32(names[2], c.iter().map(|x| x.to_bits()).collect()));
    }
    out
}

/// `n` values to write into an fp8 cache: normals, with every fourth element replaced by a
/// value that tests the rounding: an exact midpoint between neighbouring fp8 values (a tie), a
/// value past the largest finite one (saturation, infinity included), or one below the
/// smallest normal (subnormals).
pub(crate) fn fp8_inputs(rng: &mut Rng, dtype: KvDtype, n: usize) -> Vec<f32> {
    let mut v = rng.normals(n, 1.0);
    let Some(f) = dtype.fp8() else { return v };
    let max_byte = f.table().iter().take(0x80).rposition(|x| x.is_finite()).unwrap_or(0) as u8;
    for (i, x) in v.iter_mut().enumerate().filter(|(i, _)| i % 4 == 0) {
        let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
        *x = sign
            * match (i / 4) % 3 {
                0 => {
                    let b = rng.below(max_byte as usize) as u8;
                    (f.decode(b) + f.decode(b + 1)) / 2.0
                }
                1 => [f.decode(max_byte) * 1.01, 1e6, f32::INFINITY][rng.below(3)],
                _ => f.decode(1) * (rng.below(17) as f32 / 4.0),
            };
    }
    v
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
    /// The cache's element type; `None`: the backend's default.
    pub kv_dtype: Option<KvDtype>,
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
        format!("{} T={}{}", geometry_params(&self.geometry), self.tokens, kv_param(self.kv_dtype))
    }
    fn limit(&self) -> f64 {
        // An fp8 cache's bits are compared exactly as well (cache_outputs).
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
        match self.kv_dtype {
            Some(d) if d.fp8().is_some() => KvInputs {
                old_k: fp8_inputs(rng, d, g.slots() * row),
                old_v: fp8_inputs(rng, d, g.slots() * row),
                k: fp8_inputs(rng, d, self.tokens * row),
                v: fp8_inputs(rng, d, self.tokens * row),
                slots,
            },
            _ => KvInputs {
                old_k: rng.normals(g.slots() * row, 1.0),
                old_v: rng.normals(g.slots() * row, 1.0),
                k: rng.normals(self.tokens * row, 1.0),
                v: rng.normals(self.tokens * row, 1.0),
                slots,
            },
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (g, t) = (self.geometry, self.tokens);
        let row = g.num_kv_heads * g.head_dim;
        if let Some(why) = kv_unsupported(b, self.kv_dtype) {
            launch.skip(why);
            return Ok(vec![]);
        }
        let (mut kc, mut vc) = filled_cache(b, g, self.kv_dtype, &x.old_k, &x.old_v)?;
        let slots = upload_u32(b, &x.slots)?;
        let nan = upload_f32(b, &vec![f32::NAN; t * row])?;
        b.kv_write(&nan, &nan, &mut kc, &mut vc, &slots, t, g)?;
        let (k, v) = (upload_f32(b, &x.k)?, upload_f32(b, &x.v)?);
        launch.run(b, || b.kv_write(&k, &v, &mut kc, &mut vc, &slots, t, g))?;
        untouched_f32(b, &k, &x.k, "k")?;
        untouched_f32(b, &v, &x.v, "v")?;
        untouched_u32(b, &slots, &x.slots, "slots")?;

        let mut out = vec![];
        for (names, cache) in [
            (["k_cache[slots]", "k_cache[other]", "k_cache bits"], &kc),
            (["v_cache[slots]", "v_cache[other]", "v_cache bits"], &vc),
        ] {
            let c = read_cache(b, cache, g, names[0])?; // [slots, row]
            out.extend(cache_outputs(names, self.kv_dtype, &c, g, &x.slots));
        }
        Ok(out)
    }
}
