//! FP8 checkpoints: 8-bit float weights with f32 (or 16-bit) scales, dequantized once at load.
//!
//! The layouts people publish (what `config.json`'s `quantization_config` says):
//! - `quant_method: "fp8"` with `weight_block_size: [bn, bk]` (Qwen3-*-FP8, DeepSeek-V3, HF's
//!   FineGrainedFP8Config): `X.weight` in e4m3 and `X.weight_scale_inv` [ceil(n/bn), ceil(k/bk)];
//! - `quant_method: "fp8"` without a block size (AutoFP8 / vLLM's own): a per-tensor scalar
//!   `X.weight_scale` (and `X.input_scale`, a static activation scale: not needed here);
//! - `quant_method: "compressed-tensors"`, `format: "float-quantized"` (llm-compressor's FP8,
//!   RedHatAI's checkpoints): `X.weight_scale` per tensor ([] or [1]), per output channel
//!   ([n, 1]) or per block (`block_structure`).
//!
//! Every one of them means weight[r, c] = fp8(q[r, c]) * scale[block of (r, c)], the product in
//! f32 (HF transformers' dequantize and vLLM's fallback both do so), then rounded to the type
//! the model's other weights have (bf16 for every release) as [`crate::DType::from_f32`] rounds.
//! A block grid is cut from the top-left corner, ceil-divided as vLLM does; without a block size
//! in the config it is derived from the grid's shape, which must then divide the weight exactly
//! (as HF requires).
//!
//! An e4m3 weight of a bf16 model is kept in 8 bits ([`pack_blocks`]): runs of
//! [`BLOCK_ELEMS`] values of a row, each run its f32 scale (the one the checkpoint gives those
//! values: a run never crosses a scale block) followed by its bytes as stored. Every backend
//! decodes a run with [`decode_block`]'s arithmetic (the table value times the scale in f32,
//! rounded to bf16), so a matmul on the kept bytes gives the bits of the widened weight's. A
//! weight whose runs would cross a scale block, an e5m2 weight, or a model whose other weights
//! are f32 or f16 is widened at load as before.

use crate::error::{Error, Result};
use std::path::Path;

/// The two OCP FP8 formats safetensors names `F8_E4M3` and `F8_E5M2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Format {
    /// e4m3fn: bias 7, no infinities, S.1111.111 is NaN, largest 448.
    E4M3,
    /// e5m2: IEEE-like, bias 15, infinities and NaNs at exponent 31, largest 57344.
    E5M2,
}

impl Fp8Format {
    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "F8_E4M3",
            Fp8Format::E5M2 => "F8_E5M2",
        }
    }

    /// The value of one byte (exact in f32).
    pub fn decode(self, b: u8) -> f32 {
        let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let (exp_bits, man_bits, bias) = match self {
            Fp8Format::E4M3 => (4u32, 3u32, 7i32),
            Fp8Format::E5M2 => (5, 2, 15),
        };
        let e = ((b & 0x7f) >> man_bits) as i32;
        let m = (b & ((1 << man_bits) - 1)) as u32;
        let e_max = (1i32 << exp_bits) - 1;
        match self {
            Fp8Format::E4M3 if e == e_max && m == 7 => return f32::NAN,
            Fp8Format::E5M2 if e == e_max => return if m == 0 { sign * f32::INFINITY } else { f32::NAN },
            _ => {}
        }
        let frac = m as f32 / (1u32 << man_bits) as f32;
        let mag = if e == 0 { frac * 2f32.powi(1 - bias) } else { (1.0 + frac) * 2f32.powi(e - bias) };
        sign * mag
    }

    /// All 256 values, for a table lookup.
    pub fn table(self) -> [f32; 256] {
        std::array::from_fn(|i| self.decode(i as u8))
    }
}

/// What `quantization_config` says about FP8 weights: the block size, where it gives one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fp8Scheme {
    pub block: Option<[usize; 2]>,
}

