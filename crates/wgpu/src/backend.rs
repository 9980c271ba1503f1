//! `WgpuBackend`: the `tandem_core::Backend` ops, each a WGSL kernel from `shaders/`.
//! Every op checks its buffers' kinds and lengths on the host first, so a bad call is an error
//! naming the op and buffer, never an out-of-bounds access on the device.

use std::path::PathBuf;
use std::sync::Mutex;

use tandem_core::backend::{AttnArgs, KvDest, KvGeometry, NormIn};
use tandem_core::backend::{Device, FusedOps, Ops, Sampling, Storage};
use tandem_core::config::Activation;
use tandem_core::weights::TensorView;
use tandem_core::{DType, Error, Result};

use crate::adapter::{self, AdapterSummary, NAME};
use crate::buffer::{BufKind, RowSource, Texels, Tiled, WgpuBuf, TEXEL_ROW, TILE_ROWS};
use crate::recorder::{Bind, Grid, Recorder, Stats};
use crate::shaders::{self, MatmulOut, MatrixLayout, Pipelines, Prelude};

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
}

/// llvmpipe/lavapipe ends every loop of a shader once the invocation has run 65535 loop
/// iterations in total, all loops together (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS): results
/// past that are silently wrong. On CPU adapters the ops size their loops against this (with
/// a margin) and refuse, with an error, work that would exceed it.
const LAVAPIPE_LOOP_LIMIT: usize = 65535 - 1024;

/// Bytes of the uniform window matmul reads x through (the smallest maximum uniform binding
/// Vulkan allows is 16 KiB; lavapipe and common GPUs allow 64 KiB, checked at start-up).
const UNIFORM_WINDOW: u64 = 65536;

