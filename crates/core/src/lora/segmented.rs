//! The segmented LoRA update: one op per projection that adds each row's own adapter's update
//! ([`crate::backend::Ops::lora`]), Punica's BGMV idea. Every slot's factors sit in one
//! stacked buffer per layer and projection, and a row reads the slot its index names, so the
//! work follows the rows that use an adapter, not how many adapters are loaded.
//!
//! For row `t` with slot `s = slots[t]` (a slot `>= max_loras`, [`NO_SLOT`] among them: the row
//! is left as it is), `x̃` being x's row rounded to `operand` (what a matmul against A's type
//! reads: [`crate::backend::Storage::matmul_operand`]):
//!
//! ```text
//! shrink[t, j] = Σ_k x̃[t, k] · A[s, j, k]                 j < max_rank, k ascending
//! y[t, o]      = y[t, o] + scale[s] · Σ_j shrink[t, j] · B[s, o, j]   j ascending
//! ```
//!
//! with A f32 `[max_loras, max_rank, in]` and B f32 `[max_loras, out, max_rank]` (a slot of
//! rank `r < max_rank` holds zeros in A's rows and B's columns from `r` on, which add exact
//! zeros). Each sum runs in one order fixed by the shapes alone, and a row reads only its own
//! x, its slot's factors and its own y: a row's bits never depend on the other rows of the
//! step (batch invariance, docs/correctness.md).

use crate::backend::DType;
use crate::error::{Error, Result};

/// The slot index of a row that no adapter updates.
pub const NO_SLOT: u32 = u32::MAX;

/// The operands of one projection's update over `rows` rows.
pub struct LoraArgs<'a, Buf> {
    /// `[rows, inp]`: f32, or of the activation type a matmul of A's type reads.
    pub x: &'a Buf,
    /// The type x is rounded to before the products (f32: none).
    pub operand: DType,
    /// f32 `[max_loras, max_rank, inp]`.
    pub a: &'a Buf,
    /// f32 `[max_loras, out, max_rank]`.
    pub b: &'a Buf,
    /// u32 `[rows]`: each row's slot, or [`NO_SLOT`].
    pub slots: &'a Buf,
    /// f32 `[max_loras]`: each slot's `alpha / r`.
    pub scales: &'a Buf,
    pub rows: usize,
    pub inp: usize,
    pub out: usize,
    pub max_loras: usize,
    pub max_rank: usize,
}

impl<Buf> LoraArgs<'_, Buf> {
    /// The shapes as one line, for messages.
    pub fn describe(&self) -> String {
        format!(
            "rows {}, in {}, out {}, max_loras {}, max_rank {}",
            self.rows, self.inp, self.out, self.max_loras, self.max_rank
        )
    }
}

/// `v` rounded to `d` (round to nearest even), back as f32.
pub fn round_to(d: DType, v: f32) -> f32 {
    match d {
        DType::F32 => v,
        DType::BF16 => half::bf16::from_f32(v).to_f32(),
        DType::F16 => half::f16::from_f32(v).to_f32(),
    }
}

/// The update on host slices, as the module doc writes it (the reference backend's op, and
/// what every kernel repeats); `shrink` is scratch of at least `max_rank` values.
#[allow(clippy::too_many_arguments)]
pub fn lora_rows(
    x: &[f32],
    operand: DType,
    a: &[f32],
    b: &[f32],
    slots: &[u32],
    scales: &[f32],
    y: &mut [f32],
    (inp, out, max_rank): (usize, usize, usize),
) {
    let mut shrink = vec![0.0f32; max_rank];
    for (t, &s) in slots.iter().enumerate() {
        let s = s as usize;
        if s >= scales.len() {
            continue;
        }
        let xr = &x[t * inp..(t + 1) * inp];
        for (j, u) in shrink.iter_mut().enumerate() {
            let ar = &a[(s * max_rank + j) * inp..][..inp];
            let mut acc = 0.0f32;
            for (&xv, &av) in xr.iter().zip(ar) {
                acc += round_to(operand, xv) * av;
            }
            *u = acc;
        }
        let yr = &mut y[t * out..(t + 1) * out];
        for (o, yv) in yr.iter_mut().enumerate() {
            let br = &b[(s * out + o) * max_rank..][..max_rank];
            let mut acc = 0.0f32;
            for (&u, &bv) in shrink.iter().zip(br) {
                acc += u * bv;
            }
            *yv += scales[s] * acc;
        }
    }
}

/// Checks the shapes every backend's op assumes: the ranks and the row count positive where
/// there is work, and the flattened sizes within `u32` (what a kernel indexes with).
pub fn check(args: &LoraArgs<'_, impl Sized>, op: &str) -> Result<()> {
    if args.max_loras == 0 || args.max_rank == 0 {
        return Err(Error::Batch(format!("{op}: max_loras and max_rank must be positive ({})", args.describe())));
    }
    let sizes = [
        args.rows.checked_mul(args.inp),
        args.rows.checked_mul(args.out),
        args.rows.checked_mul(args.max_rank),
        args.max_loras.checked_mul(args.max_rank).and_then(|n| n.checked_mul(args.inp.max(args.out))),
    ];
    if sizes.iter().any(|s| s.is_none_or(|n| n > u32::MAX as usize)) {
        return Err(Error::Batch(format!("{op}: a buffer over 2^32 elements ({})", args.describe())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two slots, rank 2 of max 3, a row with none: against the product written out by hand.
    #[test]
    fn rows_follow_their_slots() {
        let (inp, out, max_rank) = (2, 2, 3);
        // A[s, j, k]: slot 0 rows (1, 0), (0, 1), 0; slot 1 rows (2, 0), (0, 0), 0.
        let a = [1., 0., 0., 1., 0., 0., 2., 0., 0., 0., 0., 0.];
        // B[s, o, j]: slot 0 identity on j < 2; slot 1 (1, 0, 0), (3, 0, 0).
        let b = [1., 0., 0., 0., 1., 0., 1., 0., 0., 3., 0., 0.];
        let x = [1., 2., 3., 4., 5., 6.];
        let mut y = [10., 20., 30., 40., 50., 60.];
        lora_rows(&x, DType::F32, &a, &b, &[0, NO_SLOT, 1], &[0.5, 2.0], &mut y, (inp, out, max_rank));
        // Row 0: shrink (1, 2), delta (1, 2) · 0.5; row 1 untouched; row 2: shrink (10, 0),
        // delta (10, 30) · 2.
        assert_eq!(y, [10.5, 21., 30., 40., 70., 120.]);
    }

    #[test]
    fn x_is_rounded_to_the_operand_type() {
        let x = [1.0 + 1.0 / 1024.0];
        let mut y = [0.0];
        lora_rows(&x, DType::BF16, &[1.0], &[1.0], &[0], &[1.0], &mut y, (1, 1, 1));
        assert_eq!(y, [1.0]);
    }
}
