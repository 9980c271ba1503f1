//! GGUF (llama.cpp's single-file model format), versions 2 and 3, read from a memory map.
//!
//! Layout (all little-endian):
//! `"GGUF"`, version u32, tensor_count u64, kv_count u64,
//! kv_count x (key string, value type u32, value),
//! tensor_count x (name string, n_dims u32, dims u64 x n_dims (innermost first), ggml type u32,
//! offset u64 relative to the data section),
//! padding to `general.alignment` (default 32), then the data section.
//! A string is a u64 byte length followed by UTF-8 bytes.
//!
//! Every count and length is checked against the bytes left before anything is allocated, so a
//! truncated or hostile file gives an error naming the file, never a panic or a huge allocation.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use tandem_core::{Error, Result};

use crate::quant::GgmlType;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// Any non-negative integer type, widened.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any number, widened to f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v as f64),
            Value::I16(v) => Some(v as f64),
            Value::I32(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description of the type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: innermost (fastest-varying) dimension first. Reverse for PyTorch.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Shape outermost first, as PyTorch and safetensors write it.
    pub fn torch_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A mapped GGUF file: metadata and tensor directory parsed, tensor data left in the mapping.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    /// Sorted by key (the file's own order carries no meaning).
    pub metadata: BTreeMap<String, Value>,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute byte offset of the data section.
    pub data_offset: u64,
    mmap: Mmap,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: mapped read-only; a converter run does not expect the file to change under it.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let parsed = parse(&mmap).map_err(|msg| Error::config(path, format!("not a valid GGUF file: {msg}")))?;
        let g = GgufFile {
            path: path.to_path_buf(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            mmap,
        };
        // Every tensor's bytes must lie inside the file, before anyone asks for them.
        for t in &g.tensors {
            g.tensor_bytes(t)?;
        }
        Ok(g)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A required string entry.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong_type(key, v, "string"))
    }

    /// A required non-negative integer entry.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| self.wrong_type(key, v, "non-negative integer"))
    }

    /// A required number entry.
    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self.require(key)?;
        v.as_f64().ok_or_else(|| self.wrong_type(key, v, "number"))
    }

    /// A required array entry.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong_type(key, v, "array"))
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.metadata.get(key).ok_or_else(|| Error::config(&self.path, format!("metadata key `{key}` is missing")))
    }

    fn wrong_type(&self, key: &str, v: &Value, want: &str) -> Error {
        Error::config(&self.path, format!("metadata key `{key}` is a {}, expected a {want}", v.type_name()))
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw (possibly quantised) bytes of a tensor.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<&[u8]> {
        // ggml quantises along rows: a block never spans two rows.
        if let Some((block, _)) = t.ggml_type.block_layout() {
            if !t.dims[0].is_multiple_of(block) {
                return Err(Error::tensor(
                    &self.path,
                    &t.name,
                    format!(
                        "rows of {} elements are not a whole number of {} blocks ({block} elements each)",
                        t.dims[0],
                        t.ggml_type.name()
                    ),
                ));
            }
        }
        let size = t.ggml_type.byte_size(t.numel()).map_err(|msg| Error::tensor(&self.path, &t.name, msg))?;
        let start = self.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.mmap.len() as u64 => Ok(&self.mmap[s as usize..e as usize]),
            _ => Err(Error::tensor(
                &self.path,
                &t.name,
                format!(
                    "data at offset {} + {} bytes runs past the end of the file ({} bytes; truncated?)",
                    self.data_offset.saturating_add(t.offset),
                    size,
                    self.mmap.len()
                ),
            )),
        }
    }

    /// A tensor's values as f32 (dequantised when needed), in GGUF element order.
    pub fn tensor_f32(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        t.ggml_type.check_dequantizable().map_err(|msg| Error::tensor(&self.path, &t.name, msg))?;
        let bytes = self.tensor_bytes(t)?;
        crate::quant::dequantize(t.ggml_type, bytes, t.numel() as usize)
            .map_err(|msg| Error::tensor(&self.path, &t.name, msg))
    }
}

