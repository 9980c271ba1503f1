//! The segmented LoRA update (`lora`): each row's own slot of stacked factors, rows with no
//! slot, slots of a rank below the stacks' `max_rank` (zeros past it), x rounded to bf16 as a
//! CUDA matmul against bf16 A rounds it.

use tandem_core::backend::Backend;
use tandem_core::lora::{LoraArgs, NO_SLOT};
use tandem_core::{DType, Result};

use super::{
    limits, read_guarded, untouched_f32, untouched_u32, upload_f32, upload_guarded, upload_u32, Cost, Launch, Op,
};
use crate::compare::Output;
use crate::rng::Rng;

/// `lora` over `rows` rows of stacks of `max_loras` slots of rank up to `max_rank`.
#[derive(Debug, Clone, Copy)]
pub struct Lora {
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
    pub max_loras: usize,
    pub max_rank: usize,
    /// The type x is rounded to (f32: none).
    pub operand: DType,
}

/// x, A, B, the row slots, the slot scales, y.
pub type LoraInputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<u32>, Vec<f32>, Vec<f32>);

impl Op for Lora {
    type Inputs = LoraInputs;
    const NAME: &'static str = "lora";
    fn params(&self) -> String {
        format!(
            "m={} in={} out={} max_loras={} max_rank={} operand={}",
            self.rows,
            self.inp,
            self.out,
            self.max_loras,
            self.max_rank,
            self.operand.name()
        )
    }
    fn limit(&self) -> f64 {
        limits::F32
    }
    fn cost(&self) -> Cost {
        let (m, r) = (self.rows as f64, self.max_rank as f64);
        let (i, o) = (self.inp as f64, self.out as f64);
        Cost { bytes: 4.0 * (m * (i + 2.0 * o) + m * r * (i + o)), flops: 2.0 * m * r * (i + o) }
    }
    fn generate(&self, rng: &mut Rng) -> Self::Inputs {
        let (n, r, inp, out) = (self.max_loras, self.max_rank, self.inp, self.out);
        let mut a = vec![0.0f32; n * r * inp];
        let mut b = vec![0.0f32; n * out * r];
        for s in 0..n {
            // Slot 0 uses the whole rank, the others less (down to 1).
            let rank = if s == 0 { r } else { 1 + rng.below(r) };
            for j in 0..rank {
                for k in 0..inp {
                    a[(s * r + j) * inp + k] = rng.normal() / (inp as f32).sqrt();
                }
                for o in 0..out {
                    b[(s * out + o) * r + j] = rng.normal();
                }
            }
        }
        // A quarter of the rows with none, one past max_loras (also none), the rest a slot.
        let slots = (0..self.rows)
            .map(|t| match rng.below(4) {
                0 => NO_SLOT,
                _ if t == 1 => n as u32,
                _ => rng.below(n) as u32,
            })
            .collect();
        let scales = rng.uniforms(n, 0.25, 4.0);
        (rng.normals(self.rows * inp, 1.0), a, b, slots, scales, rng.normals(self.rows * out, 1.0))
    }
    fn exec<B: Backend>(&self, b: &B, inputs: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>> {
        let (hx, ha, hb, hs, hsc, hy) = inputs;
        let x = upload_f32(b, hx)?;
        let a = upload_f32(b, ha)?;
        let bw = upload_f32(b, hb)?;
        let slots = upload_u32(b, hs)?;
        let scales = upload_f32(b, hsc)?;
        let mut shrink = b.alloc_f32((self.rows * self.max_rank).max(1))?;
        let mut y = upload_guarded(b, hy)?;
        let args = LoraArgs {
            x: &x,
            operand: self.operand,
            a: &a,
            b: &bw,
            slots: &slots,
            scales: &scales,
            rows: self.rows,
            inp: self.inp,
            out: self.out,
            max_loras: self.max_loras,
            max_rank: self.max_rank,
        };
        launch.run(b, || b.lora(&args, &mut shrink, &mut y))?;
        untouched_f32(b, &x, hx, "x")?;
        untouched_f32(b, &a, ha, "a")?;
        untouched_f32(b, &bw, hb, "b")?;
        untouched_u32(b, &slots, hs, "slots")?;
        Ok(vec![Output::f32("y", read_guarded(b, &y, self.rows * self.out, "y")?)])
    }
}

/// Batch invariance of `lora` on `b`: every row of `case`'s inputs (seeded by `seed`) run
/// alone, and the rows run in reverse order, give that row's y of the whole batch bit for bit.
/// The error names the first row that differs.
pub fn lora_rows_alone<B: Backend>(b: &B, case: &Lora, seed: u64) -> Result<()> {
    let inputs = case.generate(&mut Rng::new(seed));
    let (x, a, bw, slots, scales, y) = &inputs;
    let (inp, out) = (case.inp, case.out);
    let batch = y_of(b, case, &inputs)?;
    let alone = Lora { rows: 1, ..*case };
    for t in 0..case.rows {
        let one = (
            x[t * inp..(t + 1) * inp].to_vec(),
            a.clone(),
            bw.clone(),
            vec![slots[t]],
            scales.clone(),
            y[t * out..(t + 1) * out].to_vec(),
        );
        let got = y_of(b, &alone, &one)?;
        differs(&got, &batch[t * out..(t + 1) * out], &format!("row {t} (slot {}) alone", slots[t]))?;
    }
    let rev = |v: &[f32], w: usize| -> Vec<f32> { v.chunks_exact(w).rev().flatten().copied().collect() };
    let reversed =
        (rev(x, inp), a.clone(), bw.clone(), slots.iter().rev().copied().collect(), scales.clone(), rev(y, out));
    let got = y_of(b, case, &reversed)?;
    differs(&rev(&got, out), &batch, "the rows reversed")
}

fn y_of<B: Backend>(b: &B, case: &Lora, inputs: &LoraInputs) -> Result<Vec<f32>> {
    let outs = case.exec(b, inputs, &mut Launch::once())?;
    match outs.into_iter().next().map(|o| o.data) {
        Some(crate::compare::Data::F32(v)) => Ok(v),
        _ => Err(tandem_core::Error::Batch("lora: no f32 output".into())),
    }
}

fn differs(got: &[f32], want: &[f32], what: &str) -> Result<()> {
    match got.iter().zip(want).position(|(g, w)| g.to_bits() != w.to_bits()) {
        None => Ok(()),
        Some(i) => Err(tandem_core::Error::Batch(format!(
            "lora: {what}: element {i} is {} against {} in the batch",
            got[i], want[i]
        ))),
    }
}
