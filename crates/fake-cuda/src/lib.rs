//! A fake CUDA driver: `libcuda.so` for cudarc's dynamic loading, so that the CUDA backend's
//! host code (crates/cuda) runs unchanged on a machine without a GPU, each launched kernel run
//! by the emulator (kernels/emu/cuda_emu.h) from the same `.cu` sources compiled for the host.
//!
//! One device, an H200 as far as the backend can ask (sm_90, 132 SMs), with a small memory
//! (`TANDEM_FAKE_CUDA_MEMORY_MB`, default 1024: the KV pool is sized from it). It implements
//! the entry points the backend and cudarc's safe layer call for it, nothing more: any other
//! is a missing symbol, which cudarc reports by name (a panic), and a modelled call with an
//! argument it does not model (an attribute, a flag) fails with a message on stderr.
//!
//! Strict where a host bug would hide on a real GPU by luck of timing:
//! - device memory (and page-locked host memory) is fresh mmap'd pages filled with 0xFF (NaN
//!   as f32, bf16 and f16); a buffer ends against a guard page, and freed memory is made
//!   inaccessible and its addresses never reused, so a kernel that touches it faults (a
//!   SIGSEGV handler names the kernel);
//! - work is queued per stream and runs only when the host waits: a stream or context
//!   synchronize, an event synchronize, a copy to pageable host memory. A copy from page-locked
//!   memory reads it when it runs, so a host write before the event it should wait for shows;
//! - a launch copies its arguments by value; every pointer argument must lie inside a live
//!   device allocation when the kernel runs (else a sticky CUDA_ERROR_ILLEGAL_ADDRESS, the
//!   kernel and argument named on stderr); block size is checked against the kernel's launch
//!   bounds (`.maxntid` in its PTX) and shared memory against 48 KiB (static from the PTX plus
//!   dynamic); the PTX `.param` list must match the host build's C++ signature;
//! - stream capture records launches, memsets and device copies by value and refuses
//!   allocation, frees, pageable copies, events and synchronization from the capturing thread
//!   (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, capture invalidated);
//! - a grid's blocks start in an order shuffled per launch from `TANDEM_FAKE_CUDA_SEED`, 2-4 of
//!   them interleaved at barriers (kernels/emu/cuda_emu.h, `run_interleaved`), and `__shared__`
//!   is poisoned before each block;
//! - a kernel launched with programmatic stream serialization (cuLaunchKernelEx) right after
//!   another runs FIRST, its primary from inside it once the dependent's first block is parked
//!   at PDL_WAIT (cuda_emu.h `Pdl`), so a read of the primary's output above the wait reads
//!   stale memory; such a kernel that never waits fails the launch.
//!
//! It also exports the cuBLASLt entry points the backend calls (`cublaslt`), a GEMM on the CPU
//! from the fake device memory, so `libcublasLt.so.13` may be a link to this same library.
//!
//! What it cannot tell: the GPU memory model and races between blocks or warps (blocks and
//! threads switch only at barriers), the hardware's rounding inside an mma,
//! FMA contraction, register pressure and speed. kernels/README.md says how to use it.

#![allow(non_snake_case, clippy::missing_safety_doc)]

mod cublaslt;
mod kernels;
mod memory;
mod ptx;
mod state;

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdeviceptr, CUevent, CUfunction, CUgraph, CUgraphExec, CUmodule, CUresult, CUstream,
};

use state::{fail, with, Res};

/// Runs `f` under the driver lock and turns its result into a CUresult.
fn call(f: impl FnOnce(&mut state::State) -> Res<()>) -> CUresult {
    match with(f) {
        Ok(()) => CUresult::CUDA_SUCCESS,
        Err(e) => e,
    }
}

/// [`call`] for the calls that need the context current on this thread, as the driver's do.
fn ctx_call(what: &str, f: impl FnOnce(&mut state::State) -> Res<()>) -> CUresult {
    match state::need_context(what) {
        Ok(()) => call(f),
        Err(e) => e,
    }
}

