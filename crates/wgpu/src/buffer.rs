//! The device buffer type of the wgpu backend: a wgpu buffer, what it holds and how many.

use tandem_core::DType;

/// What a buffer holds. Activations, the KV cache and metadata are 4-byte elements; weights keep
/// their dtype, two bf16/f16 values per u32 word (the low half is the even element).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    F32,
    U32,
    Weight(DType),
}

impl BufKind {
    pub fn describe(self) -> String {
        match self {
            BufKind::F32 => "f32".into(),
            BufKind::U32 => "u32".into(),
            BufKind::Weight(d) => format!("{} weight", d.name()),
        }
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
    pub(crate) fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("`{n}`"),
            None => format!("a {} buffer of {} elements", self.kind.describe(), self.len),
        }
    }
}

impl std::fmt::Debug for WgpuBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuBuf").field("kind", &self.kind).field("len", &self.len).field("name", &self.name).finish()
    }
}
