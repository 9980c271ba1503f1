//! The small ops: embedding, gather_rows, rms_norm, add, scale, silu_mul, gelu_tanh_mul, argmax.

use tandem_core::backend::Backend;
use tandem_core::{DType, Result};

use super::{
    limits, poisoned, read_guarded, round_to, untouched_f32, untouched_u32, upload_f32, upload_guarded, upload_u32,
    weight, Cost, Launch, Op,
};
use crate::compare::Output;
use crate::rng::Rng;

/// Ids that always include the first and last rows (off-by-one at the table's ends) and a
/// repeat (two tokens reading one row).
fn ids_with_edges(rng: &mut Rng, n: usize, rows: usize) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n).map(|_| rng.below(rows) as u32).collect();
    if n >= 1 {
        ids[0] = rows as u32 - 1;
    }
    if n >= 2 {
        ids[n - 1] = 0;
    }
    if n >= 4 {
        ids[2] = ids[1];
    }
    ids
}

/// `out[t, :] = table[ids[t], :]`.
pub struct Embedding {
    pub dtype: DType,
    pub vocab: usize,
    pub hidden: usize,
    pub tokens: usize,
    /// Upload the table from a safetensors file (`upload_weight`).
    pub from_file: bool,
}

impl Op for Embedding {
    type Inputs = (Vec<f32>, Vec<u32>); // table [vocab, hidden], ids [T]
    const NAME: &'static str = "embedding";
    fn params(&self) -> String {
        format!("table={} vocab={} hidden={} T={}", self.dtype.name(), self.vocab, self.hidden, self.tokens)
            + if self.from_file { " upload=file" } else { "" }
    }
    fn limit(&self) -> f64 {
        limits::EXACT
    }
    fn cost(&self) -> Cost {
        let row = self.hidden as f64 * self.tokens as f64;
        Cost { bytes: row * (self.dtype.size() as f64 + 4.0), flops: 0.0 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let table = round_to(self.dtype, rng.normals(self.vocab * self.hidden, 1.0));
        (table, ids_with_edges(rng, self.tokens, self.vocab))
    }
    fn exec<B: Backend>(&self, b: &B, (table, host_ids): &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let n = self.tokens * self.hidden;
        let table = weight(b, self.dtype, &[self.vocab, self.hidden], table, self.from_file)?;
        let ids = upload_u32(b, host_ids)?;
        let mut out = poisoned(b, n)?;
        launch.run(b, || b.embedding(&table, &ids, &mut out, self.tokens, self.hidden))?;
        untouched_u32(b, &ids, host_ids, "ids")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, n, "out")?)])
    }
}

/// `out[i, :] = src[rows[i], :]`.
pub struct GatherRows {
    pub src_rows: usize,
    pub dim: usize,
    pub n: usize,
}

impl Op for GatherRows {
    type Inputs = (Vec<f32>, Vec<u32>); // src [src_rows, dim], rows [n]
    const NAME: &'static str = "gather_rows";
    fn params(&self) -> String {
        format!("src_rows={} dim={} n={}", self.src_rows, self.dim, self.n)
    }
    fn limit(&self) -> f64 {
        limits::EXACT
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 8.0 * (self.n * self.dim) as f64, flops: 0.0 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        (rng.normals(self.src_rows * self.dim, 1.0), ids_with_edges(rng, self.n, self.src_rows))
    }
    fn exec<B: Backend>(
        &self,
        b: &B,
        (host_src, host_rows): &Self::Inputs,
        launch: &mut Launch,
    ) -> Result<Vec<Output>> {
        let len = self.n * self.dim;
        let src = upload_f32(b, host_src)?;
        let rows = upload_u32(b, host_rows)?;
        let mut out = poisoned(b, len)?;
        launch.run(b, || b.gather_rows(&src, &rows, &mut out, self.n, self.dim))?;
        untouched_f32(b, &src, host_src, "src")?;
        untouched_u32(b, &rows, host_rows, "rows")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, len, "out")?)])
    }
}

/// `out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * w`.
pub struct RmsNorm {
    pub dtype: DType,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
    /// Scale of x: large values check that the sum of squares does not overflow or lose
    /// precision, small ones that eps is added where it should be.
    pub x_scale: f32,
    /// Upload the weight from a safetensors file (`upload_weight`).
    pub from_file: bool,
}

