//! [`CudaBackend`]: `tandem_core::Backend` on one NVIDIA GPU through cudarc.
//!
//! Start-up: is libcuda there (else a clear error, never a panic), is libnvrtc there, create
//! the context, compile every kernel file with NVRTC for the device's compute capability
//! (PTX cached on disk), load the modules and resolve every kernel handle once (`Kernels`).
//! Each op checks its buffers' kinds and lengths on the host, then enqueues kernels on one
//! stream of our own (not the legacy NULL stream); nothing waits until a read. With
//! `TANDEM_CUDA_SYNC=1` every launch is followed by a synchronize, so an asynchronous fault is
//! reported against the kernel that caused it.
//!
//! The KV cache is bf16 by default, f32 or fp8 (e4m3, e5m2, with a scale) on request
//! (`LoadOptions::kv_dtype`; see kernels/kv_write.cu): a cache buffer records its element
//! kind, and kv_write and attention pick their kernel by it. Buffers are untyped device bytes with a recorded element kind, so
//! one buffer type serves activations, ids, weights of any dtype and KV caches.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaStream, DriverError, LaunchConfig};
use tandem_core::backend::{Device, WorkspaceLimits};
use tandem_core::Result;

use crate::error::{drv, err, NO_DRIVER};
use crate::kernels::{compile_modules, load_module, Image, Kernel, Kernels};
use crate::launch::{cfg, u32_of};
use crate::sources::{self, KernelSource};
use crate::switches::Switches;
use crate::toolchain::Toolchain;
use crate::workspace::{AttnScratch, IoScratch, MatmulScratch};
use crate::{attention, compile::compile_ptx_cached, gemm, graph, launch, moe};

/// The persistent wgmma kernels (kernels/matmul_sm90.cu `matmul_wgmma_ws*`): `[dtype]` each,
/// bf16 then f16, and the SM count their grid covers (gemm.rs `wgmma_ws_grid`).
pub(crate) struct WgmmaWs {
    pub(crate) tile: [Kernel<CudaFunction>; 2],
    pub(crate) wide: [Kernel<CudaFunction>; 2],
    pub(crate) sms: usize,
}

pub struct CudaBackend {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) kernels: Kernels<CudaFunction>,
    /// kernels/matmul_sm90.cu's `matmul_wgmma_bf16` / `_f16`, loaded only with
    /// TANDEM_CUDA_GEMM_LARGE=wgmma on an sm_90 GPU (matmul.rs `wgmma_applies`).
    pub(crate) wgmma: Option<[Kernel<CudaFunction>; 2]>,
    /// The persistent, warp-specialised wgmma kernels, loaded only with
    /// TANDEM_CUDA_GEMM_LARGE=wgmma_ws on an sm_90 GPU.
    pub(crate) wgmma_ws: Option<WgmmaWs>,
    /// kernels/paged_attention_sm90.cu's `paged_attention_wgmma_d64` / `_d128` / `_d256`, loaded
    /// only with TANDEM_CUDA_ATTENTION=wgmma on an sm_90 GPU (attention.rs).
    pub(crate) wgmma_attn: Option<[Kernel<CudaFunction>; 3]>,
    /// cuBLASLt (cublaslt.rs), opened only with TANDEM_CUDA_GEMM=cublaslt or
    /// [`CudaBackend::set_gemm_cublaslt`]: where present it computes every plain 16-bit
    /// projection without bias, and the fused projections are declined.
    pub(crate) cublaslt: Option<crate::cublaslt::CublasLt>,
    pub(crate) scratch: Mutex<AttnScratch>,
    pub(crate) mm_scratch: Mutex<MatmulScratch>,
    pub(crate) io_scratch: Mutex<IoScratch>,
    pub(crate) moe_scratch: Mutex<moe::MoeScratch>,
    /// Which path a mixture of experts takes (`TANDEM_CUDA_MOE`, moe.rs).
    pub(crate) moe_path: moe::MoePath,
    /// Kernels launched so far ([`CudaBackend::launches`]).
    pub(crate) launches: AtomicU64,
    /// CUDA graphs captured at load (graph.rs), and whether a capture is open.
    pub(crate) graphs: Mutex<graph::Graphs>,
    pub(crate) capturing: std::sync::atomic::AtomicBool,
    pub(crate) sync_each: bool,
    /// `TANDEM_CUDA_PDL=1` on sm_90+: the kernels (CUfunction handles) launched with
    /// programmatic dependent launch ([`launch::PDL_FILES`]); empty otherwise.
    pub(crate) pdl: std::collections::HashSet<usize>,
    /// Keep every activation in f32 (`TANDEM_CUDA_ACTIVATIONS=f32`, or
    /// [`CudaBackend::set_f32_activations`]): the same bits, more bytes; for checks.
    pub(crate) f32_activations: bool,
    /// The `TANDEM_CUDA_*` switches as this load read them (switches.rs).
    pub(crate) switches: Switches,
    pub(crate) arch: String,
    pub(crate) device_name: String,
}

