//! `WgpuBackend`: the `tandem_core::Backend` ops, each a WGSL kernel from `shaders/`.
//! Every op checks its buffers' kinds and lengths on the host first, so a bad call is an error
//! naming the op and buffer, never an out-of-bounds access on the device.
//!
//! This file holds the backend's state and its construction; each group of the `Backend` trait
//! is implemented in its own file: `device`, `storage`, `ops` (with `lora`), `fused_ops`,
//! `sampling`; `quant` runs weights kept in a GGUF block layout. The projections all run through `matmul`; `operand` holds the host-side
//! checks every op starts with.

use std::path::PathBuf;
use std::sync::Mutex;

use tandem_core::backend::KvDtype;
use tandem_core::{Error, Result};

use crate::adapter;
use crate::buffer::{Texels, WgpuBuf};
use crate::recorder::Recorder;
use crate::shaders::{self, Pipelines};

mod device;
mod fused_ops;
mod lora;
mod matmul;
mod operand;
mod ops;
mod quant;
mod quant_tile;
mod sampling;
mod storage;

/// The KV element types this backend stores, its default first: f32 (in buffers or textures),
/// fp8 e4m3 and e5m2 (u32 words of four bytes, `crate::fp8_codec`).
const KV_DTYPES: &[KvDtype] = &[KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2];

/// Construction options beyond the defaults.
#[derive(Debug, Clone, Default)]
pub struct WgpuOptions {
    /// Read `*.wgsl` from here instead of the compiled-in sources (else `TANDEM_SHADER_DIR`).
    pub shader_dir: Option<PathBuf>,
    /// Use a storage binding limit below the adapter's (tests of the chunked weight paths).
    pub max_storage_binding: Option<u64>,
    /// Attention and rms_norm with one invocation per (token, head) / row (`Some(true)`), or one
    /// workgroup (`Some(false)`); by default `TANDEM_WGPU_KERNELS=lane|workgroup`, else lanes on
    /// CPU adapters and workgroups on GPUs.
    pub lane_kernels: Option<bool>,
    /// Hold tiled weight matrices in textures (`Some(true)` where the adapter can), or in
    /// buffers; by default `TANDEM_WGPU_TEXELS=0|1`, else textures on CPU adapters. With
    /// texel weights the KV caches are textures too, unless `TANDEM_WGPU_KV_TEXELS=0`.
    pub texel_weights: Option<bool>,
    /// Fold the residual adds and RMS norms into the projections at decode steps of at most two
    /// tokens (`Backend::fuses_norm`): `Some(true)` on, `Some(false)` off; by default
    /// `TANDEM_WGPU_FUSE_NORM=0|1`, else off. Off by default because the fused path scales the
    /// projection of `h * gamma` by `1 / rms(h)`, which rounds differently from projecting
    /// `rms_norm(h) * gamma`: a sequence's logits then depend on whether its step had 1-2 or more
    /// tokens, so greedy tokens alone and in a batch could differ at near-ties
    /// (tests/wgpu/model.rs `decode_logits_are_bitwise_the_same_alone_and_in_a_batch` measured
    /// 343 of 384 logits differing with it on). On lavapipe it saved no measurable time
    /// (docs/bench-cpu.md, "fewer dispatches per token").
    pub fuse_norm: Option<bool>,
    /// The quantized matmul's tile kernel (shaders/quant_tile.wgsl) from this many rows of x
    /// up (0: never); `None`: `TANDEM_WGPU_QUANT_TILE_M`, default 0. Off by default: on
    /// lavapipe it measured slower than the GEMV kernels at prefill and its pipelines take
    /// minutes to compile for some decoders (docs/results/2026-12-07-wgpu-quant-prefill).
    pub quant_tile_m: Option<usize>,
}

