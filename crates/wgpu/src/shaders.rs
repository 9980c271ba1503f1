//! WGSL sources (compiled in, or read from a directory at run time), the generated prelude
//! that specialises a kernel for a weight dtype, and the cache of compute pipelines.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Mutex;

use tandem_core::fp8::Fp8Format;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::{DType, Error, Result};

use crate::adapter::NAME;

/// Environment variable naming a directory of `*.wgsl` files that replace the compiled-in ones.
pub const SHADER_DIR_ENV: &str = "TANDEM_SHADER_DIR";

/// Bytes of the parameter block every kernel gets at binding 0.
pub(crate) const PARAMS_BYTES: u64 = 64;

/// The shader files, by op family; `file` names both `shaders/<file>.wgsl` and its entry point.
const EMBEDDED: &[(&str, &str)] = &[
    ("embedding", include_str!("../../../shaders/embedding.wgsl")),
    ("gather_rows", include_str!("../../../shaders/gather_rows.wgsl")),
    ("rms_norm", include_str!("../../../shaders/rms_norm.wgsl")),
    ("add", include_str!("../../../shaders/add.wgsl")),
    ("matmul", include_str!("../../../shaders/matmul.wgsl")),
    ("rope", include_str!("../../../shaders/rope.wgsl")),
    ("silu_mul", include_str!("../../../shaders/silu_mul.wgsl")),
    ("kv_write", include_str!("../../../shaders/kv_write.wgsl")),
    ("paged_attention", include_str!("../../../shaders/paged_attention.wgsl")),
    ("argmax", include_str!("../../../shaders/argmax.wgsl")),
    ("moe", include_str!("../../../shaders/moe.wgsl")),
    ("lora", include_str!("../../../shaders/lora.wgsl")),
    ("quant_block", include_str!("../../../shaders/quant_block.wgsl")),
    ("quant_int4", include_str!("../../../shaders/quant_int4.wgsl")),
    ("quant_fp8", include_str!("../../../shaders/quant_fp8.wgsl")),
    ("quant_matmul", include_str!("../../../shaders/quant_matmul.wgsl")),
    ("quant_embedding", include_str!("../../../shaders/quant_embedding.wgsl")),
    ("quant_split", include_str!("../../../shaders/quant_split.wgsl")),
    ("quant_split_matmul", include_str!("../../../shaders/quant_split_matmul.wgsl")),
    ("quant_split_embedding", include_str!("../../../shaders/quant_split_embedding.wgsl")),
    ("quant_tile", include_str!("../../../shaders/quant_tile.wgsl")),
];

/// How a kernel uses one storage binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Access {
    Read,
    ReadWrite,
    /// A uniform buffer (read only, small).
    Uniform,
    /// A weight matrix in a read-only rgba32uint storage texture (see `buffer::Texels`).
    Texels,
    /// A write-only rgba32uint storage texture (a KV cache in texels, written by kv_write).
    TexelsWrite,
}
use Access::{Read as R, ReadWrite as RW, Texels as T, TexelsWrite as TW};

/// A kernel: its file `shaders/<name>.wgsl`, its entry point, and its storage bindings from 1
/// on, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernel {
    pub name: &'static str,
    pub entry: &'static str,
    pub bindings: &'static [Access],
}

const fn k(name: &'static str, bindings: &'static [Access]) -> Kernel {
    Kernel { name, entry: name, bindings }
}

pub(crate) const EMBEDDING: Kernel = k("embedding", &[R, R, RW]);
pub(crate) const EMBEDDING_T: Kernel = k("embedding", &[T, R, RW]);
pub(crate) const GATHER_ROWS: Kernel = k("gather_rows", &[R, R, RW]);
pub(crate) const RMS_NORM: Kernel = k("rms_norm", &[R, R, RW]);
pub(crate) const ADD: Kernel = k("add", &[RW, R]);
/// The matmul kernel for its bindings: x (`Read`: a storage buffer; `Uniform`: a uniform window,
/// see [`Prelude::x_vec4`]; `Texels`: a texture, see [`Prelude::x_texels`]), w in a buffer or a
/// texture, out, then `extra` in binding order (the bias, the outputs of [`MatmulOut`], the
/// norm input of [`Prelude::norm_in`]: whichever the dispatch has).
pub(crate) fn matmul_kernel(x: Access, texels: bool, extra: &[Access]) -> Kernel {
    let mut bindings = vec![x, if texels { T } else { R }, RW];
    bindings.extend_from_slice(extra);
    k("matmul", intern(bindings))
}

/// A binding list made at run time, kept for the life of the process (the handful of matmul
/// variants), so that a [`Kernel`] stays `Copy` and keys the pipeline cache by its bindings.
fn intern(bindings: Vec<Access>) -> &'static [Access] {
    static LISTS: Mutex<Vec<&'static [Access]>> = Mutex::new(Vec::new());
    let mut lists = LISTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = lists.iter().find(|l| **l == bindings.as_slice()) {
        return l;
    }
    let l: &'static [Access] = Box::leak(bindings.into_boxed_slice());
    lists.push(l);
    l
}

/// Where matmul's results go (the prelude's `store_out(row, col, v)` and `PAIRS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatmulOut {
    /// `out[row, col]`, `p.n` columns.
    Plain,
    /// A fused q/k/v projection: weight rows `[0, nq)` go to out (q), the next `nkv` to
    /// `k_out`, the last `nkv` to `v_out` (bound at `k_binding` and the one after).
    Split { nq: u32, nkv: u32, k_binding: u32 },
    /// A fused gate/up projection with the activation (silu, or with `gelu` gelu_tanh): see
    /// matmul.wgsl (`PAIRS`, `GELU`).
    GateUp { gelu: bool },
    /// A fused q/k/v projection with rope and the KV-cache write in its epilogue: q (rows
    /// `[0, nq)`) rotated into out; k rotated and v copied into the caches at the token's slot.
    /// Bindings from `first`: k_cache, v_cache, positions, inv_freq, slots. Needs each head's
    /// rows in one lane (see matmul.wgsl's `ROPE`): head_dim divides WG * RT and head_dim / 2
    /// is a multiple of WG.
    /// With `texels` the caches are write-only rgba32uint textures (`Prelude::kv_cache`): a
    /// texel holds four elements of one lane's neighbours, so K and V go through workgroup
    /// memory (`KV_STAGE`, one barrier) and each lane then stores whole texels.
    SplitRope { nq: u32, nkv: u32, head_dim: u32, first: u32, texels: bool },
    /// The residual add: `out[row, col] += v`; with `next_norm = Some((binding, dtype))` also
    /// `hg[row, col] = out[row, col] * gamma[col]`, gamma (a weight vector) bound at `binding`
    /// and hg (f32) at the one after.
    Residual { next_norm: Option<(u32, DType)> },
}
pub(crate) const ROPE: Kernel = k("rope", &[RW, RW, R, R]);
/// rope fused with kv_write: q, k, positions, inv_freq, v, k_cache, v_cache, slots.
pub(crate) const ROPE_KV_WRITE: Kernel =
    Kernel { name: "rope", entry: "rope_kv_write", bindings: &[RW, RW, R, R, R, RW, RW, R] };
