//! A step's metadata in one staging layout: the six u32 arrays the ops read (tokens,
//! positions, slots, token_seq, logit rows, block tables) as regions of one [`U32Layout`],
//! sized at load. The model writes a step into the backend's staging memory here, then one
//! [`crate::Storage::upload_u32_group`] copies it (CUDA: one asynchronous copy from page-locked
//! memory into one allocation the six arrays are views of).
//!
//! The block tables come last: they are the largest region and the one whose used length varies
//! most, and one copy spans from the first region to the end of the last region used, so every
//! region before them is copied whole (`4 x max_tokens + max_logit_rows` words at most) and the
//! block tables only as far as the step uses them.
//!
//! A padded decode step (model.rs `Padding`) is written here directly, without building a
//! `ForwardBatch`: [`MetaStaging::stage_padded`]. Its block-table rows are `stride` entries,
//! a real row's blocks then the scratch block, a padding row all scratch block: nearly all of
//! the region at large buckets (256 rows x 512 entries at graph_max_context 8192). The staging
//! memory keeps what the last step wrote, and [`MetaStaging`] remembers how much of each row
//! may hold something else than the scratch block, so a step writes a real row's blocks and
//! only those scratch entries that are not scratch already (a padding row that was padding
//! before is not written at all).

use crate::backend::U32Layout;
use crate::batch::ForwardBatch;
use crate::error::{Error, Result};

/// Region indices, in layout order.
pub const TOKENS: usize = 0;
pub const POSITIONS: usize = 1;
pub const SLOTS: usize = 2;
pub const TOKEN_SEQ: usize = 3;
pub const LOGIT_ROWS: usize = 4;
pub const BLOCK_TABLES: usize = 5;
pub const REGIONS: usize = 6;

/// Elements a step uses of each region (what the upload copies).
pub type Used = [usize; REGIONS];

/// The layout for steps of at most `max_tokens` tokens, `max_logit_rows` logit rows and a
/// block table of `block_table_len` entries (`max_seqs x` the most blocks a row can hold).
pub fn layout(max_tokens: usize, max_logit_rows: usize, block_table_len: usize) -> Result<U32Layout> {
    let mut lens = [max_tokens; REGIONS];
    lens[LOGIT_ROWS] = max_logit_rows;
    lens[BLOCK_TABLES] = block_table_len;
    U32Layout::new(&lens)
}

/// What a padded decode step's padding rows are (model.rs `Padding`): token 0 at position 0,
/// K/V written to `scratch_block`, block-table rows of `stride` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PadRows {
    pub scratch_block: u32,
    pub stride: usize,
    pub block_size: u32,
}

/// Writes steps into the staging memory of one layout, remembering how much of each padded
/// block-table row may differ from the scratch block (so a padded step skips rewriting what
/// already is). Whoever owns it must send every write of that staging memory through it, or
/// call [`MetaStaging::forget`].
#[derive(Debug, Clone)]
pub struct MetaStaging {
    layout: U32Layout,
    /// Per row `r` of the block-table region at `pad`'s stride: entries `dirty[r]..stride` of
    /// the row hold `pad.scratch_block`, as the last write left them; [`UNKNOWN`]: nothing is
    /// known. Sized once (the most rows a padded step has); rows beyond it are always written.
    dirty: Vec<usize>,
    pad: Option<PadRows>,
}

/// A row of which nothing is known: every entry is written.
const UNKNOWN: usize = usize::MAX;

impl MetaStaging {
    /// For `layout`, with padded steps of at most `max_rows` rows.
    pub fn new(layout: U32Layout, max_rows: usize) -> Self {
        MetaStaging { layout, dirty: vec![UNKNOWN; max_rows], pad: None }
    }

    pub fn layout(&self) -> &U32Layout {
        &self.layout
    }

    /// Trusts nothing about the staging memory's block tables (someone else wrote it).
    pub fn forget(&mut self) {
        self.dirty.fill(UNKNOWN);
    }

    fn check_len(&self, staging: &[u32]) -> Result<()> {
        if staging.len() < self.layout.total() {
            return Err(Error::Batch(format!(
                "staging memory of {} elements for a layout of {}",
                staging.len(),
                self.layout.total()
            )));
        }
        Ok(())
    }