/// Where a matmul writes (see `shaders::MatmulOut`).
#[derive(Clone, Copy)]
enum Out<'a> {
    Plain(&'a wgpu::Buffer),
    Split {
        q: &'a wgpu::Buffer,
        k: &'a wgpu::Buffer,
        v: &'a wgpu::Buffer,
        nq: usize,
        nkv: usize,
    },
    /// A fused gate/up projection: out, and whether the activation is gelu_tanh (else silu).
    GateUp(&'a wgpu::Buffer, bool),
    /// A fused q/k/v projection with rope and the KV write in its epilogue (`MatmulOut::SplitRope`).
    SplitRope {
        q: &'a wgpu::Buffer,
        nq: usize,
        nkv: usize,
        head_dim: usize,
        caches: KvPair<'a>,
        kv: [&'a wgpu::Buffer; 3],
        num_slots: usize,
    },
    /// `h += x w^T`, and `hg = h * gamma` with the next norm's gamma (`MatmulOut::Residual`).
    Residual {
        h: &'a wgpu::Buffer,
        next_norm: Option<(&'a WgpuBuf, &'a wgpu::Buffer)>,
    },
}

/// A fused gate/up weight pairs blocks of this many gate rows with the up rows of the same
/// outputs; its kernel runs GATE_UP_WG lanes of GATE_UP_RT rows (WG * RT = 2 * HALF).
const GATE_UP_HALF: usize = 64;
const GATE_UP_WG: u32 = 16;
const GATE_UP_RT: u32 = 8;

/// `[rows of all, cols]` when the views are matrices of one dtype and one width.
fn stack_shape(parts: &[&TensorView]) -> Option<Vec<usize>> {
    let cols = *parts.first()?.shape.get(1)?;
    let ok = parts.iter().all(|p| p.shape.len() == 2 && p.shape[1] == cols && p.dtype == parts[0].dtype);
    ok.then(|| vec![parts.iter().map(|p| p.shape[0]).sum(), cols])
}

/// Rows `[row0, row0 + rows)` of a weight and the bytes of its buffer that hold them.
struct Chunk {
    row0: usize,
    rows: usize,
    range: Option<(u64, u64)>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn err(msg: impl Into<String>) -> Error {
    Error::backend(NAME, msg)
}

fn to_u32(op: &str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| err(format!("{op}: {what} = {v} does not fit the kernels' 32-bit indices")))
}

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
            fuse: knob("TANDEM_WGPU_FUSE", 1) == 1,
            fuse_norm: opts.fuse_norm.unwrap_or(knob("TANDEM_WGPU_FUSE_NORM", 0) == 1),
            fuse_norm_rows: knob("TANDEM_WGPU_FUSE_NORM_ROWS", 2) as usize,
            fuse_rope: knob("TANDEM_WGPU_FUSE_ROPE", 1) == 1,
            // Measured on lavapipe (SmolLM2 decode): see docs/bench-cpu.md, "fifth session".
            kv_texels: texel_weights && knob("TANDEM_WGPU_KV_TEXELS", 1) == 1,
            x_scratch: Mutex::new(None),
        })
    }

    /// The adapter in use: name, wgpu backend, device type, driver.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.rec.gpu.summary
    }

    pub fn limits(&self) -> &wgpu::Limits {
        &self.rec.gpu.limits
    }

    pub fn shader_dir(&self) -> Option<&PathBuf> {
        self.rec.pipelines.shader_dir()
    }

    /// A `[rows, cols]` weight matrix from host values, laid out as `upload_weight` lays out
    /// a matrix from a file (tiled when its rows are whole 16-byte units); `weight_from_f32`
    /// knows no shape and stays row-major. Tests cover both layouts through this.
    pub fn weight_matrix_from_f32(&self, dtype: DType, values: &[f32], rows: usize, cols: usize) -> Result<WgpuBuf> {
        if rows * cols != values.len() {
            return Err(err(format!("weight_matrix_from_f32: {} values for a [{rows}, {cols}] matrix", values.len())));
        }
        self.weight_from_bytes(
            dtype,
            values.len(),
            &dtype.from_f32(values),
            None,
            Some(&[rows, cols]),
            self.texel_weights,
        )
    }

    /// Like [`WgpuBackend::weight_matrix_from_f32`], in a texture (`texels`, where the adapter
    /// can) or a buffer whatever this backend's default (tests cover every layout).
    pub fn weight_matrix_from_f32_in(
        &self,
        dtype: DType,
        values: &[f32],
        rows: usize,
        cols: usize,
        texels: bool,
    ) -> Result<WgpuBuf> {
        if rows * cols != values.len() {
            return Err(err(format!(
                "weight_matrix_from_f32_in: {} values for a [{rows}, {cols}] matrix",
                values.len()
            )));
        }
        if texels && !(self.tiled_weights && self.rec.gpu.texel_weights) {
            return Err(err(format!(
                "adapter {} cannot hold weights in rgba32uint storage textures (or TANDEM_WGPU_TILED=0)",
                self.adapter()
            )));
        }
        self.weight_from_bytes(dtype, values.len(), &dtype.from_f32(values), None, Some(&[rows, cols]), texels)
    }

    /// Whether the adapter can hold weight matrices in textures at all.
    pub fn can_hold_texels(&self) -> bool {
        self.tiled_weights && self.rec.gpu.texel_weights
    }

    /// Whether a weight is stored tiled (see `buffer::Tiled`), in a buffer or a texture.
    pub fn is_tiled(&self, w: &WgpuBuf) -> bool {
        w.tiled.is_some()
    }

    /// Whether a weight is held in a texture (see `buffer::Texels`).
    pub fn is_texels(&self, w: &WgpuBuf) -> bool {
        w.texels.is_some()
    }

    /// Whether this backend puts tiled weight matrices in textures.
    pub fn texel_weights(&self) -> bool {
        self.texel_weights
    }

    /// Dispatch counts per kernel, submits and time spent waiting, since the last reset.
    pub fn stats(&self) -> Stats {
        self.rec.stats()
    }

    pub fn reset_stats(&self) {
        self.rec.reset_stats()
    }

    /// Times every dispatch on the device (timestamp queries, read back at each submit; slows
    /// the run down). Returns false, and does nothing, when the adapter has no timestamps.
    pub fn set_profiling(&self, on: bool) -> bool {
        self.rec.set_profiling(on)
    }

    /// True when every op queued so far has run on the device (tests of `Backend::sync`).
    pub fn is_idle(&self) -> Result<bool> {
        self.rec.is_idle()
    }

    fn create(&self, kind: BufKind, len: usize, bytes: u64, what: &str) -> Result<WgpuBuf> {
        let limits = &self.rec.gpu.limits;
        // f32 buffers carry one uniform window past their end (see matmul).
        let pad = if kind == BufKind::F32 && self.uniform_x { UNIFORM_WINDOW } else { 0 };
        let size = bytes.next_multiple_of(16).max(16) + pad;
        if size > limits.max_buffer_size {
            return Err(err(format!(
                "{what}: {size} bytes exceed the adapter's max_buffer_size of {}",
                limits.max_buffer_size
            )));
        }
        // Weights may be bound in row chunks; everything else is bound whole.
        if !matches!(kind, BufKind::Weight(_)) && size - pad > self.max_binding {
            return Err(err(format!(
                "{what}: {size} bytes exceed the largest storage binding ({} bytes)",
                self.max_binding
            )));
        }
        let buf = self.rec.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            // Uniform too: matmul reads small activations through the uniform path.
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(WgpuBuf { buf, kind, len, name: None, tiled: None, texels: None })
    }

    /// A weight from its bytes; a matrix (`shape` of two dims with whole 16-byte rows) is
    /// stored tiled (see [`Tiled`]), in a texture when `texels`; anything else as it comes.
    fn weight_from_bytes(
        &self,
        dtype: DType,
        len: usize,
        bytes: &[u8],
        name: Option<&str>,
        shape: Option<&[usize]>,
        texels: bool,
    ) -> Result<WgpuBuf> {
        if let Some(t) = shape.and_then(|s| self.tiling(s, dtype)).filter(|t| t.rows * t.cols == len) {
            return self.tiled_weight(dtype, t, name, texels, &|r| t.row_of(dtype, bytes, r));
        }
        let what =
            name.map_or_else(|| format!("a {} weight of {len} elements", dtype.name()), |n| format!("tensor `{n}`"));
        let size = (bytes.len() as u64).next_multiple_of(16).max(16);
        let buf = self.mapped_weight_buffer(&what, name, size)?;
        {
            let mut view = buf.get_mapped_range_mut(..).map_err(|e| err(format!("{what}: mapping for upload: {e}")))?;
            if bytes.len() as u64 == size {
                view.copy_from_slice(bytes);
            } else {
                let mut padded = bytes.to_vec();
                padded.resize(size as usize, 0);
                view.copy_from_slice(&padded);
            }
        }
        buf.unmap();
        Ok(WgpuBuf { buf, kind: BufKind::Weight(dtype), len, name: name.map(String::from), tiled: None, texels: None })
    }

    /// A weight buffer of `size` bytes, mapped at creation (the bytes go straight in, no
    /// staging copy on the queue); `what` names it in the error when it is too large.
    fn mapped_weight_buffer(&self, what: &str, name: Option<&str>, size: u64) -> Result<wgpu::Buffer> {
        let max = self.rec.gpu.limits.max_buffer_size;
        if size > max {
            return Err(err(format!("{what}: {size} bytes exceed the adapter's max_buffer_size of {max}")));
        }
        Ok(self.rec.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: name,
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        }))
    }

    /// The tiled layout for a matrix of `shape`, if it is one this backend tiles: rows of whole
    /// 16-byte units, a tile that fits one binding and keeps chunk offsets aligned (a matrix
    /// that fails this stays row-major, so that it can still be bound in row chunks).
    fn tiling(&self, shape: &[usize], dtype: DType) -> Option<Tiled> {
        let align = self.rec.gpu.limits.min_storage_buffer_offset_alignment as u64;
        Tiled::for_matrix(shape, dtype).filter(|t| {
            self.tiled_weights && t.tile_bytes(dtype) <= self.max_binding && t.tile_bytes(dtype) % align == 0
        })
    }

    /// Whether a tiled matrix will be bound whole (a texture, or a buffer within one binding):
    /// fused weights must be, their kernels do not take chunks.
    fn in_one_binding(&self, t: Tiled, dtype: DType) -> bool {
        (self.texel_weights && self.fits_texture(t, dtype)) || t.bytes(dtype) <= self.max_binding
    }

    /// Whether a tiled matrix fits one weight texture (the adapter's texture height).
    fn fits_texture(&self, t: Tiled, dtype: DType) -> bool {
        Texels::rows_for(t.bytes(dtype) as usize / 16) <= self.rec.gpu.limits.max_texture_dimension_2d as usize
    }

    /// A tiled weight matrix whose row `r` holds `row(r)` (`None`: zeros): in a texture when
    /// `texels` and it fits one, else in a buffer.
    fn tiled_weight(
        &self,
        dtype: DType,
        t: Tiled,
        name: Option<&str>,
        texels: bool,
        row: &RowSource<'_>,
    ) -> Result<WgpuBuf> {
        if texels && self.fits_texture(t, dtype) {
            return self.texel_weight(dtype, name, t, row);
        }
        let what = name
            .map_or_else(|| format!("a [{}, {}] {} matrix", t.rows, t.cols, dtype.name()), |n| format!("tensor `{n}`"));
        let size = t.bytes(dtype);
        let buf = self.mapped_weight_buffer(&what, name, size)?;
        {
            let mut view = buf.get_mapped_range_mut(..).map_err(|e| err(format!("{what}: mapping for upload: {e}")))?;
            // The mapped view is write-only: each tile is gathered into one tile-sized staging
            // buffer, then copied to its place.
            let tb = t.tile_bytes(dtype) as usize;
            let mut tile = vec![0u8; tb];
            for i in 0..t.num_tiles() {
                t.fill_tile(row, i, &mut tile);
                view.slice(i * tb..(i + 1) * tb).copy_from_slice(&tile);
            }
        }
        buf.unmap();
        Ok(WgpuBuf {
            buf,
            kind: BufKind::Weight(dtype),
            len: t.rows * t.cols,
            name: name.map(String::from),
            tiled: Some(t),
            texels: None,
        })
    }

    /// A tiled weight matrix into a texture of TEXEL_ROW texels per row, written a band of
    /// texture rows at a time (each band gathered from the rows; the queue's staging memory is
    /// flushed after each band, so the host holds one band, not the tensor).
    fn texel_weight(&self, dtype: DType, name: Option<&str>, t: Tiled, row: &RowSource<'_>) -> Result<WgpuBuf> {
        const BAND_ROWS: usize = 64; // 4 MiB of texels
        let units = t.bytes(dtype) as usize / 16;
        let height = Texels::rows_for(units);
        let gpu = &self.rec.gpu;
        let texels =
            Texels::new(&gpu.device, name, height, wgpu::TextureUsages::COPY_DST | wgpu::TextureUsages::COPY_SRC);
        let texture = &texels.texture;
        let mut band = vec![0u8; BAND_ROWS * TEXEL_ROW * 16];
        for y0 in (0..height).step_by(BAND_ROWS) {
            let rows = BAND_ROWS.min(height - y0);
            let band = &mut band[..rows * TEXEL_ROW * 16];
            t.fill_units(dtype, row, y0 * TEXEL_ROW, band);
            gpu.queue.write_texture(
                wgpu::TexelCopyTextureInfo {
                    texture,
                    mip_level: 0,
                    origin: wgpu::Origin3d { x: 0, y: y0 as u32, z: 0 },
                    aspect: wgpu::TextureAspect::All,
                },
                band,
                wgpu::TexelCopyBufferLayout {
                    offset: 0,
                    bytes_per_row: Some((TEXEL_ROW * 16) as u32),
                    rows_per_image: Some(rows as u32),
                },
                wgpu::Extent3d { width: TEXEL_ROW as u32, height: rows as u32, depth_or_array_layers: 1 },
            );
            gpu.queue.submit([]);
        }
        let buf = self.rec.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: name,
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        Ok(WgpuBuf {
            buf,
            kind: BufKind::Weight(dtype),
            len: t.rows * t.cols,
            name: name.map(String::from),
            tiled: Some(t),
            texels: Some(texels),
        })
    }

    /// The matmul's block for m rows of x and depth k: (WG lanes, RT weight rows and MT x rows
    /// per lane); `paired` for a fused gate/up weight, `norm` with an input norm prologue.
    fn matmul_block(&self, op: &str, paired: bool, m: usize, k: usize, norm: bool) -> Result<(u32, u32, u32)> {
        // Rows of x (MT) and of w (RT) per invocation: MT x RT accumulators, each weight load
        // serving MT tokens. Measured on lavapipe at m = 128, k = 576: 4 x 4 took half the time
        // of 8 x 2 (weight loads are the cost), and with tiled weights 8 x 4 beats 4 x 4.
        let mt = match m {
            1 => 1,
            2 => 2,
            // Never more rows per lane than the batch has (rows past m are computed and dropped).
            _ => self.prefill_mt.min(m.next_power_of_two() as u32),
        };
        let mut rt = match m {
            1 | 2 => self.matmul_rt,
            _ => self.prefill_rt,
        };
        let mut wg = self.matmul_wg;
        let mut mt = mt;
        if paired {
            // The pairing needs WG * RT / 2 = GATE_UP_HALF, whatever the knobs say.
            (wg, rt, mt) = (GATE_UP_WG, GATE_UP_RT, mt.min(4));
        }
        // Loop iterations one invocation runs (every loop counts; see LOOP_LIMIT).
        let iterations = |mt: u32, rt: u32| -> usize {
            let (mt, rt) = (mt as usize, rt as usize);
            let setup = mt
                + rt
                + mt * rt
                + rt * (1 + mt)
                + if norm { mt * (k / 4 / wg as usize + wg as usize + rt + 2) } else { 0 };
            if k % 8 == 0 {
                k / 8 * (1 + rt + mt + mt * rt) + setup
            } else {
                k * (1 + mt + mt * rt) + setup
            }
        };
        // Under a loop limit, halve the block (x rows first) until the loops fit; a paired
        // (gate/up) block keeps its rows.
        let min_rt = if paired { rt } else { 1 };
        while self.loop_limit.is_some_and(|l| iterations(mt, rt) > l) && mt * rt > min_rt {
            if mt >= rt || rt <= min_rt {
                mt = (mt / 2).max(1)
            } else {
                rt = (rt / 2).max(1)
            }
        }
        self.check_loops(op, &format!("k = {k}"), iterations(mt, rt))?;
        Ok((wg, rt, mt))
    }

    /// `x w^T (+ bias)` into `out`: n output columns, from w's rows (n of them, or for a fused
    /// weight the stacked/paired rows `out` describes). With `norm` = (h, eps), x is h * gamma
    /// and the results are scaled by 1 / rms(h) (`NormIn`).
    #[allow(clippy::too_many_arguments)]
    fn matmul_to(
        &self,
        op: &str,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        out: Out<'_>,
        norm: Option<(&WgpuBuf, f32)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return Err(err("matmul: k = 0"));
        }
        // Weight rows: n, or the fused weight's (q, k, v stacked; gate/up paired and padded).
        let w_rows = match out {
            Out::GateUp(..) => n.div_ceil(GATE_UP_HALF) * 2 * GATE_UP_HALF,
            _ => n,
        };
        let x_b = want_f32(op, "x", x, m * k)?;
        let dtype = want_weight(op, "weight", w, w_rows * k)?;
        to_u32(op, "m * n", m * n)?;
        to_u32(op, "m * k", m * k)?;
        let bias_dtype = match bias {
            Some(b) => Some(want_weight(op, "bias", b, w_rows)?),
            None => None,
        };
        let norm_h = match norm {
            Some(_) if !k.is_multiple_of(4) => {
                return Err(err(format!("{op}: a fused norm needs k % 4 == 0 (k = {k}; fuses_norm says so)")))
            }
            Some((h, _)) => Some(want_f32(op, "norm h", h, m * k)?),
            None => None,
        };
        let gamma_dtype = match out {
            Out::Residual { next_norm: Some((g, _)), .. } => Some(want_weight(op, "norm weight", g, n)?),
            _ => None,
        };
        let (wg, rt, mt) = self.matmul_block(op, matches!(out, Out::GateUp(..)), m, k, norm.is_some())?;
        // x goes through a uniform buffer when k % 8 == 0: a 64 KiB window (every f32 buffer
        // is padded to hold one past its end), one dispatch per block of rows that fits, so
        // a prefill takes a few dispatches per matmul. Otherwise through storage, whole.
        // For a batch (m > 2) on an adapter that holds weights in textures, x is copied into a
        // texture instead: its loads are then image loads too (a uniform window's index comes
        // from the loop counter, which lavapipe does not see as uniform: every lane gathers),
        // and all m rows go in one dispatch. Measured on SmolLM2 prefill: see docs/bench-cpu.md.
        let x_rows = (m * k * 4).div_ceil(TEXEL_ROW * 16);
        // The scratch is shared: held locked from the copy to the last dispatch that reads it,
        // so a matmul recorded from another thread cannot copy its x in between.
        // Decode (m <= 2) never takes the lock.
        let mut scratch = match self.texel_weights && m > 2 && x_b.size() >= (x_rows * TEXEL_ROW * 16) as u64 {
            true => Some(self.x_scratch.lock().map_err(|_| err("x scratch lock poisoned"))?),
            false => None,
        };
        let x_tex = scratch.as_deref_mut().and_then(|g| self.x_scratch(g, x_rows));
        let window_rows = if x_tex.is_none() && self.uniform_x && k % 8 == 0 {
            (UNIFORM_WINDOW as usize / (k * 4)) / mt as usize * mt as usize
        } else {
            0
        };
        let uniform_x = window_rows > 0;
        let prelude = Prelude::new().constant("MT", mt).constant("RT", rt).constant("WG", wg);
        let prelude = match &x_tex {
            Some(_) => prelude.x_texels("x", 1),
            None => prelude.x_vec4("x", 1, uniform_x.then_some((UNIFORM_WINDOW / 16) as u32)),
        };
        // Bindings from 4 on, in order: the bias, the outputs past `out`, the norm's h; their
        // access (the kernel's layout) and buffers are listed together so they cannot disagree.
        use shaders::Access::{Read as R, ReadWrite as RW};
        let mut extra: Vec<(shaders::Access, Bind)> = vec![];
        if let Some(b) = bias {
            extra.push((R, Bind::all(&b.buf)));
        }
        let first_out = 4 + extra.len() as u32;
        let to = match out {
            Out::Plain(_) => MatmulOut::Plain,
            Out::GateUp(_, gelu) => MatmulOut::GateUp { gelu },
            Out::Split { k: k_b, v: v_b, nq, nkv, .. } => {
                extra.extend([(RW, Bind::all(k_b)), (RW, Bind::all(v_b))]);
                MatmulOut::Split { nq: nq as u32, nkv: nkv as u32, k_binding: first_out }
            }
            Out::SplitRope { nq, nkv, head_dim, caches, kv, .. } => {
                let cache_access = if caches.texels() { shaders::Access::TexelsWrite } else { RW };
                extra.extend([cache_access; 2].into_iter().zip(caches.binds()));
                extra.extend([R, R, R].into_iter().zip(kv.map(Bind::all)));
                MatmulOut::SplitRope {
                    nq: nq as u32,
                    nkv: nkv as u32,
                    head_dim: head_dim as u32,
                    first: first_out,
                    texels: caches.texels(),
                }
            }
            Out::Residual { next_norm, .. } => MatmulOut::Residual {
                next_norm: next_norm.zip(gamma_dtype).map(|((g, hg), d)| {
                    extra.extend([(R, Bind::all(&g.buf)), (RW, Bind::all(hg))]);
                    (first_out, d)
                }),
            },
        };
        let norm_binding = norm_h.map(|h| {
            extra.push((R, Bind::all(h)));
            3 + extra.len() as u32
        });
        let extra_access: Vec<shaders::Access> = extra.iter().map(|(a, _)| *a).collect();
        let prelude = prelude
            .weight_matrix("w", dtype, Self::layout(w), 2)
            .optional_weight("bias", 4, bias_dtype)
            .matmul_out(to)
            .norm_in(norm_binding);
        let x_access = match (&x_tex, uniform_x) {
            (Some(_), _) => shaders::Access::Texels,
            (None, true) => shaders::Access::Uniform,
            (None, false) => shaders::Access::Read,
        };
        let kernel = shaders::matmul_kernel(x_access, w.texels.is_some(), &extra_access);
        if let Some(t) = &x_tex {
            self.rec.copy_to_texture(x_b, &t.texture, x_rows as u32)?;
        }
        let out_b = match out {
            Out::Plain(b)
            | Out::GateUp(b, _)
            | Out::Split { q: b, .. }
            | Out::SplitRope { q: b, .. }
            | Out::Residual { h: b, .. } => b,
        };
        let block = if uniform_x { window_rows } else { m };
        let eps = norm.map_or(0.0, |(_, e)| e);
        let num_slots = if let Out::SplitRope { num_slots, .. } = out { num_slots as u32 } else { 0 };
        let chunks = self.chunks(op, w, w_rows, k)?;
        if !matches!(out, Out::Plain(_)) && chunks.len() > 1 {
            return Err(err(format!(
                "{op}: fused weight {} is bound in chunks; fuse_* never makes such a weight",
                w.label()
            )));
        }
        for b0 in (0..m).step_by(block) {
            let rows_here = block.min(m - b0);
            let xb = match (&x_tex, uniform_x) {
                (Some(t), _) => Bind::Texels(&t.view),
                (None, true) => {
                    let off = (b0 * k * 4) as u64;
                    if off + UNIFORM_WINDOW > x_b.size() {
                        return Err(err(format!("matmul: x {} lacks the uniform window padding", x.label())));
                    }
                    Bind::range(x_b, Some((off, UNIFORM_WINDOW)))
                }
                (None, false) => Bind::all(x_b),
            };
            for c in &chunks {
                let params = [
                    rows_here as u32,
                    n as u32,
                    k as u32,
                    c.row0 as u32,
                    c.rows as u32,
                    b0 as u32,
                    eps.to_bits(),
                    num_slots,
                ];
                let mut binds = vec![xb, Self::weight_bind(w, c), Bind::all(out_b)];
                binds.extend(extra.iter().map(|(_, b)| *b));
                let grid = Grid::XY(groups(c.rows, (wg * rt) as usize), groups(rows_here, mt as usize));
                self.rec.dispatch(kernel, &prelude, &params, &binds, grid)?;
            }
        }
        Ok(())
    }

    /// The texture matmul copies a batch's x into, at least `rows` texture rows (grown as
    /// needed, kept; the caller holds the lock); `None` past the adapter's texture height.
    fn x_scratch<'a>(&self, g: &'a mut Option<Texels>, rows: usize) -> Option<&'a Texels> {
        if rows > self.rec.gpu.limits.max_texture_dimension_2d as usize {
            return None;
        }
        if g.as_ref().is_none_or(|t| (t.texture.size().height as usize) < rows) {
            let max = self.rec.gpu.limits.max_texture_dimension_2d as usize;
            *g = Some(Texels::new(
                &self.rec.gpu.device,
                Some("tandem matmul x"),
                rows.next_power_of_two().min(max),
                wgpu::TextureUsages::COPY_DST,
            ));
        }
        g.as_ref()
    }

    /// The first `bytes` of a weight texture, in unit order (a copy through a buffer).
    fn read_texels(&self, tx: &Texels, bytes: u64) -> Result<Vec<u8>> {
        let gpu = &self.rec.gpu;
        let size = tx.texture.size();
        let row_bytes = size.width * 16;
        let tmp = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tandem texel read-back"),
            size: row_bytes as u64 * size.height as u64,
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.rec.copy_texture(&tx.texture, &tmp)?;
        self.rec.read(&tmp, bytes)
    }

    /// How a weight matrix is laid out, for the prelude.
    fn layout(w: &WgpuBuf) -> MatrixLayout {
        match (w.tiled, &w.texels) {
            (_, Some(_)) => MatrixLayout::Texels,
            (Some(_), None) => MatrixLayout::Tiled,
            (None, None) => MatrixLayout::RowMajor,
        }
    }

    /// The binding of chunk `c` of weight `w`.
    fn weight_bind<'a>(w: &'a WgpuBuf, c: &Chunk) -> Bind<'a> {
        match &w.texels {
            Some(t) => Bind::Texels(&t.view),
            None => Bind::range(&w.buf, c.range),
        }
    }

    fn check_loops(&self, op: &str, shape: &str, iterations: usize) -> Result<()> {
        match self.loop_limit {
            Some(l) if iterations > l => Err(err(format!(
                "{op}: {shape} needs {iterations} loop iterations in one invocation; adapter {} stops loops after 65535 \
                 (llvmpipe's limit), so the result would be wrong",
                self.adapter()
            ))),
            _ => Ok(()),
        }
    }

    fn argmax_scratch(&self, rows: usize) -> Result<()> {
        let mut g = self.argmax_out.lock().map_err(|_| err("argmax scratch lock poisoned"))?;
        if g.as_ref().is_none_or(|b| b.len < rows) {
            *g = Some(self.create(BufKind::U32, rows.max(64), rows.max(64) as u64 * 4, "argmax output")?);
        }
        Ok(())
    }

    /// How a weight of `rows` rows of `row_elems` elements is bound: whole if it fits one
    /// storage binding, else in row chunks whose byte offsets meet the adapter's alignment.
    fn chunks(&self, op: &str, w: &WgpuBuf, rows: usize, row_elems: usize) -> Result<Vec<Chunk>> {
        let BufKind::Weight(dtype) = w.kind else { return Err(err(format!("{op}: {} is not a weight", w.label()))) };
        if let Some(t) = w.tiled {
            if (t.rows, t.cols) != (rows, row_elems) {
                return Err(err(format!(
                    "{op}: weight {} is a [{}, {}] matrix; the op asked for [{rows}, {row_elems}]",
                    w.label(),
                    t.rows,
                    t.cols
                )));
            }
        }
        if w.texels.is_some() || w.buf.size() <= self.max_binding {
            return Ok(vec![Chunk { row0: 0, rows, range: None }]);
        }
        if let Some(t) = w.tiled {
            // Whole tiles per chunk: a chunk starts on a tile, so the kernel's tile arithmetic
            // on chunk-relative rows holds; a tile is a multiple of 1 KiB, so offsets align.
            let tile = t.tile_bytes(dtype);
            let per = self.max_binding / tile;
            if per == 0 || tile % self.rec.gpu.limits.min_storage_buffer_offset_alignment as u64 != 0 {
                return Err(err(format!("{op}: weight {}: a tile of {TILE_ROWS} rows is {tile} bytes, more than the largest storage binding ({} bytes)", w.label(), self.max_binding)));
            }
            let per_rows = per as usize * TILE_ROWS;
            let mut out = Vec::new();
            for r in (0..rows).step_by(per_rows) {
                let n = per_rows.min(rows - r);
                let off = (r / TILE_ROWS) as u64 * tile;
                out.push(Chunk { row0: r, rows: n, range: Some((off, n.div_ceil(TILE_ROWS) as u64 * tile)) });
            }
            return Ok(out);
        }
        let row_bytes = (row_elems * dtype.size()) as u64;
        let align = self.rec.gpu.limits.min_storage_buffer_offset_alignment.max(16) as u64;
        let step = align / gcd(align, row_bytes.max(1));
        let per = (self.max_binding / row_bytes.max(1)) / step * step;
        if per == 0 {
            return Err(err(format!(
                "{op}: weight {}: one row is {row_bytes} bytes; with offset alignment {align} no chunk fits the largest storage binding ({} bytes)",
                w.label(),
                self.max_binding
            )));
        }
        let mut out = Vec::new();
        let mut r = 0usize;
        while r < rows {
            let n = (per as usize).min(rows - r);
            let off = r as u64 * row_bytes;
            let len = (n as u64 * row_bytes).next_multiple_of(16).min(w.buf.size() - off);
            out.push(Chunk { row0: r, rows: n, range: Some((off, len)) });
            r += n;
        }
        Ok(out)
    }
}