pub(crate) const SILU_MUL: Kernel = k("silu_mul", &[R, R, RW]);
pub(crate) const KV_WRITE: Kernel = k("kv_write", &[R, R, RW, RW, R]);
pub(crate) const PAGED_ATTENTION: Kernel = k("paged_attention", &[R, R, R, R, R, R, RW]);
pub(crate) const PAGED_ATTENTION_LANE: Kernel =
    Kernel { name: "paged_attention", entry: "paged_attention_lane", bindings: &[R, R, R, R, R, R, RW] };
/// The KV cache in texels (see [`Prelude::kv_cache`]): the caches are textures.
pub(crate) const KV_WRITE_T: Kernel = Kernel { name: "kv_write", entry: "kv_write_t", bindings: &[R, R, TW, TW, R] };
/// An fp8 KV cache (`Prelude::kv_cache_fp8`): kv_write_t's vec4 stores into u32 words.
pub(crate) const KV_WRITE_FP8: Kernel = Kernel { name: "kv_write", entry: "kv_write_t", bindings: &[R, R, RW, RW, R] };
pub(crate) const ROPE_KV_WRITE_T: Kernel =
    Kernel { name: "rope", entry: "rope_kv_write_t", bindings: &[RW, RW, R, R, R, TW, TW, R] };
pub(crate) const PAGED_ATTENTION_T: Kernel = k("paged_attention", &[R, T, T, R, R, R, RW]);
pub(crate) const PAGED_ATTENTION_LANE_T: Kernel =
    Kernel { name: "paged_attention", entry: "paged_attention_lane", bindings: &[R, T, T, R, R, R, RW] };
pub(crate) const SILU_MUL4: Kernel = Kernel { name: "silu_mul", entry: "silu_mul4", bindings: &[R, R, RW] };
pub(crate) const GELU_TANH_MUL: Kernel = Kernel { name: "silu_mul", entry: "gelu_tanh_mul", bindings: &[R, R, RW] };
pub(crate) const GELU_TANH_MUL4: Kernel = Kernel { name: "silu_mul", entry: "gelu_tanh_mul4", bindings: &[R, R, RW] };
/// Bindings: x (scaled in place); the factor's bits in the parameter block.
pub(crate) const SCALE: Kernel = Kernel { name: "add", entry: "scale", bindings: &[RW] };
pub(crate) const RMS_NORM_LANE: Kernel = Kernel { name: "rms_norm", entry: "rms_norm_lane", bindings: &[R, R, RW] };
/// Bindings: acc (updated), w, out, x.
pub(crate) const ADD_RMS_NORM_LANE: Kernel =
    Kernel { name: "rms_norm", entry: "add_rms_norm_lane", bindings: &[RW, R, RW, R] };
pub(crate) const ARGMAX: Kernel = k("argmax", &[R, RW]);
/// Bindings: logits, weights.
pub(crate) const MOE_ROUTE: Kernel = Kernel { name: "moe", entry: "moe_route", bindings: &[R, RW] };
/// Bindings: acc (updated), y, routing weights.
pub(crate) const MOE_ACCUMULATE: Kernel = Kernel { name: "moe", entry: "moe_accumulate", bindings: &[RW, R, R] };
/// Bindings: x, stacked A, row slots, shrink.
pub(crate) const LORA_SHRINK: Kernel = Kernel { name: "lora", entry: "lora_shrink", bindings: &[R, R, R, RW] };
/// Bindings: shrink, stacked B, row slots, slot scales, y (updated).
pub(crate) const LORA_EXPAND: Kernel = Kernel { name: "lora", entry: "lora_expand", bindings: &[R, R, R, R, RW] };
/// `LORA_SHRINK` reading x and A a vec4 at a time (`in` a multiple of 4).
pub(crate) const LORA_SHRINK4: Kernel = Kernel { name: "lora", entry: "lora_shrink4", bindings: &[R, R, R, RW] };
/// `LORA_EXPAND` reading shrink and B a vec4 at a time (`max_rank` a multiple of 4).
pub(crate) const LORA_EXPAND4: Kernel = Kernel { name: "lora", entry: "lora_expand4", bindings: &[R, R, R, R, RW] };

/// A weight kept in a GGUF block layout: x, the blocks, out (then the bias, when given).
pub(crate) const QUANT_MATMUL: Kernel = k("quant_matmul", &[R, R, RW]);
pub(crate) const QUANT_MATMUL_BIAS: Kernel = k("quant_matmul", &[R, R, RW, R]);
/// Bindings: the table's blocks, ids, out.
pub(crate) const QUANT_EMBEDDING: Kernel = k("quant_embedding", &[R, R, RW]);
/// A weight in the split layout (`crate::quant_split`), held in a texture: x, the texture, out
/// (then the bias, when given).
/// `x`: how x is bound (`Read` or `Uniform`, see [`Prelude::x_vec4`]).
pub(crate) fn quant_split_matmul_kernel(x: Access, bias: bool) -> Kernel {
    let mut bindings = vec![x, T, RW];
    if bias {
        bindings.push(R);
    }
    k("quant_split_matmul", intern(bindings))
}
/// The prefill tile kernel for a quantized weight (see [`Prelude::quant_tile_weight`]): x, the
/// weight (a texture when `texels`, else a buffer), out (then the bias, when given).
pub(crate) fn quant_tile_kernel(texels: bool, bias: bool) -> Kernel {
    let mut bindings = vec![R, if texels { T } else { R }, RW];
    if bias {
        bindings.push(R);
    }
    k("quant_tile", intern(bindings))
}
/// Bindings: the table's texture, ids, out.
pub(crate) const QUANT_SPLIT_EMBEDDING: Kernel = k("quant_split_embedding", &[T, R, RW]);

/// How a weight matrix is laid out on the device (see `crate::buffer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatrixLayout {
    RowMajor,
    /// [`crate::buffer::Tiled`] in a storage buffer.
    Tiled,
    /// [`crate::buffer::Tiled`] in a texture ([`crate::buffer::Texels`]).
    Texels,
}

/// The gated MLP activations, one text for silu_mul.wgsl's scalar kernels and matmul.wgsl's
/// `PAIRS` epilogue (so a fused gate/up projection applies silu_mul's and gelu_tanh_mul's
/// formulas): `silu(g)`, `gelu_tanh(g)` (see silu_mul.wgsl on the clamp).
const GATED_ACTS: &str = "fn silu(g: f32) -> f32 { return g / (1.0 + exp(-g)); }\n\
fn gelu_tanh(g: f32) -> f32 {\n\
\x20   let inner = clamp(0.7978846 * (g + 0.044715 * g * g * g), -10.0, 10.0);\n\
\x20   return 0.5 * g * (1.0 + tanh(inner));\n\
}\n";

/// How a prelude from [`Prelude::quant_block`] starts its decoder: the pipeline then adds
/// shaders/quant_block.wgsl, which defines the `decode4_*` it names.
const QUANT_DECODE: &str = "fn decode4";

