//! The device buffer type of the wgpu backend: a wgpu buffer, what it holds and how many.

use tandem_core::fp8::Fp8Format;
use tandem_core::quant_layout::QuantLayout;
use tandem_core::DType;

/// What a buffer holds. Activations, the KV cache and metadata are 4-byte elements; weights keep
/// their dtype, two bf16/f16 values per u32 word (the low half is the even element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    F32,
    U32,
    Weight(DType),
    /// A weight kept in a GGUF block layout: the file's bytes as they are (rows of whole
    /// blocks, one after another); `len` counts the values they decode to.
    Quant(QuantLayout),
    /// An fp8 KV cache: one byte an element, four a u32 word (`crate::fp8_codec`), holding
    /// values divided by the scale whose f32 bits follow; `len` counts elements.
    KvFp8(Fp8Format, u32),
}

impl BufKind {
    pub fn describe(self) -> String {
        match self {
            BufKind::F32 => "f32".into(),
            BufKind::U32 => "u32".into(),
            BufKind::Weight(d) => format!("{} weight", d.name()),
            BufKind::Quant(q) => format!("{} weight (kept quantized)", q.name()),
            BufKind::KvFp8(f, scale) => format!("{} KV cache (scale {})", f.name(), f32::from_bits(scale)),
        }
    }
}

/// Where a tiled matrix's rows come from: row `r`'s bytes, or `None` for a row of zeros.
pub type RowSource<'a> = dyn Fn(usize) -> Option<&'a [u8]> + 'a;

/// Rows per tile of a tiled weight matrix (a power of two; the shaders' prelude shifts by its log).
pub const TILE_ROWS: usize = 64;

/// How a weight matrix `[rows, cols]` whose rows are whole 16-byte units (`cols * dtype size`
/// a multiple of 16) is laid out on the device: tile by tile of [`TILE_ROWS`] rows, and inside
/// a tile unit by unit, the tile's rows side by side: unit `u` of row `r` is 16-byte unit
/// `((r / TILE_ROWS) * units_per_row + u) * TILE_ROWS + r % TILE_ROWS`. A matmul workgroup,
/// whose lanes walk consecutive rows in step, then reads one contiguous run per step instead of
/// one stream per row (on a CPU-side Vulkan, dozens of streams defeat the prefetchers; on a GPU
/// the lanes' loads coalesce). The last tile is padded with zero rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tiled {
    pub rows: usize,
    pub cols: usize,
}

impl Tiled {
    /// The tiled layout for a `[rows, cols]` matrix of `dtype`, if its rows are whole units.
    pub fn for_matrix(shape: &[usize], dtype: DType) -> Option<Tiled> {
        match *shape {
            [rows, cols] if rows > 0 && cols > 0 && (cols * dtype.size()).is_multiple_of(16) => {
                Some(Tiled { rows, cols })
            }
            _ => None,
        }
    }
    pub fn units_per_row(self, dtype: DType) -> usize {
        self.cols * dtype.size() / 16
    }
    /// Bytes of one tile.
    pub fn tile_bytes(self, dtype: DType) -> u64 {
        (TILE_ROWS * self.units_per_row(dtype) * 16) as u64
    }
    pub fn bytes(self, dtype: DType) -> u64 {
        self.rows.div_ceil(TILE_ROWS) as u64 * self.tile_bytes(dtype)
    }
    /// Byte offset of unit `u` of row `r`.
    fn unit_offset(self, dtype: DType, r: usize, u: usize) -> usize {
        (((r / TILE_ROWS) * self.units_per_row(dtype) + u) * TILE_ROWS + r % TILE_ROWS) * 16
    }
    pub fn num_tiles(self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }
    /// Tile `t` into `dst` ([`Tiled::tile_bytes`] long), each row's bytes from `row(r)`
    /// (`None`: a row of zeros).
    pub fn fill_tile(self, row: &RowSource<'_>, t: usize, dst: &mut [u8]) {
        dst.fill(0);
        for q in 0..TILE_ROWS.min(self.rows - t * TILE_ROWS) {
            let Some(row) = row(t * TILE_ROWS + q) else { continue };
            for (u, unit) in row.chunks_exact(16).enumerate() {
                let d = (u * TILE_ROWS + q) * 16;
                dst[d..d + 16].copy_from_slice(unit);
            }
        }
    }
    /// Units `first..first + dst.len() / 16` of the tiled layout, each row's bytes from
    /// `row(r)` (`None`: zeros; units past the matrix and padding rows are zero too).
    pub fn fill_units(self, dtype: DType, row: &RowSource<'_>, first: usize, dst: &mut [u8]) {
        let units = self.units_per_row(dtype);
        let per_tile = units * TILE_ROWS;
        for (k, d) in dst.chunks_exact_mut(16).enumerate() {
            let i = first + k;
            let (tile, rem) = (i / per_tile, i % per_tile);
            let r = tile * TILE_ROWS + rem % TILE_ROWS;
            match (r < self.rows).then(|| row(r)).flatten() {
                Some(src) => {
                    let s = rem / TILE_ROWS * 16;
                    d.copy_from_slice(&src[s..s + 16]);
                }
                None => d.fill(0),
            }
        }
    }

