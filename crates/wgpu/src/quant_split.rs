//! The split layout of a quantized weight held in a texture: each row's blocks repacked at
//! upload so that every load the kernels make is one aligned 16-byte texel.
//!
//! Why: a GGUF block (Q8_0's 34 bytes, Q4_0's 18) puts its scale in front of its quants, so the
//! quants of most blocks start at an unaligned byte, and a kernel reading them from a storage
//! buffer makes several loads per four values. On Mesa's lavapipe each such load whose address
//! differs across lanes runs as a loop over the lanes (see `buffer::Texels`), which made the
//! kept-quantized decode slower than bf16's. Split, a row is
//!
//! - first its blocks' quants, block after block, each a whole number of 16-byte units;
//! - then its blocks' headers (the bytes before the quants: scales, minimums, zero points),
//!   packed tight and padded to a whole unit;
//!
//! and the rows are tiled and held in a texture as bf16 matrices are ([`Tiled`], [`Texels`]):
//! a lane reads a unit of its row with one image load. A header of 2, 4 or 8 bytes never
//! straddles two units, and Q4_K's 16 (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins) is
//! exactly one, so one load gives a block's scales. The bytes are the file's, moved: a split row
//! is the original row's length rounded up to a unit, plus the header padding.
//!
//! Q4_K's nibbles are also moved within the block, so that each unit holds one 32-value
//! sub-block in Q4_0's arrangement (byte j: element j low, j + 16 high): the file interleaves
//! sub-blocks 2i and 2i + 1 as the low and high nibbles of the same 32 bytes, so a unit of them
//! would decode to values 64 apart, and the kernels must sum k ascending to give the file
//! path's bits. Moved, a unit decodes to 32 consecutive values with one (scale, min).
//!
//! Q5_0's 6-byte header (f16 d, the u32 of fifth bits) is padded at its end to 8 bytes in the
//! split form, so that headers never straddle two units: 2 bytes a block more than the file.
//! Q5_1's (f16 d, f16 m, the fifth bits) is 8 already.
//!
//! The K-quants with high bits keep them in units of their own after the nibbles (a block's
//! stored units, `units_per_block`, are then more than its sub-blocks, `subs_per_block`, the
//! units of 32 values the kernels step through):
//!
//! - Q5_K: Q4_K's header (one unit) and moved nibbles (8 units), then 2 units of fifth bits:
//!   sub-block s's 32 bits are word s % 4 of unit 8 + s / 4, bit l for element l (the file
//!   holds them as bit s of byte l). 176 bytes a block, as the file.
//! - Q6_K: 208 of its 210 bytes are whole units (ql 128, qh 64, the 16 i8 scales 16) and only
//!   the f16 `d` (the file's last 2 bytes) is left, so `d` alone is the header, packed tight as
//!   Q4_0's; the scales become the block's last unit. (Scales and `d` as one 18-byte header would
//!   need a 32-byte slot so as not to straddle two units: 14 bytes a block, 7%, more to read at
//!   decode.) Units 0..8 are the low nibbles of sub-blocks 0..8 in Q4_0's arrangement (the file
//!   spreads a sub-block over the two nibbles of 32 bytes shared with another), units 8..12 the
//!   2-bit highs, 8 bytes a sub-block (unit 8 + s / 2, bytes 8 * (s % 2)..), byte j holding
//!   elements 4j..4j + 3 two bits each, unit 12 the scales as the file has them. 210 bytes a
//!   block, as the file.
//!
//! The moves keep every value's bits; the kernels decode them with shaders/quant_block.wgsl's
//! arithmetic (crates/core/src/quant_block.rs's, ggml's) in the same order.
//!
//! [`Texels`]: crate::buffer::Texels

use tandem_core::quant_layout::QuantLayout;

use crate::buffer::Tiled;

/// A `[rows, cols]` weight in `layout`, split (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantSplit {
    pub layout: QuantLayout,
    pub rows: usize,
    pub cols: usize,
    /// Header bytes of a block (in front of its quants; Q6_K's `d` after them).
    head: usize,
    /// Bytes a header takes in the split form: `head` padded at its end to 2, 4, 8 or 16.
    slot: usize,
    /// Quant bytes of a block (a multiple of 16).
    quants: usize,
}

