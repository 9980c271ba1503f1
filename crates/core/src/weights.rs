//! Safetensors weights, mapped with memmap2. A tensor is a view into the mapping: the bytes go
//! from the page cache to the backend without an intermediate copy. FP8 weights (crate::fp8)
//! are the exception: an e4m3 weight of a bf16 model is repacked once at open into runs that
//! carry their scales (kept quantized, `QuantLayout::Fp8E4m3`), any other widened once, both
//! into anonymous memory, then views like any other.
//! A tensor may also be kept in a quantized layout (`crate::quant_layout`, a GGUF file's blocks):
//! its view holds the raw bytes and says the layout, and only a backend that runs the layout
//! takes it.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::backend::DType;
use crate::error::{Error, Result};
use crate::fp8::{Fp8Format, Fp8Scheme};
use crate::quant_layout::QuantLayout;

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: Range<usize>,
    /// The layout the bytes are kept in, when quantized (`dtype` is then what they decode to).
    quant: Option<QuantLayout>,
}

/// All tensors of a model directory (`model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`).
pub struct Weights {
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: BTreeMap<String, Entry>,
    /// FP8 tensors as the files store them, until [`Weights::dequantize_fp8`] turns each into
    /// an entry of `tensors`.
    fp8: BTreeMap<String, (Fp8Format, Entry)>,
    /// Integer tensors (an int4 checkpoint's packed words, shapes and group indices) by name,
    /// with their safetensors dtype, until [`Weights::convert_int4`] consumes them.
    ints: BTreeMap<String, (IntType, Entry)>,
}

/// An integer tensor's element type, as safetensors names it.
#[derive(Clone, Copy)]
enum IntType {
    I32,
    I64,
}

impl IntType {
    fn size(self) -> usize {
        match self {
            IntType::I32 => 4,
            IntType::I64 => 8,
        }
    }
}

/// One tensor: its dtype, its shape (outermost first, as in PyTorch) and its bytes in the mapping.
#[derive(Clone)]
pub struct TensorView {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub path: PathBuf,
    /// The layout the bytes are kept in, when quantized: `dtype` is then the type the values
    /// decode to (f32), and a row is [`QuantLayout::row_bytes`] long.
    pub quant: Option<QuantLayout>,
    owner: Arc<Mmap>,
    range: Range<usize>,
}

impl TensorView {
    pub fn bytes(&self) -> &[u8] {
        &self.owner[self.range.clone()]
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The mapping that holds this tensor and the byte range inside it; lets a backend keep
    /// the weights where they lie instead of copying them.
    pub fn mapping(&self) -> (Arc<Mmap>, Range<usize>) {
        (self.owner.clone(), self.range.clone())
    }
    /// Rows `rows` of this tensor (its outermost dimension): a view of those bytes, named
    /// `{name}[a..b]`. A fused projection (Phi-3's `qkv_proj`) is split this way at load.
    pub fn rows(&self, rows: Range<usize>) -> Result<TensorView> {
        let outer = self.shape.first().copied().unwrap_or(0);
        if rows.start > rows.end || rows.end > outer {
            return Err(Error::tensor(&self.path, &self.name, format!("rows {rows:?} of {outer}")));
        }
        let row_bytes =
            row_bytes(self.dtype, self.quant, &self.shape).map_err(|m| Error::tensor(&self.path, &self.name, m))?;
        let start = self.range.start + rows.start * row_bytes;
        let mut shape = self.shape.clone();
        shape[0] = rows.len();
        Ok(TensorView {
            name: format!("{}[{}..{}]", self.name, rows.start, rows.end),
            dtype: self.dtype,
            shape,
            path: self.path.clone(),
            quant: self.quant,
            owner: self.owner.clone(),
            range: start..start + rows.len() * row_bytes,
        })
    }

    /// Values as f32 (a copy; for tests, tools and small tensors). A quantized tensor is
    /// decoded block by block; bytes that are not whole blocks decode to an empty Vec (a view
    /// is checked when it is made, so only a hand-made view can be so).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.quant {
            None => self.dtype.to_f32(self.bytes()),
            Some(q) => {
                let mut out = vec![0f32; self.numel()];
                match q.dequantize(self.bytes(), &mut out) {
                    Ok(()) => out,
                    Err(_) => vec![],
                }
            }
        }
    }
}

