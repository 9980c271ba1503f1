//! Safetensors weights, mapped with memmap2. A tensor is a view into the mapping: the bytes go
//! from the page cache to the backend without an intermediate copy.

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::backend::DType;
use crate::error::{Error, Result};

struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    range: Range<usize>,
}

/// All tensors of a model directory (`model.safetensors`, or the shards listed in
/// `model.safetensors.index.json`).
pub struct Weights {
    files: Vec<(PathBuf, Arc<Mmap>)>,
    tensors: BTreeMap<String, Entry>,
}

/// One tensor: its dtype, its shape (outermost first, as in PyTorch) and its bytes in the mapping.
#[derive(Clone)]
pub struct TensorView {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub path: PathBuf,
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
    /// Values as f32 (a copy; for tests, tools and small tensors).
    pub fn to_f32(&self) -> Vec<f32> {
        self.dtype.to_f32(self.bytes())
    }
}

impl Weights {
    /// No tensors; [`Weights::replace`] adds them (tests and tools).
    pub fn empty() -> Self {
        Weights { files: vec![], tensors: BTreeMap::new() }
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
        let mut w = Weights { files: vec![], tensors: BTreeMap::new() };
        for name in names {
            w.add_file(&dir.join(name))?;
        }
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
            let dtype = match info.dtype {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::BF16 => DType::BF16,
                safetensors::Dtype::F16 => DType::F16,
                other => {
                    return Err(Error::tensor(path, name, format!("dtype {other:?} is not supported (bf16, f16, f32 are)")))
                }
            };
            let (s, e) = info.data_offsets;
            let range = data_start + s..data_start + e;
            if range.end > mmap.len() {
                return Err(Error::tensor(path, name, format!(
                    "data ends at byte {} but the file has {} bytes (truncated file?)",
                    range.end,
                    mmap.len()
                )));
            }
            let numel: usize = info.shape.iter().product();
            if numel * dtype.size() != e - s {
                return Err(Error::tensor(path, name, format!("shape {:?} needs {} bytes, header gives {}", info.shape, numel * dtype.size(), e - s)));
            }
            self.tensors.insert(name.to_string(), Entry { file: file_idx, dtype, shape: info.shape.clone(), range });
        }
        self.files.push((path.to_path_buf(), Arc::new(mmap)));
        Ok(())
    }

    /// Puts `values` (stored as `dtype`) in place of tensor `name`, or adds it. The bytes live
    /// in an anonymous mapping, so the tensor is a view like any other. For tools and tests
    /// that need to alter a model (e.g. proving that a broken weight is caught).
    pub fn replace(&mut self, name: &str, dtype: DType, shape: &[usize], values: &[f32]) -> Result<()> {
        let bytes = dtype.from_f32(values);
        if shape.iter().product::<usize>() != values.len() {
            return Err(Error::tensor("<memory>", name, format!("shape {shape:?} does not hold {} values", values.len())));
        }
        let mut anon = memmap2::MmapMut::map_anon(bytes.len().max(1)).map_err(|e| Error::io("<anonymous mapping>", e))?;
        anon[..bytes.len()].copy_from_slice(&bytes);
        let mmap = anon.make_read_only().map_err(|e| Error::io("<anonymous mapping>", e))?;
        self.tensors.insert(name.to_string(), Entry { file: self.files.len(), dtype, shape: shape.to_vec(), range: 0..bytes.len() });
        self.files.push((PathBuf::from(format!("<memory:{name}>")), Arc::new(mmap)));
        Ok(())
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
            return Err(Error::tensor(path, name, format!("missing (expected shape {shape:?})")));
        };
        let (path, mmap) = &self.files[e.file];
        if e.shape != shape {
            return Err(Error::tensor(path, name, format!("has shape {:?}, expected {shape:?}", e.shape)));
        }
        Ok(TensorView { name: name.into(), dtype: e.dtype, shape: e.shape.clone(), path: path.clone(), owner: mmap.clone(), range: e.range.clone() })
    }
}