/// How a prelude from [`Prelude::quant_split`] starts its decoder: the pipeline then adds
/// shaders/quant_split.wgsl and shaders/quant_fp8.wgsl.
const SPLIT_DECODE: &str = "fn split4";

/// Declarations prepended to a kernel's source; equal preludes share a pipeline.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Prelude(String);

impl Prelude {
    pub fn new() -> Self {
        Prelude(String::new())
    }

    /// Accessors for a weight the kernel binds as `name`: `name_t`, `name_at(i)`, `name_pair(i)`.
    pub fn weight(mut self, name: &str, dtype: DType) -> Self {
        let n = name;
        let text = match dtype {
            // bf16 is the top half of an f32: shift the low element up, mask the high one.
            DType::BF16 => format!(
                "alias {n}_t = u32;\n\
                 fn {n}_at(i: u32) -> f32 {{ let word = {n}[i >> 1u]; return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u)); }}\n\
                 fn {n}_pair(i: u32) -> vec2<f32> {{ let word = {n}[i >> 1u]; return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u)); }}\n"
            ),
            DType::F16 => format!(
                "alias {n}_t = u32;\n\
                 fn {n}_at(i: u32) -> f32 {{ return unpack2x16float({n}[i >> 1u])[i & 1u]; }}\n\
                 fn {n}_pair(i: u32) -> vec2<f32> {{ return unpack2x16float({n}[i >> 1u]); }}\n"
            ),
            DType::F32 => format!(
                "alias {n}_t = f32;\n\
                 fn {n}_at(i: u32) -> f32 {{ return {n}[i]; }}\n\
                 fn {n}_pair(i: u32) -> vec2<f32> {{ return vec2<f32>({n}[i], {n}[i + 1u]); }}\n"
            ),
        };
        self.0.push_str(&text);
        self
    }

    /// Like [`Prelude::weight`], with the weight bound as 16-byte vectors (`name_t` is
    /// `vec4<u32>` or `vec4<f32>`), adding `name_oct(i) -> mat2x4<f32>`: elements i..i+8, i a
    /// multiple of 8. A software rasteriser pays per load instruction, not per byte, so one
    /// load of eight bf16 values is what makes the decode matmul fast there.
    pub fn weight4(mut self, name: &str, dtype: DType) -> Self {
        let n = name;
        let text = match dtype {
            DType::BF16 => format!(
                "alias {n}_t = vec4<u32>;\n\
                 fn {n}_at(i: u32) -> f32 {{ let word = {n}[i >> 3u][(i >> 1u) & 3u]; return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (i & 1u) == 1u)); }}\n\
                 fn {n}_oct(i: u32) -> mat2x4<f32> {{ let v = {n}[i >> 3u]; let lo = vec4<u32>(v.x << 16u, v.x & 0xffff0000u, v.y << 16u, v.y & 0xffff0000u); let hi = vec4<u32>(v.z << 16u, v.z & 0xffff0000u, v.w << 16u, v.w & 0xffff0000u); return mat2x4<f32>(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi)); }}\n"
            ),
            DType::F16 => format!(
                "alias {n}_t = vec4<u32>;\n\
                 fn {n}_at(i: u32) -> f32 {{ return unpack2x16float({n}[i >> 3u][(i >> 1u) & 3u])[i & 1u]; }}\n\
                 fn {n}_oct(i: u32) -> mat2x4<f32> {{ let v = {n}[i >> 3u]; return mat2x4<f32>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w))); }}\n"
            ),
            DType::F32 => format!(
                "alias {n}_t = vec4<f32>;\n\
                 fn {n}_at(i: u32) -> f32 {{ return {n}[i >> 2u][i & 3u]; }}\n\
                 fn {n}_oct(i: u32) -> mat2x4<f32> {{ return mat2x4<f32>({n}[i >> 2u], {n}[(i >> 2u) + 1u]); }}\n"
            ),
        };
        self.0.push_str(&text);
        self
    }

    /// A weight matrix with `cols` elements per row, bound at `binding` (the prelude declares
    /// it), with accessors by (row, column) that hide its layout: `name_at_rc(row, col, cols)
    /// -> f32` and `name_oct_rc(row, col, cols) -> mat2x4<f32>` (elements col..col+8 of the
    /// row, col a multiple of 8). Row-major (with [`Prelude::weight4`]'s flat accessors too),
    /// or tiled as `crate::buffer::Tiled` describes: unit `u` (16 bytes) of row `r` at unit
    /// `((r >> log2 T) * units + u) << log2 T | (r & (T - 1))`, in a storage buffer or in a
    /// texture (unit `i` at texel `(i % TEXEL_ROW, i / TEXEL_ROW)`).
    pub fn weight_matrix(mut self, name: &str, dtype: DType, layout: MatrixLayout, binding: u32) -> Self {
        let n = name;
        if layout == MatrixLayout::Texels {
            let (alias, load) = match dtype {
                DType::F32 => ("vec4<f32>", "bitcast<vec4<f32>>(q)"),
                _ => ("vec4<u32>", "q"),
            };
            let (log, mask) = (crate::buffer::TEXEL_ROW_LOG2, crate::buffer::TEXEL_ROW - 1);
            self.0.push_str(&format!(
                "@group(0) @binding({binding}) var {n}: texture_storage_2d<rgba32uint, read>;\n\
                 alias {n}_t = {alias};\n\
                 fn {n}_unitv(i: u32) -> {n}_t {{ let q = textureLoad({n}, vec2<u32>(i & {mask}u, i >> {log}u)); return {load}; }}\n"
            ));
        } else {
            self.0.push_str(&format!("@group(0) @binding({binding}) var<storage, read> {n}: array<{n}_t>;\n"));
            self = self.weight4(name, dtype);
            self.0.push_str(&format!("fn {n}_unitv(i: u32) -> {n}_t {{ return {n}[i]; }}\n"));
        }
        let text = if layout == MatrixLayout::RowMajor {
            format!(
                "fn {n}_at_rc(r: u32, c: u32, cols: u32) -> f32 {{ return {n}_at(r * cols + c); }}\n\
                 fn {n}_oct_rc(r: u32, c: u32, cols: u32) -> mat2x4<f32> {{ return {n}_oct(r * cols + c); }}\n"
            )
        } else {
            let shift = crate::buffer::TILE_ROWS.trailing_zeros();
            let mask = crate::buffer::TILE_ROWS - 1;
            // Elements per 16-byte unit: 8 halves or 4 floats.
            let (per, unit_of) = match dtype {
                DType::F32 => (4, "c >> 2u"),
                _ => (8, "c >> 3u"),
            };
            let unit = format!(
                "fn {n}_unit(r: u32, u: u32, cols: u32) -> u32 {{ return ((((r >> {shift}u) * (cols / {per}u)) + u) << {shift}u) | (r & {mask}u); }}\n"
            );
            let rest = match dtype {
                DType::BF16 => format!(
                    "fn {n}_at_rc(r: u32, c: u32, cols: u32) -> f32 {{ let word = {n}_unitv({n}_unit(r, {unit_of}, cols))[(c >> 1u) & 3u]; return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (c & 1u) == 1u)); }}\n\
                     fn {n}_oct_rc(r: u32, c: u32, cols: u32) -> mat2x4<f32> {{ let v = {n}_unitv({n}_unit(r, {unit_of}, cols)); let lo = vec4<u32>(v.x << 16u, v.x & 0xffff0000u, v.y << 16u, v.y & 0xffff0000u); let hi = vec4<u32>(v.z << 16u, v.z & 0xffff0000u, v.w << 16u, v.w & 0xffff0000u); return mat2x4<f32>(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi)); }}\n"
                ),
                DType::F16 => format!(
                    "fn {n}_at_rc(r: u32, c: u32, cols: u32) -> f32 {{ return unpack2x16float({n}_unitv({n}_unit(r, {unit_of}, cols))[(c >> 1u) & 3u])[c & 1u]; }}\n\
                     fn {n}_oct_rc(r: u32, c: u32, cols: u32) -> mat2x4<f32> {{ let v = {n}_unitv({n}_unit(r, {unit_of}, cols)); return mat2x4<f32>(vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y)), vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w))); }}\n"
                ),
                DType::F32 => format!(
                    "fn {n}_at_rc(r: u32, c: u32, cols: u32) -> f32 {{ return {n}_unitv({n}_unit(r, {unit_of}, cols))[c & 3u]; }}\n\
                     fn {n}_oct_rc(r: u32, c: u32, cols: u32) -> mat2x4<f32> {{ let u = {n}_unit(r, {unit_of}, cols); return mat2x4<f32>({n}_unitv(u), {n}_unitv(u + {}u)); }}\n",
                    crate::buffer::TILE_ROWS
                ),
            };
            unit + &rest
        };
        self.0.push_str(&text);
        self
    }