/// Reads `config.json`'s `quantization_config`: None when there is none; an FP8 scheme for the
/// methods above; an error naming the method for any other (AWQ, GPTQ, bitsandbytes, int
/// compressed-tensors...), so the user learns why before a tensor's dtype is refused.
pub fn scheme_of(config: &Path) -> Result<Option<Fp8Scheme>> {
    let Ok(text) = std::fs::read_to_string(config) else { return Ok(None) };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return Ok(None) };
    // Multimodal releases keep it at the top level too; text_config never holds it alone.
    let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
    let method = q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("");
    let block_of = |b: Option<&serde_json::Value>| -> Result<Option<[usize; 2]>> {
        match b.filter(|b| !b.is_null()) {
            None => Ok(None),
            Some(b) => match b.as_array().map(|a| a.iter().map(|x| x.as_u64()).collect::<Option<Vec<u64>>>()) {
                Some(Some(a)) if a.len() == 2 && a.iter().all(|&x| x > 0) => Ok(Some([a[0] as usize, a[1] as usize])),
                _ => Err(Error::config(
                    config,
                    format!("quantization_config: block size {b} is not two positive integers"),
                )),
            },
        }
    };
    let unsupported = |what: String| {
        Error::config(config, format!("quantization_config: {what} is not supported (tandem loads FP8 checkpoints, `quant_method` fp8 or compressed-tensors float-quantized, kept in 8 bits; and GGUF files)"))
    };
    match method {
        "fp8" => Ok(Some(Fp8Scheme { block: block_of(q.get("weight_block_size"))? })),
        "compressed-tensors" => {
            let format = q.get("format").and_then(|f| f.as_str()).unwrap_or("");
            if format != "float-quantized" && format != "naive-quantized" {
                return Err(unsupported(format!("compressed-tensors format `{format}`")));
            }
            let mut block = None;
            for (name, g) in q.get("config_groups").and_then(|g| g.as_object()).into_iter().flatten() {
                let Some(w) = g.get("weights").filter(|w| !w.is_null()) else { continue };
                let bits = w.get("num_bits").and_then(|b| b.as_u64());
                let ty = w.get("type").and_then(|t| t.as_str());
                if bits != Some(8) || ty != Some("float") {
                    return Err(unsupported(format!(
                        "compressed-tensors group `{name}` with {}-bit {} weights",
                        bits.map_or("?".into(), |b| b.to_string()),
                        ty.unwrap_or("?")
                    )));
                }
                if let Some(b) = block_of(w.get("block_structure"))? {
                    block = Some(b);
                }
            }
            Ok(Some(Fp8Scheme { block }))
        }
        other => Err(unsupported(format!("`quant_method` `{other}`"))),
    }
}

/// `config.json`'s `quantization_config.quant_method` (vLLM's `--quantization` names it), or
/// None when the file has none or cannot be read.
pub fn method_of(config: &Path) -> Option<String> {
    let text = std::fs::read_to_string(config).ok()?;
    let v = serde_json::from_str::<serde_json::Value>(&text).ok()?;
    v.get("quantization_config")?.get("quant_method")?.as_str().map(str::to_string)
}

/// How a scale tensor of `scale_shape` covers a weight of `[rows, cols]`: one scale per
/// `[br, bc]` block from the top-left corner (per tensor: the whole matrix; per channel: a row).
pub fn block_of(
    rows: usize,
    cols: usize,
    scale_shape: &[usize],
    scheme: Fp8Scheme,
) -> std::result::Result<[usize; 2], String> {
    let numel: usize = scale_shape.iter().product();
    let ceil = |a: usize, b: usize| a.div_ceil(b);
    match scale_shape {
        _ if numel == 1 => Ok([rows.max(1), cols.max(1)]),
        [n] | [n, 1] if *n == rows => Ok([1, cols.max(1)]),
        [sr, sc] => match scheme.block {
            Some([br, bc]) if ceil(rows, br) == *sr && ceil(cols, bc) == *sc => Ok([br, bc]),
            Some([br, bc]) => Err(format!("scale grid {scale_shape:?} does not cover [{rows}, {cols}] in blocks of [{br}, {bc}] (needs [{}, {}])", ceil(rows, br), ceil(cols, bc))),
            None if *sr > 0 && *sc > 0 && rows.is_multiple_of(*sr) && cols.is_multiple_of(*sc) => Ok([rows / sr, cols / sc]),
            None => Err(format!("scale grid {scale_shape:?} does not divide [{rows}, {cols}] and the config gives no block size")),
        },
        _ => Err(format!("scale of shape {scale_shape:?} fits no FP8 layout of a [{rows}, {cols}] weight (per tensor, per row, or a 2-D block grid)")),
    }
}