/// Bytes of one row (the outermost dimension's step) of a tensor of `shape` stored as `dtype`,
/// or as `quant` when quantized.
fn row_bytes(dtype: DType, quant: Option<QuantLayout>, shape: &[usize]) -> std::result::Result<usize, String> {
    let inner = shape.get(1..).unwrap_or(&[]).iter().product::<usize>();
    match quant {
        None => Ok(inner * dtype.size()),
        Some(q) => match shape {
            [_, .., cols] if shape.len() >= 2 => Ok(q.row_bytes(*cols)? * (inner / cols.max(&1))),
            _ => Err(format!("a {} tensor must have rows (shape {shape:?})", q.name())),
        },
    }
}

impl Weights {
    /// No tensors; [`Weights::replace`] adds them (tests and tools).
    pub fn empty() -> Self {
        Weights { files: vec![], tensors: BTreeMap::new(), fp8: BTreeMap::new(), ints: BTreeMap::new() }
    }

    /// Maps `path` read-only (a file whose tensors [`Weights::insert_mapped`] then lists) and
    /// returns its index.
    pub fn add_mapping(&mut self, path: &Path) -> Result<usize> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; we rely on nobody truncating weights under a running server.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        self.files.push((path.to_path_buf(), Arc::new(mmap)));
        Ok(self.files.len() - 1)
    }

    /// Tensor `name` as the bytes `range` of mapping `file` ([`Weights::add_mapping`]): of
    /// `dtype`, or kept in layout `quant` (rows of whole blocks). The range must lie in the
    /// mapping and hold exactly `shape`.
    pub fn insert_mapped(
        &mut self,
        name: &str,
        file: usize,
        dtype: DType,
        quant: Option<QuantLayout>,
        shape: &[usize],
        range: Range<usize>,
    ) -> Result<()> {
        let Some((path, mmap)) = self.files.get(file) else {
            return Err(Error::tensor("<memory>", name, format!("no mapping {file}")));
        };
        let rows = shape.first().copied().unwrap_or(1);
        let need = row_bytes(dtype, quant, shape).map_err(|m| Error::tensor(path, name, m))?;
        let need = if shape.is_empty() { dtype.size() } else { need * rows };
        if range.end > mmap.len() || range.len() != need {
            return Err(Error::tensor(
                path,
                name,
                format!("bytes {range:?} do not hold shape {shape:?} ({need} bytes) in a mapping of {}", mmap.len()),
            ));
        }
        self.tensors.insert(name.to_string(), Entry { file, dtype, shape: shape.to_vec(), range, quant });
        Ok(())
    }

    /// Tensor `name` kept in layout `quant` from `bytes` copied into an anonymous mapping (a
    /// quantized tensor whose rows had to be reordered); `path` is what errors name.
    pub fn insert_quantized(
        &mut self,
        name: &str,
        quant: QuantLayout,
        shape: &[usize],
        bytes: &[u8],
        path: PathBuf,
    ) -> Result<()> {
        self.insert_owned(name, DType::F32, shape, bytes, path)?;
        let file = self.files.len() - 1;
        self.insert_mapped(name, file, DType::F32, Some(quant), shape, 0..bytes.len())
    }

    /// The names and layouts of the tensors kept quantized.
    pub fn quantized(&self) -> impl Iterator<Item = (&str, QuantLayout)> {
        self.tensors.iter().filter_map(|(n, e)| e.quant.map(|q| (n.as_str(), q)))
    }

    /// Bytes the listed tensors take as stored (what a backend that keeps them so holds).
    pub fn stored_bytes(&self) -> u64 {
        self.tensors.values().map(|e| e.range.len() as u64).sum()
    }

    /// Opens every safetensors file of a model directory.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let names: Vec<String> = if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io(&index, e))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::config(&index, format!("not valid JSON: {e}")))?;
            let map = v
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| Error::config(&index, "missing object `weight_map`"))?;
            let mut files: Vec<String> = map.values().filter_map(|f| f.as_str().map(String::from)).collect();
            files.sort();
            files.dedup();
            files
        } else if dir.join("model.safetensors").exists() {
            vec!["model.safetensors".into()]
        } else {
            return Err(Error::config(dir, "no model.safetensors or model.safetensors.index.json in this directory"));
        };
        // Read first: an unsupported quantisation is named before any tensor's dtype is refused.
        let config = dir.join("config.json");
        let int4 = crate::int4::format_of(&config)?;
        let scheme = if int4.is_some() { None } else { crate::fp8::scheme_of(&config)? };
        let mut w = Weights::empty();
        for name in names {
            w.add_file(&dir.join(name))?;
        }
        w.dequantize_fp8(scheme.unwrap_or_default())?;
        if let Some(format) = int4 {
            w.convert_int4(format)?;
        }
        w.refuse_ints()?;
        Ok(w)
    }

    /// Maps one safetensors file and records its tensors.
    pub fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only; we rely on nobody truncating weights under a running server.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&mmap[..])
            .map_err(|e| Error::config(path, format!("not a valid safetensors file: {e}")))?;
        let data_start = 8 + header_len;
        let file_idx = self.files.len();
        for (name, info) in meta.tensors() {
            let (dtype, fp8, int) = match info.dtype {
                safetensors::Dtype::F32 => (DType::F32, None, None),
                safetensors::Dtype::BF16 => (DType::BF16, None, None),
                safetensors::Dtype::F16 => (DType::F16, None, None),
                // Sized as one byte here; the entry moves to `fp8` below.
                safetensors::Dtype::F8_E4M3 => (DType::F32, Some(Fp8Format::E4M3), None),
                safetensors::Dtype::F8_E5M2 => (DType::F32, Some(Fp8Format::E5M2), None),
                // Kept aside for an int4 checkpoint's conversion; refused if it leaves them.
                safetensors::Dtype::I32 => (DType::F32, None, Some(IntType::I32)),
                safetensors::Dtype::I64 => (DType::F32, None, Some(IntType::I64)),
                other => {
                    return Err(Error::tensor(
                        path,
                        name,
                        format!(
                            "dtype {other:?} is not supported (bf16, f16, f32, and FP8 weights with their scales, are)"
                        ),
                    ))
                }
            };
            let elem = match (fp8, int) {
                (Some(_), _) => 1,
                (_, Some(i)) => i.size(),
                _ => dtype.size(),
            };
            let (s, e) = info.data_offsets;
            let range = data_start + s..data_start + e;
            if range.end > mmap.len() {
                return Err(Error::tensor(
                    path,
                    name,
                    format!("data ends at byte {} but the file has {} bytes (truncated file?)", range.end, mmap.len()),
                ));
            }
            let numel: usize = info.shape.iter().product();
            if numel * elem != e - s {
                return Err(Error::tensor(
                    path,
                    name,
                    format!("shape {:?} needs {} bytes, header gives {}", info.shape, numel * elem, e - s),
                ));
            }
            let entry = Entry { file: file_idx, dtype, shape: info.shape.clone(), range, quant: None };
            match (fp8, int) {
                (Some(f), _) => {
                    self.fp8.insert(name.to_string(), (f, entry));
                }
                (_, Some(i)) => {
                    self.ints.insert(name.to_string(), (i, entry));
                }
                (None, None) => {
                    self.tensors.insert(name.to_string(), entry);
                }
            }
        }
        self.files.push((path.to_path_buf(), Arc::new(mmap)));
        Ok(())
    }

    /// Puts `values` (stored as `dtype`) in place of tensor `name`, or adds it. The bytes live
    /// in an anonymous mapping, so the tensor is a view like any other. For tools and tests
    /// that need to alter a model (e.g. proving that a broken weight is caught).
    pub fn replace(&mut self, name: &str, dtype: DType, shape: &[usize], values: &[f32]) -> Result<()> {
        if shape.iter().product::<usize>() != values.len() {
            return Err(Error::tensor(
                "<memory>",
                name,
                format!("shape {shape:?} does not hold {} values", values.len()),
            ));
        }
        self.insert_owned(name, dtype, shape, &dtype.from_f32(values), PathBuf::from(format!("<memory:{name}>")))
    }

    /// Tensor `name` from `bytes` copied into an anonymous mapping; `path` is what errors name.
    fn insert_owned(&mut self, name: &str, dtype: DType, shape: &[usize], bytes: &[u8], path: PathBuf) -> Result<()> {
        let mut anon =
            memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| Error::io("<anonymous mapping>", e))?;
        anon[..bytes.len()].copy_from_slice(bytes);
        let mmap = anon.make_read_only().map_err(|e| Error::io("<anonymous mapping>", e))?;
        self.tensors.insert(
            name.to_string(),
            Entry { file: self.files.len(), dtype, shape: shape.to_vec(), range: 0..bytes.len(), quant: None },
        );
        self.files.push((path, Arc::new(mmap)));
        Ok(())
    }

    /// Every FP8 tensor `X.weight` with its scale (`X.weight_scale_inv`, else `X.weight_scale`;
    /// crate::fp8 for the layouts): kept in 8 bits with its scales (`QuantLayout::Fp8E4m3`)
    /// where it is e4m3, the model's other weights (the embedding's; bf16 when it has none) are
    /// bf16 and `crate::fp8::pack_blocks` takes its grid; else multiplied out and stored in the
    /// type of the other weights. The scale tensors stay listed and unread.
    pub fn dequantize_fp8(&mut self, scheme: Fp8Scheme) -> Result<()> {
        let pending = std::mem::take(&mut self.fp8);
        let target = self.entry("model.embed_tokens.weight").map_or(DType::BF16, |e| e.dtype);
        for (name, (format, e)) in pending {
            let path = self.files[e.file].0.clone();
            let fail = |msg: String| Error::tensor(&path, &name, format!("{} weight: {msg}", format.name()));
            let stem = name.strip_suffix(".weight").ok_or_else(|| fail("only `.weight` tensors may be FP8".into()))?;
            let [rows, cols] = e.shape[..] else { return Err(fail(format!("shape {:?} is not a matrix", e.shape))) };
            let scale_name = [format!("{stem}.weight_scale_inv"), format!("{stem}.weight_scale")]
                .into_iter()
                .find(|n| self.tensors.contains_key(n));
            let Some(scale_name) = scale_name else {
                return Err(fail(format!("no `{stem}.weight_scale_inv` or `{stem}.weight_scale` beside it")));
            };
            let se = &self.tensors[&scale_name];
            let block = crate::fp8::block_of(rows, cols, &se.shape, scheme)
                .map_err(|m| fail(format!("`{scale_name}`: {m}")))?;
            let scale = se.dtype.to_f32(&self.files[se.file].1[se.range.clone()]);
            let q = &self.files[e.file].1[e.range.clone()];
            let kept = (format == Fp8Format::E4M3 && target == DType::BF16)
                .then(|| crate::fp8::pack_blocks(q, rows, cols, &scale, block))
                .flatten();
            if let Some(bytes) = kept {
                let layout = QuantLayout::Fp8E4m3(crate::fp8::scales_of(rows, cols, block));
                self.insert_quantized(&name, layout, &e.shape, &bytes, path.clone())?;
                continue;
            }
            let values =
                crate::fp8::dequantize(&self.files[e.file].1[e.range.clone()], format, rows, cols, &scale, block);
            self.insert_owned(&name, target, &e.shape, &target.from_f32(&values), path.clone())?;
        }
        Ok(())
    }

    /// Every int4 weight of a checkpoint in `format` (crate::int4: AWQ's or GPTQ's `X.qweight`
    /// and its parts, compressed-tensors' `X.weight_packed` and its parts) becomes `X.weight`,
    /// kept 4-bit in [`QuantLayout::Int4Group`]; the parts are no longer listed.
    pub fn convert_int4(&mut self, format: crate::int4::Int4Format) -> Result<()> {
        use crate::int4::Int4Format;
        let (key, parts): (&str, &[&str]) = match format {
            Int4Format::Awq => ("qweight", &["qweight", "qzeros", "scales"]),
            Int4Format::Gptq { .. } => ("qweight", &["qweight", "qzeros", "scales", "g_idx"]),
            Int4Format::CompressedTensors => {
                ("weight_packed", &["weight_packed", "weight_scale", "weight_zero_point", "weight_shape"])
            }
        };
        let stems: Vec<String> = self
            .ints
            .keys()
            .filter_map(|n| n.strip_suffix(key).and_then(|s| s.strip_suffix('.')).map(String::from))
            .collect();
        for stem in stems {
            let path = self.files[self.ints[&format!("{stem}.{key}")].1.file].0.clone();
            let int = |suffix: &str| {
                let (t, e) = self.ints.get(&format!("{stem}.{suffix}"))?;
                let bytes = &self.files[e.file].1[e.range.clone()];
                let values = match t {
                    IntType::I32 => {
                        bytes.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64).collect()
                    }
                    IntType::I64 => bytes.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect(),
                };
                Some((e.shape.clone(), values))
            };
            let val = |suffix: &str| {
                let e = self.tensors.get(&format!("{stem}.{suffix}"))?;
                Some((e.shape.clone(), e.dtype.to_f32(&self.files[e.file].1[e.range.clone()])))
            };
            let converted = crate::int4::convert(format, &crate::int4::Parts { int: &int, val: &val });
            let (shape, group, bytes) = converted.map_err(|m| {
                Error::tensor(&path, format!("{stem}.weight"), format!("{} int4 weight: {m}", format.name()))
            })?;
            for p in parts {
                let name = format!("{stem}.{p}");
                self.ints.remove(&name);
                self.tensors.remove(&name);
            }
            self.insert_quantized(&format!("{stem}.weight"), QuantLayout::Int4Group { group }, &shape, &bytes, path)?;
        }
        Ok(())
    }

    /// `Err` naming an integer tensor no conversion consumed: only an int4 checkpoint's parts
    /// may be integers.
    pub fn refuse_ints(&self) -> Result<()> {
        match self.ints.iter().next() {
            None => Ok(()),
            Some((name, (t, e))) => Err(Error::tensor(
                &self.files[e.file].0,
                name,
                format!(
                    "dtype {} is not supported (bf16, f16, f32, and FP8 weights with their scales, are; integer tensors only as an int4 checkpoint's parts)",
                    match t {
                        IntType::I32 => "I32",
                        IntType::I64 => "I64",
                    }
                ),
            )),
        }
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entry(name).is_some()
    }

    /// Tensor `name`, or where a multimodal checkpoint keeps its language model under a prefix
    /// (Gemma 3's `language_model.model.*` and `language_model.lm_head.*`, or transformers 5's
    /// `model.language_model.*`), the tensor the text model's name stands for there.
    fn entry(&self, name: &str) -> Option<&Entry> {
        if let Some(e) = self.tensors.get(name) {
            return Some(e);
        }
        let alias = |prefix: &str, rest: &str| self.tensors.get(&format!("{prefix}{rest}"));
        match name.strip_prefix("model.") {
            Some(rest) => alias("language_model.model.", rest).or_else(|| alias("model.language_model.", rest)),
            None => name.strip_prefix("lm_head.").and_then(|rest| alias("language_model.lm_head.", rest)),
        }
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    /// The shape the file gives tensor `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entry(name).map(|e| e.shape.as_slice())
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<TensorView> {
        let Some(e) = self.entry(name) else {
            let path = self.files.first().map(|f| f.0.clone()).unwrap_or_default();
            if let Some((f, _)) = self.fp8.get(name) {
                return Err(Error::tensor(
                    path,
                    name,
                    format!("stored as {} and not yet dequantized (Weights::dequantize_fp8)", f.name()),
                ));
            }
            return Err(Error::tensor(path, name, format!("missing (expected shape {shape:?})")));
        };
        let (path, mmap) = &self.files[e.file];
        if e.shape != shape {
            return Err(Error::tensor(path, name, format!("has shape {:?}, expected {shape:?}", e.shape)));
        }
        Ok(TensorView {
            name: name.into(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            path: path.clone(),
            quant: e.quant,
            owner: mmap.clone(),
            range: e.range.clone(),
        })
    }
}