impl QuantSplit {
    /// The split layout of a `[rows, cols]` weight, if `layout` has one and `cols` is whole
    /// blocks.
    pub fn new(layout: QuantLayout, shape: &[usize]) -> Option<QuantSplit> {
        let (head, quants) = match layout {
            QuantLayout::Q8_0 => (2, 32),
            QuantLayout::Q4_0 => (2, 16),
            QuantLayout::Q4_1 => (4, 16),
            QuantLayout::Fp8E4m3(_) => (4, 32),
            QuantLayout::Q4K => (16, 128),
            QuantLayout::Q5_0 => (6, 16),
            QuantLayout::Q5_1 => (8, 16),
            QuantLayout::Q5K => (16, 160),
            QuantLayout::Q6K => (2, 208),
            QuantLayout::Int4Group { group } if group > 0 && group % 32 == 0 => (8, group / 2),
            _ => return None,
        };
        debug_assert_eq!(head + quants, layout.block_bytes());
        match *shape {
            [rows, cols] if rows > 0 && cols > 0 && cols.is_multiple_of(layout.block_elems()) => {
                Some(QuantSplit { layout, rows, cols, head, slot: head.next_power_of_two(), quants })
            }
            _ => None,
        }
    }

    pub fn blocks_per_row(self) -> usize {
        self.cols / self.layout.block_elems()
    }
    /// 16-byte units of a block's quants (with Q5_K's and Q6_K's high bits and Q6_K's scales).
    pub fn units_per_block(self) -> usize {
        self.quants / 16
    }
    /// Units of nibbles or bytes a block that each decode to `values_per_unit` consecutive
    /// values: the first `subs_per_block` of its `units_per_block`.
    pub fn subs_per_block(self) -> usize {
        match self.layout {
            QuantLayout::Q5K | QuantLayout::Q6K => 8,
            _ => self.units_per_block(),
        }
    }
    /// Units of a row's quants (the headers start at this unit).
    pub fn quant_units(self) -> usize {
        self.blocks_per_row() * self.units_per_block()
    }
    /// 16-bit halves of one block's header in the split form (1, 2, 4, or 8: a whole unit; a
    /// header never straddles two units).
    pub fn head_halves(self) -> usize {
        self.slot / 2
    }
    /// Units of a split row.
    pub fn units_per_row(self) -> usize {
        self.quant_units() + (self.blocks_per_row() * self.slot).div_ceil(16)
    }
    /// Values one unit of quants decodes to.
    pub fn values_per_unit(self) -> usize {
        self.layout.block_elems() / self.subs_per_block()
    }
    /// The tiled matrix the split rows form, as f32 elements (four a unit).
    pub fn tiled(self) -> Tiled {
        Tiled { rows: self.rows, cols: self.units_per_row() * 4 }
    }

    /// A row of the file's blocks (`layout.row_bytes(cols)` bytes) into its split form
    /// (`units_per_row() * 16` bytes).
    pub fn split_row(self, src: &[u8], dst: &mut [u8]) {
        let bb = self.head + self.quants;
        let heads = self.quant_units() * 16;
        dst.fill(0);
        for (b, block) in src.chunks_exact(bb).enumerate() {
            let (head, quants) = self.head_and_quants_of(block);
            self.pack_quants(quants, &mut dst[b * self.quants..(b + 1) * self.quants]);
            dst[heads + b * self.slot..][..self.head].copy_from_slice(head);
        }
    }

    /// A split row back into the file's blocks.
    pub fn join_row(self, src: &[u8], dst: &mut [u8]) {
        let bb = self.head + self.quants;
        let heads = self.quant_units() * 16;
        for (b, block) in dst.chunks_exact_mut(bb).enumerate() {
            let (head, quants) = self.head_and_quants_of_mut(block);
            self.unpack_quants(&src[b * self.quants..(b + 1) * self.quants], quants);
            head.copy_from_slice(&src[heads + b * self.slot..][..self.head]);
        }
    }

    /// Every row of `src` (the file's bytes) split, one after another.
    pub fn split(self, src: &[u8]) -> Vec<u8> {
        let (n, row) = (self.units_per_row() * 16, self.head_and_quants() * self.blocks_per_row());
        let mut out = vec![0u8; self.rows * n];
        for (s, d) in src.chunks_exact(row).zip(out.chunks_exact_mut(n)) {
            self.split_row(s, d);
        }
        out
    }

    /// Split rows `src` (at least `rows` of them) back into the file's bytes.
    pub fn join(self, src: &[u8]) -> Vec<u8> {
        let (n, row) = (self.units_per_row() * 16, self.head_and_quants() * self.blocks_per_row());
        let mut out = vec![0u8; self.rows * row];
        for (s, d) in src.chunks_exact(n).zip(out.chunks_exact_mut(row)) {
            self.join_row(s, d);
        }
        out
    }