unsafe fn out<T>(p: *mut T, v: T) -> Res<()> {
    if p.is_null() {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "a null output pointer"));
    }
    p.write(v);
    Ok(())
}

// ---- initialisation, device, context -------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CUresult {
    if flags != 0 {
        return fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuInit: flags must be 0");
    }
    call(|_| Ok(()))
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    call(|_| out(v, 13000))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    call(|_| out(n, 1))
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    call(|_| {
        if ordinal != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_DEVICE,
                &format!("cuDeviceGet: device {ordinal} (the fake driver has one, 0)"),
            ));
        }
        out(dev, 0)
    })
}

fn check_dev(dev: CUdevice, what: &str) -> Res<()> {
    if dev == 0 {
        Ok(())
    } else {
        Err(fail(CUresult::CUDA_ERROR_INVALID_DEVICE, &format!("{what}: device {dev}")))
    }
}

/// What the device calls itself: an H200's name, marked as the fake.
pub const DEVICE_NAME: &str = "NVIDIA H200 (tandem fake driver)";

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    call(|_| {
        check_dev(dev, "cuDeviceGetName")?;
        let bytes = DEVICE_NAME.as_bytes();
        if name.is_null() || len <= 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuDeviceGetName: no buffer"));
        }
        let n = bytes.len().min(len as usize - 1);
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), name as *mut u8, n);
        *name.add(n) = 0;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    call(|s| {
        check_dev(dev, "cuDeviceTotalMem")?;
        out(bytes, s.mem.total)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    call(|_| {
        check_dev(dev, "cuDeviceGetAttribute")?;
        let a = state::device_attribute(attrib)?;
        out(v, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    call(|s| {
        check_dev(dev, "cuDevicePrimaryCtxRetain")?;
        s.ctx_refs += 1;
        out(ctx, state::CONTEXT as CUcontext)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    call(|s| {
        check_dev(dev, "cuDevicePrimaryCtxRelease")?;
        s.ctx_refs = s.ctx_refs.saturating_sub(1);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult {
    // Not under the lock, and no sticky error: cudarc asks before every call.
    if ctx.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    *ctx = state::CURRENT.with(|c| c.get()) as CUcontext;
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    let c = ctx as usize;
    if c != 0 && c != state::CONTEXT {
        return fail(CUresult::CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent: not the primary context");
    }
    state::CURRENT.with(|cur| cur.set(c));
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    call(|s| {
        s.refuse_while_capturing("cuCtxSynchronize")?;
        s.drain_all()
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    call(|s| {
        out(free, s.mem.total.saturating_sub(s.mem.used))?;
        out(total, s.mem.total)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(e: CUresult, p: *mut *const c_char) -> CUresult {
    if p.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    *p = state::error_text(e).1.as_ptr();
    CUresult::CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(e: CUresult, p: *mut *const c_char) -> CUresult {
    if p.is_null() {
        return CUresult::CUDA_ERROR_INVALID_VALUE;
    }
    *p = state::error_text(e).0.as_ptr();
    CUresult::CUDA_SUCCESS
}

// ---- streams and events --------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut CUstream, _flags: c_uint) -> CUresult {
    ctx_call("cuStreamCreate", |s| {
        let id = s.new_stream();
        out(stream, id as CUstream)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(stream: CUstream) -> CUresult {
    ctx_call("cuStreamDestroy_v2", |s| s.destroy_stream(stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(stream: CUstream) -> CUresult {
    ctx_call("cuStreamSynchronize", |s| {
        s.refuse_while_capturing("cuStreamSynchronize")?;
        s.drain(stream as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamWaitEvent(stream: CUstream, event: CUevent, flags: c_uint) -> CUresult {
    ctx_call("cuStreamWaitEvent", |s| {
        if flags != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "cuStreamWaitEvent: flags other than 0 are not modelled",
            ));
        }
        s.wait_event(stream as usize, event as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamBeginCapture_v2(stream: CUstream, mode: c_int) -> CUresult {
    ctx_call("cuStreamBeginCapture_v2", |s| s.begin_capture(stream as usize, mode))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult {
    ctx_call("cuStreamEndCapture", |s| {
        let g = s.end_capture(stream as usize);
        match g {
            Ok(id) => out(graph, id as CUgraph),
            Err(e) => {
                if !graph.is_null() {
                    *graph = std::ptr::null_mut();
                }
                Err(e)
            }
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: CUstream, status: *mut c_int) -> CUresult {
    ctx_call("cuStreamIsCapturing", |s| {
        let st = s.capture_status(stream as usize)?;
        out(status, st)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut CUevent, _flags: c_uint) -> CUresult {
    ctx_call("cuEventCreate", |s| {
        let id = s.new_event();
        out(event, id as CUevent)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(event: CUevent) -> CUresult {
    ctx_call("cuEventDestroy_v2", |s| s.destroy_event(event as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult {
    ctx_call("cuEventRecord", |s| s.record_event(event as usize, stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(event: CUevent) -> CUresult {
    ctx_call("cuEventSynchronize", |s| s.sync_event(event as usize))
}

// ---- memory --------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, stream: CUstream) -> CUresult {
    ctx_call("cuMemAllocAsync", |s| {
        s.refuse_while_capturing("cuMemAllocAsync")?;
        s.stream(stream as usize)?;
        let p = s.alloc_device(bytes)?;
        out(dptr, p as CUdeviceptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    ctx_call("cuMemAlloc_v2", |s| {
        s.refuse_while_capturing("cuMemAlloc")?;
        let p = s.alloc_device(bytes)?;
        out(dptr, p as CUdeviceptr)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult {
    ctx_call("cuMemFreeAsync", |s| {
        s.refuse_while_capturing("cuMemFreeAsync")?;
        s.free_device_async(dptr as usize, stream as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    ctx_call("cuMemFree_v2", |s| {
        s.refuse_while_capturing("cuMemFree")?;
        s.drain_all()?;
        s.free_device_now(dptr as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    ctx_call("cuMemHostAlloc", |s| {
        s.refuse_while_capturing("cuMemHostAlloc")?;
        let p = s.alloc_host(bytes)?;
        out(pp, p as *mut c_void)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    ctx_call("cuMemFreeHost", |s| {
        s.refuse_while_capturing("cuMemFreeHost")?;
        s.drain_all()?;
        s.free_host(p as usize)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) -> CUresult {
    ctx_call("cuMemsetD8Async", |s| s.enqueue(stream as usize, state::Op::Memset { dst: dst as usize, value, n }))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    ctx_call("cuMemcpyHtoDAsync_v2", |s| s.copy_htod(dst as usize, src as usize, n, stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    ctx_call("cuMemcpyDtoHAsync_v2", |s| s.copy_dtoh(dst as usize, src as usize, n, stream as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    ctx_call("cuMemcpyDtoDAsync_v2", |s| {
        s.enqueue(stream as usize, state::Op::DtoD { dst: dst as usize, src: src as usize, n })
    })
}

// ---- tensor maps (TMA) ---------------------------------------------------------------------

/// cuTensorMapEncodeTiled, for what kernels/matmul_sm90.cu asks: rank 2, 16-bit elements,
/// element strides 1, no interleave, no swizzle or the 128-byte one, zero fill. The 128 bytes
/// are kernels/emu/wgmma.h's `TensorMap2d` (the emulated TMA reads them, checking the tag);
/// the argument checks are those cuTensorMapEncodeTiled documents (wgmma.h
/// `encode_tensor_map_2d` makes the same ones for the emulator's own tests).
#[no_mangle]
pub unsafe extern "C" fn cuTensorMapEncodeTiled(
    map: *mut cudarc::driver::sys::CUtensorMap,
    dtype: cudarc::driver::sys::CUtensorMapDataType,
    rank: c_uint,
    base: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    boxes: *const c_uint,
    elem_strides: *const c_uint,
    interleave: cudarc::driver::sys::CUtensorMapInterleave,
    swizzle: cudarc::driver::sys::CUtensorMapSwizzle,
    _l2: cudarc::driver::sys::CUtensorMapL2promotion,
    oob: cudarc::driver::sys::CUtensorMapFloatOOBfill,
) -> CUresult {
    use cudarc::driver::sys::{
        CUtensorMapDataType as D, CUtensorMapFloatOOBfill as O, CUtensorMapInterleave as I, CUtensorMapSwizzle as S,
    };
    let bad = |m: &str| fail(CUresult::CUDA_ERROR_INVALID_VALUE, &format!("cuTensorMapEncodeTiled: {m}"));
    if map.is_null() || dims.is_null() || strides.is_null() || boxes.is_null() || elem_strides.is_null() {
        return bad("a null pointer");
    }
    if rank != 2 {
        return bad("only rank 2 is modelled");
    }
    let elem: u64 = match dtype {
        D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 | D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16 => 2,
        _ => return bad("only bf16 / f16 elements are modelled"),
    };
    let swz: u32 = match swizzle {
        S::CU_TENSOR_MAP_SWIZZLE_NONE => 0,
        S::CU_TENSOR_MAP_SWIZZLE_128B => 3,
        _ => return bad("only no swizzle and the 128-byte swizzle are modelled"),
    };
    if interleave != I::CU_TENSOR_MAP_INTERLEAVE_NONE || oob != O::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE {
        return bad("only no interleave and zero fill are modelled");
    }
    let (d0, d1, st, b0, b1) = (*dims, *dims.add(1), *strides, *boxes as u64, *boxes.add(1) as u64);
    if *elem_strides != 1 || *elem_strides.add(1) != 1 {
        return bad("element strides other than 1 are not modelled");
    }
    if !(base as usize).is_multiple_of(16)
        || !st.is_multiple_of(16)
        || d0 == 0
        || d1 == 0
        || st < d0 * elem
        || b0 == 0
        || b1 == 0
        || b0 > 256
        || b1 > 256
        || !(b0 * elem).is_multiple_of(16)
        || (swz == 3 && b0 * elem > 128)
    {
        return bad(&format!(
            "address {base:p}, dims [{d0}, {d1}], row stride {st}, box [{b0}, {b1}]: outside what the driver accepts"
        ));
    }
    // wgmma.h TensorMap2d: tag, base, dim0, dim1, stride1 (u64 each), box0, box1, elem bytes, swizzle (u32 each).
    let mut w = [0u64; 16];
    w[0] = 0x74_6d61_7032_6400;
    w[1] = base as u64;
    w[2] = d0;
    w[3] = d1;
    w[4] = st;
    w[5] = b0 | (b1 << 32);
    w[6] = elem | ((swz as u64) << 32);
    std::ptr::copy_nonoverlapping(w.as_ptr() as *const u8, map as *mut u8, 128);
    CUresult::CUDA_SUCCESS
}

// ---- modules, functions, launches ----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    ctx_call("cuModuleLoadData", |s| {
        if image.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: null image"));
        }
        let head = std::slice::from_raw_parts(image as *const u8, 4);
        if head == b"\x7fELF" {
            return Err(fail(
                CUresult::CUDA_ERROR_NOT_SUPPORTED,
                "cuModuleLoadData: a cubin; the fake driver loads PTX text only",
            ));
        }
        let text = CStr::from_ptr(image as *const c_char).to_string_lossy();
        let id = s.load_module(&text)?;
        out(module, id as CUmodule)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleUnload(module: CUmodule) -> CUresult {
    ctx_call("cuModuleUnload", |s| s.unload_module(module as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(f: *mut CUfunction, module: CUmodule, name: *const c_char) -> CUresult {
    ctx_call("cuModuleGetFunction", |s| {
        if name.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: null name"));
        }
        let name = CStr::from_ptr(name).to_string_lossy();
        let id = s.get_function(module as usize, &name)?;
        out(f, id as CUfunction)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(v: *mut c_int, attrib: c_int, f: CUfunction) -> CUresult {
    ctx_call("cuFuncGetAttribute", |s| {
        let a = s.function_attribute(f as usize, attrib)?;
        out(v, a)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attrib: c_int, value: c_int) -> CUresult {
    ctx_call("cuFuncSetAttribute", |s| s.set_function_attribute(f as usize, attrib, value))
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    smem: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ctx_call("cuLaunchKernel", |s| {
        if !extra.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernel: `extra` is not modelled; pass kernelParams",
            ));
        }
        let op = s.make_launch(f as usize, [gx, gy, gz], [bx, by, bz], smem, params as *const *const c_void, false)?;
        s.enqueue(stream as usize, op)
    })
}

/// cuLaunchKernel with launch attributes: only programmatic stream serialization is modelled
/// (a kernel launched with it after another runs as that one's programmatic dependent:
/// state.rs `run_pair`); any other attribute is refused, by id.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const cudarc::driver::sys::CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    ctx_call("cuLaunchKernelEx", |s| {
        if config.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx: config is null"));
        }
        if !extra.is_null() {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "cuLaunchKernelEx: `extra` is not modelled; pass kernelParams",
            ));
        }
        let c = &*config;
        if c.numAttrs > 0 && c.attrs.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx: numAttrs > 0 with attrs null"));
        }
        let mut pdl = false;
        for i in 0..c.numAttrs as usize {
            let a = &*c.attrs.add(i);
            match a.id {
                cudarc::driver::sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION => {
                    pdl = a.value.programmaticStreamSerializationAllowed != 0;
                }
                other => {
                    return Err(fail(
                        CUresult::CUDA_ERROR_INVALID_VALUE,
                        &format!("cuLaunchKernelEx: launch attribute {other:?} is not modelled"),
                    ))
                }
            }
        }
        let grid = [c.gridDimX, c.gridDimY, c.gridDimZ];
        let block = [c.blockDimX, c.blockDimY, c.blockDimZ];
        let op = s.make_launch(f as usize, grid, block, c.sharedMemBytes, params as *const *const c_void, pdl)?;
        s.enqueue(c.hStream as usize, op)
    })
}

// ---- graphs --------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    ctx_call("cuGraphInstantiateWithFlags", |s| {
        if flags != 0 {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                "cuGraphInstantiateWithFlags: flags other than 0 are not modelled",
            ));
        }
        let id = s.instantiate(graph as usize)?;
        out(exec, id as CUgraphExec)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult {
    ctx_call("cuGraphUpload", |s| {
        s.exec(exec as usize)?;
        s.stream(stream as usize)?;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    ctx_call("cuGraphLaunch", |s| {
        let ops = s.exec(exec as usize)?;
        s.enqueue(stream as usize, state::Op::Graph(ops))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    ctx_call("cuGraphDestroy", |s| s.destroy_graph(graph as usize))
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    ctx_call("cuGraphExecDestroy", |s| s.destroy_exec(exec as usize))
}

// ---- what NVRTC asks of a driver it finds ---------------------------------------------------

/// NVRTC 13 opens libcuda.so.1 when it can and asks for the driver's private export tables;
/// the fake has none, and says so (NVRTC then compiles as it does without a driver).
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const c_void, _id: *const c_void) -> CUresult {
    if !table.is_null() {
        *table = std::ptr::null();
    }
    CUresult::CUDA_ERROR_NOT_FOUND
}