fn want_f32<'a>(op: &str, what: &str, b: &'a WgpuBuf, need: usize) -> Result<&'a wgpu::Buffer> {
    if b.kind != BufKind::F32 {
        return Err(err(format!("{op}: {what} must be an f32 buffer, got {}", b.label())));
    }
    if b.texels.is_some() {
        return Err(err(format!(
            "{op}: {what} is {}, kept in a texture: only kv_write, rope_kv_write, paged_attention and read_kv take it",
            b.label()
        )));
    }
    if b.len < need {
        return Err(err(format!("{op}: {what} needs {need} elements, {} has {}", b.label(), b.len)));
    }
    Ok(&b.buf)
}

/// A pair of KV caches as the kernels bind them: storage buffers, or textures (`Prelude::kv_cache`).
#[derive(Clone, Copy)]
enum KvPair<'a> {
    Bufs(&'a wgpu::Buffer, &'a wgpu::Buffer),
    Texels(&'a wgpu::TextureView, &'a wgpu::TextureView),
}

impl<'a> KvPair<'a> {
    fn texels(self) -> bool {
        matches!(self, KvPair::Texels(..))
    }
    fn binds(self) -> [Bind<'a>; 2] {
        match self {
            KvPair::Bufs(k, v) => [Bind::all(k), Bind::all(v)],
            KvPair::Texels(k, v) => [Bind::Texels(k), Bind::Texels(v)],
        }
    }
}