pub struct WgpuBackend {
    rec: Recorder,
    /// Largest storage binding this backend uses (the adapter's, or smaller if asked).
    max_binding: u64,
    argmax_out: Mutex<Option<WgpuBuf>>,
    /// One invocation per (token, head) / row in attention and rms_norm instead of a workgroup:
    /// faster on CPU adapters (no barriers, no workgroup memory).
    lane_kernels: bool,
    /// Lanes per matmul workgroup, and weight rows per lane at decode shapes (m <= 2).
    matmul_wg: u32,
    matmul_rt: u32,
    /// Rows of x and of w per invocation from three rows of x up (prefill, batched decode).
    prefill_mt: u32,
    prefill_rt: u32,
    /// Matmul may read x through a uniform buffer (`TANDEM_WGPU_UNIFORM_X=0` turns it off).
    uniform_x: bool,
    /// Most loop iterations one invocation may run, where the driver has such a limit.
    loop_limit: Option<usize>,
    /// Store weight matrices tiled (`TANDEM_WGPU_TILED=0` keeps them row-major, to compare).
    tiled_weights: bool,
    /// Hold tiled weight matrices in textures (see `buffer::Texels`): by default on CPU
    /// adapters that can read rgba32uint storage textures; `TANDEM_WGPU_TEXELS=0|1` decides.
    texel_weights: bool,
    /// Hold quantized weights whose layout has one in the split layout in textures
    /// (`crate::quant_split`): with texel weights, unless `TANDEM_WGPU_QUANT_TEXELS=0`.
    quant_texels: bool,
    /// Weight rows per lane of the split-layout quantized matmul from three rows of x up
    /// (`TANDEM_WGPU_QUANT_PREFILL_RT`): each x load then serves that many rows. 4 against 1
    /// on lavapipe (SmolLM2 Q8_0, 64-token prefill): ~1.3-2.0 s against ~6.5 s; see
    /// docs/results/2026-12-07-wgpu-quant-prefill.
    quant_prefill_rt: u32,
    /// The quantized matmul's tile kernel from this many rows of x up (0: never), and its
    /// weight rows and k values a step (`TANDEM_WGPU_QUANT_TILE_M`, `_N`, `_KC`).
    quant_tile_m: usize,
    quant_tile_n: usize,
    quant_tile_kc: usize,
    /// Fuse the q/k/v and the gate/up projections at load (`TANDEM_WGPU_FUSE=0` keeps them apart).
    fuse: bool,
    /// Fuse the residual adds and norms into the projections (`Backend::fuses_norm`): off by
    /// default, see `WgpuOptions::fuse_norm`.
    fuse_norm: bool,
    /// Forward passes of at most this many tokens fuse norms (`TANDEM_WGPU_FUSE_NORM_ROWS`, 2).
    fuse_norm_rows: usize,
    /// Apply rope and write the KV cache in the q/k/v projection's epilogue where the shapes
    /// allow (`TANDEM_WGPU_FUSE_ROPE=0` runs rope_kv_write after it).
    fuse_rope: bool,
    /// Where matmul copies a batch's x on texture-holding adapters (see `matmul_to`).
    x_scratch: Mutex<Option<Texels>>,
    /// KV caches in textures ([`Texels`], 4 f32 per texel) rather than storage buffers: on a
    /// CPU-side Vulkan attention's K and V loads become gathers instead of lane-by-lane loops.
    kv_texels: bool,
    /// Bytes of the weight buffers and textures uploaded so far (`Device::weight_bytes`).
    weight_bytes: std::sync::atomic::AtomicU64,
}

/// llvmpipe/lavapipe ends every loop of a shader once the invocation has run 65535 loop
/// iterations in total, all loops together (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS): results
/// past that are silently wrong. On CPU adapters the ops size their loops against this (with
/// a margin) and refuse, with an error, work that would exceed it.
const LAVAPIPE_LOOP_LIMIT: usize = 65535 - 1024;

/// Bytes of the uniform window matmul reads x through (the smallest maximum uniform binding
/// Vulkan allows is 16 KiB; lavapipe and common GPUs allow 64 KiB, checked at start-up).
const UNIFORM_WINDOW: u64 = 65536;

impl WgpuBackend {
    /// Opens the Vulkan adapter (or those `TANDEM_WGPU_BACKENDS` names); shaders from
    /// `TANDEM_SHADER_DIR` if set, else compiled in.
    pub fn new() -> Result<Self> {
        Self::with_options(WgpuOptions::default())
    }

    /// Like [`WgpuBackend::new`], with shaders read from `dir` at run time.
    pub fn with_shader_dir(dir: impl Into<PathBuf>) -> Result<Self> {
        Self::with_options(WgpuOptions { shader_dir: Some(dir.into()), ..Default::default() })
    }

