//! A mixture of experts' routing (`moe_route`), weighted combine (`moe_accumulate`), and the
//! routed path (`moe_routed`) against the every-expert one.

use tandem_core::backend::{Backend, MoeExpert};
use tandem_core::weights::Weights;
use tandem_core::{DType, Result};

use super::{limits, poisoned, read_guarded, round_to, untouched_f32, upload_f32, upload_guarded, Cost, Launch, Op};
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
        format!(
            "rows={} experts={} top_k={} renormalize={} ties={}",
            self.rows,
            self.experts,
            self.top_k,
            self.renormalize,
            if self.ties { "yes" } else { "no" }
        )
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
        format!(
            "rows={} dim={} expert={} experts={} first={}",
            self.rows, self.dim, self.expert, self.experts, self.first
        )
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
        let w = (0..self.rows * self.experts)
            .map(|_| if rng.below(3) == 0 { rng.uniform(0.0, 1.0) } else { 0.0 })
            .collect();
        (rng.normals(self.rows * self.dim, 1.0), rng.normals(self.rows * self.dim, 1.0), w)
    }
    fn exec<B: Backend>(
        &self,
        b: &B,
        (host_acc, host_y, host_w): &Self::Inputs,
        launch: &mut Launch,
    ) -> Result<Vec<Output>> {
        let n = self.rows * self.dim;
        // With `first` the accumulator's old values must not matter: start it poisoned.
        let mut acc = if self.first { poisoned(b, n)? } else { upload_guarded(b, host_acc)? };
        let y = upload_f32(b, host_y)?;
        let w = upload_f32(b, host_w)?;
        launch.run(b, || {
            b.moe_accumulate(&mut acc, &y, &w, self.rows, self.dim, self.expert, self.experts, self.first)
        })?;
        untouched_f32(b, &y, host_y, "y")?;
        untouched_f32(b, &w, host_w, "weights")?;
        Ok(vec![Output::f32("acc", read_guarded(b, &acc, n, "acc")?)])
    }
}

/// The routed mixture of experts (`moe_prepare` + `moe_routed`: CUDA runs each expert over the
/// tokens routed to it) against the every-expert path on the same backend (`layers::Moe`'s:
/// the gate/up projection with silu, down, `moe_accumulate` per expert in ascending id), which
/// the routed one must match bit for bit but for the sign of an exact zero; the output is also
/// compared with the reference's every-expert path. A backend whose `moe_prepare` gives no table
/// has no routed path: the case is skipped there, with the reason on its line and in the count.
pub struct MoeRouted {
    pub dtype: DType,
    pub rows: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub inter: usize,
    pub renormalize: bool,
}

pub struct MoeRoutedInputs {
    x: Vec<f32>,       // [rows, hidden]
    weights: Vec<f32>, // [rows, experts], moe_route's
    gate: Vec<f32>,    // [experts, inter, hidden]
    up: Vec<f32>,      // [experts, inter, hidden]
    down: Vec<f32>,    // [experts, hidden, inter]
}

/// An expert's gate/up weight as `Loader::mlp` keeps it: fused where the backend fuses.
enum GateUp<Buf> {
    Fused(Buf),
    Split(Buf, Buf),
}

