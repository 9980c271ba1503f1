//! Int4 weights with group scales and zero points, read from the three checkpoint formats vLLM
//! serves them from, and kept 4-bit in one layout of our own
//! ([`QuantLayout::Int4Group`](crate::quant_layout::QuantLayout::Int4Group)).
//!
//! The formats (as vLLM's awq.py, gptq.py and compressed_tensors wNa16 read them):
//! - AWQ (`quant_method: "awq"`, version gemm): `qweight` i32 `[in, out/8]`, nibble `i` of a
//!   word holding output column `8c + AWQ_ORDER[i]`; `qzeros` i32 `[in/group, out/8]` packed
//!   the same; `scales` `[in/group, out]`.
//! - GPTQ (`quant_method: "gptq"`): `qweight` i32 `[in/8, out]`, nibble `j` of row `r` holding
//!   input `8r + j`; `qzeros` i32 `[in/group, out/8]`, nibble `j` holding output `8c + j`,
//!   stored minus one (`checkpoint_format` gptq; gptq_v2 stores them as they are); `scales`
//!   `[in/group, out]`; `g_idx` `[in]`, which must be `i / group` (act order is refused).
//! - compressed-tensors `pack-quantized`: `weight_packed` i32 `[out, in/8]`, nibble `j` holding
//!   input `8k + j` plus 8 (the signed value offset to unsigned); `weight_scale`
//!   `[out, in/group]`; `weight_zero_point` (asymmetric only) i32 `[out/8, in/group]` packed
//!   along the output dimension, plus 8 as well; `weight_shape` `[out, in]`.
//!
//! In every format a weight is `w = (q - z) * s` with `q` and `z` 4-bit integers (`z` may be
//! 16 in GPTQ's stored-minus-one zeros). The layout kept here is a row per output channel, a
//! block per group of `group` inputs: the scale as an f32 (bytes 0..4, exact for f16 and bf16
//! scales), the zero point as a byte (byte 4, then 3 bytes of padding), then `group / 2` bytes
//! of nibbles, input `2j` in the low nibble of byte `j` and `2j + 1` in its high nibble (so
//! word `k` of the nibbles holds inputs `8k..8k + 8` at bits `4i`). A group of 128 takes 72
//! bytes: 0.5625 bytes a weight.

use std::path::Path;

use crate::error::{Error, Result};

/// Bytes a group's block spends on its scale and zero point, before the nibbles.
pub const HEADER_BYTES: usize = 8;

/// Where AWQ's packing puts output column `8c + j` of word `c`: nibble `AWQ_NIBBLE[j]`
/// (the inverse of AutoAWQ's order `[0, 2, 4, 6, 1, 3, 5, 7]`).
const AWQ_NIBBLE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

/// The checkpoint format an int4 model is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int4Format {
    Awq,
    /// `zeros_minus_one`: GPTQ's original checkpoints store each zero point minus one.
    Gptq {
        zeros_minus_one: bool,
    },
    CompressedTensors,
}

impl Int4Format {
    /// vLLM's `--quantization` name of the format.
    pub fn name(self) -> &'static str {
        match self {
            Int4Format::Awq => "awq",
            Int4Format::Gptq { .. } => "gptq",
            Int4Format::CompressedTensors => "compressed-tensors",
        }
    }
}

/// Decodes one block of the layout above: `b` holds `HEADER_BYTES + o.len() / 2` bytes. The
/// value is `(q - z) * s`, the difference exact in f32 and one rounding in the product, as
/// every backend computes it.
pub fn block_int4(b: &[u8], o: &mut [f32]) {
    let s = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let z = b[4] as f32;
    for (j, &q) in b[HEADER_BYTES..HEADER_BYTES + o.len() / 2].iter().enumerate() {
        o[2 * j] = ((q & 0x0f) as f32 - z) * s;
        o[2 * j + 1] = ((q >> 4) as f32 - z) * s;
    }
}

/// A weight of `rows` outputs by `cols` inputs in the layout above, built from accessors:
/// `q(o, i)` the 4-bit value, `z(o, g)` the zero point and `s(o, g)` the scale of group `g`.
pub fn pack(
    rows: usize,
    cols: usize,
    group: usize,
    q: impl Fn(usize, usize) -> u8,
    z: impl Fn(usize, usize) -> u8,
    s: impl Fn(usize, usize) -> f32,
) -> Vec<u8> {
    let block = HEADER_BYTES + group / 2;
    let groups = cols / group;
    let mut out = vec![0u8; rows * groups * block];
    for (o, row) in out.chunks_exact_mut(groups * block).enumerate() {
        for (g, b) in row.chunks_exact_mut(block).enumerate() {
            b[..4].copy_from_slice(&s(o, g).to_le_bytes());
            b[4] = z(o, g);
            for (j, byte) in b[HEADER_BYTES..].iter_mut().enumerate() {
                let i = g * group + 2 * j;
                *byte = (q(o, i) & 0x0f) | ((q(o, i + 1) & 0x0f) << 4);
            }
        }
    }
    out
}