    /// An optional weight at `binding`: declared with accessors, or `name_at` returning 0.
    pub fn optional_weight(mut self, name: &str, binding: u32, dtype: Option<DType>) -> Self {
        match dtype {
            Some(d) => {
                self.0
                    .push_str(&format!("@group(0) @binding({binding}) var<storage, read> {name}: array<{name}_t>;\n"));
                self.weight(name, d)
            }
            None => {
                self.0.push_str(&format!("fn {name}_at(i: u32) -> f32 {{ return 0.0; }}\n"));
                self
            }
        }
    }

    /// matmul's input norm (see `tandem_core::backend::NormIn`): with `Some(binding)`, the
    /// residual stream h f32 `[rows, p.k]` (p.k a multiple of 4) bound there, `NORM` true and
    /// `norm_prologue(li, row0, last)`: 1 / sqrt(mean(h[row]²) + p.eps) of the MT rows from
    /// row0 (rows past `last` repeat it), which scale the rows' results. The workgroup's lanes
    /// share the rows, so each sums a strided part and one barrier joins the parts: every lane
    /// reading the whole row cost more than the norm dispatch it replaces (on lavapipe, a
    /// storage load whose address comes from a loop is a loop over the lanes). Call it in
    /// uniform control flow. With `None`, `NORM` false.
    pub fn norm_in(mut self, binding: Option<u32>) -> Self {
        self.0.push_str(&match binding {
            Some(b) => format!(
                "const NORM: bool = true;\n\
                 @group(0) @binding({b}) var<storage, read> norm_h: array<vec4<f32>>;\n\
                 var<workgroup> norm_part: array<f32, WG * MT>;\n\
                 fn norm_prologue(li: u32, row0: u32, last: u32) -> array<f32, MT> {{\n\
                 \x20   let k4 = p.k / 4u;\n\
                 \x20   for (var mi = 0u; mi < MT; mi++) {{\n\
                 \x20       let base = min(row0 + mi, last) * k4;\n\
                 \x20       var s = 0.0;\n\
                 \x20       for (var i = li; i < k4; i += WG) {{ let v = norm_h[base + i]; s += dot(v, v); }}\n\
                 \x20       norm_part[mi * WG + li] = s;\n\
                 \x20   }}\n\
                 \x20   workgroupBarrier();\n\
                 \x20   var inv: array<f32, MT>;\n\
                 \x20   for (var mi = 0u; mi < MT; mi++) {{\n\
                 \x20       var s = 0.0;\n\
                 \x20       for (var j = 0u; j < WG; j++) {{ s += norm_part[mi * WG + j]; }}\n\
                 \x20       inv[mi] = 1.0 / sqrt(s / f32(p.k) + p.eps);\n\
                 \x20   }}\n\
                 \x20   return inv;\n\
                 }}\n"
            ),
            None => "const NORM: bool = false;\nfn norm_prologue(li: u32, row0: u32, last: u32) -> array<f32, MT> { var inv: array<f32, MT>; return inv; }\n".to_string(),
        });
        self
    }

    /// An f32 activation bound at `binding` as vec4s, read by `name4(i)`: from a storage
    /// buffer, or from a uniform buffer of exactly `uniform_vec4s` vec4s.
    pub fn x_vec4(mut self, name: &str, binding: u32, uniform_vec4s: Option<u32>) -> Self {
        let decl = match uniform_vec4s {
            Some(n) => format!("@group(0) @binding({binding}) var<uniform> {name}: array<vec4<f32>, {n}>;\n"),
            None => format!("@group(0) @binding({binding}) var<storage, read> {name}: array<vec4<f32>>;\n"),
        };
        self.0.push_str(&decl);
        self.0.push_str(&format!("fn {name}4(i: u32) -> vec4<f32> {{ return {name}[i]; }}\n"));
        self
    }

    /// An f32 activation bound at `binding` as a texture of rgba32uint texels (vec4 `i` of the
    /// activation at texel `(i % TEXEL_ROW, i / TEXEL_ROW)`, f32 bits), read by `name4(i)`.
    pub fn x_texels(mut self, name: &str, binding: u32) -> Self {
        let (log, mask) = (crate::buffer::TEXEL_ROW_LOG2, crate::buffer::TEXEL_ROW - 1);
        self.0.push_str(&format!(
            "@group(0) @binding({binding}) var {name}_tex: texture_storage_2d<rgba32uint, read>;\n\
             fn {name}4(i: u32) -> vec4<f32> {{ return bitcast<vec4<f32>>(textureLoad({name}_tex, vec2<u32>(i & {mask}u, i >> {log}u))); }}\n"
        ));
        self
    }

