//! An op's operands checked on the host before anything is recorded: each buffer's kind and
//! length, the KV caches' pair, the sizes the kernels' 32-bit indices can hold. A bad call is
//! an error naming the op and the buffer, never an out-of-bounds access on the device.

use tandem_core::backend::KvGeometry;
use tandem_core::fp8::Fp8Format;
use tandem_core::{DType, Error, Result};

use crate::adapter::NAME;
use crate::buffer::{BufKind, WgpuBuf};
use crate::recorder::Bind;
use crate::shaders::Prelude;

pub(super) fn err(msg: impl Into<String>) -> Error {
    Error::backend(NAME, msg)
}

pub(super) fn to_u32(op: &str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| err(format!("{op}: {what} = {v} does not fit the kernels' 32-bit indices")))
}

pub(super) fn want_f32<'a>(op: &str, what: &str, b: &'a WgpuBuf, need: usize) -> Result<&'a wgpu::Buffer> {
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

/// A pair of KV caches as the kernels bind them: f32 storage buffers, textures
/// (`Prelude::kv_cache`), or fp8 words in storage buffers (`Prelude::kv_cache_fp8`).
#[derive(Clone, Copy)]
pub(super) enum KvPair<'a> {
    Bufs(&'a wgpu::Buffer, &'a wgpu::Buffer),
    Texels(&'a wgpu::TextureView, &'a wgpu::TextureView),
    /// The caches, their format and the f32 bits of their scales (k, v).
    Fp8(&'a wgpu::Buffer, &'a wgpu::Buffer, Fp8Format, [u32; 2]),
}

impl<'a> KvPair<'a> {
    pub(super) fn texels(self) -> bool {
        matches!(self, KvPair::Texels(..))
    }
    /// The fp8 format of an fp8 pair.
    pub(super) fn fp8(self) -> Option<Fp8Format> {
        match self {
            KvPair::Fp8(_, _, f, _) => Some(f),
            _ => None,
        }
    }
    /// The f32 bits of the K and V scales the kernels' params carry (1.0 but for fp8).
    pub(super) fn scales(self) -> [u32; 2] {
        match self {
            KvPair::Fp8(.., s) => s,
            _ => [1f32.to_bits(); 2],
        }
    }
    pub(super) fn binds(self) -> [Bind<'a>; 2] {
        match self {
            KvPair::Bufs(k, v) | KvPair::Fp8(k, v, ..) => [Bind::all(k), Bind::all(v)],
            KvPair::Texels(k, v) => [Bind::Texels(k), Bind::Texels(v)],
        }
    }
    /// `prelude` with this pair's accessors for a kernel binding it at `k_binding` and the one
    /// after (`write`: k4_store / v4_store; else k_at, k4_at and their v twins).
    pub(super) fn prelude(self, prelude: Prelude, k_binding: u32, write: bool) -> Prelude {
        match self.fp8() {
            Some(f) => prelude.kv_cache_fp8(k_binding, f, write),
            None => prelude.kv_cache(k_binding, self.texels(), write),
        }
    }
}

/// The k and v caches of one layer, both of `g`'s size and of one kind: f32 buffers, f32
/// textures or fp8 buffers of one format.
pub(super) fn want_kv<'a>(op: &str, k: &'a WgpuBuf, v: &'a WgpuBuf, g: KvGeometry) -> Result<KvPair<'a>> {
    for (what, b) in [("k_cache", k), ("v_cache", v)] {
        if !matches!(b.kind, BufKind::F32 | BufKind::KvFp8(..)) || b.len < g.layer_elems() {
            return Err(err(format!(
                "{op}: {what} must be a KV cache of {} elements (from alloc_kv), got {}",
                g.layer_elems(),
                b.label()
            )));
        }
    }
    match (&k.texels, &v.texels, k.kind, v.kind) {
        (None, None, BufKind::F32, BufKind::F32) => Ok(KvPair::Bufs(&k.buf, &v.buf)),
        (None, None, BufKind::KvFp8(a, ks), BufKind::KvFp8(b, vs)) if a == b => {
            Ok(KvPair::Fp8(&k.buf, &v.buf, a, [ks, vs]))
        }
        (Some(kt), Some(vt), BufKind::F32, BufKind::F32) => Ok(KvPair::Texels(&kt.view, &vt.view)),
        _ => Err(err(format!("{op}: k_cache and v_cache differ in kind ({} and {})", k.label(), v.label()))),
    }
}

pub(super) fn want_u32<'a>(op: &str, what: &str, b: &'a WgpuBuf, need: usize) -> Result<&'a wgpu::Buffer> {
    if b.kind != BufKind::U32 {
        return Err(err(format!("{op}: {what} must be a u32 buffer, got {}", b.label())));
    }
    if b.len < need {
        return Err(err(format!("{op}: {what} needs {need} elements, {} has {}", b.label(), b.len)));
    }
    Ok(&b.buf)
}

pub(super) fn want_weight(op: &str, what: &str, b: &WgpuBuf, need: usize) -> Result<DType> {
    let BufKind::Weight(d) = b.kind else {
        return Err(err(format!("{op}: {what} must be a weight buffer, got {}", b.label())));
    };
    if b.len < need {
        return Err(err(format!("{op}: {what} needs {need} elements, {} has {}", b.label(), b.len)));
    }
    Ok(d)
}

pub(super) fn groups(items: usize, per: usize) -> u64 {
    items.div_ceil(per) as u64
}
