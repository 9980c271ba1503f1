//! The `Sampling` group of `WgpuBackend`: greedy argmax on the device, only the token ids read
//! back; the other samplers are the trait's host defaults.

use tandem_core::backend::Sampling;
use tandem_core::Result;

use super::operand::{err, to_u32, want_f32};
use super::WgpuBackend;
use crate::buffer::{BufKind, WgpuBuf};
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

impl Sampling for WgpuBackend {
    fn argmax(&self, logits: &WgpuBuf, rows: usize, vocab: usize) -> Result<Vec<u32>> {
        let op = "argmax";
        if rows == 0 {
            return Ok(vec![]);
        }
        if vocab == 0 {
            return Err(err("argmax: vocab 0"));
        }
        let l_b = want_f32(op, "logits", logits, rows * vocab)?;
        to_u32(op, "rows * vocab", rows * vocab)?;
        self.argmax_scratch(rows)?;
        let g = self.argmax_out.lock().map_err(|_| err("argmax scratch lock poisoned"))?;
        let out = g.as_ref().ok_or_else(|| err("argmax scratch missing"))?;
        let binds = [Bind::all(l_b), Bind::all(&out.buf)];
        self.rec.dispatch(
            shaders::ARGMAX,
            &Prelude::new(),
            &[rows as u32, vocab as u32],
            &binds,
            Grid::Linear(rows as u64),
        )?;
        let bytes = self.rec.read(&out.buf, rows as u64 * 4)?;
        Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl WgpuBackend {
    pub(super) fn argmax_scratch(&self, rows: usize) -> Result<()> {
        let mut g = self.argmax_out.lock().map_err(|_| err("argmax scratch lock poisoned"))?;
        if g.as_ref().is_none_or(|b| b.len < rows) {
            *g = Some(self.create(BufKind::U32, rows.max(64), rows.max(64) as u64 * 4, "argmax output")?);
        }
        Ok(())
    }
}