    /// How a kernel reaches the KV caches bound at `k_binding` and `k_binding + 1`: through
    /// `k_at(i)` / `v_at(i)` (element `i`) and `k4_at(i)` / `v4_at(i)` (vec4 `i`) when reading,
    /// `k4_store(i, x)` / `v4_store(i, x)` when writing. In storage buffers (the kernel file
    /// declares them as `k_cache`/`k4`, `v_cache`/`v4`), or with `texels` in rgba32uint
    /// textures (`buffer::Texels`: vec4 `i` of the cache at texel `(i % TEXEL_ROW, i /
    /// TEXEL_ROW)`, f32 bits) declared here, read-only or (`write`) write-only. lavapipe reads
    /// a storage buffer at addresses that differ across lanes one lane and one component at a
    /// time, a texel with one gather: attention's K and V loads are what that is for.
    pub fn kv_cache(mut self, k_binding: u32, texels: bool, write: bool) -> Self {
        let (log, mask) = (crate::buffer::TEXEL_ROW_LOG2, crate::buffer::TEXEL_ROW - 1);
        let text = match (texels, write) {
            (false, false) => "fn k_at(i: u32) -> f32 { return k_cache[i]; }\n\
                 fn v_at(i: u32) -> f32 { return v_cache[i]; }\n\
                 fn k4_at(i: u32) -> vec4<f32> { return k4[i]; }\n\
                 fn v4_at(i: u32) -> vec4<f32> { return v4[i]; }\n"
                .to_string(),
            (false, true) => "fn k4_store(i: u32, x: vec4<f32>) { k4[i] = x; }\n\
                 fn v4_store(i: u32, x: vec4<f32>) { v4[i] = x; }\n"
                .to_string(),
            (true, false) => format!(
                "@group(0) @binding({k_binding}) var k_tex: texture_storage_2d<rgba32uint, read>;\n\
                 @group(0) @binding({}) var v_tex: texture_storage_2d<rgba32uint, read>;\n\
                 fn k4_at(i: u32) -> vec4<f32> {{ return bitcast<vec4<f32>>(textureLoad(k_tex, vec2<u32>(i & {mask}u, i >> {log}u))); }}\n\
                 fn v4_at(i: u32) -> vec4<f32> {{ return bitcast<vec4<f32>>(textureLoad(v_tex, vec2<u32>(i & {mask}u, i >> {log}u))); }}\n\
                 fn k_at(i: u32) -> f32 {{ return k4_at(i >> 2u)[i & 3u]; }}\n\
                 fn v_at(i: u32) -> f32 {{ return v4_at(i >> 2u)[i & 3u]; }}\n",
                k_binding + 1
            ),
            (true, true) => format!(
                "@group(0) @binding({k_binding}) var k_tex: texture_storage_2d<rgba32uint, write>;\n\
                 @group(0) @binding({}) var v_tex: texture_storage_2d<rgba32uint, write>;\n\
                 fn k4_store(i: u32, x: vec4<f32>) {{ textureStore(k_tex, vec2<u32>(i & {mask}u, i >> {log}u), bitcast<vec4<u32>>(x)); }}\n\
                 fn v4_store(i: u32, x: vec4<f32>) {{ textureStore(v_tex, vec2<u32>(i & {mask}u, i >> {log}u), bitcast<vec4<u32>>(x)); }}\n",
                k_binding + 1
            ),
        };
        self.0.push_str(&text);
        self
    }

    /// [`Prelude::kv_cache`] for an fp8 cache in storage buffers: 4 elements a u32 word
    /// (`crate::fp8_codec`), bound at `k_binding` and the one after as `k8` / `v8`. Reading
    /// decodes and multiplies by the kernel's `p.k_scale` / `p.v_scale`; `k4_store(i, x)` writes
    /// word `i` from `x / scale` rounded as `tandem_core::fp8_round` rounds. A word holds whole
    /// vec4s only, so a writer stores a vec4 at a time (no two lanes share a word).
    pub fn kv_cache_fp8(mut self, k_binding: u32, format: Fp8Format, write: bool) -> Self {
        let access = if write { "read_write" } else { "read" };
        self.0.push_str(&crate::fp8_codec::wgsl(format));
        self.0.push_str(&format!(
            "@group(0) @binding({k_binding}) var<storage, {access}> k8: array<u32>;\n\
             @group(0) @binding({}) var<storage, {access}> v8: array<u32>;\n",
            k_binding + 1
        ));
        self.0.push_str(if write {
            "fn k4_store(i: u32, x: vec4<f32>) { k8[i] = fp8x4_encode(div4_rn(x, p.k_scale)); }\n\
             fn v4_store(i: u32, x: vec4<f32>) { v8[i] = fp8x4_encode(div4_rn(x, p.v_scale)); }\n"
        } else {
            "fn k4_at(i: u32) -> vec4<f32> { return fp8x4_decode(k8[i]) * p.k_scale; }\n\
             fn v4_at(i: u32) -> vec4<f32> { return fp8x4_decode(v8[i]) * p.v_scale; }\n\
             fn k_at(i: u32) -> f32 { return fp8_decode(k8[i >> 2u] >> ((i & 3u) << 3u)) * p.k_scale; }\n\
             fn v_at(i: u32) -> f32 { return fp8_decode(v8[i >> 2u] >> ((i & 3u) << 3u)) * p.v_scale; }\n"
        });
        self
    }

    /// paged_attention.wgsl's lane kernel per key, written out for `hv` = head_dim / 4 and `gq`
    /// query heads (the prelude constants HV and GQ): `lane_scores(ko, &qv) -> array<f32, GQ>`,
    /// the GQ dot products of the key's vec4s from `ko` with qv, and `lane_accumulate(ko, &acc,
    /// corr, pr)`, acc = acc * corr + pr * the value's vec4s. Every private-array index is a
    /// constant here: lavapipe did not unroll these loops (HV x GQ long) and served each
    /// run-time index of qv and acc with a load per lane, which was most of attention's time.
    pub fn lane_attention(mut self, hv: usize, gq: usize) -> Self {
        let mut t = String::from("fn lane_scores(ko: u32, qv: ptr<function, array<vec4<f32>, GQ * HV>>) -> array<f32, GQ> {\n    var s: array<vec4<f32>, GQ>;\n");
        for g in 0..gq {
            t += &format!("    s[{g}] = vec4<f32>(0.0);\n");
        }
        for d in 0..hv {
            t += &format!("    {{ let kk = k4_at(ko + {d}u);");
            for g in 0..gq {
                t += &format!(" s[{g}] += (*qv)[{}] * kk;", g * hv + d);
            }
            t += " }\n";
        }
        let sums: Vec<String> = (0..gq).map(|g| format!("s[{g}].x + s[{g}].y + s[{g}].z + s[{g}].w")).collect();
        t += &format!("    return array<f32, GQ>({});\n}}\n", sums.join(", "));
        t += "fn lane_accumulate(ko: u32, acc: ptr<function, array<vec4<f32>, GQ * HV>>, corr: array<f32, GQ>, pr: array<f32, GQ>) {\n";
        for d in 0..hv {
            t += &format!("    {{ let vv = v4_at(ko + {d}u);");
            for g in 0..gq {
                let i = g * hv + d;
                t += &format!(" (*acc)[{i}] = (*acc)[{i}] * corr[{g}] + pr[{g}] * vv;");
            }
            t += " }\n";
        }
        t += "}\n";
        self.0.push_str(&t);
        self
    }

    /// `silu(g)` and `gelu_tanh(g)` ([`GATED_ACTS`]): silu_mul.wgsl's and matmul.wgsl's.
    pub fn gated_acts(mut self) -> Self {
        self.0.push_str(GATED_ACTS);
        self
    }