impl Op for RmsNorm {
    type Inputs = (Vec<f32>, Vec<f32>); // x [rows, dim], w [dim]
    const NAME: &'static str = "rms_norm";
    fn params(&self) -> String {
        format!(
            "w={} rows={} dim={} eps={:e} x_scale={}",
            self.dtype.name(),
            self.rows,
            self.dim,
            self.eps,
            self.x_scale
        ) + if self.from_file { " upload=file" } else { "" }
    }
    fn limit(&self) -> f64 {
        limits::weight(self.dtype).min(limits::F32)
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.dim) as f64;
        Cost { bytes: 8.0 * n + (self.dim * self.dtype.size()) as f64, flops: 4.0 * n }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let x = rng.normals(self.rows * self.dim, self.x_scale);
        let w = round_to(self.dtype, (0..self.dim).map(|_| 1.0 + 0.3 * rng.normal()).collect());
        (x, w)
    }
    fn exec<B: Backend>(&self, b: &B, (host_x, w): &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let n = self.rows * self.dim;
        let x = upload_f32(b, host_x)?;
        let w = weight(b, self.dtype, &[self.dim], w, self.from_file)?;
        let mut out = poisoned(b, n)?;
        launch.run(b, || b.rms_norm(&x, &w, &mut out, self.rows, self.dim, self.eps))?;
        untouched_f32(b, &x, host_x, "x")?;
        Ok(vec![Output::f32("out", read_guarded(b, &out, n, "out")?)])
    }
}

/// `acc += x` (in place: the accumulator is the output).
pub struct Add {
    pub len: usize,
}

impl Op for Add {
    type Inputs = (Vec<f32>, Vec<f32>); // acc [len], x [len]
    const NAME: &'static str = "add";
    fn params(&self) -> String {
        format!("len={}", self.len)
    }
    fn limit(&self) -> f64 {
        limits::EXACT
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 12.0 * self.len as f64, flops: self.len as f64 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        (rng.normals(self.len, 1.0), rng.normals(self.len, 1.0))
    }
    fn exec<B: Backend>(&self, b: &B, (acc, host_x): &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let mut acc = upload_guarded(b, acc)?;
        let x = upload_f32(b, host_x)?;
        launch.run(b, || b.add(&mut acc, &x, self.len))?;
        untouched_f32(b, &x, host_x, "x")?;
        Ok(vec![Output::f32("acc", read_guarded(b, &acc, self.len, "acc")?)])
    }
}

/// `x *= factor` (in place: Gemma's embedding times √hidden).
pub struct Scale {
    pub len: usize,
    pub factor: f32,
}

impl Op for Scale {
    type Inputs = Vec<f32>; // x [len]
    const NAME: &'static str = "scale";
    fn params(&self) -> String {
        format!("len={} factor={}", self.len, self.factor)
    }
    /// One rounding of one product: both sides should be bit-identical.
    fn limit(&self) -> f64 {
        limits::EXACT
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 8.0 * self.len as f64, flops: self.len as f64 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        rng.normals(self.len, 1.0)
    }
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let mut x = upload_guarded(b, x)?;
        launch.run(b, || b.scale(&mut x, self.factor, self.len))?;
        Ok(vec![Output::f32("x", read_guarded(b, &x, self.len, "x")?)])
    }
}

/// The residual add fused with the norm after it: `acc += x`, then `out = rms_norm(acc) * w`.
/// Both the updated accumulator and the normed output are compared.
pub struct AddRmsNorm {
    pub dtype: DType,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

impl Op for AddRmsNorm {
    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>); // acc [rows, dim], x [rows, dim], w [dim]
    const NAME: &'static str = "add_rms_norm";
    fn params(&self) -> String {
        format!("w={} rows={} dim={} eps={:e}", self.dtype.name(), self.rows, self.dim, self.eps)
    }
    fn limit(&self) -> f64 {
        limits::weight(self.dtype).min(limits::F32)
    }
    fn cost(&self) -> Cost {
        let n = (self.rows * self.dim) as f64;
        Cost { bytes: 16.0 * n + (self.dim * self.dtype.size()) as f64, flops: 5.0 * n }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let n = self.rows * self.dim;
        let w = round_to(self.dtype, (0..self.dim).map(|_| 1.0 + 0.3 * rng.normal()).collect());
        (rng.normals(n, 1.0), rng.normals(n, 1.0), w)
    }
    fn exec<B: Backend>(&self, b: &B, (acc, host_x, w): &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let n = self.rows * self.dim;
        let mut acc = upload_guarded(b, acc)?;
        let x = upload_f32(b, host_x)?;
        let w = weight(b, self.dtype, &[self.dim], w, false)?;
        let mut out = poisoned(b, n)?;
        launch.run(b, || b.add_rms_norm(&mut acc, &x, &w, &mut out, self.rows, self.dim, self.eps))?;
        untouched_f32(b, &x, host_x, "x")?;
        Ok(vec![
            Output::f32("acc", read_guarded(b, &acc, n, "acc")?),
            Output::f32("out", read_guarded(b, &out, n, "out")?),
        ])
    }
}

/// `out = silu(gate) * up`.
pub struct SiluMul {
    pub len: usize,
    /// Scale of gate: large values reach the tails of the sigmoid, where a naive
    /// `exp(-x)` overflows.
    pub gate_scale: f32,
}