    /// Writes `batch` as it is; a batch beyond a region is an error and writes nothing.
    pub fn stage_batch(&mut self, staging: &mut [u32], batch: &ForwardBatch) -> Result<Used> {
        let mut used = [0; REGIONS];
        let parts: [&[u32]; REGIONS] =
            [&batch.tokens, &batch.positions, &batch.slots, &batch.token_seq, &batch.logit_rows, &batch.block_tables];
        for (u, p) in used.iter_mut().zip(&parts) {
            *u = p.len();
        }
        self.layout.span(&used)?;
        self.check_len(staging)?;
        for (i, p) in parts.iter().enumerate() {
            let o = self.layout.offset(i);
            staging[o..o + p.len()].copy_from_slice(p);
        }
        // The block tables were written at the batch's own stride, over any padding rows.
        self.forget();
        Ok(used)
    }

    /// Writes `batch` (decode rows: sequence i = token i = logit row i) padded to `rows` rows:
    /// what model.rs `pad_decode` used to build as a `ForwardBatch` (the tests keep it as the
    /// oracle). Real rows keep their first `stride` block-table entries, the rest of each row
    /// and every padding row is the scratch block. A batch that is not `n <= rows` decode rows,
    /// or a step beyond a region, is an error and writes nothing.
    pub fn stage_padded(
        &mut self,
        staging: &mut [u32],
        batch: &ForwardBatch,
        pad: PadRows,
        rows: usize,
    ) -> Result<Used> {
        let n = batch.num_tokens();
        let (stride, scratch) = (pad.stride, pad.scratch_block);
        if n > rows
            || batch.positions.len() != n
            || batch.slots.len() != n
            || batch.max_blocks == 0
            || batch.block_tables.len() != n * batch.max_blocks
        {
            return Err(Error::Batch(format!("a padded step takes n <= {rows} decode rows with [n, max_blocks] block tables ({n} tokens, {} table entries of stride {})", batch.block_tables.len(), batch.max_blocks)));
        }
        let bt_len = rows
            .checked_mul(stride)
            .ok_or_else(|| Error::Batch(format!("{rows} padded rows of {stride} blocks overflow")))?;
        let scratch_slot = scratch.checked_mul(pad.block_size).ok_or_else(|| {
            Error::Batch(format!("scratch block {scratch} of {} slots is beyond u32", pad.block_size))
        })?;
        let used = [rows, rows, rows, rows, rows, bt_len];
        self.layout.span(&used)?;
        self.check_len(staging)?;
        let offsets: [usize; REGIONS] = std::array::from_fn(|i| self.layout.offset(i));
        let at = |i: usize| offsets[i];
        let fill = |s: &mut [u32], o: usize, head: &[u32], tail: u32| {
            s[o..o + head.len()].copy_from_slice(head);
            s[o + head.len()..o + rows].fill(tail);
        };
        fill(staging, at(TOKENS), &batch.tokens, 0);
        fill(staging, at(POSITIONS), &batch.positions, 0);
        fill(staging, at(SLOTS), &batch.slots, scratch_slot);
        for (i, v) in staging[at(TOKEN_SEQ)..at(TOKEN_SEQ) + rows].iter_mut().enumerate() {
            *v = i as u32;
        }
        for (i, v) in staging[at(LOGIT_ROWS)..at(LOGIT_ROWS) + rows].iter_mut().enumerate() {
            *v = i as u32;
        }
        if self.pad != Some(pad) {
            // Another stride or scratch block: what is known was known of other rows.
            self.forget();
            self.pad = Some(pad);
        }
        let bt = &mut staging[at(BLOCK_TABLES)..at(BLOCK_TABLES) + bt_len];
        for (r, dst) in bt.chunks_exact_mut(stride).enumerate() {
            // A real row's blocks (entries past its context are never read: the stride only
            // has to hold it), then the scratch block; a padding row is all scratch block.
            let keep = match r < n {
                true => {
                    let row = &batch.block_tables[r * batch.max_blocks..(r + 1) * batch.max_blocks];
                    let keep = row.len().min(stride);
                    dst[..keep].copy_from_slice(&row[..keep]);
                    keep
                }
                false => 0,
            };
            let dirty = self.dirty.get_mut(r);
            let end = dirty.as_deref().map_or(stride, |&d| d.min(stride));
            if end > keep {
                dst[keep..end].fill(scratch);
            }
            if let Some(d) = dirty {
                *d = keep;
            }
        }
        Ok(used)
    }
}