/// Nibble `n` of a packed word.
fn nib(word: i64, n: usize) -> u8 {
    ((word as u64 >> (4 * n)) & 0x0f) as u8
}

/// The group size of a weight of `cols` inputs whose scales give `groups` groups, or why not.
pub fn group_of(cols: usize, groups: usize) -> std::result::Result<usize, String> {
    if groups == 0 || !cols.is_multiple_of(groups) {
        return Err(format!("{groups} scale groups do not divide {cols} inputs"));
    }
    let group = cols / groups;
    if !group.is_multiple_of(8) {
        return Err(format!("groups of {group} inputs are not a multiple of 8 (a packed word)"));
    }
    Ok(group)
}

/// A tensor's shape and its elements.
pub type Tensor<T> = (Vec<usize>, Vec<T>);

/// The tensors a format stores for one weight, by suffix (`qweight`, `scales`...), read as
/// integers (`int`) or values (`val`), for [`convert`].
pub struct Parts<'a> {
    pub int: &'a dyn Fn(&str) -> Option<Tensor<i64>>,
    pub val: &'a dyn Fn(&str) -> Option<Tensor<f32>>,
}

/// The weight `[out, in]` in the layout above, and its group, from the tensors `format` stores
/// for it; an error names the tensor (by suffix) that is missing or malformed.
pub fn convert(format: Int4Format, parts: &Parts) -> std::result::Result<([usize; 2], usize, Vec<u8>), String> {
    let int = |n: &str| (parts.int)(n).ok_or_else(|| format!("`{n}` is missing (or not an integer tensor)"));
    let val = |n: &str| (parts.val)(n).ok_or_else(|| format!("`{n}` is missing (or not a float tensor)"));
    let matrix = |n: &str, shape: &[usize]| match shape {
        [a, b] => Ok((*a, *b)),
        _ => Err(format!("`{n}` has shape {shape:?}, not a matrix")),
    };
    let expect = |n: &str, shape: &[usize], want: [usize; 2]| {
        if shape == want {
            Ok(())
        } else {
            Err(format!("`{n}` has shape {shape:?}, expected {want:?}"))
        }
    };
    match format {
        Int4Format::Awq | Int4Format::Gptq { .. } => {
            let (qs, qw) = int("qweight")?;
            let (a, b) = matrix("qweight", &qs)?;
            let (cols, rows) = if format == Int4Format::Awq { (a, b * 8) } else { (a * 8, b) };
            let (ss, sc) = val("scales")?;
            let (groups, _) = matrix("scales", &ss)?;
            expect("scales", &ss, [groups, rows])?;
            let group = group_of(cols, groups).map_err(|m| format!("`scales`: {m}"))?;
            let (zs, qz) = int("qzeros")?;
            expect("qzeros", &zs, [groups, rows.div_ceil(8)])?;
            let zw = rows.div_ceil(8);
            if let Int4Format::Gptq { zeros_minus_one } = format {
                if let Some((gs, gi)) = (parts.int)("g_idx") {
                    if gs != [cols] {
                        return Err(format!("`g_idx` has shape {gs:?}, expected [{cols}]"));
                    }
                    if let Some(i) = gi.iter().enumerate().position(|(i, &g)| g != (i / group) as i64) {
                        return Err(format!(
                            "`g_idx` puts input {i} in group {} (act order, desc_act); only groups of consecutive inputs are supported",
                            gi[i]
                        ));
                    }
                }
                let plus = zeros_minus_one as u8;
                let bytes = pack(
                    rows,
                    cols,
                    group,
                    |o, i| nib(qw[(i / 8) * rows + o], i % 8),
                    |o, g| nib(qz[g * zw + o / 8], o % 8) + plus,
                    |o, g| sc[g * rows + o],
                );
                return Ok(([rows, cols], group, bytes));
            }
            let bytes = pack(
                rows,
                cols,
                group,
                |o, i| nib(qw[i * b + o / 8], AWQ_NIBBLE[o % 8]),
                |o, g| nib(qz[g * zw + o / 8], AWQ_NIBBLE[o % 8]),
                |o, g| sc[g * rows + o],
            );
            Ok(([rows, cols], group, bytes))
        }
        Int4Format::CompressedTensors => {
            let (_, shape) = int("weight_shape")?;
            let [rows, cols] = shape[..] else {
                return Err(format!("`weight_shape` is {shape:?}, not two dimensions"));
            };
            if rows <= 0 || cols <= 0 {
                return Err(format!("`weight_shape` {shape:?} is not positive"));
            }
            let (rows, cols) = (rows as usize, cols as usize);
            let (ps, qw) = int("weight_packed")?;
            let w = cols.div_ceil(8);
            expect("weight_packed", &ps, [rows, w])?;
            let (ss, sc) = val("weight_scale")?;
            let (_, groups) = matrix("weight_scale", &ss)?;
            expect("weight_scale", &ss, [rows, groups])?;
            let group = group_of(cols, groups).map_err(|m| format!("`weight_scale`: {m}"))?;
            let zp = (parts.int)("weight_zero_point");
            if let Some((zs, _)) = &zp {
                expect("weight_zero_point", zs, [rows.div_ceil(8), groups])?;
            }
            let bytes = pack(
                rows,
                cols,
                group,
                |o, i| nib(qw[o * w + i / 8], i % 8),
                |o, g| match &zp {
                    // Both nibbles carry the same +8, so the zero point stays as packed.
                    Some((_, z)) => nib(z[(o / 8) * groups + g], o % 8),
                    None => 8,
                },
                |o, g| sc[o * groups + g],
            );
            Ok(([rows, cols], group, bytes))
        }
    }
}