impl Op for SiluMul {
    type Inputs = (Vec<f32>, Vec<f32>); // gate [len], up [len]
    const NAME: &'static str = "silu_mul";
    fn params(&self) -> String {
        format!("len={} gate_scale={}", self.len, self.gate_scale)
    }
    fn limit(&self) -> f64 {
        limits::F32
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 12.0 * self.len as f64, flops: 5.0 * self.len as f64 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        (rng.normals(self.len, self.gate_scale), rng.normals(self.len, 1.0))
    }
    fn exec<B: Backend>(&self, b: &B, inputs: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        run_gated(b, inputs, self.len, launch, |g, u, o| b.silu_mul(g, u, o, self.len))
    }
}

/// `out = gelu_tanh(gate) * up` (GeGLU), PyTorch's `gelu(approximate="tanh")`.
pub struct GeluTanhMul {
    pub len: usize,
    /// Scale of gate: large values saturate tanh (and overflow a naive `exp(2x)` form).
    pub gate_scale: f32,
}

impl Op for GeluTanhMul {
    type Inputs = (Vec<f32>, Vec<f32>); // gate [len], up [len]
    const NAME: &'static str = "gelu_tanh_mul";
    fn params(&self) -> String {
        format!("len={} gate_scale={}", self.len, self.gate_scale)
    }
    /// Tighter than the f32 limit: the exact (erf) GELU, the wrong one for Gemma, differs from
    /// this one by NMSE 3.9e-8 at gate_scale 1 (2.2e-10 at 12), under limits::F32. A GPU's
    /// tanhf differs from the host's by an ulp or two (CUDA documents 2 ulp): NMSE ~1e-14.
    fn limit(&self) -> f64 {
        limits::GELU
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 12.0 * self.len as f64, flops: 10.0 * self.len as f64 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        (rng.normals(self.len, self.gate_scale), rng.normals(self.len, 1.0))
    }
    fn exec<B: Backend>(&self, b: &B, inputs: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        run_gated(b, inputs, self.len, launch, |g, u, o| b.gelu_tanh_mul(g, u, o, self.len))
    }
}

/// A gated activation's run: gate and up uploaded, `op(gate, up, out)` launched into a poisoned
/// out, the inputs checked untouched.
fn run_gated<B: Backend>(
    b: &B,
    (host_gate, host_up): &(Vec<f32>, Vec<f32>),
    len: usize,
    launch: &mut Launch,
    op: impl Fn(&B::Buf, &B::Buf, &mut B::Buf) -> Result<()>,
) -> Result<Vec<Output>> {
    let gate = upload_f32(b, host_gate)?;
    let up = upload_f32(b, host_up)?;
    let mut out = poisoned(b, len)?;
    launch.run(b, || op(&gate, &up, &mut out))?;
    untouched_f32(b, &gate, host_gate, "gate")?;
    untouched_f32(b, &up, host_up, "up")?;
    Ok(vec![Output::f32("out", read_guarded(b, &out, len, "out")?)])
}

/// Index of the largest logit per row (lowest index on ties).
pub struct Argmax {
    pub rows: usize,
    pub vocab: usize,
    /// Copy each row's maximum to other places, so that the lowest-index rule decides.
    pub ties: bool,
}

impl Op for Argmax {
    type Inputs = Vec<f32>; // logits [rows, vocab]
    const NAME: &'static str = "argmax";
    fn params(&self) -> String {
        format!("rows={} vocab={} ties={}", self.rows, self.vocab, if self.ties { "yes" } else { "no" })
    }
    fn limit(&self) -> f64 {
        0.0
    }
    fn cost(&self) -> Cost {
        Cost { bytes: 4.0 * (self.rows * self.vocab) as f64, flops: (self.rows * self.vocab) as f64 }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let mut logits = rng.normals(self.rows * self.vocab, 4.0);
        if self.ties && self.vocab >= 2 {
            for row in logits.chunks_exact_mut(self.vocab) {
                let max = row.iter().copied().fold(f32::MIN, f32::max);
                // Ties before and after the original maximum and at the row's end, but not at
                // index 0, so that "always answer 0" cannot pass.
                for j in [self.vocab / 2, self.vocab - 1, 1 + rng.below(self.vocab.max(2) - 1)] {
                    row[j] = max;
                }
            }
        }
        logits
    }
    fn exec<B: Backend>(&self, b: &B, logits: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let host_logits = logits;
        let logits = upload_f32(b, host_logits)?;
        let mut ids = vec![];
        launch.run(b, || {
            ids = b.argmax(&logits, self.rows, self.vocab)?;
            Ok(())
        })?;
        untouched_f32(b, &logits, host_logits, "logits")?;
        Ok(vec![Output::u32("ids", ids)])
    }
}
