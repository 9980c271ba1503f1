//! [`CudaBuf`]: device memory with a recorded element kind, owned or a view into a shared
//! allocation (a [`U32Group`]'s regions, staged from page-locked memory); the argument checks
//! every op runs on its buffers, and the backend's [`Storage`].

use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, DevicePtr, PinnedHostSlice};
use tandem_core::backend::{DType, KvDtype, KvGeometry, Storage, U32Group, U32Layout};
use tandem_core::fp8::Fp8Format;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::TensorView;
use tandem_core::Result;

use crate::device::CudaBackend;
use crate::error::{drv, err};
use crate::kernels::weight_index;

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    U32,
    BF16,
    F16,
    /// A weight kept in a GGUF block layout (quant.rs): `len` counts its bytes.
    Quant(QuantLayout),
    /// An fp8 KV cache: one byte an element, `x / scale` in `format` (kernels/common.cuh
    /// `kv_store`); the scale's f32 bits follow (the kernels take it as an argument).
    Fp8Kv(Fp8Format, u32),
}

impl Elem {
    pub(crate) fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::U32 => 4,
            Elem::BF16 | Elem::F16 => 2,
            Elem::Quant(_) | Elem::Fp8Kv(..) => 1,
        }
    }
    pub(crate) fn of(d: DType) -> Elem {
        match d {
            DType::F32 => Elem::F32,
            DType::BF16 => Elem::BF16,
            DType::F16 => Elem::F16,
        }
    }
    /// The `bias_dtype` code of kernels/common.cuh `load_bias`.
    pub(crate) fn bias_code(self) -> i32 {
        match self {
            Elem::F32 => 1,
            Elem::BF16 => 2,
            Elem::F16 => 3,
            Elem::U32 | Elem::Quant(_) | Elem::Fp8Kv(..) => 0,
        }
    }
}

/// A device buffer: `len` elements of `elem`, in an allocation of its own or a view into one
/// shared with other buffers (the regions of a [`U32Group`]: the step's metadata). Ops see no
/// difference: a view's `mem` is a `CudaSlice` whose pointer is the allocation's plus the
/// view's offset, which is also what a captured graph records.
pub struct CudaBuf {
    /// The memory ops pass to kernels. Owned (freed on drop) unless `base` is Some: then it
    /// was made over the view's bytes by `upgrade_device_ptr` and is leaked, never freed.
    pub(crate) mem: ManuallyDrop<CudaSlice<u8>>,
    pub(crate) elem: Elem,
    pub(crate) len: usize,
    /// A view's allocation, alive as long as any view of it is.
    pub(crate) base: Option<Arc<CudaSlice<u8>>>,
    /// A carved group's whole buffer ([`U32Group::carved`]): its page-locked staging memory.
    pub(crate) staging: Option<Box<Staging>>,
}

impl Drop for CudaBuf {
    fn drop(&mut self) {
        // SAFETY: `mem` is not touched again; `drop` runs once.
        let mem = unsafe { ManuallyDrop::take(&mut self.mem) };
        match self.base {
            // The allocation belongs to `base` (dropped after this, with the last view).
            Some(_) => {
                mem.leak();
            }
            None => drop(mem),
        }
    }
}

/// The host side of a carved [`U32Group`]: page-locked memory in the group's layout, and the
/// event recorded after the copy that last read it.
///
/// One buffer and an event, not two buffers alternated. The copy is the first thing a step
/// queues, so when the host prepares the next step while this one runs (async scheduling,
/// worker.rs) the wait in `u32_staging` is at most the tail of that copy (the step's metadata,
/// a few hundred KB for a padded decode step at bucket 256), never a step; and today a forward
/// returns only once its work has run, so the wait finds the copy done. Two buffers would also
/// break what the model relies on: the staging memory holds what the last step wrote there
/// (meta.rs `MetaStaging` skips block-table entries that already hold the scratch block).
pub(crate) struct Staging {
    pub(crate) host: PinnedHostSlice<u32>,
    pub(crate) copied: CudaEvent,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The copy may still read the page-locked memory `host` frees after this.
        let _ = self.copied.synchronize();
    }
}

