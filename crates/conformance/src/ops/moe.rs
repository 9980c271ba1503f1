//! A mixture of experts' routing (`moe_route`) and weighted combine (`moe_accumulate`).

use tandem_core::backend::Backend;
use tandem_core::Result;

use super::{limits, poisoned, read_guarded, untouched_f32, upload_f32, upload_guarded, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

/// Router logits to dense routing weights: softmax, top-k, renormalised or not.
pub struct MoeRoute {
    pub rows: usize,
    pub experts: usize,
    pub top_k: usize,
    pub renormalize: bool,
    /// Copy one logit of each row onto another expert: equal probabilities, where the lower
    /// index must win.
    pub ties: bool,
}

impl Op for MoeRoute {
    type Inputs = Vec<f32>; // logits [rows, experts]
    const NAME: &'static str = "moe_route";
    fn params(&self) -> String {
        format!("rows={} experts={} top_k={} renormalize={} ties={}", self.rows, self.experts, self.top_k, self.renormalize, if self.ties { "yes" } else { "no" })
    }
    fn limit(&self) -> f64 {
        limits::F32
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.experts) as f64;
        Cost { bytes: 8.0 * n, flops: n * (2.0 + self.top_k as f64) }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let mut l = rng.normals(self.rows * self.experts, 1.5);
        if self.ties && self.experts > 1 {
            for row in l.chunks_exact_mut(self.experts) {
                let (a, b) = (rng.below(self.experts), rng.below(self.experts));
                let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                // The row's best logit twice: the tie decides the first pick.
                row[a] = top;
                row[b] = top;
            }
        }
        l
    }
    fn exec<B: Backend>(&self, b: &B, host: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let logits = upload_f32(b, host)?;
        let n = self.rows * self.experts;
        let mut out = poisoned(b, n)?;
        launch.run(b, || b.moe_route(&logits, &mut out, self.rows, self.experts, self.top_k, self.renormalize))?;
        untouched_f32(b, &logits, host, "logits")?;
        Ok(vec![Output::f32("weights", read_guarded(b, &out, n, "weights")?)])
    }
}

/// One expert's output scaled by its routing weight, written (expert 0) or added.
pub struct MoeAccumulate {
    pub rows: usize,
    pub dim: usize,
    pub expert: usize,
    pub experts: usize,
    pub first: bool,
}

impl Op for MoeAccumulate {
    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>); // acc [rows, dim], y [rows, dim], weights [rows, experts]
    const NAME: &'static str = "moe_accumulate";
    fn params(&self) -> String {
        format!("rows={} dim={} expert={} experts={} first={}", self.rows, self.dim, self.expert, self.experts, self.first)
    }
    fn limit(&self) -> f64 {
        limits::F32
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.dim) as f64;
        Cost { bytes: 12.0 * n, flops: 2.0 * n }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        // Routing weights as routing leaves them: most 0, the rest in (0, 1].
        let w = (0..self.rows * self.experts).map(|_| if rng.below(3) == 0 { rng.uniform(0.0, 1.0) } else { 0.0 }).collect();
        (rng.normals(self.rows * self.dim, 1.0), rng.normals(self.rows * self.dim, 1.0), w)
    }
    fn exec<B: Backend>(&self, b: &B, (host_acc, host_y, host_w): &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let n = self.rows * self.dim;
        // With `first` the accumulator's old values must not matter: start it poisoned.
        let mut acc = if self.first { poisoned(b, n)? } else { upload_guarded(b, host_acc)? };
        let y = upload_f32(b, host_y)?;
        let w = upload_f32(b, host_w)?;
        launch.run(b, || b.moe_accumulate(&mut acc, &y, &w, self.rows, self.dim, self.expert, self.experts, self.first))?;
        untouched_f32(b, &y, host_y, "y")?;
        untouched_f32(b, &w, host_w, "weights")?;
        Ok(vec![Output::f32("acc", read_guarded(b, &acc, n, "acc")?)])
    }
}