    /// Row `r` of row-major bytes `src` for [`Tiled::fill_tile`] / [`Tiled::fill_units`].
    pub fn row_of(self, dtype: DType, src: &[u8], r: usize) -> Option<&[u8]> {
        let n = self.cols * dtype.size();
        src.get(r * n..(r + 1) * n)
    }
    /// Row-major bytes into the tiled layout (`dst` is [`Tiled::bytes`] long).
    pub fn tile(self, dtype: DType, src: &[u8], dst: &mut [u8]) {
        let tb = self.tile_bytes(dtype) as usize;
        for (t, d) in dst.chunks_exact_mut(tb).enumerate() {
            self.fill_tile(&|r| self.row_of(dtype, src, r), t, d);
        }
    }
    /// The tiled layout back into row-major bytes.
    pub fn untile(self, dtype: DType, src: &[u8]) -> Vec<u8> {
        let units = self.units_per_row(dtype);
        let mut out = vec![0u8; self.rows * units * 16];
        for r in 0..self.rows {
            for u in 0..units {
                let d = (r * units + u) * 16;
                let s = self.unit_offset(dtype, r, u);
                out[d..d + 16].copy_from_slice(&src[s..s + 16]);
            }
        }
        out
    }
}

/// Texels per row of a weight texture (log2): a tiled matrix's 16-byte unit `i` is texel
/// `(i % TEXEL_ROW, i / TEXEL_ROW)` of an rgba32uint texture.
pub const TEXEL_ROW_LOG2: u32 = 12;
pub const TEXEL_ROW: usize = 1 << TEXEL_ROW_LOG2;

/// A tiled weight matrix held in an rgba32uint storage texture instead of a buffer, unit `i`
/// of the [`Tiled`] layout at texel `(i % TEXEL_ROW, i / TEXEL_ROW)`. Why: on Mesa's lavapipe
/// (Mesa 22.3) a storage-buffer load whose address differs across lanes runs as a loop over the
/// lanes with two branches per lane and 32-bit component, while an image load is one
/// branch-free gather per lane; the decode matmul reads its weights about twice as fast this way
/// (`load_probe`, `decode_bench`).
pub struct Texels {
    pub(crate) texture: wgpu::Texture,
    pub(crate) view: wgpu::TextureView,
}

impl Texels {
    /// A texture of `rows` rows of TEXEL_ROW rgba32uint texels, bindable as a storage texture,
    /// with `usage` besides, and its view.
    pub(crate) fn new(device: &wgpu::Device, label: Option<&str>, rows: usize, usage: wgpu::TextureUsages) -> Texels {
        let texture = device.create_texture(&wgpu::TextureDescriptor {
            label,
            size: wgpu::Extent3d { width: TEXEL_ROW as u32, height: rows as u32, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: wgpu::TextureFormat::Rgba32Uint,
            usage: wgpu::TextureUsages::STORAGE_BINDING | usage,
            view_formats: &[],
        });
        let view = texture.create_view(&wgpu::TextureViewDescriptor::default());
        Texels { texture, view }
    }

    /// Texture rows for `units` 16-byte units.
    pub fn rows_for(units: usize) -> usize {
        units.div_ceil(TEXEL_ROW)
    }
}

/// A device buffer; its kind and element count are fixed at creation. The wgpu buffer may be a
/// little longer than `len` elements (sizes are padded to whole 4-byte words).
pub struct WgpuBuf {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) kind: BufKind,
    pub(crate) len: usize,
    /// The tensor's name for a weight from a file (errors name it).
    pub(crate) name: Option<String>,
    /// Set for a weight matrix stored tiled (see [`Tiled`]); row-major otherwise.
    pub(crate) tiled: Option<Tiled>,
    /// Set for a tiled matrix held in a texture; `buf` is then an unused 16-byte placeholder.
    pub(crate) texels: Option<Texels>,
}

impl WgpuBuf {
    pub fn kind(&self) -> BufKind {
        self.kind
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Whether this buffer lives in a texture (weights and KV caches on CPU adapters).
    pub fn in_texture(&self) -> bool {
        self.texels.is_some()
    }
    pub(crate) fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("`{n}`"),
            None => format!("a {} buffer of {} elements", self.kind.describe(), self.len),
        }
    }
}

impl std::fmt::Debug for WgpuBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBuf")
            .field("kind", &self.kind)
            .field("len", &self.len)
            .field("name", &self.name)
            .field("tiled", &self.tiled)
            .field("texels", &self.texels.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiling_round_trips_and_places_units_tile_by_tile() {
        // 70 rows (a partial second tile) of 24 bf16 = 3 units per row.
        let t = Tiled::for_matrix(&[70, 24], DType::BF16).unwrap();
        assert_eq!(t.units_per_row(DType::BF16), 3);
        assert_eq!(t.bytes(DType::BF16), 2 * 64 * 3 * 16);
        let src: Vec<u8> = (0..70 * 48).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0xAAu8; t.bytes(DType::BF16) as usize];
        t.tile(DType::BF16, &src, &mut dst);
        // Unit 2 of row 65: tile 1, unit 2, row 1 of the tile.
        let d = ((3 + 2) * 64 + 1) * 16;
        assert_eq!(&dst[d..d + 16], &src[65 * 48 + 32..65 * 48 + 48]);
        // The padding rows of the last tile are zeros (tile 1, unit 0, row 6 of the tile).
        let pad = (3 * 64 + 6) * 16;
        assert!(dst[pad..pad + 16].iter().all(|&b| b == 0));
        assert_eq!(t.untile(DType::BF16, &dst), src);
        assert_eq!(Tiled::for_matrix(&[4, 6], DType::BF16), None, "rows of 12 bytes are not whole units");
        assert_eq!(Tiled::for_matrix(&[8], DType::F32), None);
        assert!(Tiled::for_matrix(&[3, 4], DType::F32).is_some());
    }
}
