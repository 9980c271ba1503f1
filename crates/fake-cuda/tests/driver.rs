//! The fake driver's own behaviour, through its C entry points, loaded from the `libcuda.so`
//! cargo built beside this test (as cudarc would load it): the checks that make host bugs show
//! (kernels/README.md, "the fake driver"). One test, in order: the last check leaves the
//! context with a sticky error, as a fault does on a GPU.

use std::ffi::{c_int, c_uint, c_void};

use libloading::Library;

type R = c_int;
const SUCCESS: R = 0;
const INVALID_VALUE: R = 1;
const INVALID_CONTEXT: R = 201;
const INVALID_PTX: R = 218;
const ILLEGAL_ADDRESS: R = 700;
const LAUNCH_OUT_OF_RESOURCES: R = 701;
const CAPTURE_UNSUPPORTED: R = 900;
const CAPTURE_INVALIDATED: R = 901;

/// kernels/add.cu `add(float* acc, const float* x, unsigned long long len)`, as NVRTC declares it.
const PTX: &str = ".version 9.0\n.target sm_90\n.address_size 64\n\n.visible .entry add(\n\t.param .u64 .ptr .align 1 add_param_0,\n\t.param .u64 .ptr .align 1 add_param_1,\n\t.param .u64 add_param_2\n)\n.maxntid 256, 1, 1\n{\n\tret;\n}\n";

struct Driver(Library);

impl Driver {
    fn f<T: Copy>(&self, name: &str) -> T {
        // SAFETY: the symbol's type is the one the caller names (the CUDA driver API's).
        unsafe { *self.0.get::<T>(name.as_bytes()).unwrap_or_else(|e| panic!("{name}: {e}")) }
    }
}

/// The fake driver built by `cargo build -p tandem-fake-cuda`, or None (said and counted as a
/// skip): `cargo test` builds no cdylib, and building it before the workspace's tests would put
/// a "driver" on the loader path cargo gives every test (target/debug), so the CUDA crate's
/// no-driver test would no longer see a machine without one. `cargo xtask test` runs this test
/// in the fake-driver group, after building the library.
fn driver() -> Option<Driver> {
    // target/<profile>/deps/driver-* -> target/<profile>/libcuda.so
    let exe = std::env::current_exe().unwrap();
    let lib = exe.parent().and_then(|d| d.parent()).unwrap().join("libcuda.so");
    if !lib.is_file() {
        let msg = format!("the fake driver's own test: {} is not built (`cargo build -p tandem-fake-cuda`; the fake-driver group of `cargo xtask test` runs it)", lib.display());
        eprintln!("SKIPPED: {msg}");
        if let Some(path) = std::env::var_os("TANDEM_SKIP_LOG") {
            use std::io::Write;
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = writeln!(f, "SKIPPED: {msg}");
            }
        }
        return None;
    }
    // SAFETY: our own library; its initialisers only set up the emulator's globals.
    Some(Driver(unsafe { Library::new(&lib) }.unwrap_or_else(|e| panic!("{}: {e}", lib.display()))))
}

