//! The segmented LoRA update behind `Ops::lora` ( `shaders/lora.wgsl`): the shrink pass over
//! `[rows, max_rank]`, then the expand pass adding each row's update into y, both reading
//! each row's slot of the stacked factors.

use tandem_core::lora::segmented::{check, LoraArgs};
use tandem_core::{DType, Result};

use super::operand::{err, groups, want_f32, want_u32};
use super::WgpuBackend;
use crate::buffer::WgpuBuf;
use crate::recorder::{Bind, Grid};
use crate::shaders::{self, Prelude};

impl WgpuBackend {
    pub(super) fn segmented_lora(
        &self,
        args: &LoraArgs<'_, WgpuBuf>,
        shrink: &mut WgpuBuf,
        y: &mut WgpuBuf,
    ) -> Result<()> {
        const OP: &str = "lora";
        check(args, OP)?;
        if args.rows == 0 || args.out == 0 {
            return Ok(());
        }
        let operand = match args.operand {
            DType::F32 => 0u32,
            DType::BF16 => 1,
            DType::F16 => return Err(err(format!("{OP}: x rounded to f16 is not supported here"))),
        };
        let (l, r) = (args.max_loras, args.max_rank);
        let x_b = want_f32(OP, "x", args.x, args.rows * args.inp)?;
        let a_b = want_f32(OP, "a", args.a, l * r * args.inp)?;
        let b_b = want_f32(OP, "b", args.b, l * args.out * r)?;
        let s_b = want_u32(OP, "slots", args.slots, args.rows)?;
        let sc_b = want_f32(OP, "scales", args.scales, l)?;
        let u_b = want_f32(OP, "shrink", shrink, args.rows * r)?;
        let y_b = want_f32(OP, "y", y, args.rows * args.out)?;
        // `check` bounds every size by u32.
        let params = [args.rows, args.inp, args.out, l, r].map(|v| v as u32);
        let params = [params[0], params[1], params[2], params[3], params[4], operand];
        // The vec4 kernels where every row of x, A, shrink and B starts on a 16-byte boundary;
        // their sums are the scalar ones', in the same order.
        let shrink_kernel = if args.inp.is_multiple_of(4) { shaders::LORA_SHRINK4 } else { shaders::LORA_SHRINK };
        let expand_kernel = if r.is_multiple_of(4) { shaders::LORA_EXPAND4 } else { shaders::LORA_EXPAND };
        self.rec.dispatch(
            shrink_kernel,
            &Prelude::new(),
            &params,
            &[Bind::all(x_b), Bind::all(a_b), Bind::all(s_b), Bind::all(u_b)],
            Grid::Linear(groups(args.rows * r, 64)),
        )?;
        self.rec.dispatch(
            expand_kernel,
            &Prelude::new(),
            &params,
            &[Bind::all(u_b), Bind::all(b_b), Bind::all(s_b), Bind::all(sc_b), Bind::all(y_b)],
            Grid::Linear(groups(args.rows * args.out, 64)),
        )
    }
}