impl CudaBackend {
    /// Opens GPU `device_ordinal` and compiles the kernels for it. Kernel sources come from
    /// `TANDEM_KERNEL_DIR` when set, else from the copies built into this binary.
    pub fn new(device_ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the driver library and drops it again.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(err(NO_DRIVER));
        }
        if !Toolchain::nvrtc_loadable() {
            return Err(err(format!(
                "the CUDA backend compiles its kernels at start-up, but {}",
                Toolchain::discover().nvrtc_missing_message()
            )));
        }
        let srcs = match std::env::var_os("TANDEM_KERNEL_DIR").filter(|v| !v.is_empty()) {
            Some(dir) => sources::from_dir(std::path::Path::new(&dir))?,
            None => sources::embedded(),
        };
        // cudarc panics when a driver symbol it expects is missing (a driver older than CUDA 13).
        let ctx = std::panic::catch_unwind(|| CudaContext::new(device_ordinal))
            .map_err(|_| err("creating the CUDA context panicked: is the driver older than CUDA 13.0? (see stderr)"))?
            .map_err(drv(&format!("opening GPU {device_ordinal}")))?;
        // One stream orders everything; per-buffer events would only add cost.
        // SAFETY: all work of this backend goes to the one stream below.
        unsafe { ctx.disable_event_tracking() };
        // Our own stream, not the legacy NULL stream: the NULL stream synchronizes with every
        // other stream of the context (a profiler's, a library's) and is what CUDA graph
        // capture cannot use.
        let stream = ctx.new_stream().map_err(drv("creating the stream"))?;
        let (maj, min) = ctx.compute_capability().map_err(drv("compute capability"))?;
        if maj < 8 {
            return Err(err(format!(
                "GPU {device_ordinal} is sm_{maj}{min}; the kernels need sm_80 or newer (bf16 mma.sync, cp.async)"
            )));
        }
        let arch = format!("{maj}{min}");
        // kernels/matmul_sm90.cu (wgmma + TMA, sm_90a) is compiled and loaded only when asked for.
        let switches = Switches::from_env()?;
        switches.log();
        let variants = switches.gemm;
        let sm90 = variants.wgmma || variants.wgmma_ws;
        if sm90 && arch != "90" {
            let which = if variants.wgmma { "wgmma" } else { "wgmma_ws" };
            return Err(err(format!(
                "TANDEM_CUDA_GEMM_LARGE={which} needs an sm_90 (Hopper) GPU; GPU {device_ordinal} is sm_{arch}"
            )));
        }
        // So is kernels/paged_attention_sm90.cu (wgmma prefill attention).
        let attn_sm90 = switches.attention == attention::AttnVariant::Wgmma;
        if attn_sm90 && arch != "90" {
            return Err(err(format!(
                "TANDEM_CUDA_ATTENTION=wgmma needs an sm_90 (Hopper) GPU; GPU {device_ordinal} is sm_{arch}"
            )));
        }
        let srcs: Vec<KernelSource> = srcs
            .into_iter()
            .filter(|s| (s.name != "matmul_sm90" || sm90) && (s.name != "paged_attention_sm90" || attn_sm90))
            .collect();
        let device_name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let include = Toolchain::discover().include_dir;
        let images = compile_modules(&srcs, &arch, include.as_ref(), switches.cubin)?;
        let mut funcs = HashMap::new();
        let pdl_on = switches.pdl;
        if pdl_on && maj < 9 {
            tracing::warn!("TANDEM_CUDA_PDL=1: GPU {device_ordinal} is sm_{arch}, below sm_90; launching without it");
        }
        let mut pdl_names = std::collections::HashSet::new();
        for (src, image) in srcs.iter().zip(images) {
            let cubin = matches!(image, Image::Cubin(_));
            let before: std::collections::HashSet<String> = funcs.keys().cloned().collect();
            let pdl_file = launch::PDL_FILES.contains(&src.name.as_str());
            let mut note = |funcs: &HashMap<String, CudaFunction>| {
                if pdl_file {
                    pdl_names.extend(funcs.keys().filter(|k| !before.contains(*k)).cloned());
                }
            };
            if let Err(e) = load_module(&ctx, src, image, &mut funcs) {
                if !cubin {
                    return Err(e);
                }
                // Not seen yet (the cubin path has not met a GPU): the PTX the driver compiles
                // itself is the path that has.
                tracing::warn!("{}.cu: the driver refused its sm_{arch} cubin ({e}); loading PTX instead", src.name);
                load_module(&ctx, src, Image::Ptx(compile_ptx_cached(src, &arch, include.as_ref())?), &mut funcs)?;
            }
            note(&funcs);
        }
        let loaded = funcs.len();
        let pdl: std::collections::HashSet<usize> = if pdl_on && maj >= 9 {
            pdl_names.iter().filter_map(|n| funcs.get(n)).map(|f| f.cu_function() as usize).collect()
        } else {
            Default::default()
        };
        if !pdl.is_empty() {
            tracing::info!("cuda: programmatic dependent launch for {} kernels (TANDEM_CUDA_PDL)", pdl.len());
        }
        let mut sm90_kernel = |name: &'static str, smem: u32| -> Result<Kernel<CudaFunction>> {
            let f = funcs
                .remove(name)
                .ok_or_else(|| err(format!("kernel `{name}` is not in the loaded modules (kernels/*_sm90.cu)")))?;
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(drv(&format!("{name}: {smem} bytes of shared memory")))?;
            Ok(Kernel { name, f })
        };
        let wgmma = if variants.wgmma {
            let k = &mut sm90_kernel;
            Some([k(gemm::WGMMA_KERNELS[0], gemm::WGMMA_SMEM)?, k(gemm::WGMMA_KERNELS[1], gemm::WGMMA_SMEM)?])
        } else {
            None
        };
        let wgmma_ws = if variants.wgmma_ws {
            let k = &mut sm90_kernel;
            let [[t0, t1], [w0, w1]] = gemm::WGMMA_WS_KERNELS;
            let [s0, s1] = gemm::WGMMA_WS_SMEM;
            let sms = ctx
                .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(drv("the multiprocessor count"))?;
            Some(WgmmaWs { tile: [k(t0, s0)?, k(t1, s0)?], wide: [k(w0, s1)?, k(w1, s1)?], sms: sms.max(1) as usize })
        } else {
            None
        };
        let wgmma_attn = if attn_sm90 {
            let k = &mut sm90_kernel;
            let [n0, n1, n2] = attention::PAW_KERNELS;
            let [s0, s1, s2] = attention::PAW_SMEM.map(|b| b as u32);
            Some([k(n0, s0)?, k(n1, s1)?, k(n2, s2)?])
        } else {
            None
        };
        let kernels = Kernels::resolve(|name| {
            funcs
                .remove(name)
                .ok_or_else(|| err(format!("kernel `{name}` is not in the loaded modules (edited kernels/*.cu?)")))
        })?;
        // Tile kernels with more than 48 KiB of dynamic shared memory opt in to it.
        for row in &kernels.matmul_tc {
            for (kern, g) in row.iter().zip(gemm::GEMM_KERNELS) {
                if g.smem > gemm::SMEM_DEFAULT_LIMIT {
                    kern.f
                        .set_attribute(
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            g.smem as i32,
                        )
                        .map_err(drv(&format!("{}: {} bytes of shared memory", kern.name, g.smem)))?;
                }
            }
        }
        // The tc_deep attention at head_dim 128 takes more than 48 KiB.
        for (kern, &bytes) in kernels.attn_tc_deep.iter().zip(&attention::PATD_SMEM) {
            if bytes as u32 > gemm::SMEM_DEFAULT_LIMIT {
                kern.f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(drv(&format!("{}: {bytes} bytes of shared memory", kern.name)))?;
            }
        }
        // The tc_shared attention's K/V tile ring takes more than 48 KiB at both head sizes.
        for (kern, &bytes) in kernels.attn_tc_shared.iter().zip(&attention::PATS_SMEM) {
            if bytes as u32 > gemm::SMEM_DEFAULT_LIMIT {
                kern.f
                    .set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )
                    .map_err(drv(&format!("{}: {bytes} bytes of shared memory", kern.name)))?;
            }
        }
        // So does tc at head_dim 256 (four warps, each with a third buffer for q), and its fp8 form.
        for d256 in [&kernels.attn_tc[2], &kernels.attn_tc_fp8[0][2], &kernels.attn_tc_fp8[1][2]] {
            d256.f
                .set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    attention::PAT_SMEM_D256 as i32,
                )
                .map_err(drv(&format!("{}: {} bytes of shared memory", d256.name, attention::PAT_SMEM_D256)))?;
        }
        let cublaslt = if switches.cublaslt { Some(crate::cublaslt::CublasLt::open(&stream)?) } else { None };
        let sync_each = switches.sync;
        let f32_activations = switches.f32_activations;
        let moe_path = switches.moe;
        tracing::info!("cuda: {device_name} (sm_{arch}), {loaded} kernels from {} files", srcs.len());
        Ok(CudaBackend {
            ctx,
            stream,
            kernels,
            wgmma,
            wgmma_ws,
            wgmma_attn,
            cublaslt,
            scratch: Mutex::new(AttnScratch::default()),
            mm_scratch: Mutex::new(MatmulScratch::default()),
            io_scratch: Mutex::new(IoScratch::default()),
            moe_scratch: Mutex::new(moe::MoeScratch::default()),
            moe_path,
            launches: AtomicU64::new(0),
            graphs: Mutex::new(graph::Graphs::default()),
            capturing: std::sync::atomic::AtomicBool::new(false),
            sync_each,
            pdl,
            f32_activations,
            switches,
            arch,
            device_name,
        })
    }

    /// Stores every activation in f32 from now on (models loaded after this call); the
    /// tokens are the same bits either way (kernels/matmul.cu's contract), which the GPU
    /// tests check by loading one model each way.
    pub fn set_f32_activations(&mut self, on: bool) {
        self.f32_activations = on;
    }

    /// Computes the plain 16-bit projections through cuBLASLt (`on`), or through our tile
    /// kernels, for models loaded after this call (TANDEM_CUDA_GEMM's choice otherwise): the
    /// fused projections are declined while it is on. Not batch-invariant (cublaslt.rs). An
    /// error names the library when it is absent.
    pub fn set_gemm_cublaslt(&mut self, on: bool) -> Result<()> {
        self.cublaslt = match (on, self.cublaslt.take()) {
            (false, _) => None,
            (true, Some(lt)) => Some(lt),
            (true, None) => Some(crate::cublaslt::CublasLt::open(&self.stream)?),
        };
        Ok(())
    }

    /// Whether cuBLASLt computes the plain projections ([`CudaBackend::set_gemm_cublaslt`]).
    pub fn gemm_cublaslt(&self) -> bool {
        self.cublaslt.is_some()
    }

    /// Routes mixtures of experts (each expert over its own tokens) or runs every expert over
    /// every token, for models loaded after this call (`TANDEM_CUDA_MOE`'s choice otherwise);
    /// the same bits either way, which the GPU tests check by loading one model each way.
    pub fn set_moe_routed(&mut self, on: bool) {
        self.moe_path = if on { moe::MoePath::Routed } else { moe::MoePath::Dense };
    }

    /// `"90"` for an H100/H200.
    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Waits for all queued work and reports any fault it raised.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(drv("synchronize"))
    }

    /// Kernels this backend has launched since it was created (every enqueue that succeeded):
    /// the difference over one forward is its launch count, what the fused ops bring down.
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// A launch of `f` on the stream, with programmatic dependent launch where it is on for `f`.
    pub(crate) fn launch_args<'a>(&'a self, f: &'a CudaFunction) -> launch::Launch<'a> {
        launch::Launch::new(&self.stream, f, !self.pdl.is_empty() && self.pdl.contains(&(f.cu_function() as usize)))
    }

    /// Whether kernels are launched with programmatic dependent launch (`TANDEM_CUDA_PDL=1` on sm_90+).
    pub fn pdl(&self) -> bool {
        !self.pdl.is_empty()
    }

    /// Turns a launch result into ours and, in sync mode, waits for the kernel.
    pub(crate) fn launched<T>(&self, name: &str, r: std::result::Result<T, DriverError>) -> Result<()> {
        r.map_err(drv(&format!("launching {name}")))?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // A synchronize inside a capture would invalidate it.
        if self.sync_each && !self.capturing.load(Ordering::Relaxed) {
            self.stream.synchronize().map_err(drv(&format!("{name} (TANDEM_CUDA_SYNC=1)")))?;
        }
        Ok(())
    }

    /// Elementwise kernels over `len` values: grid ceil(len / 256), block 256.
    pub(crate) fn elementwise_cfg(len: usize, op: &str) -> Result<LaunchConfig> {
        Ok(cfg((u32_of(len.div_ceil(256), op, "blocks")?, 1, 1), 256))
    }
}

impl Device for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<()> {
        self.begin_capture_impl()
    }

    fn end_capture(&self) -> Result<tandem_core::backend::GraphId> {
        self.end_capture_impl()
    }

    fn replay(&self, graph: tandem_core::backend::GraphId) -> Result<()> {
        self.replay_impl(graph)
    }

    fn launch_count(&self) -> Option<u64> {
        Some(self.launches())
    }

    fn sync(&self) -> Result<()> {
        // On the fake driver a failed capture is an error (graph.rs says why).
        self.capture_failed_on_fake()?;
        self.synchronize()
    }

    fn free_memory(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(free, _total)| free as u64)
    }

    fn total_memory(&self) -> Option<u64> {
        self.ctx.mem_get_info().ok().map(|(_free, total)| total as u64)
    }

    fn reserve_workspace(&self, l: &WorkspaceLimits) -> Result<u64> {
        self.reserve(l)
    }
}