    /// matmul's `store_out`, `PAIRS` and `GELU` for `to`.
    pub fn matmul_out(mut self, to: MatmulOut) -> Self {
        self = self.gated_acts();
        self.0.push_str(&format!("const GELU: bool = {};\n", matches!(to, MatmulOut::GateUp { gelu: true })));
        let plain = "fn store_out(row: u32, col: u32, v: f32) { out[row * p.n + col] = v; }\n";
        // matmul.wgsl's rope epilogue: ROPE false leaves it out.
        let no_rope = "const ROPE: bool = false;\nconst HALF: u32 = 1u;\nfn store_rope(tok: u32, col: u32, i: u32, x1: f32, x2: f32, stage: u32) {}\n";
        let no_stage = "const KV_STAGE: bool = false;\nfn kv_stage_flush(base: u32, m0: u32, li: u32) {}\n";
        if !matches!(to, MatmulOut::SplitRope { texels: true, .. }) {
            self.0.push_str(no_stage);
        }
        if !matches!(to, MatmulOut::SplitRope { .. }) {
            self.0.push_str(no_rope);
        }
        let text = match to {
            MatmulOut::Plain => format!("const PAIRS: bool = false;\n{plain}"),
            MatmulOut::GateUp { .. } => format!("const PAIRS: bool = true;\n{plain}"),
            MatmulOut::Split { nq, nkv, k_binding } => format!(
                "const PAIRS: bool = false;\n\
                 @group(0) @binding({k_binding}) var<storage, read_write> k_out: array<f32>;\n\
                 @group(0) @binding({}) var<storage, read_write> v_out: array<f32>;\n\
                 fn store_out(row: u32, col: u32, v: f32) {{\n\
                 \x20   if (col < {nq}u) {{ out[row * {nq}u + col] = v; }}\n\
                 \x20   else if (col < {nq}u + {nkv}u) {{ k_out[row * {nkv}u + col - {nq}u] = v; }}\n\
                 \x20   else {{ v_out[row * {nkv}u + col - {nq}u - {nkv}u] = v; }}\n\
                 }}\n",
                k_binding + 1
            ),
            MatmulOut::SplitRope { nq, nkv, head_dim, first, texels } => {
                let half = head_dim / 2;
                // Both cache kinds: the bindings after the caches, and the rotation (q and k
                // columns; v passes through) with q's store.
                let head = format!(
                    "const PAIRS: bool = false;\n\
                     const ROPE: bool = true;\n\
                     const HALF: u32 = {half}u;\n\
                     @group(0) @binding({}) var<storage, read> rope_pos: array<u32>;\n\
                     @group(0) @binding({}) var<storage, read> rope_freq: array<f32>;\n\
                     @group(0) @binding({}) var<storage, read> rope_slots: array<u32>;\n\
                     {plain}\
                     // Column col (< HALF within its head, element i) and its partner col + HALF of token tok,\n\
                     // rotated unless they are v's; q's are stored (true returned).\n\
                     fn rope_q(tok: u32, col: u32, i: u32, y: ptr<function, vec2<f32>>) -> bool {{\n\
                     \x20   if (col < {nq}u + {nkv}u) {{\n\
                     \x20       *y = rotate((*y).x, (*y).y, sincos(f32(rope_pos[tok]) * rope_freq[i]));\n\
                     \x20   }}\n\
                     \x20   if (col < {nq}u) {{ out[tok * {nq}u + col] = (*y).x; out[tok * {nq}u + col + {half}u] = (*y).y; return true; }}\n\
                     \x20   return false;\n\
                     }}\n",
                    first + 2,
                    first + 3,
                    first + 4
                );
                self = self.sincos();
                if texels {
                    let kv4 = nkv / 4;
                    self = self.kv_cache(first, true, true);
                    format!(
                        "{head}\
                         const KV_STAGE: bool = true;\n\
                         // The block's rows for each of its tokens: K and V rows wait here for kv_stage_flush.\n\
                         var<workgroup> kv_stage: array<f32, MT * WG * RT>;\n\
                         // `stage` is col's place in kv_stage.\n\
                         fn store_rope(tok: u32, col: u32, i: u32, x1: f32, x2: f32, stage: u32) {{\n\
                         \x20   var y = vec2<f32>(x1, x2);\n\
                         \x20   if (rope_q(tok, col, i, &y)) {{ return; }}\n\
                         \x20   kv_stage[stage] = y.x;\n\
                         \x20   kv_stage[stage + {half}u] = y.y;\n\
                         }}\n\
                         // After the barrier: the K and V rows of the block (from row `base`) into the caches, a\n\
                         // texel of four rows at a time (a head never splits a texel: head_dim % 4 == 0).\n\
                         fn kv_stage_flush(base: u32, m0: u32, li: u32) {{\n\
                         \x20   for (var mi = 0u; mi < MT; mi++) {{\n\
                         \x20       if (m0 + mi >= p.m) {{ break; }}\n\
                         \x20       let slot = rope_slots[p.out_row0 + m0 + mi];\n\
                         \x20       if (slot >= p.num_slots) {{ continue; }}\n\
                         \x20       for (var u = li; u < WG * RT / 4u; u += WG) {{\n\
                         \x20           let row = base + 4u * u;\n\
                         \x20           if (row < {nq}u || row >= p.rows) {{ continue; }}\n\
                         \x20           let s = mi * WG * RT + 4u * u;\n\
                         \x20           let x = vec4<f32>(kv_stage[s], kv_stage[s + 1u], kv_stage[s + 2u], kv_stage[s + 3u]);\n\
                         \x20           if (row < {nq}u + {nkv}u) {{ k4_store(slot * {kv4}u + (row - {nq}u) / 4u, x); }}\n\
                         \x20           else {{ v4_store(slot * {kv4}u + (row - {nq}u - {nkv}u) / 4u, x); }}\n\
                         \x20       }}\n\
                         \x20   }}\n\
                         }}\n"
                    )
                } else {
                    format!(
                        "{head}\
                         @group(0) @binding({first}) var<storage, read_write> k_cache: array<f32>;\n\
                         @group(0) @binding({}) var<storage, read_write> v_cache: array<f32>;\n\
                         fn store_rope(tok: u32, col: u32, i: u32, x1: f32, x2: f32, stage: u32) {{\n\
                         \x20   var y = vec2<f32>(x1, x2);\n\
                         \x20   if (rope_q(tok, col, i, &y)) {{ return; }}\n\
                         \x20   let slot = rope_slots[tok];\n\
                         \x20   if (slot >= p.num_slots) {{ return; }}\n\
                         \x20   if (col < {nq}u + {nkv}u) {{ let o = slot * {nkv}u + col - {nq}u; k_cache[o] = y.x; k_cache[o + {half}u] = y.y; }}\n\
                         \x20   else {{ let o = slot * {nkv}u + col - {nq}u - {nkv}u; v_cache[o] = y.x; v_cache[o + {half}u] = y.y; }}\n\
                         }}\n",
                        first + 1
                    )
                }
            }
            MatmulOut::Residual { next_norm: None } => {
                "const PAIRS: bool = false;\nfn store_out(row: u32, col: u32, v: f32) { out[row * p.n + col] += v; }\n"
                    .to_string()
            }
            MatmulOut::Residual { next_norm: Some((binding, dtype)) } => {
                self = self.optional_weight("gamma", binding, Some(dtype));
                format!(
                    "const PAIRS: bool = false;\n\
                     @group(0) @binding({}) var<storage, read_write> hg: array<f32>;\n\
                     fn store_out(row: u32, col: u32, v: f32) {{ let i = row * p.n + col; let h = out[i] + v; out[i] = h; hg[i] = h * gamma_at(col); }}\n",
                    binding + 1
                )
            }
        };
        self.0.push_str(&text);
        self
    }