/// The k and v caches of one layer, both of `g`'s size and both buffers or both textures.
fn want_kv<'a>(op: &str, k: &'a WgpuBuf, v: &'a WgpuBuf, g: KvGeometry) -> Result<KvPair<'a>> {
    for (what, b) in [("k_cache", k), ("v_cache", v)] {
        if b.kind != BufKind::F32 || b.len < g.layer_elems() {
            return Err(err(format!(
                "{op}: {what} must be a KV cache of {} f32 (from alloc_kv), got {}",
                g.layer_elems(),
                b.label()
            )));
        }
    }
    match (&k.texels, &v.texels) {
        (None, None) => Ok(KvPair::Bufs(&k.buf, &v.buf)),
        (Some(kt), Some(vt)) => Ok(KvPair::Texels(&kt.view, &vt.view)),
        _ => Err(err(format!("{op}: k_cache and v_cache differ in kind ({} and {})", k.label(), v.label()))),
    }
}

fn want_u32<'a>(op: &str, what: &str, b: &'a WgpuBuf, need: usize) -> Result<&'a wgpu::Buffer> {
    if b.kind != BufKind::U32 {
        return Err(err(format!("{op}: {what} must be a u32 buffer, got {}", b.label())));
    }
    if b.len < need {
        return Err(err(format!("{op}: {what} needs {need} elements, {} has {}", b.label(), b.len)));
    }
    Ok(&b.buf)
}

