//! Rotary embedding in place on q and k (HF "rotate half": dimension i pairs with i + head_dim/2).

use tandem_core::backend::Backend;
use tandem_core::Result;

use super::{
    limits, read_guarded, untouched_f32, untouched_u32, upload_f32, upload_guarded, upload_u32, Cost, Launch, Op,
};
use crate::compare::Output;
use crate::rng::Rng;

pub struct Rope {
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub theta: f32,
    /// Positions are drawn from `0..max_pos`, not in order: a backend must read each token's own.
    pub max_pos: usize,
}

pub struct RopeInputs {
    q: Vec<f32>,         // [T, q_heads, head_dim]
    k: Vec<f32>,         // [T, kv_heads, head_dim]
    positions: Vec<u32>, // [T]
    inv_freq: Vec<f32>,  // [head_dim/2]
}

impl Op for Rope {
    type Inputs = RopeInputs;
    const NAME: &'static str = "rope";
    fn params(&self) -> String {
        format!(
            "T={} q_heads={} kv_heads={} (gqa {}) head_dim={} theta={} max_pos={}",
            self.tokens,
            self.q_heads,
            self.kv_heads,
            self.q_heads / self.kv_heads.max(1),
            self.head_dim,
            self.theta,
            self.max_pos
        )
    }
    fn limit(&self) -> f64 {
        limits::ROPE
    }
    fn cost(&self) -> Cost {
        let n = (self.tokens * (self.q_heads + self.kv_heads) * self.head_dim) as f64;
        Cost { bytes: 8.0 * n, flops: 3.0 * n }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let half = self.head_dim / 2;
        // The model's own formula: theta^(-2i/head_dim), computed in f64 then stored as f32.
        let inv_freq =
            (0..half).map(|i| (self.theta as f64).powf(-2.0 * i as f64 / self.head_dim as f64) as f32).collect();
        let mut positions: Vec<u32> = (0..self.tokens).map(|_| rng.below(self.max_pos) as u32).collect();
        // Position 0 (identity rotation) and the largest one are both worth seeing.
        if self.tokens >= 2 {
            positions[0] = 0;
            positions[self.tokens - 1] = self.max_pos as u32 - 1;
        }
        RopeInputs {
            q: rng.normals(self.tokens * self.q_heads * self.head_dim, 1.0),
            k: rng.normals(self.tokens * self.kv_heads * self.head_dim, 1.0),
            positions,
            inv_freq,
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let mut q = upload_guarded(b, &x.q)?;
        let mut k = upload_guarded(b, &x.k)?;
        let positions = upload_u32(b, &x.positions)?;
        let inv_freq = upload_f32(b, &x.inv_freq)?;
        let (t, qh, kh, hd) = (self.tokens, self.q_heads, self.kv_heads, self.head_dim);
        launch.run(b, || b.rope(&mut q, &mut k, &positions, &inv_freq, t, qh, kh, hd))?;
        untouched_u32(b, &positions, &x.positions, "positions")?;
        untouched_f32(b, &inv_freq, &x.inv_freq, "inv_freq")?;
        Ok(vec![
            Output::f32("q", read_guarded(b, &q, x.q.len(), "q")?),
            Output::f32("k", read_guarded(b, &k, x.k.len(), "k")?),
        ])
    }
}