impl CudaBuf {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn elem(&self) -> Elem {
        self.elem
    }
}

/// Checks that `b` holds `elem` and at least `need` elements; `what` names the argument.
pub(crate) fn need(b: &CudaBuf, elem: Elem, need: usize, op: &str, what: &str) -> Result<()> {
    if b.elem != elem {
        return Err(err(format!("{op}: `{what}` holds {:?}, expected {elem:?}", b.elem)));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(())
}

/// An activation output (f32, bf16 or f16: [`Storage::activation_dtype`]) of at least `need`
/// elements; returns kernels/common.cuh `store_act`'s code for it.
pub(crate) fn need_act(b: &CudaBuf, need: usize, op: &str, what: &str) -> Result<i32> {
    if b.elem == Elem::U32 {
        return Err(err(format!("{op}: `{what}` holds u32, expected an activation (f32, bf16 or f16)")));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(b.elem.bias_code())
}

/// A weight buffer (f32, bf16 or f16) with at least `need` elements; returns its
/// [`weight_index`].
pub(crate) fn need_weight(b: &CudaBuf, need: usize, op: &str, what: &str) -> Result<usize> {
    if b.elem == Elem::U32 {
        return Err(err(format!("{op}: `{what}` holds u32, expected a weight (f32, bf16 or f16)")));
    }
    if let Elem::Quant(q) = b.elem {
        return Err(err(format!(
            "{op}: `{what}` is kept as {}, which this op does not take (only matmul and embedding do)",
            q.name()
        )));
    }
    if b.len < need {
        return Err(err(format!("{op}: `{what}` has {} elements, needs {need}", b.len)));
    }
    Ok(weight_index(b.elem))
}

/// Both caches of one layer: the same element kind (f32, bf16, or fp8 of one format, each
/// with its own scale), each a whole layer. Returns that kind's index in [`Kernels`]' per-cache
/// arrays ([`KV_F32`], [`KV_BF16`], [`KV_FP8_E4M3`], [`KV_FP8_E5M2`]).
pub(crate) fn need_kv(k_cache: &CudaBuf, v_cache: &CudaBuf, g: KvGeometry, op: &str) -> Result<usize> {
    let ci = match k_cache.elem {
        Elem::F32 => KV_F32,
        Elem::BF16 => KV_BF16,
        Elem::Fp8Kv(Fp8Format::E4M3, _) => KV_FP8_E4M3,
        Elem::Fp8Kv(Fp8Format::E5M2, _) => KV_FP8_E5M2,
        other => {
            return Err(err(format!(
                "{op}: `k_cache` holds {other:?}, expected a KV cache (f32, bf16 or fp8, from alloc_kv)"
            )))
        }
    };
    let same = match (k_cache.elem, v_cache.elem) {
        (Elem::Fp8Kv(a, _), Elem::Fp8Kv(b, _)) => a == b,
        (a, b) => a == b,
    };
    if !same {
        return Err(err(format!(
            "{op}: `k_cache` holds {:?} and `v_cache` {:?}: not one KV cache type",
            k_cache.elem, v_cache.elem
        )));
    }
    need(k_cache, k_cache.elem, g.layer_elems(), op, "k_cache")?;
    need(v_cache, v_cache.elem, g.layer_elems(), op, "v_cache")?;
    Ok(ci)
}

/// [`need_kv`]'s indices: the per-cache kernel arrays of [`Kernels`] in this order.
pub(crate) const KV_F32: usize = 0;
pub(crate) const KV_BF16: usize = 1;
pub(crate) const KV_FP8_E4M3: usize = 2;
pub(crate) const KV_FP8_E5M2: usize = 3;

/// The (k_scale, v_scale) an fp8 cache pair's kernels take; (1, 1) for f32 and bf16.
pub(crate) fn kv_scales(k_cache: &CudaBuf, v_cache: &CudaBuf) -> (f32, f32) {
    let of = |b: &CudaBuf| match b.elem {
        Elem::Fp8Kv(_, bits) => f32::from_bits(bits),
        _ => 1.0,
    };
    (of(k_cache), of(v_cache))
}

impl CudaBackend {
    pub(crate) fn alloc(&self, elem: Elem, len: usize) -> Result<CudaBuf> {
        // Zero-length device allocations are not portable; keep a few bytes behind every buffer.
        let bytes = (len * elem.size()).max(4);
        // SAFETY: contents are unspecified by the Backend contract.
        let mem = unsafe { self.stream.alloc::<u8>(bytes) }.map_err(drv(&format!("allocating {bytes} bytes")))?;
        Ok(CudaBuf { mem: ManuallyDrop::new(mem), elem, len, base: None, staging: None })
    }

    /// `len` u32 elements of `base` from element `at`: a view (nothing is allocated).
    pub(crate) fn u32_view(&self, base: &Arc<CudaSlice<u8>>, at: usize, len: usize) -> Result<CudaBuf> {
        let end = at.checked_add(len).and_then(|e| e.checked_mul(4)).filter(|&e| e <= base.len());
        if end.is_none() {
            return Err(err(format!("u32_view: elements {at}..+{len} beyond an allocation of {} bytes", base.len())));
        }
        let ptr = base.device_ptr(&self.stream).0 + (at * 4) as u64;
        // SAFETY: ptr..ptr + 4 len lies inside `base` (checked above), which the view keeps
        // alive; the CudaSlice made here is leaked, never freed, when the view drops.
        let mem = unsafe { self.stream.upgrade_device_ptr::<u8>(ptr, len * 4) };
        Ok(CudaBuf { mem: ManuallyDrop::new(mem), elem: Elem::U32, len, base: Some(base.clone()), staging: None })
    }

    pub(crate) fn upload_bytes(&self, elem: Elem, bytes: &[u8]) -> Result<CudaBuf> {
        let len = bytes.len() / elem.size();
        let mut b = self.alloc(elem, len)?;
        if !bytes.is_empty() {
            let mut dst = b.mem.slice_mut(0..bytes.len());
            self.stream.memcpy_htod(bytes, &mut dst).map_err(drv("copy to device"))?;
        }
        Ok(b)
    }

    pub(crate) fn write<T: cudarc::driver::DeviceRepr>(&self, buf: &mut CudaBuf, elem: Elem, data: &[T]) -> Result<()> {
        need(buf, elem, data.len(), "write", "buffer")?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `buf` holds at least data.len() elements of T (checked above; T is 4 bytes).
        let mut dst =
            unsafe { buf.mem.transmute_mut::<T>(data.len()) }.ok_or_else(|| err("write: buffer too small"))?;
        self.stream.memcpy_htod(data, &mut dst).map_err(drv("copy to device"))
    }

    pub(crate) fn read<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaBuf,
        elem: Elem,
        len: usize,
    ) -> Result<Vec<T>> {
        need(buf, elem, len, "read", "buffer")?;
        let mut out = vec![T::default(); len];
        if len > 0 {
            // SAFETY: `buf` holds at least len elements of T (checked above).
            let src = unsafe { buf.mem.transmute::<T>(len) }.ok_or_else(|| err("read: buffer too small"))?;
            self.stream.memcpy_dtoh(&src, &mut out).map_err(drv("copy to host"))?;
        }
        self.stream.synchronize().map_err(drv("synchronize after copy to host"))?;
        Ok(out)
    }
}

impl Storage for CudaBackend {
    type Buf = CudaBuf;

    fn matmul_operand(&self, weight: DType) -> DType {
        // kernels/matmul.cu: bf16 and f16 weights take the tensor cores with x rounded to their
        // type; f32 weights take the f32 SIMT kernel.
        match weight {
            DType::BF16 | DType::F16 => weight,
            _ => DType::F32,
        }
    }

    /// The tensor cores' operand type: every reader of the activation rounds it so, so it is
    /// stored so (half the bytes, the same bits; kernels/common.cuh `store_act`).
    fn activation_dtype(&self, weight: DType) -> DType {
        if self.f32_activations {
            return DType::F32;
        }
        self.matmul_operand(weight)
    }

    fn alloc_activation(&self, dtype: DType, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::of(dtype), len)
    }

    fn upload_weight(&self, t: &TensorView) -> Result<CudaBuf> {
        if let Some(q) = t.quant {
            // Kept as stored: the blocks' bytes (quant.rs reads them).
            return self.upload_bytes(Elem::Quant(q), t.bytes());
        }
        self.upload_bytes(Elem::of(t.dtype), t.bytes())
    }

    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<CudaBuf> {
        self.upload_bytes(Elem::of(dtype), &dtype.from_f32(values))
    }

    fn alloc_f32(&self, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::F32, len)
    }

    fn alloc_u32(&self, len: usize) -> Result<CudaBuf> {
        self.alloc(Elem::U32, len)
    }

    /// One device allocation the regions are views of, and page-locked staging memory of the
    /// same layout: a step's metadata is one asynchronous copy ([`Staging`]).
    fn alloc_u32_group(&self, layout: &U32Layout) -> Result<U32Group<CudaBuf>> {
        const OP: &str = "alloc_u32_group";
        let total = layout.total();
        // SAFETY: contents are unspecified until the first upload, which writes what it uses.
        let base = Arc::new(
            unsafe { self.stream.alloc::<u8>((total * 4).max(4)) }.map_err(drv(&format!("{OP}: {total} u32")))?,
        );
        let parts = (0..layout.regions())
            .map(|i| self.u32_view(&base, layout.offset(i), layout.len(i)))
            .collect::<Result<Vec<_>>>()?;
        let mut whole = self.u32_view(&base, 0, total)?;
        // Plain page-locked memory, not write-combined: the host also reads it (tests), and
        // write-combined reads are uncached.
        // SAFETY: zeroed below before anyone reads it.
        let mut host = unsafe { self.ctx.alloc_pinned_with_flags::<u32>(total.max(1), 0) }
            .map_err(drv(&format!("{OP}: {total} u32 of page-locked memory")))?;
        host.as_mut_slice().map_err(drv(OP))?.fill(0);
        let copied = self.ctx.new_event(None).map_err(drv(&format!("{OP}: creating the copy's event")))?;
        whole.staging = Some(Box::new(Staging { host, copied }));
        Ok(U32Group::carved(layout.clone(), parts, whole))
    }

    fn u32_staging<'a>(&self, group: &'a mut U32Group<CudaBuf>) -> Result<&'a mut [u32]> {
        const OP: &str = "u32_staging";
        let st = group
            .carved
            .as_mut()
            .and_then(|w| w.staging.as_deref_mut())
            .ok_or_else(|| err(format!("{OP}: a group this backend did not carve")))?;
        // The last upload's copy may still be reading it.
        st.copied.synchronize().map_err(drv(&format!("{OP}: waiting for the last metadata copy")))?;
        st.host.as_mut_slice().map_err(drv(OP))
    }

    /// One asynchronous copy from the page-locked staging memory of everything `used` spans
    /// ([`U32Layout::span`]: the regions before the last one used whole, that one's prefix),
    /// then the event `u32_staging` waits on before the host writes the memory again.
    fn upload_u32_group(&self, group: &mut U32Group<CudaBuf>, used: &[usize]) -> Result<()> {
        const OP: &str = "upload_u32_group";
        let end = group.layout.span(used)?;
        if self.capturing.load(Ordering::Relaxed) {
            return Err(err(format!("{OP}: uploads are not allowed while a graph is captured")));
        }
        let whole = group.carved.as_mut().ok_or_else(|| err(format!("{OP}: a group this backend did not carve")))?;
        let dst = whole.mem.device_ptr(&self.stream).0;
        let st = whole.staging.as_deref_mut().ok_or_else(|| err(format!("{OP}: a group without staging memory")))?;
        if end == 0 {
            return Ok(());
        }
        let src = &st.host.as_slice().map_err(drv(OP))?[..end];
        self.ctx.bind_to_thread().map_err(drv(OP))?;
        // SAFETY: dst is the group's allocation of layout.total() >= end u32 (span checked
        // `used` against the layout); src is page-locked and nobody writes it until `copied`
        // has completed (u32_staging waits for it, and so does Staging's drop before freeing).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream()) }
            .map_err(drv(&format!("{OP}: copy of {end} u32 to device")))?;
        st.copied.record(&self.stream).map_err(drv(&format!("{OP}: recording the copy's event")))
    }

    /// bf16 first: half the bytes a decode step reads per token of context, twice the blocks
    /// in the same memory; f32 is kept for checks against the reference; fp8 (e4m3, e5m2) is
    /// asked for by name (`--kv-cache-dtype fp8`), never picked by `auto`.
    fn kv_dtypes(&self) -> &'static [KvDtype] {
        &[KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2]
    }

    fn alloc_kv(&self, geometry: KvGeometry) -> Result<CudaBuf> {
        self.alloc_kv_as(geometry, KvDtype::Bf16)
    }

    fn alloc_kv_as(&self, geometry: KvGeometry, dtype: KvDtype) -> Result<CudaBuf> {
        self.alloc_kv_scaled(geometry, dtype, tandem_core::fp8_round::KV_SCALE)
    }

    /// An fp8 cache records its format and scale in its [`Elem`]: kv_write divides by the scale
    /// and attention multiplies by it (kernels/common.cuh `kv_store` / `kv_load`).
    fn alloc_kv_scaled(&self, geometry: KvGeometry, dtype: KvDtype, scale: f32) -> Result<CudaBuf> {
        let elem = match dtype.fp8() {
            None if scale != 1.0 => {
                return Err(err(format!("alloc_kv: a {} KV cache takes no scale (given {scale})", dtype.name())))
            }
            None if dtype == KvDtype::F32 => Elem::F32,
            None => Elem::BF16,
            Some(_) if !(scale.is_normal() && scale > 0.0) => {
                return Err(err(format!(
                    "alloc_kv: the scale of a {} KV cache must be positive, finite and normal, not {scale}",
                    dtype.name()
                )))
            }
            Some(f) => Elem::Fp8Kv(f, scale.to_bits()),
        };
        self.alloc(elem, geometry.layer_elems())
    }

    fn write_f32(&self, buf: &mut CudaBuf, data: &[f32]) -> Result<()> {
        self.write(buf, Elem::F32, data)
    }

    fn write_u32(&self, buf: &mut CudaBuf, data: &[u32]) -> Result<()> {
        self.write(buf, Elem::U32, data)
    }

    fn read_f32(&self, buf: &CudaBuf, len: usize) -> Result<Vec<f32>> {
        self.read(buf, Elem::F32, len)
    }

    fn read_u32(&self, buf: &CudaBuf, len: usize) -> Result<Vec<u32>> {
        self.read(buf, Elem::U32, len)
    }

    fn read_kv(&self, buf: &CudaBuf, geometry: KvGeometry) -> Result<Vec<f32>> {
        let n = geometry.layer_elems();
        match buf.elem {
            // bf16 widens to f32 exactly: the top half of the f32 bits.
            Elem::BF16 => Ok(self
                .read::<u16>(buf, Elem::BF16, n)?
                .into_iter()
                .map(|b| f32::from_bits(u32::from(b) << 16))
                .collect()),
            // The byte's value times the scale: what attention reads (fp8_round::dequantize).
            Elem::Fp8Kv(f, bits) => Ok(self
                .read::<u8>(buf, buf.elem, n)?
                .into_iter()
                .map(|b| tandem_core::fp8_round::dequantize(f, b, f32::from_bits(bits)))
                .collect()),
            _ => self.read(buf, Elem::F32, n),
        }
    }
}
