//! A step's u32 metadata as regions of one host staging buffer and their device buffers
//! ([`U32Layout`], [`U32Group`]): what [`Storage::alloc_u32_group`] allocates and
//! [`Storage::upload_u32_group`] uploads in one copy where the backend can.
//!
//! [`Storage::alloc_u32_group`]: crate::backend::Storage::alloc_u32_group
//! [`Storage::upload_u32_group`]: crate::backend::Storage::upload_u32_group

use crate::error::{Error, Result};

/// Regions of u32 elements one after another in one host staging buffer (and, where a backend
/// carves them from one allocation, in one device allocation): region `i` holds at most
/// `len(i)` elements from element `offset(i)`. Offsets are multiples of [`U32Layout::ALIGN`]
/// elements (256 bytes), so a region's device pointer is as aligned as an allocation of its own
/// would be and vectorized loads in kernels stay legal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct U32Layout {
    offsets: Vec<usize>,
    lens: Vec<usize>,
    total: usize,
}

impl U32Layout {
    /// Elements a region's offset is a multiple of (256 bytes).
    pub const ALIGN: usize = 64;

    /// Regions of `lens` elements in this order. Sizes that overflow the address space are an
    /// error (they come from load options).
    pub fn new(lens: &[usize]) -> Result<Self> {
        let overflow = || Error::Batch(format!("a u32 group of regions {lens:?} overflows usize"));
        let mut offsets = Vec::with_capacity(lens.len());
        let mut at = 0usize;
        for &len in lens {
            offsets.push(at);
            let end = at.checked_add(len).ok_or_else(overflow)?;
            at = end.checked_next_multiple_of(Self::ALIGN).ok_or_else(overflow)?;
        }
        at.checked_mul(4).ok_or_else(overflow)?;
        Ok(U32Layout { offsets, lens: lens.to_vec(), total: at })
    }
    pub fn regions(&self) -> usize {
        self.lens.len()
    }
    /// Element offset of region `i` (panics if there is no region `i`: a caller's constant).
    pub fn offset(&self, i: usize) -> usize {
        self.offsets[i]
    }
    /// Capacity of region `i` in elements.
    pub fn len(&self, i: usize) -> usize {
        self.lens[i]
    }
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }
    /// Elements of the whole layout (the staging buffer's length).
    pub fn total(&self) -> usize {
        self.total
    }
    /// Elements one copy of the first `used[i]` elements of every region spans: from element 0
    /// to the end of the last region with any used (gaps between regions included). A count
    /// beyond a region's capacity, or a count for every region but not exactly, is an error.
    pub fn span(&self, used: &[usize]) -> Result<usize> {
        if used.len() != self.lens.len() {
            return Err(Error::Batch(format!(
                "{} used counts for a u32 group of {} regions",
                used.len(),
                self.lens.len()
            )));
        }
        let mut end = 0;
        for (i, (&u, &cap)) in used.iter().zip(&self.lens).enumerate() {
            if u > cap {
                return Err(Error::Batch(format!("region {i} of a u32 group: {u} elements, at most {cap}")));
            }
            if u > 0 {
                end = self.offsets[i] + u;
            }
        }
        Ok(end)
    }
}

/// The device buffers of one [`U32Layout`] and the host staging memory they are uploaded from
/// ([`Storage::alloc_u32_group`]): the host writes the staging memory in the layout
/// ([`Storage::u32_staging`]), then [`Storage::upload_u32_group`] copies what it used.
pub struct U32Group<Buf> {
    /// Region `i`'s device buffer, `layout.len(i)` elements: a buffer of its own, or a view
    /// into one allocation. Ops take these like any other buffer.
    pub parts: Vec<Buf>,
    pub layout: U32Layout,
    /// The backend's own: where it carved `parts` out of one allocation, the buffer that holds
    /// that allocation and the staging memory that goes with it (CUDA: page-locked host
    /// memory and the event of its last copy). None: separate buffers staged in a host Vec.
    pub carved: Option<Buf>,
    /// Staging memory where `carved` is None; reused by every upload.
    pub(crate) host: Vec<u32>,
}

impl<Buf> U32Group<Buf> {
    /// Separate buffers (one per region) staged in a host Vec: the trait's default.
    pub fn separate(layout: U32Layout, parts: Vec<Buf>) -> Self {
        let host = vec![0; layout.total()];
        U32Group { parts, layout, carved: None, host }
    }
    /// Views of one allocation held by `whole`, which also holds the backend's staging memory.
    pub fn carved(layout: U32Layout, parts: Vec<Buf>, whole: Buf) -> Self {
        U32Group { parts, layout, carved: Some(whole), host: vec![] }
    }
}