/// weight[r, c] = value(q[r, c]) * scale[r / br, c / bc], in f32. `q` holds rows * cols bytes,
/// `scale` the grid row-major. Split over threads by rows for large weights (each element is
/// one product: the split cannot change a bit).
pub fn dequantize(q: &[u8], format: Fp8Format, rows: usize, cols: usize, scale: &[f32], block: [usize; 2]) -> Vec<f32> {
    let table = format.table();
    let [br, bc] = block;
    let grid_cols = cols.div_ceil(bc);
    let mut out = vec![0.0f32; rows * cols];
    let fill = |r0: usize, dst: &mut [f32]| {
        for (i, row) in dst.chunks_mut(cols.max(1)).enumerate() {
            let r = r0 + i;
            let srow = &scale[(r / br) * grid_cols..];
            for (c, v) in row.iter_mut().enumerate() {
                *v = table[q[r * cols + c] as usize] * srow[c / bc];
            }
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if rows * cols < 1 << 20 || threads == 1 || cols == 0 {
        fill(0, &mut out);
        return out;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (t, chunk) in out.chunks_mut(per * cols).enumerate() {
            let fill = &fill;
            s.spawn(move || fill(t * per, chunk));
        }
    });
    out
}

/// Where a scale grid in blocks of `block` applies on a `[rows, cols]` weight, by name.
pub fn scales_of(rows: usize, cols: usize, block: [usize; 2]) -> crate::quant_layout::Fp8Scales {
    use crate::quant_layout::Fp8Scales;
    match block {
        [br, bc] if br >= rows && bc >= cols => Fp8Scales::Tensor,
        [1, bc] if bc >= cols => Fp8Scales::Channel,
        _ => Fp8Scales::Block,
    }
}

/// Values in one kept run of an e4m3 weight ([`pack_blocks`]).
pub const BLOCK_ELEMS: usize = 32;
/// Bytes of one kept run: its f32 scale (little-endian), then [`BLOCK_ELEMS`] e4m3 bytes.
pub const BLOCK_BYTES: usize = 4 + BLOCK_ELEMS;

/// The e4m3 table, built once.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| Fp8Format::E4M3.table())
}

/// One kept run (`b`: [`BLOCK_BYTES`]) into `o` ([`BLOCK_ELEMS`] values): each byte's e4m3
/// value times the run's scale in f32, rounded to the nearest bf16 (ties to even), as the
/// widened weight holds it.
pub fn decode_block(b: &[u8], o: &mut [f32]) {
    let table = e4m3_table();
    let scale = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    // A whole run (every caller's case) in two fixed-length passes, so the compiler unrolls
    // the lookups and vectorises the rounding; the same arithmetic either way.
    if let (Ok(q), Ok(o)) =
        (<&[u8; BLOCK_ELEMS]>::try_from(&b[4..BLOCK_BYTES]), <&mut [f32; BLOCK_ELEMS]>::try_from(&mut *o))
    {
        let prod: [f32; BLOCK_ELEMS] = std::array::from_fn(|i| table[q[i] as usize] * scale);
        for (x, p) in o.iter_mut().zip(prod) {
            *x = round_bf16(p);
        }
        return;
    }
    for (x, &q) in o.iter_mut().zip(&b[4..BLOCK_BYTES]) {
        *x = round_bf16(table[q as usize] * scale);
    }
}

