//! Launches: a kernel call checked as the driver checks it at the call (grid, block, shared
//! memory, arguments) and copied by value; run later by the emulator, its pointer arguments
//! checked live first, and a programmatic dependent run with its primary as a pair.

use std::ffi::{c_void, CString};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::sys::CUresult;

use crate::kernels::{HostKernel, LaunchArgs};

use super::fault::RUNNING;
use super::module::{OPTIN_SMEM_LIMIT, STATIC_SMEM_LIMIT};
use super::stream::Op;
use super::{fail, need_context, Res, State};

pub struct Launch {
    pub(super) name: String,
    pub(super) kernel: HostKernel,
    pub(super) grid: [u32; 3],
    pub(super) block: [u32; 3],
    pub(super) smem: u32,
    pub(super) seed: u64,
    /// Each argument's bytes, by value (in 8-byte words, zero-filled past its size).
    pub(super) params: Vec<Vec<u64>>,
    /// Launched with the programmatic-stream-serialization attribute (cuLaunchKernelEx).
    pub(super) pdl: bool,
}

impl Launch {
    pub(super) fn pdl_after(op: &Op) -> Option<&Arc<Launch>> {
        match op {
            Op::Launch(l) if l.pdl => Some(l),
            _ => None,
        }
    }
}

/// A primary grid run from inside its dependent (cuda_emu.h `Pdl`).
struct Primary<'a> {
    kernel: HostKernel,
    args: LaunchArgs,
    _params: &'a [*const c_void],
}

unsafe extern "C" fn run_primary(p: *mut c_void) {
    // SAFETY: `p` is the `Primary` that run_pair keeps alive across the dependent's run.
    let p = &*(p as *const Primary);
    p.kernel.run(&p.args);
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49eb_1331_11eb);
    z ^ (z >> 31)
}

impl State {
    pub(super) fn run(&mut self, l: &Launch) -> Res<()> {
        self.check_pointers(l)?;
        let ptrs: Vec<*const c_void> = l.params.iter().map(|p| p.as_ptr() as *const c_void).collect();
        let mut waits = 0u64;
        let mut args = Self::args(l, &ptrs);
        args.pdl_waits = &mut waits;
        let name = CString::new(l.name.clone()).unwrap_or_default();
        RUNNING.store(name.as_ptr() as *mut u8, Ordering::SeqCst);
        // SAFETY: `params` holds one 8-byte slot per parameter of the kernel's signature, and
        // every pointer argument lies in a live allocation (its extent is the kernel's to keep).
        unsafe { l.kernel.run(&args) };
        RUNNING.store(std::ptr::null_mut(), Ordering::SeqCst);
        Self::check_waited(l, waits)
    }