/// The padded decode step as model.rs built it before the staging layout (a fresh
/// `ForwardBatch`): the oracle [`MetaStaging::stage_padded`] is tested against here and timed
/// against in the reference backend's upload bench.
#[doc(hidden)]
pub fn pad_decode(batch: &ForwardBatch, pad: PadRows, rows: usize) -> ForwardBatch {
    let n = batch.num_tokens();
    let bs = pad.block_size;
    let mut p = ForwardBatch { max_blocks: pad.stride, ..Default::default() };
    p.tokens.extend(batch.tokens.iter().copied().chain(std::iter::repeat_n(0, rows - n)));
    p.positions.extend(batch.positions.iter().copied().chain(std::iter::repeat_n(0, rows - n)));
    p.slots.extend(batch.slots.iter().copied().chain(std::iter::repeat_n(pad.scratch_block * bs, rows - n)));
    p.token_seq.extend(0..rows as u32);
    p.logit_rows.extend(0..rows as u32);
    p.block_tables.reserve(rows * pad.stride);
    for s in 0..n {
        let row = &batch.block_tables[s * batch.max_blocks..(s + 1) * batch.max_blocks];
        let keep = row.len().min(pad.stride);
        p.block_tables.extend_from_slice(&row[..keep]);
        p.block_tables.extend(std::iter::repeat_n(pad.scratch_block, pad.stride - keep));
    }
    p.block_tables.extend(std::iter::repeat_n(pad.scratch_block, (rows - n) * pad.stride));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regions of `staging` a step of `used` wrote, as a batch.
    fn staged(l: &U32Layout, staging: &[u32], used: &Used, max_blocks: usize) -> ForwardBatch {
        let r = |i: usize| staging[l.offset(i)..l.offset(i) + used[i]].to_vec();
        ForwardBatch {
            tokens: r(TOKENS),
            positions: r(POSITIONS),
            slots: r(SLOTS),
            token_seq: r(TOKEN_SEQ),
            block_tables: r(BLOCK_TABLES),
            max_blocks,
            logit_rows: r(LOGIT_ROWS),
            adapters: vec![],
        }
    }

    struct Lcg(u64);
    impl Lcg {
        fn below(&mut self, n: usize) -> usize {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 33) % n.max(1) as u64) as usize
        }
    }

    /// `n` decode rows over blocks 0..40 (block size 16), tables of 1..=max_blocks blocks.
    fn decode_batch(rng: &mut Lcg, n: usize, max_blocks: usize) -> ForwardBatch {
        let mut b = ForwardBatch { max_blocks, ..Default::default() };
        for _ in 0..n {
            let blocks = 1 + rng.below(max_blocks);
            let table: Vec<u32> = (0..blocks).map(|_| rng.below(40) as u32).collect();
            let pos = (blocks - 1) * 16 + rng.below(16);
            b.push_seq(&[rng.below(100) as u32], pos, &table, 16, true);
        }
        b
    }

    #[test]
    fn regions_are_aligned_in_order_and_sized_for_their_limits() {
        let l = layout(100, 70, 8 * 33).unwrap();
        assert_eq!(l.regions(), REGIONS);
        let offsets: Vec<usize> = (0..REGIONS).map(|i| l.offset(i)).collect();
        // 100 rounds up to 128 (two 64-element units); 70 to 128; the block tables end unaligned
        // and the total rounds up.
        assert_eq!(offsets, vec![0, 128, 256, 384, 512, 640]);
        assert_eq!(l.total(), 640 + 320);
        assert_eq!((l.len(TOKENS), l.len(LOGIT_ROWS), l.len(BLOCK_TABLES)), (100, 70, 264));
        // Empty regions take no room, and nothing overlaps.
        let e = U32Layout::new(&[0, 5, 0, 64]).unwrap();
        assert_eq!((0..4).map(|i| e.offset(i)).collect::<Vec<_>>(), vec![0, 0, 64, 64]);
        assert_eq!(e.total(), 128);
    }

    #[test]
    fn layouts_that_overflow_and_counts_beyond_a_region_are_errors() {
        assert!(U32Layout::new(&[usize::MAX, 1]).is_err());
        assert!(U32Layout::new(&[usize::MAX - 10]).is_err(), "rounding up overflows");
        assert!(U32Layout::new(&[usize::MAX / 4 + 64]).is_err(), "bytes overflow");
        let l = layout(8, 4, 16).unwrap();
        assert_eq!(l.span(&[8, 8, 8, 8, 4, 16]).unwrap(), l.offset(BLOCK_TABLES) + 16);
        assert_eq!(
            l.span(&[1, 1, 1, 1, 1, 0]).unwrap(),
            l.offset(LOGIT_ROWS) + 1,
            "the span ends at the last region used"
        );
        assert_eq!(l.span(&[0; REGIONS]).unwrap(), 0);
        assert!(l.span(&[9, 8, 8, 8, 4, 16]).is_err());
        assert!(l.span(&[8, 8, 8, 8, 4, 17]).is_err());
        assert!(l.span(&[8, 8, 8]).is_err(), "a count for every region");
    }

    #[test]
    fn a_batch_beyond_a_region_is_an_error_and_writes_nothing() {
        let l = layout(4, 2, 8).unwrap();
        let mut st = MetaStaging::new(l.clone(), 4);
        let mut mem = vec![7u32; l.total()];
        let mut rng = Lcg(3);
        let fits = decode_batch(&mut rng, 2, 4);
        let used = st.stage_batch(&mut mem, &fits).unwrap();
        assert_eq!(staged(&l, &mem, &used, 4), fits);
        let before = mem.clone();
        // Three logit rows (two fit), then 12 block-table entries (eight fit), then five tokens.
        assert!(st.stage_batch(&mut mem, &decode_batch(&mut rng, 3, 1)).is_err());
        assert!(st.stage_batch(&mut mem, &decode_batch(&mut rng, 2, 6)).is_err());
        let mut long = fits.clone();
        long.tokens.extend([1, 2, 3]);
        assert!(st.stage_batch(&mut mem, &long).is_err());
        let pad = PadRows { scratch_block: 40, stride: 4, block_size: 16 };
        assert!(st.stage_padded(&mut mem, &fits, pad, 3).is_err(), "3 rows of 4 blocks: 12 entries");
        assert!(st.stage_padded(&mut mem, &fits, pad, 1).is_err(), "more rows than the bucket");
        assert!(st.stage_padded(&mut mem[..l.total() - 1], &fits, pad, 2).is_err(), "short staging memory");
        assert_eq!(mem, before);
    }

    #[test]
    fn padded_steps_stage_what_pad_decode_built() {
        let (max_rows, max_blocks) = (16, 8);
        let l = layout(max_rows, max_rows + 4, max_rows * max_blocks).unwrap();
        // One row fewer than the largest bucket tracked: that row is always written whole.
        let mut st = MetaStaging::new(l.clone(), max_rows - 1);
        let mut mem = vec![u32::MAX; l.total()];
        let mut rng = Lcg(11);
        let pads = [
            PadRows { scratch_block: 40, stride: 4, block_size: 16 },
            PadRows { scratch_block: 41, stride: 8, block_size: 16 },
        ];
        let mut skipped_some = false;
        // A random walk of padded steps (growing, shrinking, other strides) and eager steps
        // between them, each checked against the oracle: what the rows skipped hold is right.
        for step in 0..400 {
            if rng.below(6) == 0 {
                let (n, mb) = (1 + rng.below(max_rows), 1 + rng.below(max_blocks));
                let b = decode_batch(&mut rng, n, mb);
                let used = st.stage_batch(&mut mem, &b).unwrap();
                assert_eq!(staged(&l, &mem, &used, b.max_blocks), b, "step {step}");
                continue;
            }
            let pad = pads[(rng.below(5) == 0) as usize];
            let rows = [1, 2, 4, 8, 16][rng.below(5)];
            let n = rng.below(rows + 1);
            let mb = 1 + rng.below(max_blocks);
            let b = decode_batch(&mut rng, n, mb);
            skipped_some |= st.pad == Some(pad) && (0..rows).any(|r| st.dirty.get(r).is_some_and(|&d| d < pad.stride));
            let used = st.stage_padded(&mut mem, &b, pad, rows).unwrap();
            assert_eq!(
                staged(&l, &mem, &used, pad.stride),
                pad_decode(&b, pad, rows),
                "step {step}: {n} rows padded to {rows}, {pad:?}"
            );
            // What it claims is the scratch block is.
            let bt = &mem[l.offset(BLOCK_TABLES)..];
            for (r, &d) in st.dirty.iter().enumerate().filter(|(_, &d)| d != UNKNOWN) {
                assert!(
                    bt[r * pad.stride + d..(r + 1) * pad.stride].iter().all(|&x| x == pad.scratch_block),
                    "step {step}: row {r} from {d}"
                );
            }
        }
        assert!(skipped_some, "the walk never skipped a scratch entry");
    }

    #[test]
    fn a_padding_only_step_is_every_row_padding() {
        let l = layout(8, 8, 8 * 3).unwrap();
        let mut st = MetaStaging::new(l.clone(), 8);
        let mut mem = vec![0; l.total()];
        let pad = PadRows { scratch_block: 9, stride: 3, block_size: 32 };
        let empty = ForwardBatch { max_blocks: 3, ..Default::default() };
        let used = st.stage_padded(&mut mem, &empty, pad, 8).unwrap();
        let b = staged(&l, &mem, &used, 3);
        assert_eq!(b.tokens, vec![0; 8]);
        assert_eq!(b.slots, vec![9 * 32; 8]);
        assert_eq!(b.token_seq, (0..8).collect::<Vec<u32>>());
        assert_eq!(b.block_tables, vec![9; 24]);
        assert_eq!(st.dirty, vec![0; 8]);
    }
}