/// `half::bf16::from_f32(x).to_f32()`, bit for bit, without branches: half's rounding branches
/// on the mantissa's low bits, which a weight's values leave unpredictable, and the
/// mispredictions made the reference's FP8 matmul ~7x slower than its bf16 one. Ties to even by
/// adding 0x7fff plus the kept lowest bit (a carry iff half rounds up); a NaN keeps its top
/// mantissa bits with the quiet bit set, as half does.
#[inline(always)]
fn round_bf16(x: f32) -> f32 {
    let u = x.to_bits();
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1)) & 0xffff_0000;
    let nan = (u & 0xffff_0000) | 0x0040_0000;
    f32::from_bits(if u & 0x7fff_ffff > 0x7f80_0000 { nan } else { rounded })
}

/// An e4m3 weight `[rows, cols]` (`q`, row-major bytes) with its scale grid in blocks of
/// `block`, as kept runs: each row's runs of [`BLOCK_ELEMS`] values, each its scale then its
/// bytes. None where a run would cross a scale block (`cols` not a multiple of
/// [`BLOCK_ELEMS`], or a block's column span neither a multiple of it nor the whole row): such a
/// weight is widened instead.
pub fn pack_blocks(q: &[u8], rows: usize, cols: usize, scale: &[f32], block: [usize; 2]) -> Option<Vec<u8>> {
    let [br, bc] = block;
    if cols == 0 || !cols.is_multiple_of(BLOCK_ELEMS) || !(bc.is_multiple_of(BLOCK_ELEMS) || bc >= cols) {
        return None;
    }
    let grid_cols = cols.div_ceil(bc);
    if q.len() != rows * cols || scale.len() < rows.div_ceil(br) * grid_cols {
        return None;
    }
    let mut out = Vec::with_capacity(rows * cols / BLOCK_ELEMS * BLOCK_BYTES);
    for (r, row) in q.chunks_exact(cols).enumerate() {
        for (i, run) in row.chunks_exact(BLOCK_ELEMS).enumerate() {
            let s = scale[(r / br) * grid_cols + i * BLOCK_ELEMS / bc];
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(run);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_values_follow_the_ocp_spec() {
        let f = Fp8Format::E4M3;
        // (byte, value): zero, the smallest subnormal 2^-9, the largest subnormal, the smallest
        // normal 2^-6, one, 1.125, the largest 448, and their negatives.
        for (b, v) in [
            (0x00, 0.0),
            (0x01, 2f32.powi(-9)),
            (0x07, 7.0 * 2f32.powi(-9)),
            (0x08, 2f32.powi(-6)),
            (0x38, 1.0),
            (0x39, 1.125),
            (0x7e, 448.0),
            (0xb8, -1.0),
            (0xfe, -448.0),
        ] {
            assert_eq!(f.decode(b), v, "byte {b:#04x}");
        }
        assert!(f.decode(0x7f).is_nan() && f.decode(0xff).is_nan());
        // Every other byte is finite, and the table is strictly increasing over 0x00..0x7e.
        let t = f.table();
        assert_eq!(t.iter().filter(|v| v.is_nan()).count(), 2);
        assert!((1..0x7f).all(|i| t[i] > t[i - 1]));
        assert_eq!(f.decode(0x80).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn e5m2_values_follow_the_ocp_spec() {
        let f = Fp8Format::E5M2;
        for (b, v) in
            [(0x01, 2f32.powi(-16)), (0x04, 2f32.powi(-14)), (0x3c, 1.0), (0x3d, 1.25), (0x7b, 57344.0), (0xbc, -1.0)]
        {
            assert_eq!(f.decode(b), v, "byte {b:#04x}");
        }
        assert_eq!(f.decode(0x7c), f32::INFINITY);
        assert_eq!(f.decode(0xfc), f32::NEG_INFINITY);
        assert!(f.decode(0x7d).is_nan() && f.decode(0xff).is_nan());
    }

    #[test]
    fn scale_layouts() {
        let s = |b| Fp8Scheme { block: b };
        assert_eq!(block_of(300, 200, &[], s(None)), Ok([300, 200]));
        assert_eq!(block_of(300, 200, &[1], s(None)), Ok([300, 200]));
        assert_eq!(block_of(300, 200, &[300, 1], s(None)), Ok([1, 200]));
        assert_eq!(block_of(300, 200, &[300], s(None)), Ok([1, 200]));
        // vLLM's ceil-divided grid: 300 rows in blocks of 128 are 3 block rows.
        assert_eq!(block_of(300, 200, &[3, 2], s(Some([128, 128]))), Ok([128, 128]));
        assert!(block_of(300, 200, &[2, 2], s(Some([128, 128]))).unwrap_err().contains("needs [3, 2]"));
        // No block size: HF's rule, the grid must divide exactly.
        assert_eq!(block_of(256, 128, &[2, 1], s(None)), Ok([128, 128]));
        assert!(block_of(300, 200, &[3, 3], s(None)).unwrap_err().contains("no block size"));
        assert_eq!(block_of(300, 200, &[3, 2], s(None)), Ok([100, 100]));
        assert!(block_of(300, 200, &[2, 3, 4], s(None)).is_err());
    }

    #[test]
    fn dequantize_multiplies_each_block_by_its_scale() {
        // 5 x 3 in blocks of [2, 2]: a 3 x 2 grid with ragged last row and column.
        let q: Vec<u8> = (0..15).map(|i| 0x38 + i as u8).collect(); // 1.0, 1.125, ...
        let scale: Vec<f32> = (0..6).map(|i| (i + 1) as f32).collect();
        let got = dequantize(&q, Fp8Format::E4M3, 5, 3, &scale, [2, 2]);
        for r in 0..5 {
            for c in 0..3 {
                let want = Fp8Format::E4M3.decode(q[r * 3 + c]) * scale[(r / 2) * 2 + c / 2];
                assert_eq!(got[r * 3 + c], want, "({r}, {c})");
            }
        }
        // The threaded split gives the same values as one thread.
        let (rows, cols) = (1100, 1000);
        let q: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 251) as u8 & 0x7e).collect();
        let scale: Vec<f32> = (0..9 * 8).map(|i| 0.5 + i as f32).collect();
        let big = dequantize(&q, Fp8Format::E4M3, rows, cols, &scale, [128, 128]);
        for (i, v) in big.iter().enumerate().step_by(997) {
            let (r, c) = (i / cols, i % cols);
            assert_eq!(*v, Fp8Format::E4M3.decode(q[i]) * scale[(r / 128) * 8 + c / 128]);
        }
    }

    /// A kept weight decodes to the bits the widened one holds in bf16, for tensor, channel and
    /// (ragged) block scales; a run that would cross a block is not kept.
    #[test]
    fn kept_runs_decode_to_the_widened_bf16_values() {
        let (rows, cols) = (5, 192);
        let q: Vec<u8> = (0..rows * cols).map(|i| (i * 37 % 256) as u8).collect();
        for (grid, block) in [
            (vec![0.37f32], [5, 192]),
            ((0..5).map(|i| 0.01 + i as f32).collect(), [1, 192]),
            ((0..6).map(|i| 0.3 * (i + 1) as f32).collect(), [2, 128]),
        ] {
            let packed = pack_blocks(&q, rows, cols, &grid, block).expect("runs within blocks");
            assert_eq!(packed.len(), rows * cols / BLOCK_ELEMS * BLOCK_BYTES);
            let mut got = vec![0f32; rows * cols];
            for (b, o) in packed.chunks_exact(BLOCK_BYTES).zip(got.chunks_exact_mut(BLOCK_ELEMS)) {
                decode_block(b, o);
            }
            let want = crate::DType::BF16.to_f32(&crate::DType::BF16.from_f32(&dequantize(
                &q,
                Fp8Format::E4M3,
                rows,
                cols,
                &grid,
                block,
            )));
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "blocks {block:?}");
        }
        assert!(pack_blocks(&q, rows, cols, &[1.0; 20], [1, 48]).is_none(), "a run crosses a 48-column block");
        assert!(pack_blocks(&q[..rows * 100], rows, 100, &[1.0], [5, 100]).is_none(), "100 is not whole runs");
    }

    /// The branch-free rounding gives half's bits: every f32 whose low half is one of the
    /// patterns that decide a rounding (ties, just above and below, zero, all ones), every
    /// e4m3 value times a spread of scales, and infinities and NaNs of both signs.
    #[test]
    fn round_bf16_matches_half() {
        let half_round = |x: f32| half::bf16::from_f32(x).to_f32().to_bits();
        let check = |x: f32| assert_eq!(round_bf16(x).to_bits(), half_round(x), "{:#010x}", x.to_bits());
        for hi in 0..=0xffffu32 {
            for lo in [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000] {
                check(f32::from_bits(hi << 16 | lo));
            }
        }
        let table = Fp8Format::E4M3.table();
        for s in 0..4096u32 {
            let scale = f32::from_bits(0x3000_0000 + s.wrapping_mul(0x9e37_79b9) % 0x1800_0000);
            for &t in &table {
                check(t * scale);
            }
        }
    }

    /// Every f32 bit pattern (2^32 of them): slow, so only on request
    /// (`cargo test -p tandem-core --lib round_bf16_every_f32 -- --ignored`).
    #[test]
    #[ignore]
    fn round_bf16_every_f32() {
        for u in 0..=u32::MAX {
            let x = f32::from_bits(u);
            assert_eq!(round_bf16(x).to_bits(), half::bf16::from_f32(x).to_f32().to_bits(), "{u:#010x}");
        }
    }

    #[test]
    fn quantization_configs() {
        let dir = std::env::temp_dir().join(format!("tandem-fp8-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("config.json");
        let with = |q: &str| {
            std::fs::write(&cfg, format!("{{\"model_type\": \"llama\", \"quantization_config\": {q}}}")).unwrap();
            scheme_of(&cfg)
        };
        assert_eq!(
            with(r#"{"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}"#)
                .unwrap(),
            Some(Fp8Scheme { block: Some([128, 128]) })
        );
        assert_eq!(
            with(r#"{"quant_method": "fp8", "activation_scheme": "static"}"#).unwrap(),
            Some(Fp8Scheme { block: None })
        );
        let ct = r#"{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}, "targets": ["Linear"]}}, "ignore": ["lm_head"]}"#;
        assert_eq!(with(ct).unwrap(), Some(Fp8Scheme { block: None }));
        let awq = with(r#"{"quant_method": "awq", "bits": 4}"#).unwrap_err().to_string();
        assert!(awq.contains("`quant_method` `awq` is not supported") && awq.contains("config.json"), "{awq}");
        let int4 =
            with(r#"{"quant_method": "compressed-tensors", "format": "pack-quantized"}"#).unwrap_err().to_string();
        assert!(int4.contains("pack-quantized"), "{int4}");
        let w4 = with(r#"{"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "float"}}}}"#).unwrap_err().to_string();
        assert!(w4.contains("4-bit float"), "{w4}");
        assert!(with(r#"{"quant_method": "fp8", "weight_block_size": [128]}"#).is_err());
        with(ct).unwrap();
        assert_eq!(method_of(&cfg).as_deref(), Some("compressed-tensors"));
        std::fs::write(&cfg, "{\"model_type\": \"llama\"}").unwrap();
        assert_eq!(scheme_of(&cfg).unwrap(), None);
        assert_eq!(method_of(&cfg), None);
        std::fs::remove_dir_all(&dir).ok();
    }
}