/// Reads `config.json`'s `quantization_config`: the int4 format it names, None for any other
/// method (`crate::fp8` names those), an error naming the field for an int4 scheme that is not
/// run (bits other than 4, act order, AWQ's gemv packing, activations quantized too).
pub fn format_of(config: &Path) -> Result<Option<Int4Format>> {
    let Ok(text) = std::fs::read_to_string(config) else { return Ok(None) };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else { return Ok(None) };
    let Some(q) = v.get("quantization_config").filter(|q| !q.is_null()) else { return Ok(None) };
    let refuse = |field: &str, what: String| {
        Error::config(
            config,
            format!("quantization_config.{field}: {what} (tandem runs 4-bit weights with group scales)"),
        )
    };
    let bits = |q: &serde_json::Value, field: &str| -> Result<()> {
        match q.get(field).and_then(|b| b.as_u64()) {
            Some(4) => Ok(()),
            other => Err(refuse(
                field,
                format!("{}-bit weights are not supported", other.map_or("?".into(), |b| b.to_string())),
            )),
        }
    };
    let str_of = |q: &serde_json::Value, f: &str| q.get(f).and_then(|s| s.as_str()).map(str::to_ascii_lowercase);
    match q.get("quant_method").and_then(|m| m.as_str()).unwrap_or("") {
        "awq" => {
            bits(q, "bits")?;
            if let Some(v) = str_of(q, "version").filter(|v| v != "gemm") {
                return Err(refuse("version", format!("AWQ `{v}` packing is not supported (gemm is)")));
            }
            if q.get("zero_point").and_then(|z| z.as_bool()) == Some(false) {
                return Err(refuse("zero_point", "AWQ without zero points is not supported".into()));
            }
            Ok(Some(Int4Format::Awq))
        }
        "gptq" => {
            bits(q, "bits")?;
            if q.get("desc_act").and_then(|d| d.as_bool()) == Some(true) {
                return Err(refuse("desc_act", "act order (desc_act: true) is not supported".into()));
            }
            let zeros_minus_one = match str_of(q, "checkpoint_format").as_deref() {
                None | Some("gptq") => true,
                Some("gptq_v2") => false,
                Some(other) => {
                    return Err(refuse("checkpoint_format", format!("`{other}` is not supported (gptq, gptq_v2 are)")))
                }
            };
            Ok(Some(Int4Format::Gptq { zeros_minus_one }))
        }
        "compressed-tensors" if str_of(q, "format").as_deref() == Some("pack-quantized") => {
            for (name, g) in q.get("config_groups").and_then(|g| g.as_object()).into_iter().flatten() {
                let field = |f: &str| format!("config_groups.{name}.{f}");
                if g.get("input_activations").is_some_and(|a| !a.is_null()) {
                    return Err(refuse(&field("input_activations"), "quantized activations are not supported".into()));
                }
                let Some(w) = g.get("weights").filter(|w| !w.is_null()) else { continue };
                bits(w, "num_bits")
                    .map_err(|_| refuse(&field("weights.num_bits"), "only 4-bit weights are supported".into()))?;
                if let Some(t) = str_of(w, "type").filter(|t| t != "int") {
                    return Err(refuse(&field("weights.type"), format!("`{t}` weights are not supported (int are)")));
                }
                if let Some(a) = w.get("actorder").filter(|a| !a.is_null() && a.as_bool() != Some(false)) {
                    return Err(refuse(&field("weights.actorder"), format!("act order {a} is not supported")));
                }
                if let Some(s) = str_of(w, "strategy").filter(|s| s != "group" && s != "channel") {
                    return Err(refuse(
                        &field("weights.strategy"),
                        format!("`{s}` scales are not supported (group, channel are)"),
                    ));
                }
            }
            Ok(Some(Int4Format::CompressedTensors))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
#[path = "int4_tests.rs"]
mod tests;
