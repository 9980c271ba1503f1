//! The segmented LoRA update of [`CudaBackend`] (`Ops::lora`, kernels/lora.cu): the shrink
//! launch (a warp per row and rank index, x read in its stored type and rounded as a matmul
//! against A's type rounds it), then the expand launch adding each row's update into y. Both
//! read each row's slot of the stacked factors, so their sizes follow the step's shape alone
//! (decode steps are still captured as graphs, whatever adapters are loaded).

use cudarc::driver::PushKernelArg;
use tandem_core::lora::segmented::{check, LoraArgs};
use tandem_core::{DType, Result};

use crate::buf::{need, CudaBuf, Elem};
use crate::device::CudaBackend;
use crate::error::err;
use crate::launch::{cfg, i32_of, u32_of};

/// Warps a shrink block holds, one rank index each (kernels/lora.cu).
const SHRINK_WARPS: usize = 8;
/// The most rows one launch takes: the grid's y dimension.
const MAX_ROWS: usize = 65_535;

impl CudaBackend {
    pub(crate) fn lora_update(
        &self,
        args: &LoraArgs<'_, CudaBuf>,
        shrink: &mut CudaBuf,
        y: &mut CudaBuf,
    ) -> Result<()> {
        const OP: &str = "lora";
        check(args, OP)?;
        if args.rows == 0 || args.out == 0 {
            return Ok(());
        }
        if args.rows > MAX_ROWS {
            return Err(err(format!("{OP}: {} rows, over the {MAX_ROWS} one launch takes", args.rows)));
        }
        let (l, r) = (args.max_loras, args.max_rank);
        let x_elem = args.x.elem();
        let shrink_k = match x_elem {
            Elem::F32 => &self.kernels.lora_shrink[0],
            Elem::BF16 => &self.kernels.lora_shrink[1],
            Elem::F16 => &self.kernels.lora_shrink[2],
            other => return Err(err(format!("{OP}: `x` holds {other:?}, expected f32, bf16 or f16"))),
        };
        need(args.x, x_elem, args.rows * args.inp, OP, "x")?;
        need(args.a, Elem::F32, l * r * args.inp, OP, "a")?;
        need(args.b, Elem::F32, l * args.out * r, OP, "b")?;
        need(args.slots, Elem::U32, args.rows, OP, "slots")?;
        need(args.scales, Elem::F32, l, OP, "scales")?;
        need(shrink, Elem::F32, args.rows * r, OP, "shrink")?;
        need(y, Elem::F32, args.rows * args.out, OP, "y")?;
        let round_code: i32 = match args.operand {
            DType::F32 => 1,
            DType::BF16 => 2,
            DType::F16 => 3,
        };
        let (inp, out, li, ri) = (
            i32_of(args.inp, OP, "in")?,
            i32_of(args.out, OP, "out")?,
            i32_of(l, OP, "max_loras")?,
            i32_of(r, OP, "max_rank")?,
        );
        let rows = u32_of(args.rows, OP, "rows")?;

        let mut ls = self.stream.launch_builder(&shrink_k.f);
        ls.arg(&*args.x.mem).arg(&*args.a.mem).arg(&*args.slots.mem).arg(&mut *shrink.mem);
        ls.arg(&inp).arg(&li).arg(&ri).arg(&round_code);
        let grid = (u32_of(r.div_ceil(SHRINK_WARPS), OP, "blocks")?, rows, 1);
        // SAFETY: every buffer was checked above for its type and the elements the kernel reads
        // or writes; the arguments follow kernels/lora.cu's signature.
        let res = unsafe { ls.launch(cfg(grid, (SHRINK_WARPS * 32) as u32)) };
        self.launched(shrink_k.name, res)?;

        let ek = &self.kernels.lora_expand;
        let mut le = self.stream.launch_builder(&ek.f);
        le.arg(&*shrink.mem).arg(&*args.b.mem).arg(&*args.slots.mem).arg(&*args.scales.mem).arg(&mut *y.mem);
        le.arg(&out).arg(&li).arg(&ri);
        let grid = (u32_of(args.out.div_ceil(256), OP, "blocks")?, rows, 1);
        // SAFETY: as above.
        let res = unsafe { le.launch(cfg(grid, 256)) };
        self.launched(ek.name, res)
    }
}