    fn head_and_quants(self) -> usize {
        self.head + self.quants
    }

    /// A file block's header and quants: the header leads, but Q6_K's `d` ends the block.
    fn head_and_quants_of(self, block: &[u8]) -> (&[u8], &[u8]) {
        if self.layout == QuantLayout::Q6K {
            let (quants, head) = block.split_at(self.quants);
            (head, quants)
        } else {
            block.split_at(self.head)
        }
    }

    fn head_and_quants_of_mut(self, block: &mut [u8]) -> (&mut [u8], &mut [u8]) {
        if self.layout == QuantLayout::Q6K {
            let (quants, head) = block.split_at_mut(self.quants);
            (head, quants)
        } else {
            block.split_at_mut(self.head)
        }
    }

    /// A block's quants (the file's) into their split units: the same bytes, but for the
    /// K-quants, moved as the module docs say.
    fn pack_quants(self, src: &[u8], dst: &mut [u8]) {
        match self.layout {
            QuantLayout::Q4K => pack_k_nibbles(src, dst),
            QuantLayout::Q5K => {
                let (qh, qs) = src.split_at(32);
                pack_k_nibbles(qs, &mut dst[..128]);
                for (s, word) in dst[128..].chunks_exact_mut(4).enumerate() {
                    let bits = (0..32).fold(0u32, |w, l| w | ((((qh[l] >> s) & 1) as u32) << l));
                    word.copy_from_slice(&bits.to_le_bytes());
                }
            }
            QuantLayout::Q6K => {
                let (ql, qh) = (&src[..128], &src[128..192]);
                for (e, unit) in (0..256).step_by(32).zip(dst[..128].chunks_exact_mut(16)) {
                    for (j, byte) in unit.iter_mut().enumerate() {
                        *byte = q6_k_low(ql, e + j) | (q6_k_low(ql, e + j + 16) << 4);
                    }
                }
                for (e, byte) in (0..256).step_by(4).zip(&mut dst[128..192]) {
                    *byte = (0..4).fold(0, |v, i| v | (q6_k_high(qh, e + i) << (2 * i)));
                }
                dst[192..].copy_from_slice(&src[192..]);
            }
            _ => dst.copy_from_slice(src),
        }
    }

    /// [`Self::pack_quants`] undone.
    fn unpack_quants(self, src: &[u8], dst: &mut [u8]) {
        match self.layout {
            QuantLayout::Q4K => unpack_k_nibbles(src, dst),
            QuantLayout::Q5K => {
                let (qh, qs) = dst.split_at_mut(32);
                unpack_k_nibbles(&src[..128], qs);
                qh.fill(0);
                for (s, word) in src[128..].chunks_exact(4).enumerate() {
                    let bits = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    for (l, byte) in qh.iter_mut().enumerate() {
                        *byte |= (((bits >> l) & 1) as u8) << s;
                    }
                }
            }
            QuantLayout::Q6K => {
                dst[..192].fill(0);
                for e in 0..256 {
                    let (g, j) = (e / 32, e % 32);
                    let low = (src[g * 16 + j % 16] >> (4 * (j / 16))) & 0x0f;
                    let high = (src[128 + e / 4] >> (2 * (e % 4))) & 3;
                    let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
                    dst[h * 64 + (s % 2) * 32 + l] |= low << (4 * (s / 2));
                    dst[128 + h * 32 + l] |= high << (2 * s);
                }
                dst[192..].copy_from_slice(&src[192..]);
            }
            _ => dst.copy_from_slice(src),
        }
    }
}

/// Q4_K's (and Q5_K's) 128 nibble bytes into 8 units, unit s sub-block s's 32 nibbles in Q4_0's
/// arrangement (see the module docs).
fn pack_k_nibbles(src: &[u8], dst: &mut [u8]) {
    for (s, unit) in dst.chunks_exact_mut(16).enumerate() {
        let (run, shift) = (&src[(s / 2) * 32..(s / 2 + 1) * 32], 4 * (s % 2));
        for (j, byte) in unit.iter_mut().enumerate() {
            *byte = ((run[j] >> shift) & 0x0f) | (((run[j + 16] >> shift) & 0x0f) << 4);
        }
    }
}