fn want_weight(op: &str, what: &str, b: &WgpuBuf, need: usize) -> Result<DType> {
    let BufKind::Weight(d) = b.kind else {
        return Err(err(format!("{op}: {what} must be a weight buffer, got {}", b.label())));
    };
    if b.len < need {
        return Err(err(format!("{op}: {what} needs {need} elements, {} has {}", b.label(), b.len)));
    }
    Ok(d)
}

fn groups(items: usize, per: usize) -> u64 {
    items.div_ceil(per) as u64
}

impl WgpuBackend {
    /// A gated activation `out = act(gate) * up` over f32 `[len]` by its scalar and vec4 kernels
    /// (the vec4 one where len is a multiple of 4).
    fn gated(
        &self,
        op: &str,
        [scalar, vec4]: [shaders::Kernel; 2],
        gate: &WgpuBuf,
        up: &WgpuBuf,
        out: &mut WgpuBuf,
        len: usize,
    ) -> Result<()> {
        let g_b = want_f32(op, "gate", gate, len)?;
        let u_b = want_f32(op, "up", up, len)?;
        let o_b = want_f32(op, "out", out, len)?;
        to_u32(op, "len", len)?;
        let binds = [Bind::all(g_b), Bind::all(u_b), Bind::all(o_b)];
        match len % 4 {
            0 => self.rec.dispatch(
                vec4,
                &Prelude::new().gated_acts(),
                &[len as u32],
                &binds,
                Grid::Linear(groups(len / 4, 64)),
            ),
            _ => self.rec.dispatch(
                scalar,
                &Prelude::new().gated_acts(),
                &[len as u32],
                &binds,
                Grid::Linear(groups(len, 64)),
            ),
        }
    }
}

impl Device for WgpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn sync(&self) -> Result<()> {
        self.rec.finish()
    }

    /// wgpu has no portable query for free device memory, so this says nothing rather than guess.
    fn free_memory(&self) -> Option<u64> {
        None
    }
}

impl Storage for WgpuBackend {
    type Buf = WgpuBuf;

    fn upload_weight(&self, t: &TensorView) -> Result<WgpuBuf> {
        let numel = t.numel();
        if t.bytes().len() != numel * t.dtype.size() {
            return Err(Error::tensor(
                &t.path,
                &t.name,
                format!("{} bytes for {numel} {} values", t.bytes().len(), t.dtype.name()),
            ));
        }
        self.weight_from_bytes(t.dtype, numel, t.bytes(), Some(&t.name), Some(&t.shape), self.texel_weights).map_err(
            |e| match e {
                Error::Backend { msg, .. } => Error::tensor(&t.path, &t.name, msg),
                other => other,
            },
        )
    }

    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<WgpuBuf> {
        self.weight_from_bytes(dtype, values.len(), &dtype.from_f32(values), None, None, false)
    }

    fn alloc_f32(&self, len: usize) -> Result<WgpuBuf> {
        self.create(BufKind::F32, len, len as u64 * 4, &format!("f32 buffer of {len} elements"))
    }

    fn alloc_u32(&self, len: usize) -> Result<WgpuBuf> {
        self.create(BufKind::U32, len, len as u64 * 4, &format!("u32 buffer of {len} elements"))
    }

    fn alloc_kv(&self, g: KvGeometry) -> Result<WgpuBuf> {
        let len = g.layer_elems();
        let what = format!("KV cache {g:?}");
        // In texels when asked and each head is whole vec4s (a texel never spans two heads);
        // a cache taller than the adapter's largest texture stays a buffer.
        let rows = Texels::rows_for(len.div_ceil(4));
        if self.kv_texels
            && g.head_dim.is_multiple_of(4)
            && rows <= self.rec.gpu.limits.max_texture_dimension_2d as usize
        {
            // Textures start zeroed, like buffers.
            let texels = Texels::new(
                &self.rec.gpu.device,
                Some(&what),
                rows.max(1),
                wgpu::TextureUsages::COPY_SRC | wgpu::TextureUsages::COPY_DST,
            );
            let buf = self.rec.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(&what),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
            return Ok(WgpuBuf { buf, kind: BufKind::F32, len, name: None, tiled: None, texels: Some(texels) });
        }
        self.create(BufKind::F32, len, len as u64 * 4, &what)
    }

    fn write_f32(&self, buf: &mut WgpuBuf, data: &[f32]) -> Result<()> {
        if let (BufKind::F32, Some(tx)) = (buf.kind, &buf.texels) {
            // A KV cache in texels: whole texels only.
            if data.len() > buf.len || !data.len().is_multiple_of(4) {
                return Err(err(format!(
                    "write_f32: {} values into a KV cache of {} kept in texels (a multiple of 4 up to its size)",
                    data.len(),
                    buf.len
                )));
            }
            return self.rec.write_texels(&tx.texture, bytemuck::cast_slice(data));
        }
        let b = want_f32("write_f32", "destination", buf, data.len())?;
        self.rec.write(b, bytemuck::cast_slice(data))
    }

    fn write_u32(&self, buf: &mut WgpuBuf, data: &[u32]) -> Result<()> {
        let b = want_u32("write_u32", "destination", buf, data.len())?;
        self.rec.write(b, bytemuck::cast_slice(data))
    }