impl Op for MoeRouted {
    type Inputs = MoeRoutedInputs;
    const NAME: &'static str = "moe_routed";
    fn params(&self) -> String {
        format!(
            "w={} rows={} experts={} top_k={} hidden={} inter={} renormalize={}",
            self.dtype.name(),
            self.rows,
            self.experts,
            self.top_k,
            self.hidden,
            self.inter,
            self.renormalize
        )
    }
    /// Four times a single GEMM's: a backend that rounds activations to the weight type rounds
    /// x into gate/up (1 + limits::SILU_GAIN roundings' worth in act, as in
    /// residual_norm_gate_up) and act into down (1 more): 3.1 in each expert's output, and a
    /// token's sum of top_k such outputs keeps that NMSE; 4 leaves some more for few rows.
    fn limit(&self) -> f64 {
        4.0 * limits::weight(self.dtype)
    }
    fn cost(&self) -> Cost {
        let (m, d, i, k) =
            (self.rows as f64, self.hidden as f64, self.inter as f64, self.top_k.min(self.experts) as f64);
        let used = (self.rows * self.top_k).min(self.experts) as f64;
        Cost {
            bytes: used * 3.0 * d * i * self.dtype.size() as f64 + 4.0 * m * (2.0 * d + self.experts as f64),
            flops: 2.0 * m * k * 3.0 * d * i,
        }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let (e, d, i) = (self.experts, self.hidden, self.inter);
        let logits = rng.normals(self.rows * e, 1.5);
        let mut weights = vec![0.0; self.rows * e];
        tandem_core::backend::moe_route_rows(&logits, &mut weights, e, self.top_k, self.renormalize);
        let (sd, si) = (1.0 / (d as f32).sqrt(), 1.0 / (i as f32).sqrt());
        MoeRoutedInputs {
            x: rng.normals(self.rows * d, 1.0),
            weights,
            gate: round_to(self.dtype, rng.normals(e * i * d, sd)),
            up: round_to(self.dtype, rng.normals(e * i * d, sd)),
            down: round_to(self.dtype, rng.normals(e * d * i, si)),
        }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (m, ne, d, i) = (self.rows, self.experts, self.hidden, self.inter);
        let mut ws = Weights::empty();
        let mut mlps = Vec::with_capacity(ne);
        for e in 0..ne {
            let (gi, di) = (e * i * d..(e + 1) * i * d, e * d * i..(e + 1) * d * i);
            ws.replace("gate", self.dtype, &[i, d], &x.gate[gi.clone()])?;
            ws.replace("up", self.dtype, &[i, d], &x.up[gi])?;
            ws.replace("down", self.dtype, &[d, i], &x.down[di])?;
            let (gv, uv, dv) = (ws.get("gate", &[i, d])?, ws.get("up", &[i, d])?, ws.get("down", &[d, i])?);
            let gu = match b.fuse_gate_up(&gv, &uv)? {
                Some(w) => GateUp::Fused(w),
                None => GateUp::Split(b.upload_weight(&gv)?, b.upload_weight(&uv)?),
            };
            mlps.push((gu, b.upload_weight(&dv)?));
        }
        let refs: Vec<MoeExpert<'_, B::Buf>> = mlps
            .iter()
            .map(|(gu, down)| match gu {
                GateUp::Fused(w) => MoeExpert { gate: w, up: None, down },
                GateUp::Split(g, u) => MoeExpert { gate: g, up: Some(u), down },
            })
            .collect();
        let xb = upload_f32(b, &x.x)?;
        let wb = upload_f32(b, &x.weights)?;
        // The every-expert path, as layers::Moe::forward runs it without a table.
        let dense = || -> Result<Vec<f32>> {
            let mut out = poisoned(b, m * d)?;
            let (mut g, mut u, mut act, mut y) =
                (poisoned(b, m * i)?, poisoned(b, m * i)?, poisoned(b, m * i)?, poisoned(b, m * d)?);
            for (e, (gu, down)) in mlps.iter().enumerate() {
                match gu {
                    GateUp::Fused(w) => {
                        b.gate_up_act(tandem_core::config::Activation::Silu, &xb, w, &mut act, m, i, d, None)?
                    }
                    GateUp::Split(wg, wu) => {
                        b.matmul(&xb, wg, None, &mut g, m, i, d)?;
                        b.matmul(&xb, wu, None, &mut u, m, i, d)?;
                        b.silu_mul(&g, &u, &mut act, m * i)?;
                    }
                }
                b.matmul(&act, down, None, &mut y, m, d, i)?;
                b.moe_accumulate(&mut out, &y, &wb, m, d, e, ne, e == 0)?;
            }
            read_guarded(b, &out, m * d, "out (every expert)")
        };
        let Some(table) = b.moe_prepare(&refs, d, i)? else {
            launch.skip(format!(
                "{} has no routed path (moe_prepare gave no table: every expert runs over every token)",
                b.name()
            ));
            return Ok(vec![Output::f32("out", dense()?)]);
        };
        let mut out = poisoned(b, m * d)?;
        launch.run(b, || b.moe_routed(&table, &refs, &xb, &wb, &mut out, m, d, i, self.top_k))?;
        let routed = read_guarded(b, &out, m * d, "out")?;
        untouched_f32(b, &xb, &x.x, "x")?;
        untouched_f32(b, &wb, &x.weights, "weights")?;
        let every = dense()?;
        // Bitwise, but an exact zero may differ in sign (routed skips the 0-weight terms).
        if let Some(j) =
            (0..m * d).find(|&j| routed[j].to_bits() != every[j].to_bits() && !(routed[j] == 0.0 && every[j] == 0.0))
        {
            let n = (0..m * d)
                .filter(|&j| routed[j].to_bits() != every[j].to_bits() && !(routed[j] == 0.0 && every[j] == 0.0))
                .count();
            return Err(tandem_core::Error::backend(
                b.name(),
                format!("moe_routed: {n} of {} values differ from the every-expert path's bits, first at [{j}] (token {}): {} against {}", m * d, j / d, routed[j], every[j]),
            ));
        }
        Ok(vec![Output::f32("out", routed)])
    }
}