struct Parsed {
    version: u32,
    metadata: BTreeMap<String, Value>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_offset: u64,
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> std::result::Result<&'a [u8], String> {
        if self.buf.len() - self.pos < n {
            return Err(format!(
                "file ends at byte {} while reading {what} ({n} bytes needed at offset {}; truncated?)",
                self.buf.len(),
                self.pos
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> std::result::Result<[u8; N], String> {
        Ok(self.take(N, what)?.try_into().expect("take returned N bytes"))
    }
    fn u32(&mut self, what: &str) -> std::result::Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> std::result::Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    /// A count that claims `count` items of at least `min_size` bytes each must fit in what is left.
    fn check_count(&self, count: u64, min_size: usize, what: &str) -> std::result::Result<usize, String> {
        match count.checked_mul(min_size as u64) {
            Some(b) if b <= self.remaining() as u64 => Ok(count as usize),
            _ => Err(format!(
                "{what} claims {count} items at offset {}, more than the {} bytes left",
                self.pos,
                self.remaining()
            )),
        }
    }
    fn string(&mut self, what: &str) -> std::result::Result<String, String> {
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, what)?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} at offset {at} is not valid UTF-8"))
    }
}

fn parse(buf: &[u8]) -> std::result::Result<Parsed, String> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.take(4, "the magic number")?;
    if magic != MAGIC {
        return Err(format!("magic is {magic:02x?}, expected \"GGUF\""));
    }
    let version = c.u32("the version")?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 (32-bit counts) is not supported; re-export the file as version 3".into()),
        v if v.swap_bytes() <= 3 => {
            return Err(format!("big-endian GGUF (version {}) is not supported", v.swap_bytes()))
        }
        v => return Err(format!("unknown GGUF version {v} (2 and 3 are supported)")),
    }
    let n_tensors = c.u64("the tensor count")?;
    let n_kv = c.u64("the metadata count")?;
    // A key/value needs at least 8 (key length) + 4 (type) + 1 bytes.
    let n_kv = c.check_count(n_kv, 13, "the metadata count")?;
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("the type of metadata `{key}`"))?;
        let v = read_value(&mut c, ty, &key, 0)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(format!("metadata key `{key}` appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => return Err(format!("general.alignment is {v:?}, expected a positive power of two")),
        },
    };
    // A tensor info needs at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
    let n_tensors = c.check_count(n_tensors, 24, "the tensor count")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor #{i}"))?;
        let n_dims = c.u32(&format!("n_dims of tensor `{name}`"))?;
        if n_dims == 0 || n_dims > 8 {
            return Err(format!("tensor `{name}` has {n_dims} dimensions (1 to 8 expected)"));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&format!("the dimensions of tensor `{name}`"))?);
        }
        if dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).is_none() {
            return Err(format!("tensor `{name}` has dimensions {dims:?} whose product overflows"));
        }
        let ty = c.u32(&format!("the type of tensor `{name}`"))?;
        let ggml_type = GgmlType::from_id(ty);
        let offset = c.u64(&format!("the offset of tensor `{name}`"))?;
        if offset % alignment != 0 {
            return Err(format!("tensor `{name}` has offset {offset}, not a multiple of the alignment {alignment}"));
        }
        tensors.push(TensorInfo { name, dims, ggml_type, offset });
    }
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    if data_offset > buf.len() as u64 {
        return Err(format!(
            "the data section would start at byte {data_offset}, past the end of the file ({} bytes)",
            buf.len()
        ));
    }
    Ok(Parsed { version, metadata, tensors, alignment, data_offset })
}

/// Nested arrays are legal GGUF but never used in practice; the depth limit keeps a hostile file
/// from recursing without end.
const MAX_DEPTH: usize = 4;

fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> std::result::Result<Value, String> {
    let what = || format!("the value of metadata `{key}`");
    Ok(match ty {
        0 => Value::U8(c.array::<1>(&what())?[0]),
        1 => Value::I8(c.array::<1>(&what())?[0] as i8),
        2 => Value::U16(u16::from_le_bytes(c.array(&what())?)),
        3 => Value::I16(i16::from_le_bytes(c.array(&what())?)),
        4 => Value::U32(u32::from_le_bytes(c.array(&what())?)),
        5 => Value::I32(i32::from_le_bytes(c.array(&what())?)),
        6 => Value::F32(f32::from_le_bytes(c.array(&what())?)),
        7 => match c.array::<1>(&what())?[0] {
            0 => Value::Bool(false),
            1 => Value::Bool(true),
            b => return Err(format!("metadata `{key}` is a bool with byte value {b}")),
        },
        8 => Value::String(c.string(&what())?),
        9 => {
            if depth >= MAX_DEPTH {
                return Err(format!("metadata `{key}` nests arrays deeper than {MAX_DEPTH}"));
            }
            let elem_ty = c.u32(&format!("the element type of metadata `{key}`"))?;
            let n = c.u64(&format!("the length of metadata `{key}`"))?;
            let min = match elem_ty {
                0 | 1 | 7 => 1,
                2 | 3 => 2,
                4..=6 => 4,
                8 | 10 | 11 | 12 => 8,
                9 => 12,
                t => return Err(format!("metadata `{key}` is an array of unknown type {t}")),
            };
            let n = c.check_count(n, min, &format!("array metadata `{key}`"))?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(read_value(c, elem_ty, key, depth + 1)?);
            }
            Value::Array(items)
        }
        10 => Value::U64(c.u64(&what())?),
        11 => Value::I64(i64::from_le_bytes(c.array(&what())?)),
        12 => Value::F64(f64::from_le_bytes(c.array(&what())?)),
        t => return Err(format!("metadata `{key}` has unknown value type {t}")),
    })
}

/// Writes GGUF v3 files; for tests (hand-made files) and small fixtures, not a full exporter.
pub(crate) mod writer {
    use super::*;

    pub fn string(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    pub fn value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.push(*x),
            Value::I8(x) => out.push(*x as u8),
            Value::U16(x) => out.extend(x.to_le_bytes()),
            Value::I16(x) => out.extend(x.to_le_bytes()),
            Value::U32(x) => out.extend(x.to_le_bytes()),
            Value::I32(x) => out.extend(x.to_le_bytes()),
            Value::F32(x) => out.extend(x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => string(out, s),
            Value::Array(items) => {
                let elem = items.first().map(type_id).unwrap_or(4);
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for it in items {
                    value(out, it);
                }
            }
            Value::U64(x) => out.extend(x.to_le_bytes()),
            Value::I64(x) => out.extend(x.to_le_bytes()),
            Value::F64(x) => out.extend(x.to_le_bytes()),
        }
    }