    /// A kernel launched as a programmatic dependent that no thread waited in: on a GPU it may
    /// run beside its primary, reading what that has not written yet.
    fn check_waited(l: &Launch, waits: u64) -> Res<()> {
        if l.pdl && waits == 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_LAUNCH_FAILED,
                &format!("kernel {} was launched with programmatic stream serialization but no thread executed PDL_WAIT (griddepcontrol.wait)", l.name),
            ));
        }
        Ok(())
    }

    fn args(l: &Launch, ptrs: &[*const c_void]) -> LaunchArgs {
        LaunchArgs {
            grid: l.grid,
            block: l.block,
            smem: l.smem,
            block_order_seed: l.seed,
            params: ptrs.as_ptr(),
            pdl_primary: None,
            pdl_arg: std::ptr::null_mut(),
            pdl_late: 0,
            pdl_ran_late: std::ptr::null_mut(),
            pdl_waits: std::ptr::null_mut(),
        }
    }

    /// Kernel `p`, then `d` launched as its programmatic dependent, as the emulator models it
    /// (kernels/emu/cuda_emu.h `Pdl`): `d` runs first and `p` runs from inside it, once the
    /// first block of `d` is parked at PDL_WAIT; so a read of p's output above d's wait reads
    /// memory p has not written yet. `TANDEM_FAKE_CUDA_PDL_LATE=1` (a deliberate break): p runs
    /// after d's first block instead, as if d did not wait.
    pub(super) fn run_pair(&mut self, p: &Launch, d: &Launch) -> Res<()> {
        self.check_pointers(p)?;
        self.check_pointers(d)?;
        let pp: Vec<*const c_void> = p.params.iter().map(|x| x.as_ptr() as *const c_void).collect();
        let dp: Vec<*const c_void> = d.params.iter().map(|x| x.as_ptr() as *const c_void).collect();
        let primary = Primary { kernel: p.kernel, args: Self::args(p, &pp), _params: &pp };
        let (mut ran_late, mut waits) = (0u32, 0u64);
        let mut args = Self::args(d, &dp);
        args.pdl_primary = Some(run_primary);
        args.pdl_arg = &primary as *const Primary as *mut c_void;
        args.pdl_late = self.pdl_late as u32;
        args.pdl_ran_late = &mut ran_late;
        args.pdl_waits = &mut waits;
        let name = CString::new(format!("{} (programmatic dependent of {})", d.name, p.name)).unwrap_or_default();
        RUNNING.store(name.as_ptr() as *mut u8, Ordering::SeqCst);
        // SAFETY: as in run, for both kernels; `primary` outlives the dependent's run.
        unsafe { d.kernel.run(&args) };
        RUNNING.store(std::ptr::null_mut(), Ordering::SeqCst);
        self.pdl_pairs += 1;
        if self.pdl_pairs == 1 {
            eprintln!(
                "fake-cuda: {} ran as a programmatic dependent of {} (first of such pairs; kernels/README.md)",
                d.name, p.name
            );
        }
        if ran_late != 0 && !self.pdl_late {
            return Err(fail(
                CUresult::CUDA_ERROR_LAUNCH_FAILED,
                &format!(
                    "kernel {} (a programmatic dependent of {}) finished a block without any thread at PDL_WAIT",
                    d.name, p.name
                ),
            ));
        }
        Self::check_waited(d, waits)
    }

    pub(super) fn check_pointers(&self, l: &Launch) -> Res<()> {
        for &[i, off] in l.kernel.pointers {
            let words = &l.params[i as usize];
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            let p = u64::from_le_bytes(bytes[off as usize..off as usize + 8].try_into().expect("8 bytes")) as usize;
            if p != 0 && self.mem.device_at(p).is_none() {
                let host = if self.mem.host_range(p, 1) { " (page-locked host memory)" } else { "" };
                return Err(fail(
                    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS,
                    &format!("kernel {} argument {i} (byte {off}): pointer {p:#x}{host} is not inside any live device allocation", l.name),
                ));
            }
        }
        Ok(())
    }

    /// Checks a launch as the driver would at the call and copies its arguments.
    ///
    /// # Safety
    /// `params` is cuLaunchKernel's `kernelParams`.
    pub unsafe fn make_launch(
        &mut self,
        id: usize,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        params: *const *const c_void,
        pdl: bool,
    ) -> Res<Op> {
        need_context("cuLaunchKernel")?;
        let f = self.func(id)?;
        let name = f.entry.name.clone();
        let bad = |code: CUresult, msg: String| fail(code, &format!("launching {name}: {msg}"));
        let Some(kernel) = f.kernel else {
            return Err(bad(
                CUresult::CUDA_ERROR_NOT_FOUND,
                "no host build of this kernel in the fake driver (rebuild tandem-fake-cuda)".into(),
            ));
        };
        if grid.contains(&0) || block.contains(&0) {
            return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, format!("an empty grid {grid:?} or block {block:?}")));
        }
        if grid[0] > i32::MAX as u32
            || grid[1] > 65535
            || grid[2] > 65535
            || block[0] > 1024
            || block[1] > 1024
            || block[2] > 64
        {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("grid {grid:?} or block {block:?} beyond the device's limits"),
            ));
        }
        let threads = block[0] * block[1] * block[2];
        let bound = f.entry.max_threads.unwrap_or(1024);
        if threads > bound {
            return Err(bad(
                CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                format!("{threads} threads a block, but its launch bounds allow {bound}"),
            ));
        }
        if let Some(req) = f.entry.req_threads {
            if threads != req {
                return Err(bad(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("{threads} threads a block, but it requires {req}"),
                ));
            }
        }
        let smem = smem as usize;
        let limit = if f.max_dynamic_smem > STATIC_SMEM_LIMIT { OPTIN_SMEM_LIMIT } else { STATIC_SMEM_LIMIT };
        if smem > f.max_dynamic_smem || f.entry.static_smem + smem > limit {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{} bytes of static and {smem} of dynamic shared memory exceed what it may use ({} dynamic)",
                    f.entry.static_smem, f.max_dynamic_smem
                ),
            ));
        }
        if f.entry.dynamic_smem && smem == 0 {
            return Err(bad(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "it uses dynamic shared memory, the launch gives none".into(),
            ));
        }
        if !kernel.sig.is_empty() && params.is_null() {
            return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, "kernelParams is null".into()));
        }
        let mut vals = Vec::with_capacity(kernel.sig.len());
        for (i, &n) in kernel.sizes.iter().enumerate() {
            let p = *params.add(i);
            if p.is_null() {
                return Err(bad(CUresult::CUDA_ERROR_INVALID_VALUE, format!("kernelParams[{i}] is null")));
            }
            let mut v = vec![0u64; (n as usize).div_ceil(8)];
            std::ptr::copy_nonoverlapping(p as *const u8, v.as_mut_ptr() as *mut u8, n as usize);
            vals.push(v);
        }
        self.launches += 1;
        let seed = splitmix(self.seed ^ splitmix(self.launches)) | 1;
        Ok(Op::Launch(Arc::new(Launch { name, kernel, grid, block, smem: smem as u32, seed, params: vals, pdl })))
    }
}