    fn read_f32(&self, buf: &WgpuBuf, len: usize) -> Result<Vec<f32>> {
        if buf.len < len {
            return Err(err(format!("read_f32: {len} elements asked of {}", buf.label())));
        }
        match buf.kind {
            BufKind::Weight(d) if buf.tiled.is_some() => {
                let t = buf.tiled.expect("checked");
                let raw = match &buf.texels {
                    Some(tx) => self.read_texels(tx, t.bytes(d))?,
                    None => self.rec.read(&buf.buf, t.bytes(d))?,
                };
                let bytes = t.untile(d, &raw);
                Ok(d.to_f32(&bytes[..len * d.size()]))
            }
            BufKind::F32 if buf.texels.is_some() => {
                let tx = buf.texels.as_ref().expect("checked");
                let bytes = self.read_texels(tx, len as u64 * 4)?;
                Ok(bytemuck::pod_collect_to_vec(&bytes))
            }
            BufKind::F32 | BufKind::Weight(DType::F32) => {
                let bytes = self.rec.read(&buf.buf, len as u64 * 4)?;
                Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            BufKind::Weight(d) => {
                let bytes = self.rec.read(&buf.buf, (len * d.size()) as u64)?;
                Ok(d.to_f32(&bytes))
            }
            BufKind::U32 => Err(err(format!("read_f32: {} holds u32 values", buf.label()))),
        }
    }

    fn read_u32(&self, buf: &WgpuBuf, len: usize) -> Result<Vec<u32>> {
        want_u32("read_u32", "source", buf, len)?;
        let bytes = self.rec.read(&buf.buf, len as u64 * 4)?;
        Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn read_kv(&self, buf: &WgpuBuf, g: KvGeometry) -> Result<Vec<f32>> {
        want_kv("read_kv", buf, buf, g)?;
        self.read_f32(buf, g.layer_elems())
    }
}

impl Ops for WgpuBackend {
    fn embedding(
        &self,
        table: &WgpuBuf,
        ids: &WgpuBuf,
        out: &mut WgpuBuf,
        num_tokens: usize,
        hidden: usize,
    ) -> Result<()> {
        let op = "embedding";
        if hidden == 0 {
            return Err(err("embedding: hidden size 0"));
        }
        let dtype = want_weight(op, "table", table, hidden)?;
        let ids_b = want_u32(op, "ids", ids, num_tokens)?;
        let out_b = want_f32(op, "out", out, num_tokens * hidden)?;
        let vocab = table.len / hidden;
        to_u32(op, "num_tokens * hidden", num_tokens * hidden)?;
        let prelude = Prelude::new().weight_matrix("w", dtype, Self::layout(table), 1);
        let kernel = if table.texels.is_some() { shaders::EMBEDDING_T } else { shaders::EMBEDDING };
        for c in self.chunks(op, table, vocab, hidden)? {
            let params = [num_tokens as u32, hidden as u32, c.row0 as u32, c.rows as u32];
            let binds = [Self::weight_bind(table, &c), Bind::all(ids_b), Bind::all(out_b)];
            self.rec.dispatch(kernel, &prelude, &params, &binds, Grid::Linear(groups(num_tokens * hidden, 64)))?;
        }
        Ok(())
    }

    fn gather_rows(&self, src: &WgpuBuf, rows: &WgpuBuf, out: &mut WgpuBuf, n: usize, dim: usize) -> Result<()> {
        let op = "gather_rows";
        if dim == 0 {
            return Ok(());
        }
        let src_b = want_f32(op, "src", src, dim)?;
        let rows_b = want_u32(op, "rows", rows, n)?;
        let out_b = want_f32(op, "out", out, n * dim)?;
        to_u32(op, "n * dim", n * dim)?;
        let params = [n as u32, dim as u32, (src.len / dim) as u32];
        let binds = [Bind::all(src_b), Bind::all(rows_b), Bind::all(out_b)];
        self.rec.dispatch(shaders::GATHER_ROWS, &Prelude::new(), &params, &binds, Grid::Linear(groups(n * dim, 64)))
    }

    fn rms_norm(&self, x: &WgpuBuf, w: &WgpuBuf, out: &mut WgpuBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
        let op = "rms_norm";
        let x_b = want_f32(op, "x", x, rows * dim)?;
        let dtype = want_weight(op, "weight", w, dim)?;
        let out_b = want_f32(op, "out", out, rows * dim)?;
        to_u32(op, "rows * dim", rows * dim)?;
        if w.buf.size() > self.max_binding {
            return Err(err(format!("rms_norm: weight {} exceeds one storage binding", w.label())));
        }
        if w.tiled.is_some() {
            return Err(err(format!("rms_norm: weight {} is a matrix, not a vector", w.label())));
        }
        let params = [rows as u32, dim as u32, eps.to_bits()];
        let binds = [Bind::all(x_b), Bind::all(&w.buf), Bind::all(out_b)];
        let prelude = Prelude::new().weight4("w", dtype);
        if self.lane_kernels && dim % 8 == 0 {
            self.rec.dispatch(shaders::RMS_NORM_LANE, &prelude, &params, &binds, Grid::Linear(groups(rows, 64)))
        } else {
            self.rec.dispatch(shaders::RMS_NORM, &prelude, &params, &binds, Grid::Linear(rows as u64))
        }
    }

    fn add(&self, acc: &mut WgpuBuf, x: &WgpuBuf, len: usize) -> Result<()> {
        let op = "add";
        let acc_b = want_f32(op, "acc", acc, len)?;
        let x_b = want_f32(op, "x", x, len)?;
        to_u32(op, "len", len)?;
        let binds = [Bind::all(acc_b), Bind::all(x_b)];
        let vec4 = len % 4 == 0;
        self.rec.dispatch(
            shaders::ADD,
            &Prelude::new().elems(vec4),
            &[len as u32],
            &binds,
            Grid::Linear(groups(if vec4 { len / 4 } else { len }, 64)),
        )
    }

    fn matmul(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        out: &mut WgpuBuf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let out_b = want_f32("matmul", "out", out, m * n)?;
        self.matmul_to("matmul", x, w, bias, Out::Plain(out_b), None, m, n, k)
    }

    fn rope(
        &self,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        positions: &WgpuBuf,
        inv_freq: &WgpuBuf,
        num_tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let op = "rope";
        if head_dim % 2 != 0 {
            return Err(err(format!("rope: head_dim {head_dim} is odd")));
        }
        let half = head_dim / 2;
        let q_b = want_f32(op, "q", q, num_tokens * q_heads * head_dim)?;
        let k_b = want_f32(op, "k", k, num_tokens * kv_heads * head_dim)?;
        let p_b = want_u32(op, "positions", positions, num_tokens)?;
        let f_b = want_f32(op, "inv_freq", inv_freq, half)?;
        let items = num_tokens * (q_heads + kv_heads) * half;
        to_u32(op, "tokens * heads * head_dim", num_tokens * (q_heads + kv_heads) * head_dim)?;
        let params = [num_tokens as u32, q_heads as u32, kv_heads as u32, head_dim as u32];
        let binds = [Bind::all(q_b), Bind::all(k_b), Bind::all(p_b), Bind::all(f_b)];
        // rope.wgsl's other entry points need the cache accessors to compile.
        let prelude = Prelude::new().sincos().kv_cache(6, false, true);
        self.rec.dispatch(shaders::ROPE, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
    }

    fn silu_mul(&self, gate: &WgpuBuf, up: &WgpuBuf, out: &mut WgpuBuf, len: usize) -> Result<()> {
        self.gated("silu_mul", [shaders::SILU_MUL, shaders::SILU_MUL4], gate, up, out, len)
    }

    fn gelu_tanh_mul(&self, gate: &WgpuBuf, up: &WgpuBuf, out: &mut WgpuBuf, len: usize) -> Result<()> {
        self.gated("gelu_tanh_mul", [shaders::GELU_TANH_MUL, shaders::GELU_TANH_MUL4], gate, up, out, len)
    }

    fn scale(&self, x: &mut WgpuBuf, factor: f32, len: usize) -> Result<()> {
        let op = "scale";
        let x_b = want_f32(op, "x", x, len)?;
        to_u32(op, "len", len)?;
        let params = [len as u32, factor.to_bits()];
        let vec4 = len % 4 == 0;
        self.rec.dispatch(
            shaders::SCALE,
            &Prelude::new().elems(vec4),
            &params,
            &[Bind::all(x_b)],
            Grid::Linear(groups(if vec4 { len / 4 } else { len }, 64)),
        )
    }

    fn moe_route(
        &self,
        logits: &WgpuBuf,
        weights: &mut WgpuBuf,
        rows: usize,
        experts: usize,
        top_k: usize,
        renormalize: bool,
    ) -> Result<()> {
        let op = "moe_route";
        if rows == 0 || experts == 0 {
            return Ok(());
        }
        let l_b = want_f32(op, "logits", logits, rows * experts)?;
        let w_b = want_f32(op, "weights", weights, rows * experts)?;
        to_u32(op, "rows * experts", rows * experts)?;
        let params = [rows as u32, experts as u32, top_k.min(experts) as u32, renormalize as u32];
        self.rec.dispatch(
            shaders::MOE_ROUTE,
            &Prelude::new(),
            &params,
            &[Bind::all(l_b), Bind::all(w_b)],
            Grid::Linear(groups(rows, 64)),
        )
    }

    fn moe_accumulate(
        &self,
        acc: &mut WgpuBuf,
        y: &WgpuBuf,
        weights: &WgpuBuf,
        rows: usize,
        dim: usize,
        expert: usize,
        experts: usize,
        first: bool,
    ) -> Result<()> {
        let op = "moe_accumulate";
        if rows == 0 || dim == 0 {
            return Ok(());
        }
        if expert >= experts {
            return Err(err(format!("{op}: expert {expert} of {experts}")));
        }
        let a_b = want_f32(op, "acc", acc, rows * dim)?;
        let y_b = want_f32(op, "y", y, rows * dim)?;
        let w_b = want_f32(op, "weights", weights, rows * experts)?;
        to_u32(op, "rows * dim", rows * dim)?;
        let params = [(rows * dim) as u32, dim as u32, expert as u32, experts as u32, first as u32];
        self.rec.dispatch(
            shaders::MOE_ACCUMULATE,
            &Prelude::new(),
            &params,
            &[Bind::all(a_b), Bind::all(y_b), Bind::all(w_b)],
            Grid::Linear(groups(rows * dim, 64)),
        )
    }

    fn kv_write(
        &self,
        k: &WgpuBuf,
        v: &WgpuBuf,
        k_cache: &mut WgpuBuf,
        v_cache: &mut WgpuBuf,
        slots: &WgpuBuf,
        num_tokens: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let op = "kv_write";
        let kv_dim = g.num_kv_heads * g.head_dim;
        let k_b = want_f32(op, "k", k, num_tokens * kv_dim)?;
        let v_b = want_f32(op, "v", v, num_tokens * kv_dim)?;
        let kv = want_kv(op, k_cache, v_cache, g)?;
        let s_b = want_u32(op, "slots", slots, num_tokens)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        let params = [num_tokens as u32, kv_dim as u32, g.slots() as u32];
        let [kc, vc] = kv.binds();
        let binds = [Bind::all(k_b), Bind::all(v_b), kc, vc, Bind::all(s_b)];
        let prelude = Prelude::new().kv_cache(3, kv.texels(), true);
        match kv.texels() {
            // A texel cache is written a vec4 at a time (alloc_kv made head_dim a multiple of 4).
            true => self.rec.dispatch(
                shaders::KV_WRITE_T,
                &prelude,
                &params,
                &binds,
                Grid::Linear(groups(num_tokens * kv_dim / 4, 64)),
            ),
            false => self.rec.dispatch(
                shaders::KV_WRITE,
                &prelude,
                &params,
                &binds,
                Grid::Linear(groups(num_tokens * kv_dim, 64)),
            ),
        }
    }

    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut WgpuBuf) -> Result<()> {
        let op = "paged_attention";
        let g = a.geometry;
        let (t, nh, hd) = (a.num_tokens, a.num_heads, g.head_dim);
        if g.num_kv_heads == 0 || nh % g.num_kv_heads != 0 {
            return Err(err(format!("{op}: {nh} heads are not a multiple of {} kv heads", g.num_kv_heads)));
        }
        if hd == 0 || hd > 256 {
            return Err(err(format!("{op}: head_dim {hd} outside 1..=256")));
        }
        if t > 0 && (a.num_seqs == 0 || a.max_blocks == 0) {
            return Err(err(format!("{op}: {t} tokens but {} sequences of {} blocks", a.num_seqs, a.max_blocks)));
        }
        let q_b = want_f32(op, "q", a.q, t * nh * hd)?;
        let kv = want_kv(op, a.k_cache, a.v_cache, g)?;
        let p_b = want_u32(op, "positions", a.positions, t)?;
        let s_b = want_u32(op, "token_seq", a.token_seq, t)?;
        let bt = want_u32(op, "block_tables", a.block_tables, a.num_seqs * a.max_blocks)?;
        let o_b = want_f32(op, "out", out, t * nh * hd)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        to_u32(op, "q elements", t * nh * hd)?;
        let params = [
            t as u32,
            nh as u32,
            g.num_kv_heads as u32,
            hd as u32,
            g.block_size as u32,
            a.max_blocks as u32,
            a.num_seqs as u32,
            g.slots() as u32,
            a.scale.to_bits(),
            to_u32(op, "window", a.window)?,
        ];
        let [kc, vc] = kv.binds();
        let binds = [Bind::all(q_b), kc, vc, Bind::all(p_b), Bind::all(s_b), Bind::all(bt), Bind::all(o_b)];
        let (lane_kernel, group_kernel) = match kv.texels() {
            true => (shaders::PAGED_ATTENTION_LANE_T, shaders::PAGED_ATTENTION_T),
            false => (shaders::PAGED_ATTENTION_LANE, shaders::PAGED_ATTENTION),
        };
        // Loop iterations per invocation (see LAVAPIPE_LOOP_LIMIT), counted as if nothing were
        // unrolled: the lane kernel runs hd/4 (1 + gq) twice and 3 gq + 1 more per key of its
        // eighth of the keys, the workgroup kernel hd + 5 * 64 + 1 per tile of 64 keys. (A lane
        // kernel that walked all keys in one lane gave NaN at context 1024, head_dim 128 on
        // lavapipe: 1024 x 65 iterations, just past the limit.)
        let keys = a.max_context.max(1);
        let hv = hd / 4;
        let lane_iters =
            |gq: usize| keys.div_ceil(8) * (2 * hv * (1 + gq) + 3 * gq + 1) + 3 * gq * hv + 8 * 2 * gq + 32;
        let group_iters = keys.div_ceil(64) * (hd + 5 * 64 + 1) + 4;
        let fits = |gq: usize| self.loop_limit.is_none_or(|l| lane_iters(gq) <= l);
        // The lane kernel serves GQ query heads of one kv head per workgroup, so each K and V
        // load serves them all: the largest divisor of the group whose GQ x head_dim/4 private
        // vec4s stay within UNROLL_VEC4S (the compiler unrolls the loops over them, which keeps
        // them in registers but costs compile time: without a shader cache, lavapipe built the
        // op suite's 16 attention cases in 88 s with groups up to 128 vec4s, in 4 s with this
        // cap; SmolLM2's 3 heads x 16 fit it) and whose merge buffer fits workgroup memory.
        const UNROLL_VEC4S: usize = 48;
        let group = nh / g.num_kv_heads;
        let wg_bytes = |gq: usize| (8 * gq * hv * 16 + 2 * 8 * gq * 4) as u64;
        let max_wg = self.rec.gpu.limits.max_compute_workgroup_storage_size as u64;
        let gq = (1..=group)
            .rev()
            .filter(|&d| group % d == 0 && (d == 1 || d * hv <= UNROLL_VEC4S))
            .find(|&d| wg_bytes(d) <= max_wg && fits(d));
        match gq {
            Some(gq) if self.lane_kernels && hd % 4 == 0 => {
                let prelude = Prelude::new()
                    .constant("HV", hv as u32)
                    .constant("GQ", gq as u32)
                    .kv_cache(2, kv.texels(), false)
                    .lane_attention(hv, gq);
                self.rec.dispatch(lane_kernel, &prelude, &params, &binds, Grid::Linear((t * nh / gq) as u64))
            }
            _ => {
                self.check_loops(op, &format!("context {keys}, head_dim {hd}"), group_iters)?;
                // The lane kernel's declarations in the same file need HV and GQ to compile.
                let prelude = Prelude::new()
                    .constant("HV", hv.max(1) as u32)
                    .constant("GQ", 1)
                    .kv_cache(2, kv.texels(), false)
                    .lane_attention(hv.max(1), 1);
                self.rec.dispatch(group_kernel, &prelude, &params, &binds, Grid::Linear((t * nh) as u64))
            }
        }
    }
}

impl FusedOps for WgpuBackend {
    /// One pass per row on CPU adapters (the lane kernel); elsewhere, or when dim % 8 != 0,
    /// the add and the norm as two ops.
    fn add_rms_norm(
        &self,
        acc: &mut WgpuBuf,
        x: &WgpuBuf,
        w: &WgpuBuf,
        out: &mut WgpuBuf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        if !(self.lane_kernels && dim % 8 == 0) {
            return tandem_core::backend::add_then_rms_norm(self, acc, x, w, out, rows, dim, eps);
        }
        let op = "add_rms_norm";
        let acc_b = want_f32(op, "acc", acc, rows * dim)?;
        let x_b = want_f32(op, "x", x, rows * dim)?;
        let dtype = want_weight(op, "weight", w, dim)?;
        let out_b = want_f32(op, "out", out, rows * dim)?;
        to_u32(op, "rows * dim", rows * dim)?;
        if w.buf.size() > self.max_binding || w.tiled.is_some() {
            return Err(err(format!("{op}: weight {} must be a vector within one storage binding", w.label())));
        }
        let params = [rows as u32, dim as u32, eps.to_bits()];
        let binds = [Bind::all(acc_b), Bind::all(&w.buf), Bind::all(out_b), Bind::all(x_b)];
        let prelude = Prelude::new().weight4("w", dtype);
        self.rec.dispatch(shaders::ADD_RMS_NORM_LANE, &prelude, &params, &binds, Grid::Linear(groups(rows, 64)))
    }

    fn fuse_qkv(
        &self,
        q: &TensorView,
        k: &TensorView,
        v: &TensorView,
        bias: Option<[&TensorView; 3]>,
    ) -> Result<Option<tandem_core::backend::WeightAndBias<WgpuBuf>>> {
        if !self.fuse {
            return Ok(None);
        }
        let Some(t) = stack_shape(&[q, k, v])
            .and_then(|shape| self.tiling(&shape, q.dtype))
            .filter(|t| self.in_one_binding(*t, q.dtype))
        else {
            return Ok(None);
        };
        let (nq, nkv) = (q.shape[0], k.shape[0]);
        if v.shape[0] != nkv {
            return Ok(None);
        }
        let name = q.name.replace("q_proj", "qkv_proj");
        let row = |r: usize| {
            let (src, i) = if r < nq {
                (q, r)
            } else if r < nq + nkv {
                (k, r - nq)
            } else {
                (v, r - nq - nkv)
            };
            t.row_of(q.dtype, src.bytes(), i)
        };
        let w = self.tiled_weight(q.dtype, t, Some(&name), self.texel_weights, &row)?;
        let b = match bias {
            None => None,
            Some(bs) => {
                if bs.iter().any(|b| b.dtype != bs[0].dtype) {
                    return Ok(None);
                }
                let bytes: Vec<u8> = bs.iter().flat_map(|b| b.bytes().iter().copied()).collect();
                let len = bs.iter().map(|b| b.numel()).sum();
                Some(self.weight_from_bytes(
                    bs[0].dtype,
                    len,
                    &bytes,
                    Some(&name.replace("weight", "bias")),
                    None,
                    false,
                )?)
            }
        };
        Ok(Some((w, b)))
    }

    fn qkv_proj(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &mut WgpuBuf,
        m: usize,
        nq: usize,
        nkv: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
    ) -> Result<()> {
        let op = "qkv_proj";
        let q_b = want_f32(op, "q", q, m * nq)?;
        let k_b = want_f32(op, "k", k, m * nkv)?;
        let v_b = want_f32(op, "v", v, m * nkv)?;
        to_u32(op, "m * (nq + 2 nkv)", m * (nq + 2 * nkv))?;
        self.matmul_to(
            op,
            x,
            w,
            bias,
            Out::Split { q: q_b, k: k_b, v: v_b, nq, nkv },
            norm.map(|n| (n.h, n.eps)),
            m,
            nq + 2 * nkv,
            hidden,
        )
    }

    fn fuse_gate_up(&self, gate: &TensorView, up: &TensorView) -> Result<Option<WgpuBuf>> {
        if !self.fuse || gate.shape != up.shape || gate.dtype != up.dtype {
            return Ok(None);
        }
        let [inter, cols] = gate.shape[..] else { return Ok(None) };
        // Blocks of GATE_UP_HALF gate rows, then the up rows of the same outputs; the last
        // block padded with zero rows (see matmul.wgsl, PAIRS).
        let h = GATE_UP_HALF;
        let rows = inter.div_ceil(h) * 2 * h;
        let Some(t) = self.tiling(&[rows, cols], gate.dtype).filter(|t| self.in_one_binding(*t, gate.dtype)) else {
            return Ok(None);
        };
        let row = |r: usize| {
            let (block, i) = (r / (2 * h), r % (2 * h));
            let (src, out) = if i < h { (gate, block * h + i) } else { (up, block * h + i - h) };
            if out < inter {
                t.row_of(gate.dtype, src.bytes(), out)
            } else {
                None
            }
        };
        let name = gate.name.replace("gate_proj", "gate_up_proj");
        self.tiled_weight(gate.dtype, t, Some(&name), self.texel_weights, &row).map(Some)
    }

    fn gate_up_act(
        &self,
        act: Activation,
        x: &WgpuBuf,
        w: &WgpuBuf,
        out: &mut WgpuBuf,
        m: usize,
        inter: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
    ) -> Result<()> {
        let op = "gate_up_act";
        let out_b = want_f32(op, "out", out, m * inter)?;
        let rows = inter.div_ceil(GATE_UP_HALF) * 2 * GATE_UP_HALF;
        match w.tiled {
            Some(t) if t.rows == rows && t.cols == hidden => {}
            _ => {
                return Err(err(format!(
                    "{op}: weight {} is not a fused [{inter}, {hidden}] gate/up pair from fuse_gate_up",
                    w.label()
                )))
            }
        }
        let gelu = act == Activation::GeluTanh;
        self.matmul_to(op, x, w, None, Out::GateUp(out_b, gelu), norm.map(|n| (n.h, n.eps)), m, inter, hidden)
    }

    fn qkv_rope_kv_write(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        bias: Option<&WgpuBuf>,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &mut WgpuBuf,
        m: usize,
        nq: usize,
        hidden: usize,
        norm: Option<NormIn<'_, WgpuBuf>>,
        kv: KvDest<'_, WgpuBuf>,
    ) -> Result<()> {
        let op = "qkv_rope_kv_write";
        let g = kv.geometry;
        let (hd, nkv) = (g.head_dim, g.num_kv_heads * g.head_dim);
        if hd == 0 || !hd.is_multiple_of(2) || !nq.is_multiple_of(hd) {
            return Err(err(format!("{op}: head_dim {hd} must be even and divide nq {nq}")));
        }
        // The epilogue needs each head's rows in one lane (see matmul.wgsl's ROPE); otherwise
        // (or with TANDEM_WGPU_FUSE_ROPE=0) the projection and rope_kv_write run apart.
        let (wg, rt, _) = self.matmul_block(op, false, m, hidden, norm.is_some())?;
        if !(self.fuse_rope && ((wg * rt) as usize).is_multiple_of(hd) && (hd / 2).is_multiple_of(wg as usize)) {
            self.qkv_proj(x, w, bias, q, k, v, m, nq, nkv, hidden, norm)?;
            return self.rope_kv_write(
                q,
                k,
                v,
                kv.k_cache,
                kv.v_cache,
                kv.positions,
                kv.inv_freq,
                kv.slots,
                m,
                nq / hd,
                g,
            );
        }
        let q_b = want_f32(op, "q", q, m * nq)?;
        let caches = want_kv(op, kv.k_cache, kv.v_cache, g)?;
        if caches.texels() && !hd.is_multiple_of(4) {
            return Err(err(format!(
                "{op}: caches in textures need head_dim % 4 == 0 (head_dim {hd}; alloc_kv says so)"
            )));
        }
        let p_b = want_u32(op, "positions", kv.positions, m)?;
        let f_b = want_f32(op, "inv_freq", kv.inv_freq, hd / 2)?;
        let s_b = want_u32(op, "slots", kv.slots, m)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        to_u32(op, "m * (nq + 2 nkv)", m * (nq + 2 * nkv))?;
        let out = Out::SplitRope { q: q_b, nq, nkv, head_dim: hd, caches, kv: [p_b, f_b, s_b], num_slots: g.slots() };
        self.matmul_to(op, x, w, bias, out, norm.map(|n| (n.h, n.eps)), m, nq + 2 * nkv, hidden)
    }

    fn fuses_norm(&self, hidden: usize, tokens: usize) -> bool {
        // Every block of a projection's columns recomputes the norm of its rows (a workgroup
        // prologue): at one or two tokens that costs less than the add_rms_norm dispatches it
        // saves; at a 128-token prefill it made the prefill about 10% slower (docs/bench-cpu.md).
        self.fuse_norm && hidden.is_multiple_of(4) && tokens <= self.fuse_norm_rows
    }

    fn matmul_residual(
        &self,
        x: &WgpuBuf,
        w: &WgpuBuf,
        h: &mut WgpuBuf,
        next_norm: Option<(&WgpuBuf, &mut WgpuBuf)>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let op = "matmul_residual";
        if !self.fuse_norm {
            return Err(err(format!("{op}: residual fusion is off (TANDEM_WGPU_FUSE_NORM=0)")));
        }
        let h_b = want_f32(op, "h", h, m * n)?;
        let next_norm = match next_norm {
            Some((g, hg)) => {
                if g.buf.size() > self.max_binding || g.tiled.is_some() {
                    return Err(err(format!(
                        "{op}: norm weight {} must be a vector within one storage binding",
                        g.label()
                    )));
                }
                Some((g, want_f32(op, "hg", hg, m * n)?))
            }
            None => None,
        };
        self.matmul_to(op, x, w, None, Out::Residual { h: h_b, next_norm }, None, m, n, k)
    }

    fn rope_kv_write(
        &self,
        q: &mut WgpuBuf,
        k: &mut WgpuBuf,
        v: &WgpuBuf,
        k_cache: &mut WgpuBuf,
        v_cache: &mut WgpuBuf,
        positions: &WgpuBuf,
        inv_freq: &WgpuBuf,
        slots: &WgpuBuf,
        num_tokens: usize,
        q_heads: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let op = "rope_kv_write";
        let (kv_heads, head_dim) = (g.num_kv_heads, g.head_dim);
        if head_dim % 2 != 0 {
            return Err(err(format!("{op}: head_dim {head_dim} is odd")));
        }
        let half = head_dim / 2;
        let kv_dim = kv_heads * head_dim;
        let q_b = want_f32(op, "q", q, num_tokens * q_heads * head_dim)?;
        let k_b = want_f32(op, "k", k, num_tokens * kv_dim)?;
        let v_b = want_f32(op, "v", v, num_tokens * kv_dim)?;
        let kv = want_kv(op, k_cache, v_cache, g)?;
        let p_b = want_u32(op, "positions", positions, num_tokens)?;
        let f_b = want_f32(op, "inv_freq", inv_freq, half)?;
        let s_b = want_u32(op, "slots", slots, num_tokens)?;
        to_u32(op, "tokens * heads * head_dim", num_tokens * (q_heads + kv_heads) * head_dim)?;
        to_u32(op, "cache elements", g.layer_elems())?;
        let params = [num_tokens as u32, q_heads as u32, kv_heads as u32, head_dim as u32, g.slots() as u32];
        let [kc, vc] = kv.binds();
        let binds =
            [Bind::all(q_b), Bind::all(k_b), Bind::all(p_b), Bind::all(f_b), Bind::all(v_b), kc, vc, Bind::all(s_b)];
        let prelude = Prelude::new().sincos().kv_cache(6, kv.texels(), true);
        match kv.texels() {
            // q's pairs, then k and v a vec4 at a time (see rope.wgsl).
            true => {
                let items = num_tokens * q_heads * half + num_tokens * kv_dim / 4;
                self.rec.dispatch(shaders::ROPE_KV_WRITE_T, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
            }
            false => {
                let items = num_tokens * (q_heads + kv_heads) * half;
                self.rec.dispatch(shaders::ROPE_KV_WRITE, &prelude, &params, &binds, Grid::Linear(groups(items, 64)))
            }
        }
    }
}

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