    pub fn with_options(opts: WgpuOptions) -> Result<Self> {
        let dir = opts.shader_dir.or_else(|| std::env::var_os(shaders::SHADER_DIR_ENV).map(PathBuf::from));
        if let Some(d) = &dir {
            if !d.is_dir() {
                return Err(Error::config(d, "shader directory does not exist"));
            }
        }
        let gpu = adapter::open()?;
        let adapter_max = gpu.limits.max_storage_buffer_binding_size;
        let max_binding = opts.max_storage_binding.map_or(adapter_max, |m| m.min(adapter_max)) / 4 * 4;
        let lane_kernels = match (opts.lane_kernels, std::env::var("TANDEM_WGPU_KERNELS").as_deref()) {
            (Some(v), _) => v,
            (None, Ok("lane")) => true,
            (None, Ok("workgroup")) => false,
            _ => gpu.summary.device_type == wgpu::DeviceType::Cpu,
        };
        let gpu_limits_uniform = gpu.limits.max_uniform_buffer_binding_size;
        let loop_limit = (gpu.summary.device_type == wgpu::DeviceType::Cpu).then_some(LAVAPIPE_LOOP_LIMIT);
        let pipelines = Pipelines::new(dir, std::env::var_os("TANDEM_WGPU_CHECKED").is_some());
        // Tuning knobs; the defaults were measured on lavapipe (op_bench, SmolLM2 shapes): 8 rows
        // per lane cut CPU time by about a third against 4, and 16-lane workgroups still give
        // two or more workgroups for the smallest projection (192 rows).
        let knob = |name: &str, default: u32| {
            std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|v| (0..=256).contains(v)).unwrap_or(default)
        };
        let matmul_wg = knob("TANDEM_WGPU_MATMUL_WG", 16).max(1);
        let matmul_rt = knob("TANDEM_WGPU_MATMUL_RT", 8).max(1);
        // 8 x 4 against 4 x 4 at m = 128 on lavapipe (SmolLM2, tiled weights): prefill 47-51
        // against 31-36 tokens/s, the box shared with a build.
        let prefill_mt = knob("TANDEM_WGPU_PREFILL_MT", 8).max(1);
        let prefill_rt = knob("TANDEM_WGPU_PREFILL_RT", 4).max(1);
        let uniform_x = knob("TANDEM_WGPU_UNIFORM_X", 1) == 1 && gpu_limits_uniform >= UNIFORM_WINDOW;
        let tiled_weights = knob("TANDEM_WGPU_TILED", 1) == 1;
        // Measured on lavapipe (SmolLM2 decode, batch 1): see buffer::Texels. Not measured on
        // a GPU, where buffers stay the default.
        let texel_default = u32::from(gpu.summary.device_type == wgpu::DeviceType::Cpu);
        let texel_weights = tiled_weights
            && gpu.texel_weights
            && opts.texel_weights.unwrap_or(knob("TANDEM_WGPU_TEXELS", texel_default) == 1);
        Ok(WgpuBackend {
            rec: Recorder::new(gpu, pipelines),
            max_binding,
            argmax_out: Mutex::new(None),
            lane_kernels,
            matmul_wg,
            matmul_rt,
            prefill_mt,
            prefill_rt,
            uniform_x,
            loop_limit,
            tiled_weights,
            texel_weights,
            // Measured on lavapipe (SmolLM2 Q8_0 / Q4_0 decode): docs/results/2026-12-07-quantized.
            quant_texels: texel_weights && knob("TANDEM_WGPU_QUANT_TEXELS", 1) == 1,
            quant_prefill_rt: knob("TANDEM_WGPU_QUANT_PREFILL_RT", 4).max(1),
            quant_tile_m: opts.quant_tile_m.unwrap_or(knob("TANDEM_WGPU_QUANT_TILE_M", 0) as usize),
            quant_tile_n: (knob("TANDEM_WGPU_QUANT_TILE_N", 32) as usize).next_power_of_two().clamp(8, 64),
            quant_tile_kc: knob("TANDEM_WGPU_QUANT_TILE_KC", 64) as usize,
            fuse: knob("TANDEM_WGPU_FUSE", 1) == 1,
            fuse_norm: opts.fuse_norm.unwrap_or(knob("TANDEM_WGPU_FUSE_NORM", 0) == 1),
            fuse_norm_rows: knob("TANDEM_WGPU_FUSE_NORM_ROWS", 2) as usize,
            fuse_rope: knob("TANDEM_WGPU_FUSE_ROPE", 1) == 1,
            // Measured on lavapipe (SmolLM2 decode): see docs/bench-cpu.md, "fifth session".
            kv_texels: texel_weights && knob("TANDEM_WGPU_KV_TEXELS", 1) == 1,
            x_scratch: Mutex::new(None),
            weight_bytes: Default::default(),
        })
    }

    pub fn shader_dir(&self) -> Option<&PathBuf> {
        self.rec.pipelines.shader_dir()
    }
}