#[test]
fn the_fake_driver_queues_checks_and_refuses() {
    let Some(d) = driver() else { return };
    unsafe {
        let init: unsafe extern "C" fn(c_uint) -> R = d.f("cuInit");
        let retain: unsafe extern "C" fn(*mut usize, c_int) -> R = d.f("cuDevicePrimaryCtxRetain");
        let set_current: unsafe extern "C" fn(usize) -> R = d.f("cuCtxSetCurrent");
        let stream_create: unsafe extern "C" fn(*mut usize, c_uint) -> R = d.f("cuStreamCreate");
        let sync: unsafe extern "C" fn(usize) -> R = d.f("cuStreamSynchronize");
        let load: unsafe extern "C" fn(*mut usize, *const c_void) -> R = d.f("cuModuleLoadData");
        let get_fn: unsafe extern "C" fn(*mut usize, usize, *const i8) -> R = d.f("cuModuleGetFunction");
        let alloc: unsafe extern "C" fn(*mut u64, usize, usize) -> R = d.f("cuMemAllocAsync");
        let free: unsafe extern "C" fn(u64, usize) -> R = d.f("cuMemFreeAsync");
        let host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> R = d.f("cuMemHostAlloc");
        let htod: unsafe extern "C" fn(u64, *const c_void, usize, usize) -> R = d.f("cuMemcpyHtoDAsync_v2");
        let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize, usize) -> R = d.f("cuMemcpyDtoHAsync_v2");
        let memset: unsafe extern "C" fn(u64, u8, usize, usize) -> R = d.f("cuMemsetD8Async");
        type Launch = unsafe extern "C" fn(
            usize,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            usize,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> R;
        let launch: Launch = d.f("cuLaunchKernel");
        let begin: unsafe extern "C" fn(usize, c_int) -> R = d.f("cuStreamBeginCapture_v2");
        let end: unsafe extern "C" fn(usize, *mut usize) -> R = d.f("cuStreamEndCapture");
        let instantiate: unsafe extern "C" fn(*mut usize, usize, u64) -> R = d.f("cuGraphInstantiateWithFlags");
        let graph_launch: unsafe extern "C" fn(usize, usize) -> R = d.f("cuGraphLaunch");

        assert_eq!(init(0), SUCCESS);
        let mut s = 0usize;
        assert_eq!(stream_create(&mut s, 1), INVALID_CONTEXT, "a stream without a current context");
        let mut ctx = 0usize;
        assert_eq!(retain(&mut ctx, 0), SUCCESS);
        assert_eq!(set_current(ctx), SUCCESS);
        assert_eq!(stream_create(&mut s, 1), SUCCESS);

        // A PTX parameter list that differs from the host build's signature fails the load.
        let mut m = 0usize;
        let drifted = PTX.replace(",\n\t.param .u64 add_param_2", "");
        let drifted = std::ffi::CString::new(drifted).unwrap();
        assert_eq!(load(&mut m, drifted.as_ptr() as *const c_void), INVALID_PTX, "signature drift");
        let ptx = std::ffi::CString::new(PTX).unwrap();
        assert_eq!(load(&mut m, ptx.as_ptr() as *const c_void), SUCCESS);
        let mut f = 0usize;
        assert_eq!(get_fn(&mut f, m, c"add".as_ptr()), SUCCESS);

        // Fresh device memory is poisoned.
        let n = 300usize;
        let (mut acc, mut x) = (0u64, 0u64);
        assert_eq!(alloc(&mut acc, n * 4, s), SUCCESS);
        assert_eq!(alloc(&mut x, n * 4, s), SUCCESS);
        let mut back = vec![0f32; n];
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, acc, n * 4, s), SUCCESS);
        assert!(back.iter().all(|v| v.to_bits() == 0xffff_ffff), "fresh memory not poisoned");

        // A copy from page-locked memory reads it when the queue runs, not at the call.
        let mut pinned: *mut c_void = std::ptr::null_mut();
        assert_eq!(host_alloc(&mut pinned, n * 4, 0), SUCCESS);
        let host = std::slice::from_raw_parts_mut(pinned as *mut f32, n);
        host.iter_mut().enumerate().for_each(|(i, v)| *v = i as f32);
        assert_eq!(htod(x, pinned, n * 4, s), SUCCESS);
        assert_eq!(memset(acc, 0, n * 4, s), SUCCESS);
        let len = n as u64;
        let mut args: [*mut c_void; 3] =
            [&mut acc as *mut u64 as *mut c_void, &mut x as *mut u64 as *mut c_void, &len as *const u64 as *mut c_void];
        let blocks = n.div_ceil(256) as c_uint;
        assert_eq!(launch(f, blocks, 1, 1, 256, 1, 1, 0, s, args.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        host.iter_mut().for_each(|v| *v += 1000.0); // before any wait: the copy sees this
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, acc, n * 4, s), SUCCESS);
        assert!(
            back.iter().enumerate().all(|(i, &v)| v == i as f32 + 1000.0),
            "the copy ran before the host waited: {:?}",
            &back[..4]
        );

        // Launch bounds (.maxntid 256) and shared memory (48 KiB without opting in).
        assert_eq!(
            launch(f, 1, 1, 1, 512, 1, 1, 0, s, args.as_mut_ptr(), std::ptr::null_mut()),
            LAUNCH_OUT_OF_RESOURCES
        );
        assert_eq!(launch(f, 1, 1, 1, 256, 1, 1, 64 << 10, s, args.as_mut_ptr(), std::ptr::null_mut()), INVALID_VALUE);

        // Capture refuses allocation from the capturing thread, and the capture is lost.
        assert_eq!(begin(s, 1), SUCCESS);
        let mut tmp = 0u64;
        assert_eq!(alloc(&mut tmp, 64, s), CAPTURE_UNSUPPORTED);
        let mut g = 0usize;
        assert_eq!(end(s, &mut g), CAPTURE_INVALIDATED);

        // A graph replayed over a buffer freed since its capture: an illegal address when it
        // runs, and the context is unusable from then on.
        assert_eq!(begin(s, 1), SUCCESS);
        assert_eq!(launch(f, blocks, 1, 1, 256, 1, 1, 0, s, args.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        assert_eq!(end(s, &mut g), SUCCESS);
        let mut exec = 0usize;
        assert_eq!(instantiate(&mut exec, g, 0), SUCCESS);
        assert_eq!(graph_launch(exec, s), SUCCESS);
        assert_eq!(sync(s), SUCCESS);
        assert_eq!(dtoh(back.as_mut_ptr() as *mut c_void, acc, n * 4, s), SUCCESS);
        assert!(
            back.iter().enumerate().all(|(i, &v)| v == 2.0 * (i as f32 + 1000.0)),
            "the replay did not add x again"
        );
        // Programmatic dependent launch: add(acc, x), then add(y, acc) launched with the
        // programmatic-stream-serialization attribute (cuLaunchKernelEx). The dependent runs
        // first in the fake and its primary at its first block's PDL_WAIT (add waits at the
        // top), so y sees the new acc; eagerly and replayed from a graph (the pairing
        // alternates between replays), and an attribute the fake does not model is refused.
        use cudarc::driver::sys::{CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig};
        let launch_ex: unsafe extern "C" fn(*const CUlaunchConfig, usize, *mut *mut c_void, *mut *mut c_void) -> R =
            d.f("cuLaunchKernelEx");
        let mut y = 0u64;
        assert_eq!(alloc(&mut y, n * 4, s), SUCCESS);
        assert_eq!(memset(y, 0, n * 4, s), SUCCESS);
        let mut dep: [*mut c_void; 3] =
            [&mut y as *mut u64 as *mut c_void, &mut acc as *mut u64 as *mut c_void, &len as *const u64 as *mut c_void];
        let mut attr: CUlaunchAttribute = std::mem::zeroed();
        attr.id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = CUlaunchConfig {
            gridDimX: blocks,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 256,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: s as _,
            attrs: &mut attr,
            numAttrs: 1,
        };
        let mut want = back.clone();
        let mut y_want = vec![0f32; n];
        let step = |want: &mut Vec<f32>, y_want: &mut Vec<f32>| {
            for i in 0..n {
                want[i] += i as f32 + 1000.0;
                y_want[i] += want[i];
            }
        };
        assert_eq!(launch(f, blocks, 1, 1, 256, 1, 1, 0, s, args.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        assert_eq!(launch_ex(&cfg, f, dep.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        step(&mut want, &mut y_want);
        let mut got = vec![0f32; n];
        assert_eq!(dtoh(got.as_mut_ptr() as *mut c_void, y, n * 4, s), SUCCESS);
        assert_eq!(got, y_want, "the programmatic dependent did not see its primary's output");
        let mut g2 = 0usize;
        assert_eq!(begin(s, 1), SUCCESS);
        assert_eq!(launch(f, blocks, 1, 1, 256, 1, 1, 0, s, args.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        assert_eq!(launch_ex(&cfg, f, dep.as_mut_ptr(), std::ptr::null_mut()), SUCCESS);
        assert_eq!(end(s, &mut g2), SUCCESS);
        let mut exec2 = 0usize;
        assert_eq!(instantiate(&mut exec2, g2, 0), SUCCESS);
        for _ in 0..2 {
            assert_eq!(graph_launch(exec2, s), SUCCESS);
            step(&mut want, &mut y_want);
        }
        assert_eq!(dtoh(got.as_mut_ptr() as *mut c_void, y, n * 4, s), SUCCESS);
        assert_eq!(got, y_want, "a replayed programmatic dependent did not see its primary's output");
        assert_eq!(dtoh(got.as_mut_ptr() as *mut c_void, acc, n * 4, s), SUCCESS);
        assert_eq!(got, want);
        (*cfg.attrs).id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        assert_eq!(
            launch_ex(&cfg, f, dep.as_mut_ptr(), std::ptr::null_mut()),
            INVALID_VALUE,
            "an attribute the fake does not model"
        );

        assert_eq!(free(x, s), SUCCESS);
        assert_eq!(graph_launch(exec, s), SUCCESS);
        assert_eq!(sync(s), ILLEGAL_ADDRESS, "a replay over a freed buffer");
        assert_eq!(sync(s), ILLEGAL_ADDRESS, "the error is sticky");
    }
    // Never unloaded, as cudarc never unloads the driver: its fault handler stays installed.
    std::mem::forget(d);
}
