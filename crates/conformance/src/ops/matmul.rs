//! `out[m, n] = Σ_k x[m, k] · w[n, k] (+ bias[n])` at decode (m small) and prefill shapes.

use tandem_core::backend::Backend;
use tandem_core::{DType, Result};

use super::{limits, poisoned, read_guarded, round_to, untouched_f32, upload_f32, weight, Cost, Launch, Op};
use crate::compare::Output;
use crate::rng::Rng;

pub struct Matmul {
    pub dtype: DType,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub bias: bool,
    /// Upload the weights from a safetensors file (`upload_weight`), not `weight_from_f32`.
    pub from_file: bool,
}

pub struct MatmulInputs {
    x: Vec<f32>,          // [m, k]
    w: Vec<f32>,          // [n, k]
    bias: Option<Vec<f32>>, // [n]
}

impl Op for Matmul {
    type Inputs = MatmulInputs;
    const NAME: &'static str = "matmul";
    fn params(&self) -> String {
        format!(
            "w={} m={} n={} k={} bias={}",
            self.dtype.name(),
            self.m,
            self.n,
            self.k,
            if self.bias { "yes" } else { "no" }
        ) + if self.from_file { " upload=file" } else { "" }
    }
    fn limit(&self) -> f64 {
        limits::weight(self.dtype)
    }
    fn cost(&self) -> Cost {
        let (m, n, k) = (self.m as f64, self.n as f64, self.k as f64);
        Cost { bytes: n * k * self.dtype.size() as f64 + 4.0 * (m * k + m * n), flops: 2.0 * m * n * k }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        // Weights scaled by 1/√k keep outputs O(1) whatever k is, like a trained projection.
        let w = round_to(self.dtype, rng.normals(self.n * self.k, 1.0 / (self.k as f32).sqrt()));
        let bias = self.bias.then(|| round_to(self.dtype, rng.normals(self.n, 0.5)));
        MatmulInputs { x: rng.normals(self.m * self.k, 1.0), w, bias }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let len = self.m * self.n;
        let xb = upload_f32(b, &x.x)?;
        let w = weight(b, self.dtype, &[self.n, self.k], &x.w, self.from_file)?;
        let bias = x.bias.as_ref().map(|v| weight(b, self.dtype, &[self.n], v, self.from_file)).transpose()?;
        let mut out = poisoned(b, len)?;
        launch.run(b, || b.matmul(&xb, &w, bias.as_ref(), &mut out, self.m, self.n, self.k))?;
        untouched_f32(b, &xb, &x.x, "x")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, len, "out")?)])
    }
}

/// `out = silu(x Wg^T) * (x Wu^T)`, fused where the backend fuses (`fuse_gate_up`, then
/// `gate_up_silu`: CUDA's one GEMM with the silu epilogue, wgpu's fused projection), else the
/// two matmuls and `silu_mul`; the reference runs the latter.
pub struct GateUpSilu {
    pub dtype: DType,
    pub m: usize,
    pub inter: usize,
    pub hidden: usize,
}

pub struct GateUpInputs {
    x: Vec<f32>,    // [m, hidden]
    gate: Vec<f32>, // [inter, hidden]
    up: Vec<f32>,
}

impl Op for GateUpSilu {
    type Inputs = GateUpInputs;
    const NAME: &'static str = "gate_up_silu";
    fn params(&self) -> String {
        format!("w={} m={} inter={} hidden={}", self.dtype.name(), self.m, self.inter, self.hidden)
    }
    fn limit(&self) -> f64 {
        limits::weight(self.dtype)
    }
    fn cost(&self) -> Cost {
        let (m, n, k) = (self.m as f64, 2.0 * self.inter as f64, self.hidden as f64);
        Cost { bytes: n * k * self.dtype.size() as f64 + 4.0 * (m * k + m * n / 2.0), flops: 2.0 * m * n * k }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let scale = 1.0 / (self.hidden as f32).sqrt();
        let gate = round_to(self.dtype, rng.normals(self.inter * self.hidden, scale));
        let up = round_to(self.dtype, rng.normals(self.inter * self.hidden, scale));
        GateUpInputs { x: rng.normals(self.m * self.hidden, 1.0), gate, up }
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (m, inter, h) = (self.m, self.inter, self.hidden);
        let mut ws = tandem_core::weights::Weights::empty();
        ws.replace("gate", self.dtype, &[inter, h], &x.gate)?;
        ws.replace("up", self.dtype, &[inter, h], &x.up)?;
        let (gv, uv) = (ws.get("gate", &[inter, h])?, ws.get("up", &[inter, h])?);
        let xb = upload_f32(b, &x.x)?;
        let mut out = poisoned(b, m * inter)?;
        match b.fuse_gate_up(&gv, &uv)? {
            Some(w) => launch.run(b, || b.gate_up_silu(&xb, &w, &mut out, m, inter, h, None))?,
            None => {
                let (wg, wu) = (b.upload_weight(&gv)?, b.upload_weight(&uv)?);
                let (mut g, mut u) = (poisoned(b, m * inter)?, poisoned(b, m * inter)?);
                launch.run(b, || {
                    b.matmul(&xb, &wg, None, &mut g, m, inter, h)?;
                    b.matmul(&xb, &wu, None, &mut u, m, inter, h)?;
                    b.silu_mul(&g, &u, &mut out, m * inter)
                })?
            }
        }
        untouched_f32(b, &xb, &x.x, "x")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, m * inter, "out")?)])
    }
}