    /// `sincos(a) -> vec2<f32>(sin a, cos a)` for angles up to ~1e5 rad, to a few ulps: a GPU's
    /// own sin/cos is only bounded on [-pi, pi], and rope angles reach thousands of radians. The
    /// angle is reduced by pi/2 in three exact-ish steps (Cody-Waite: the first constant has 8
    /// significant bits, so kf * DP1 is exact for kf < 2^16), then short polynomials on
    /// [-pi/4, pi/4] (Cephes sinf/cosf). Also `rotate(x1, x2, sc)`, rope's rotation of a pair.
    /// Used by rope.wgsl and matmul's rope epilogue.
    pub fn sincos(mut self) -> Self {
        self.0.push_str(
            "fn sincos(a: f32) -> vec2<f32> {\n\
             \x20   let kf = round(a * 0.63661977236758134);\n\
             \x20   var r = a - kf * 1.5703125;\n\
             \x20   r = r - kf * 4.837512969970703125e-4;\n\
             \x20   r = r - kf * 7.549789948768648e-8;\n\
             \x20   let z = r * r;\n\
             \x20   let s = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));\n\
             \x20   let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));\n\
             \x20   switch i32(kf) & 3 {\n\
             \x20       case 0: { return vec2<f32>(s, c); }\n\
             \x20       case 1: { return vec2<f32>(c, -s); }\n\
             \x20       case 2: { return vec2<f32>(-s, -c); }\n\
             \x20       default: { return vec2<f32>(-c, s); }\n\
             \x20   }\n\
             }\n\
             // The pair (x1, x2) (elements i and i + head_dim / 2) rotated by the angle whose (sin, cos) is sc.\n\
             fn rotate(x1: f32, x2: f32, sc: vec2<f32>) -> vec2<f32> { return vec2<f32>(x1 * sc.y - x2 * sc.x, x2 * sc.y + x1 * sc.x); }\n",
        );
        self
    }

    /// add.wgsl's element type `elem_t` and `ELEMS`, the values in one: `vec4<f32>` and 4 with
    /// `vec4` (one invocation a vec4), else `f32` and 1.
    pub fn elems(mut self, vec4: bool) -> Self {
        self.0.push_str(if vec4 {
            "alias elem_t = vec4<f32>;\nconst ELEMS: u32 = 4u;\n"
        } else {
            "alias elem_t = f32;\nconst ELEMS: u32 = 1u;\n"
        });
        self
    }

    /// The block decoders (shaders/quant_block.wgsl, and shaders/quant_fp8.wgsl for FP8, which
    /// the pipeline puts after the prelude) for a weight in `layout`: `BLOCK_BYTES`,
    /// `BLOCK_ELEMS` and `decode4(base, e)`. `None` for a layout that keeps its scales beside
    /// the weight (no block decoder).
    pub fn quant_block(mut self, layout: QuantLayout) -> Option<Self> {
        let f = match layout {
            QuantLayout::Q8_0 => "q8_0",
            QuantLayout::Q4_0 => "q4_0",
            QuantLayout::Q4_1 => "q4_1",
            QuantLayout::Q5_0 => "q5_0",
            QuantLayout::Q5_1 => "q5_1",
            QuantLayout::Q4K => "q4_k",
            QuantLayout::Q5K => "q5_k",
            QuantLayout::Q6K => "q6_k",
            // shaders/quant_int4.wgsl: the group is BLOCK_ELEMS.
            QuantLayout::Int4Group { group } if group > 0 && group % 8 == 0 => "int4",
            QuantLayout::Fp8E4m3(_) => "fp8",
            QuantLayout::Int4Group { .. } => return None,
        };
        self.0.push_str(&format!(
            "const BLOCK_BYTES: u32 = {}u;\nconst BLOCK_ELEMS: u32 = {}u;\n{QUANT_DECODE}(base: u32, e: u32) -> vec4<f32> {{ return decode4_{f}(base, e); }}\n",
            layout.block_bytes(),
            layout.block_elems()
        ));
        Some(self)
    }

    /// The split-layout decoders (shaders/quant_split.wgsl, which the pipeline puts after the
    /// prelude) for a weight in `split`, held in a texture bound at `binding` (declared here as
    /// `qw`, read by `q_unit(i)`): `BLOCK_ELEMS`, `QU`, `QS`, `HH`, `VJ`, `HIGH_UNITS`,
    /// `SUBS_PER_HIGH`, `SCALE_UNIT`, `split_head(h, i)`, `split_sub(h, hv, u)`,
    /// `split_bits(h, i)`, `split_high(hb, a, u)` and `split4(hv, hx, t, j)`.
    pub fn quant_split(mut self, split: crate::quant_split::QuantSplit, binding: u32) -> Self {
        let (head, sub, f) = match split.layout {
            QuantLayout::Q8_0 => ("f16", "block", "q8_0"),
            QuantLayout::Q4_0 => ("f16", "block", "q4_0"),
            QuantLayout::Q4_1 => ("f16x2", "block", "q4_1"),
            QuantLayout::Q5_0 => ("f16", "block", "q5_0"),
            QuantLayout::Q5_1 => ("f16x2", "block", "q5_1"),
            QuantLayout::Q4K => ("f16x2", "k4", "q4_k"),
            QuantLayout::Q5K => ("f16x2", "k4", "q5_k"),
            QuantLayout::Q6K => ("f16", "q6_k", "q6_k"),
            QuantLayout::Fp8E4m3(_) => ("f32", "block", "fp8"),
            _ => ("int4", "block", "int4"),
        };
        // Q5_0's and Q5_1's fifth bits ride beside the scales, Q5_K's and Q6_K's high bits in
        // units of their own (`split_high`); the other layouts have none.
        let (bits, decode) = match split.layout {
            QuantLayout::Q5_0 => ("split_bits_q5_0(h, i)", format!("split4_{f}(hv, t, j, hx.x)")),
            QuantLayout::Q5_1 => ("h[(i >> 1u) + 1u]", format!("split4_{f}(hv, t, j, hx.x)")),
            QuantLayout::Q5K => ("0u", format!("split4_{f}(hv, t, j, hx.x)")),
            QuantLayout::Q6K => ("0u", format!("split4_{f}(hv, hx, t, j)")),
            _ => ("0u", format!("split4_{f}(hv, t, j)")),
        };
        let (high, subs_per_high) = match split.layout {
            QuantLayout::Q5K => ("q5_k", 4),
            QuantLayout::Q6K => ("q6_k", 2),
            _ => ("head", 1),
        };
        let scale_unit = split.layout == QuantLayout::Q6K;
        let (log, mask) = (crate::buffer::TEXEL_ROW_LOG2, crate::buffer::TEXEL_ROW - 1);
        self.0.push_str(&format!(
            "@group(0) @binding({binding}) var qw: texture_storage_2d<rgba32uint, read>;\n\
             fn q_unit(i: u32) -> vec4<u32> {{ return textureLoad(qw, vec2<u32>(i & {mask}u, i >> {log}u)); }}\n\
             const BLOCK_ELEMS: u32 = {}u;\nconst QU: u32 = {}u;\nconst QS: u32 = {}u;\nconst HH: u32 = {}u;\nconst VJ: u32 = {}u;\n\
             const HIGH_UNITS: bool = {};\nconst SUBS_PER_HIGH: u32 = {subs_per_high}u;\nconst SCALE_UNIT: bool = {scale_unit};\n\
             fn split_head(h: vec4<u32>, i: u32) -> vec2<f32> {{ return split_head_{head}(h, i); }}\n\
             fn split_sub(h: vec4<u32>, hv: vec2<f32>, u: u32) -> vec2<f32> {{ return split_sub_{sub}(h, hv, u); }}\n\
             fn split_bits(h: vec4<u32>, i: u32) -> u32 {{ return {bits}; }}\n\
             fn split_high(hb: u32, a: vec4<u32>, u: u32) -> vec2<u32> {{ return split_high_{high}(hb, a, u); }}\n\
             {SPLIT_DECODE}(hv: vec2<f32>, hx: vec2<u32>, t: vec4<u32>, j: u32) -> vec4<f32> {{ return {decode}; }}\n",
            split.layout.block_elems(),
            split.subs_per_block(),
            split.units_per_block(),
            split.head_halves(),
            split.values_per_unit() / 4,
            high != "head",
        ));
        self
    }