/// [`pack_k_nibbles`] undone.
fn unpack_k_nibbles(src: &[u8], dst: &mut [u8]) {
    for (s, unit) in src.chunks_exact(16).enumerate() {
        let (run, shift) = (&mut dst[(s / 2) * 32..(s / 2 + 1) * 32], 4 * (s % 2));
        let keep = 0xf0u8 >> shift;
        for (j, &byte) in unit.iter().enumerate() {
            run[j] = (run[j] & keep) | ((byte & 0x0f) << shift);
            run[j + 16] = (run[j + 16] & keep) | ((byte >> 4) << shift);
        }
    }
}

/// Q6_K element e's low 4 bits from the file's `ql` (crates/core/src/quant_block.rs
/// `block_q6_k`: nibble s / 2 of `ql[h * 64 + (s % 2) * 32 + l]`).
fn q6_k_low(ql: &[u8], e: usize) -> u8 {
    let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
    (ql[h * 64 + (s % 2) * 32 + l] >> (4 * (s / 2))) & 0x0f
}

/// Q6_K element e's high 2 bits from the file's `qh` (bits 2s..2s + 1 of `qh[h * 32 + l]`).
fn q6_k_high(qh: &[u8], e: usize) -> u8 {
    let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
    (qh[h * 32 + l] >> (2 * s)) & 3
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::quant_layout::Fp8Scales;

    #[test]
    fn split_rows_hold_quants_then_headers_and_join_back() {
        // Q8_0, 3 rows of 3 blocks: 34-byte blocks, 2 bytes of f16 scale then 32 quants.
        let s = QuantSplit::new(QuantLayout::Q8_0, &[3, 96]).unwrap();
        assert_eq!((s.quant_units(), s.units_per_row(), s.head_halves(), s.values_per_unit()), (6, 7, 1, 16));
        let src: Vec<u8> = (0..3 * 3 * 34).map(|i| (i % 253) as u8).collect();
        let split = s.split(&src);
        assert_eq!(split.len(), 3 * 7 * 16);
        // Row 1, block 2: quants at unit 4 of the row, header at byte 4 of the header unit.
        let (row, block) = (&split[7 * 16..14 * 16], &src[(3 + 2) * 34..(3 + 3) * 34]);
        assert_eq!(&row[64..96], &block[2..]);
        assert_eq!(&row[96 + 4..96 + 6], &block[..2]);
        assert!(row[96 + 6..].iter().all(|&b| b == 0), "header padding is zeros");
        assert_eq!(s.join(&split), src);
    }

    #[test]
    fn only_layouts_with_whole_quant_units_split() {
        let fp8 = QuantSplit::new(QuantLayout::Fp8E4m3(Fp8Scales::Block), &[2, 64]).unwrap();
        assert_eq!((fp8.units_per_block(), fp8.head_halves(), fp8.values_per_unit()), (2, 2, 16));
        let int4 = QuantSplit::new(QuantLayout::Int4Group { group: 128 }, &[2, 256]).unwrap();
        assert_eq!((int4.units_per_block(), int4.head_halves(), int4.values_per_unit()), (4, 4, 32));
        assert_eq!(QuantSplit::new(QuantLayout::Int4Group { group: 16 }, &[2, 64]), None);
        assert_eq!(QuantSplit::new(QuantLayout::Q6K, &[2, 128]), None, "not whole blocks");
        assert_eq!(QuantSplit::new(QuantLayout::Q4_0, &[2, 48]), None, "not whole blocks");
        let src: Vec<u8> = (0..2 * 2 * 72).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(int4.join(&int4.split(&src)), src);
    }

    #[test]
    fn q4_k_units_hold_one_sub_block_each_and_join_back() {
        let s = QuantSplit::new(QuantLayout::Q4K, &[2, 512]).unwrap();
        assert_eq!((s.units_per_block(), s.head_halves(), s.values_per_unit(), s.units_per_row()), (8, 8, 32, 18));
        let src: Vec<u8> = (0..2 * 2 * 144).map(|i| (i * 13 % 251) as u8).collect();
        let split = s.split(&src);
        // Row 0, block 1: its header is unit 17; its unit 3 is sub-block 3, the high nibbles of
        // the block's quant bytes 32..64, elements 0..16 in the low nibbles.
        let block = &src[144..288];
        assert_eq!(&split[17 * 16..18 * 16], &block[..16]);
        let unit = &split[(8 + 3) * 16..(8 + 4) * 16];
        for j in 0..16 {
            assert_eq!(unit[j] & 0x0f, block[16 + 32 + j] >> 4, "element {j}");
            assert_eq!(unit[j] >> 4, block[16 + 48 + j] >> 4, "element {}", j + 16);
        }
        assert_eq!(s.join(&split), src);
    }

    #[test]
    fn q5_0_headers_are_padded_to_eight_bytes() {
        let s = QuantSplit::new(QuantLayout::Q5_0, &[1, 96]).unwrap();
        assert_eq!((s.quant_units(), s.head_halves(), s.units_per_row()), (3, 4, 5));
        let src: Vec<u8> = (0..3 * 22).map(|i| (i * 11 % 251 + 1) as u8).collect();
        let split = s.split(&src);
        // Block 2: quants in unit 2, header at byte 16 of the header units, then 2 zero bytes.
        assert_eq!(&split[32..48], &src[2 * 22 + 6..3 * 22]);
        assert_eq!(&split[48 + 16..48 + 22], &src[2 * 22..2 * 22 + 6]);
        assert_eq!(&split[48 + 22..48 + 24], &[0, 0]);
        assert_eq!(s.join(&split), src);
    }

    /// Decodes a K-quant's split units on the host as quant_split.wgsl does, and compares each
    /// value with crates/core's decode of the file's block.
    fn split_decode(s: QuantSplit, unit: &[u8], head: &[u8], e: usize) -> f32 {
        let f16 = |b: &[u8], o: usize| half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32();
        let (g, j) = (e / 32, e % 32);
        let nib = (unit[g * 16 + j % 16] >> (4 * (j / 16))) & 0x0f;
        match s.layout {
            QuantLayout::Q5K => {
                let word = &unit[128 + 4 * g..][..4];
                let fifth = (u32::from_le_bytes([word[0], word[1], word[2], word[3]]) >> j) & 1;
                let k = &head[4..16];
                let (sc, m) = if g < 4 {
                    (k[g] & 63, k[g + 4] & 63)
                } else {
                    ((k[g + 4] & 0x0f) | ((k[g - 4] >> 6) << 4), (k[g + 4] >> 4) | ((k[g] >> 6) << 4))
                };
                let q = nib as u32 | (fifth << 4);
                f16(head, 0) * sc as f32 * q as f32 - f16(head, 2) * m as f32
            }
            _ => {
                let high = (unit[128 + e / 4] >> (2 * (e % 4))) & 3;
                let q = (nib | (high << 4)) as i32 - 32;
                f16(head, 0) * (unit[192 + e / 16] as i8) as f32 * q as f32
            }
        }
    }

    #[test]
    fn q5_k_and_q6_k_units_decode_to_the_files_values_and_join_back() {
        for (layout, decode) in [
            (QuantLayout::Q5K, tandem_core::quant_block::block_q5_k as fn(&[u8], &mut [f32])),
            (QuantLayout::Q6K, tandem_core::quant_block::block_q6_k),
        ] {
            let s = QuantSplit::new(layout, &[2, 512]).unwrap();
            let bb = layout.block_bytes();
            let (units, slot): (usize, usize) = if layout == QuantLayout::Q5K { (10, 16) } else { (13, 2) };
            assert_eq!((s.units_per_block(), s.subs_per_block(), s.values_per_unit()), (units, 8, 32));
            assert_eq!(s.units_per_row(), 2 * units + (2 * slot).div_ceil(16));
            let mut src: Vec<u8> = (0..2 * 2 * bb).map(|i| (i * 29 % 251) as u8).collect();
            for block in src.chunks_exact_mut(bb) {
                let at = if layout == QuantLayout::Q6K { 208 } else { 0 };
                block[at..at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if layout == QuantLayout::Q5K {
                    block[2..4].copy_from_slice(&half::f16::from_f32(0.02).to_le_bytes());
                }
            }
            let split = s.split(&src);
            let row = s.units_per_row() * 16;
            for (r, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                let block = &src[(r * 2 + b) * bb..][..bb];
                let mut want = [0f32; 256];
                decode(block, &mut want);
                let unit = &split[r * row + b * units * 16..][..units * 16];
                let head = &split[r * row + 2 * units * 16 + b * slot..][..slot];
                for (e, &w) in want.iter().enumerate() {
                    let got = split_decode(s, unit, head, e);
                    assert_eq!(got.to_bits(), w.to_bits(), "{} row {r} block {b} element {e}", layout.name());
                }
            }
            assert_eq!(s.join(&split), src, "{}", layout.name());
        }
    }
}
