//! The `Storage` group of `WgpuBackend`: buffers and textures, weight uploads (tiled, in
//! buffers or textures), KV cache allocation, writes and read-back.

use tandem_core::backend::{kv_dtype_names, KvDtype, KvGeometry, Storage};
use tandem_core::fp8_round::{self, KV_SCALE};
use tandem_core::weights::TensorView;
use tandem_core::{DType, Error, Result};

use super::operand::{err, want_f32, want_kv, want_u32};
use super::{WgpuBackend, KV_DTYPES, UNIFORM_WINDOW};
use crate::buffer::{BufKind, RowSource, Texels, Tiled, WgpuBuf, TEXEL_ROW};

impl Storage for WgpuBackend {
    type Buf = WgpuBuf;

    fn upload_weight(&self, t: &TensorView) -> Result<WgpuBuf> {
        let w = match t.quant {
            Some(layout) => self.upload_quantized(t, layout)?,
            None => self.upload_plain(t)?,
        };
        Ok(self.held(w))
    }

    fn kv_dtypes(&self) -> &'static [KvDtype] {
        KV_DTYPES
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

    /// A KV cache in `dtype`: f32 as [`WgpuBackend::alloc_kv`] makes it, or fp8 in a storage
    /// buffer of one byte an element (never a texture: the kernels read it a u32 word at a
    /// time, `Prelude::kv_cache_fp8`).
    fn alloc_kv_as(&self, g: KvGeometry, dtype: KvDtype) -> Result<WgpuBuf> {
        self.alloc_kv_scaled(g, dtype, KV_SCALE)
    }

    /// [`WgpuBackend::alloc_kv_as`] with an fp8 cache's scale (`Storage::alloc_kv_scaled`).
    fn alloc_kv_scaled(&self, g: KvGeometry, dtype: KvDtype, scale: f32) -> Result<WgpuBuf> {
        if !(scale.is_normal() && scale > 0.0) {
            return Err(err(format!("alloc_kv: KV scale {scale} is not a positive, finite, normal number")));
        }
        let Some(format) = dtype.fp8() else {
            if dtype == KvDtype::F32 && scale == 1.0 {
                return self.alloc_kv(g);
            }
            if dtype == KvDtype::F32 {
                return Err(err(format!("alloc_kv: an f32 KV cache takes no scale ({scale})")));
            }
            return Err(err(format!(
                "alloc_kv: a {} KV cache is not supported here (this backend stores {})",
                dtype.name(),
                kv_dtype_names(KV_DTYPES)
            )));
        };
        // Four elements a word, written a vec4 at a time: a word must never span two heads.
        if !g.head_dim.is_multiple_of(4) {
            return Err(err(format!(
                "alloc_kv: a {} KV cache needs head_dim % 4 == 0 (head_dim {})",
                dtype.name(),
                g.head_dim
            )));
        }
        let len = g.layer_elems();
        let what = format!("{} KV cache {g:?}", dtype.name());
        self.create(BufKind::KvFp8(format, scale.to_bits()), len, len as u64, &what)
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
            BufKind::Quant(q) => self.read_quantized(buf, q, len),
            BufKind::U32 => Err(err(format!("read_f32: {} holds u32 values", buf.label()))),
            BufKind::KvFp8(..) => Err(err(format!("read_f32: {} holds fp8 bytes (read_kv decodes it)", buf.label()))),
        }
    }

    fn read_u32(&self, buf: &WgpuBuf, len: usize) -> Result<Vec<u32>> {
        want_u32("read_u32", "source", buf, len)?;
        let bytes = self.rec.read(&buf.buf, len as u64 * 4)?;
        Ok(bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn read_kv(&self, buf: &WgpuBuf, g: KvGeometry) -> Result<Vec<f32>> {
        want_kv("read_kv", buf, buf, g)?;
        if let BufKind::KvFp8(f, scale) = buf.kind {
            let bytes = self.rec.read(&buf.buf, g.layer_elems() as u64)?;
            return Ok(bytes.iter().map(|&b| fp8_round::dequantize(f, b, f32::from_bits(scale))).collect());
        }
        self.read_f32(buf, g.layer_elems())
    }
}

impl WgpuBackend {
    /// A weight kept in its file's dtype (tiled, in a buffer or a texture).
    fn upload_plain(&self, t: &TensorView) -> Result<WgpuBuf> {
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

    /// Counts a weight uploaded for the model toward `Device::weight_bytes`: its buffer's bytes
    /// and, for one held in a texture, the texture's.
    pub(super) fn held(&self, w: WgpuBuf) -> WgpuBuf {
        let texture = w.texels.as_ref().map_or(0, |t| {
            let s = t.texture.size();
            s.width as u64 * s.height as u64 * 16
        });
        self.weight_bytes.fetch_add(w.buf.size() + texture, std::sync::atomic::Ordering::Relaxed);
        w
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

    pub(super) fn create(&self, kind: BufKind, len: usize, bytes: u64, what: &str) -> Result<WgpuBuf> {
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
    pub(super) fn weight_from_bytes(
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
    pub(super) fn mapped_weight_buffer(&self, what: &str, name: Option<&str>, size: u64) -> Result<wgpu::Buffer> {
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
    pub(super) fn tiling(&self, shape: &[usize], dtype: DType) -> Option<Tiled> {
        let align = self.rec.gpu.limits.min_storage_buffer_offset_alignment as u64;
        Tiled::for_matrix(shape, dtype).filter(|t| {
            self.tiled_weights && t.tile_bytes(dtype) <= self.max_binding && t.tile_bytes(dtype) % align == 0
        })
    }

    /// Whether a tiled matrix will be bound whole (a texture, or a buffer within one binding):
    /// fused weights must be, their kernels do not take chunks.
    pub(super) fn in_one_binding(&self, t: Tiled, dtype: DType) -> bool {
        (self.texel_weights && self.fits_texture(t, dtype)) || t.bytes(dtype) <= self.max_binding
    }

    /// Whether a tiled matrix fits one weight texture (the adapter's texture height).
    pub(super) fn fits_texture(&self, t: Tiled, dtype: DType) -> bool {
        Texels::rows_for(t.bytes(dtype) as usize / 16) <= self.rec.gpu.limits.max_texture_dimension_2d as usize
    }

    /// A tiled weight matrix whose row `r` holds `row(r)` (`None`: zeros): in a texture when
    /// `texels` and it fits one, else in a buffer.
    pub(super) fn tiled_weight(
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
    pub(super) fn texel_weight(
        &self,
        dtype: DType,
        name: Option<&str>,
        t: Tiled,
        row: &RowSource<'_>,
    ) -> Result<WgpuBuf> {
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

    /// The first `bytes` of a weight texture, in unit order (a copy through a buffer).
    pub(super) fn read_texels(&self, tx: &Texels, bytes: u64) -> Result<Vec<u8>> {
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
}