    /// The weight of shaders/quant_tile.wgsl at binding 2 and its `tile_w4(r, kk)`: in the
    /// split layout in a texture (`split`), or the file's blocks of `layout` in a buffer
    /// (`None` when `layout` has no block decoder).
    pub fn quant_tile_weight(self, layout: QuantLayout, split: Option<crate::quant_split::QuantSplit>) -> Option<Self> {
        let mut out = match split {
            Some(s) => self.quant_split(s, 2),
            None => self.quant_block(layout)?,
        };
        out.0.push_str(match split {
            Some(_) => {
                "fn tile_w4(r: u32, kk: u32) -> vec4<f32> { return split_row4(r, kk, p.row_bytes, p.q_units); }\n"
            }
            None => {
                "@group(0) @binding(2) var<storage, read> qw: array<u32>;\n\
                     fn tile_w4(r: u32, kk: u32) -> vec4<f32> { return block_row4(r * p.row_bytes, kk); }\n"
            }
        });
        Some(out)
    }

    pub fn constant(mut self, name: &str, value: u32) -> Self {
        self.0.push_str(&format!("const {name}: u32 = {value}u;\n"));
        self
    }
}

pub(crate) struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
}

/// Compiled pipelines, one per (kernel, bindings, prelude), and their bind group layouts.
type PipelineKey = (&'static str, &'static [Access], Prelude);

pub(crate) struct Pipelines {
    dir: Option<PathBuf>,
    /// Keep wgpu's bounds checks in the shaders.
    checked: bool,
    cache: Mutex<HashMap<PipelineKey, std::sync::Arc<Pipeline>>>,
}

impl Pipelines {
    pub fn new(dir: Option<PathBuf>, checked: bool) -> Self {
        Pipelines { dir, checked, cache: Mutex::new(HashMap::new()) }
    }

    pub fn shader_dir(&self) -> Option<&PathBuf> {
        self.dir.as_ref()
    }

    fn source(&self, name: &str) -> Result<String> {
        if let Some(dir) = &self.dir {
            let path = dir.join(format!("{name}.wgsl"));
            return std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e));
        }
        EMBEDDED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.to_string())
            .ok_or_else(|| Error::backend(NAME, format!("no compiled-in shader named {name}")))
    }

    pub fn get(&self, device: &wgpu::Device, kernel: Kernel, prelude: &Prelude) -> Result<std::sync::Arc<Pipeline>> {
        let key = (kernel.entry, kernel.bindings, prelude.clone());
        let mut cache = self.cache.lock().map_err(|_| Error::backend(NAME, "pipeline cache lock poisoned"))?;
        if let Some(p) = cache.get(&key) {
            return Ok(p.clone());
        }
        // The FP8 value functions serve both decoder files (unused functions cost nothing).
        let decoders = if prelude.0.contains(QUANT_DECODE) {
            [self.source("quant_block")?, self.source("quant_int4")?, self.source("quant_fp8")?].join("\n")
        } else if prelude.0.contains(SPLIT_DECODE) {
            self.source("quant_split")? + "\n" + &self.source("quant_fp8")?
        } else {
            String::new()
        };
        let source = format!("{}\n{decoders}\n{}", prelude.0, self.source(kernel.name)?);
        let where_ = match &self.dir {
            Some(d) => d.join(format!("{}.wgsl", kernel.name)).display().to_string(),
            None => format!("shaders/{}.wgsl (compiled in)", kernel.name),
        };
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc =
            wgpu::ShaderModuleDescriptor { label: Some(kernel.name), source: wgpu::ShaderSource::Wgsl(source.into()) };
        let module = if self.checked {
            device.create_shader_module(desc)
        } else {
            // SAFETY: every kernel bounds its own indices (see each shader) and the host checks
            // every buffer's length before recording, so wgpu's clamping adds only cost.
            unsafe { device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        };
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: NonZeroU64::new(PARAMS_BYTES),
            },
            count: None,
        }];
        for (i, a) in kernel.bindings.iter().enumerate() {
            let buffer = |ty| wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None };
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match a {
                    Access::Uniform => buffer(wgpu::BufferBindingType::Uniform),
                    Access::Read => buffer(wgpu::BufferBindingType::Storage { read_only: true }),
                    Access::ReadWrite => buffer(wgpu::BufferBindingType::Storage { read_only: false }),
                    Access::Texels => wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::ReadOnly,
                        format: wgpu::TextureFormat::Rgba32Uint,
                        view_dimension: wgpu::TextureViewDimension::D2,
                    },
                    Access::TexelsWrite => wgpu::BindingType::StorageTexture {
                        access: wgpu::StorageTextureAccess::WriteOnly,
                        format: wgpu::TextureFormat::Rgba32Uint,
                        view_dimension: wgpu::TextureViewDimension::D2,
                    },
                },
                count: None,
            });
        }
        let layout = device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor { label: Some(kernel.name), entries: &entries });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(kernel.name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(kernel.name),
            layout: Some(&pl),
            module: &module,
            entry_point: Some(kernel.entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[],
                // Every kernel writes its workgroup memory before reading it.
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::backend(NAME, format!("{where_}: {e}")));
        }
        let p = std::sync::Arc::new(Pipeline { pipeline, layout });
        cache.insert(key, p.clone());
        Ok(p)
    }
}