    pub fn type_id(v: &Value) -> u32 {
        match v {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// A whole file: metadata, then tensors given as (name, GGUF dims, type id, raw bytes).
    pub fn file(meta: &[(&str, Value)], tensors: &[(&str, Vec<u64>, u32, Vec<u8>)], alignment: u64) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((meta.len() as u64).to_le_bytes());
        for (k, v) in meta {
            string(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = vec![];
        for (name, dims, ty, bytes) in tensors {
            string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + bytes.len() as u64).div_ceil(alignment) * alignment;
        }
        let pad = |out: &mut Vec<u8>| {
            while !(out.len() as u64).is_multiple_of(alignment) {
                out.push(0);
            }
        };
        pad(&mut out);
        let data_start = out.len() as u64;
        for ((_, _, _, bytes), off) in tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend(bytes);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tandem-gguf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    fn sample() -> Vec<u8> {
        let f32s: Vec<u8> = [1.0f32, -2.0, 3.5, 0.25, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        writer::file(
            &[
                ("general.architecture", Value::String("llama".into())),
                ("general.alignment", Value::U32(64)),
                ("llama.block_count", Value::U32(2)),
                ("llama.rope.freq_base", Value::F32(10000.0)),
                ("tokenizer.ggml.tokens", Value::Array(vec![Value::String("a".into()), Value::String("b c".into())])),
                ("x.i64", Value::I64(-5)),
                ("x.f64", Value::F64(0.5)),
                ("x.bool", Value::Bool(true)),
                ("x.u8", Value::U8(7)),
                ("x.i16", Value::I16(-3)),
                ("x.nested", Value::Array(vec![Value::Array(vec![Value::U16(1), Value::U16(2)])])),
            ],
            &[("t.a", vec![3, 2], 0, f32s.clone()), ("t.b", vec![2], 0, f32s[..8].to_vec())],
            64,
        )
    }

    #[test]
    fn reads_metadata_of_every_kind_and_tensors() {
        let p = tmp("sample.gguf", &sample());
        let g = GgufFile::open(&p).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset % 64, 0);
        assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get_u64("llama.block_count").unwrap(), 2);
        assert_eq!(g.get_f64("llama.rope.freq_base").unwrap(), 10000.0);
        assert_eq!(g.get("x.i64"), Some(&Value::I64(-5)));
        assert_eq!(g.get("x.i64").unwrap().as_u64(), None);
        assert_eq!(g.get_f64("x.f64").unwrap(), 0.5);
        assert_eq!(g.get("x.bool").unwrap().as_bool(), Some(true));
        assert_eq!(g.get("x.u8"), Some(&Value::U8(7)));
        assert_eq!(g.get("x.i16"), Some(&Value::I16(-3)));
        let toks = g.get_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(toks[1].as_str(), Some("b c"));
        assert_eq!(g.get("x.nested").unwrap().as_array().unwrap()[0], Value::Array(vec![Value::U16(1), Value::U16(2)]));
        assert_eq!(g.tensors.len(), 2);
        let a = g.tensor("t.a").unwrap();
        assert_eq!(a.torch_shape(), vec![2, 3]);
        assert_eq!(g.tensor_f32(a).unwrap(), vec![1.0, -2.0, 3.5, 0.25, 5.0, 6.0]);
        let b = g.tensor("t.b").unwrap();
        assert_eq!(b.offset, 64);
        assert_eq!(g.tensor_f32(b).unwrap(), vec![1.0, -2.0]);
        // Wrong-type and missing keys name the key.
        let e = g.get_u64("general.architecture").unwrap_err().to_string();
        assert!(e.contains("general.architecture") && e.contains("string"), "{e}");
        let e = g.get_str("llama.nope").unwrap_err().to_string();
        assert!(e.contains("llama.nope") && e.contains("missing"), "{e}");
    }

    #[test]
    fn every_truncation_is_an_error_naming_the_file() {
        let full = sample();
        // Cutting anywhere must fail cleanly: in the header, the metadata, the tensor infos or the data.
        for cut in (0..full.len()).step_by(7) {
            let p = tmp("cut.gguf", &full[..cut]);
            match GgufFile::open(&p) {
                Ok(_) => panic!("a file cut at byte {cut} of {} was accepted", full.len()),
                Err(e) => assert!(e.to_string().contains("cut.gguf"), "{e}"),
            }
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let full = sample();
        let mut state = 0x1234_5678_u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize
        };
        let (mut opened, mut rejected) = (0, 0);
        for round in 0..400 {
            let mut bad = full.clone();
            for _ in 0..1 + round % 4 {
                let i = next() % bad.len();
                bad[i] = next() as u8;
            }
            match GgufFile::open(&tmp("fuzz.gguf", &bad)) {
                Ok(g) => {
                    opened += 1;
                    for t in &g.tensors {
                        let _ = g.tensor_f32(t);
                    }
                }
                Err(_) => rejected += 1,
            }
        }
        assert!(opened > 0 && rejected > 0, "opened {opened}, rejected {rejected}");
    }

    #[test]
    fn rejects_bad_magic_version_and_counts() {
        let mut bad = sample();
        bad[0] = b'X';
        let e = GgufFile::open(&tmp("magic.gguf", &bad)).err().unwrap().to_string();
        assert!(e.contains("magic"), "{e}");
        let mut v1 = sample();
        v1[4..8].copy_from_slice(&1u32.to_le_bytes());
        let e = GgufFile::open(&tmp("v1.gguf", &v1)).err().unwrap().to_string();
        assert!(e.contains("version 1"), "{e}");
        let mut huge = sample();
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes()); // kv count
        let e = GgufFile::open(&tmp("huge.gguf", &huge)).err().unwrap().to_string();
        assert!(e.contains("metadata count"), "{e}");
    }

    #[test]
    fn tensor_past_the_end_names_the_tensor() {
        let f32s: Vec<u8> = (0..4).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let mut bytes = writer::file(&[], &[("w", vec![4], 0, f32s)], 32);
        // Claim 8 elements where 4 are stored.
        let pos = bytes.windows(8).position(|w| w == 4u64.to_le_bytes()).unwrap();
        bytes[pos..pos + 8].copy_from_slice(&800u64.to_le_bytes());
        let e = GgufFile::open(&tmp("short.gguf", &bytes)).err().unwrap().to_string();
        assert!(e.contains("`w`") && e.contains("past the end"), "{e}");
    }
}
