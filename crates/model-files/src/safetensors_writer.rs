//! A streaming safetensors writer with a deterministic header.
//!
//! File: u64 header length, the header JSON (`__metadata__` first, then tensors sorted by name,
//! padded with spaces to a multiple of 8), then the data of each tensor in that same order.
//! The header is computed from the shapes alone, so tensors can be produced one at a time (or
//! in chunks) and never need to be in memory together: a random 8B model streams to disk.

use std::io::Write;
use std::path::{Path, PathBuf};

use tandem_core::{DType, Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Stored as FP8 e4m3 bytes, given as they are by [`SafetensorsWriter::push_raw`] (`dtype`
    /// is then unused).
    pub e4m3: bool,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[usize]) -> Self {
        TensorSpec { name: name.into(), dtype, shape: shape.to_vec(), e4m3: false }
    }
    /// An FP8 (e4m3) tensor.
    pub fn e4m3(name: impl Into<String>, shape: &[usize]) -> Self {
        TensorSpec { e4m3: true, ..TensorSpec::new(name, DType::F32, shape) }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn elem_size(&self) -> usize {
        if self.e4m3 {
            1
        } else {
            self.dtype.size()
        }
    }
    fn tag(&self) -> &'static str {
        match (self.e4m3, self.dtype) {
            (true, _) => "F8_E4M3",
            (false, DType::F32) => "F32",
            (false, DType::BF16) => "BF16",
            (false, DType::F16) => "F16",
        }
    }
}

/// Writes tensors in [`SafetensorsWriter::specs`] order; each tensor's values may arrive in
/// several [`SafetensorsWriter::push`] calls.
pub struct SafetensorsWriter<W: Write> {
    out: W,
    path: PathBuf,
    specs: Vec<TensorSpec>,
    current: usize,
    done_in_current: usize,
}

impl<W: Write> SafetensorsWriter<W> {
    /// Sorts `specs` by name and writes the header. `path` is only for error messages.
    pub fn new(mut out: W, path: &Path, mut specs: Vec<TensorSpec>) -> Result<Self> {
        specs.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = specs.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(Error::tensor(path, &w[0].name, "appears twice"));
        }
        let header = header_json(&specs);
        out.write_all(&(header.len() as u64).to_le_bytes()).map_err(|e| Error::io(path, e))?;
        out.write_all(header.as_bytes()).map_err(|e| Error::io(path, e))?;
        let mut w = SafetensorsWriter { out, path: path.to_path_buf(), specs, current: 0, done_in_current: 0 };
        w.skip_empty();
        Ok(w)
    }

    /// The order in which values must be pushed.
    pub fn specs(&self) -> &[TensorSpec] {
        &self.specs
    }

    /// The tensor the next [`Self::push`] writes into, if any remain.
    pub fn current(&self) -> Option<&TensorSpec> {
        self.specs.get(self.current)
    }

    /// Appends values to the current tensor, converted to its dtype; moves on when it is full.
    pub fn push(&mut self, values: &[f32]) -> Result<()> {
        self.append(values.len(), false, |spec| spec.dtype.from_f32(values))
    }

    /// Appends stored bytes, one a value, to the current tensor, which must be FP8.
    pub fn push_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.append(bytes.len(), true, |_| bytes.to_vec())
    }

    fn append(&mut self, n: usize, raw: bool, bytes: impl FnOnce(&TensorSpec) -> Vec<u8>) -> Result<()> {
        let Some(spec) = self.specs.get(self.current) else {
            return Err(Error::config(&self.path, format!("{n} values pushed after the last tensor")));
        };
        if spec.e4m3 != raw {
            return Err(Error::tensor(
                &self.path,
                &spec.name,
                if raw {
                    "bytes pushed into a tensor of values"
                } else {
                    "values pushed into an FP8 tensor (push_raw)"
                },
            ));
        }
        let left = spec.numel() - self.done_in_current;
        if n > left {
            return Err(Error::tensor(&self.path, &spec.name, format!("{n} values pushed where {left} remain")));
        }
        self.out.write_all(&bytes(spec)).map_err(|e| Error::io(&self.path, e))?;
        self.done_in_current += n;
        if self.done_in_current == spec.numel() {
            self.current += 1;
            self.done_in_current = 0;
            self.skip_empty();
        }
        Ok(())
    }

    fn skip_empty(&mut self) {
        while self.specs.get(self.current).is_some_and(|s| s.numel() == 0) {
            self.current += 1;
        }
    }

    /// Checks that every tensor was written in full and flushes.
    pub fn finish(mut self) -> Result<W> {
        if let Some(spec) = self.specs.get(self.current) {
            return Err(Error::tensor(
                &self.path,
                &spec.name,
                format!("only {} of {} values written", self.done_in_current, spec.numel()),
            ));
        }
        self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        Ok(self.out)
    }
}

fn header_json(specs: &[TensorSpec]) -> String {
    let mut map = serde_json::Map::new();
    map.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0usize;
    for s in specs {
        let end = offset + s.numel() * s.elem_size();
        map.insert(
            s.name.clone(),
            serde_json::json!({ "dtype": s.tag(), "shape": s.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut text = serde_json::Value::Object(map).to_string();
    // The data section starts 8-aligned, so that f32 tensors can be viewed in place.
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::weights::Weights;

    #[test]
    fn round_trips_through_the_core_loader() {
        let dir = std::env::temp_dir().join(format!("tandem-st-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let specs = vec![
            TensorSpec::new("b.weight", DType::BF16, &[2, 3]),
            TensorSpec::new("a.weight", DType::F32, &[3]),
            TensorSpec::new("c.bias", DType::F16, &[1]),
        ];
        let mut w = SafetensorsWriter::new(std::fs::File::create(&path).unwrap(), &path, specs).unwrap();
        let order: Vec<_> = w.specs().iter().map(|s| s.name.clone()).collect();
        assert_eq!(order, ["a.weight", "b.weight", "c.bias"]);
        w.push(&[1.0, 2.0, 3.0]).unwrap();
        w.push(&[0.5, -1.0]).unwrap(); // b in two chunks
        w.push(&[1.5, 2.5, 3.5, 4.5]).unwrap();
        assert!(w.push(&[1.0, 2.0]).is_err(), "c has one element");
        w.push(&[-2.0]).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let hlen = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert_eq!(hlen % 8, 0);
        let ws = Weights::open(&dir).unwrap();
        assert_eq!(ws.get("a.weight", &[3]).unwrap().to_f32(), vec![1.0, 2.0, 3.0]);
        assert_eq!(ws.get("b.weight", &[2, 3]).unwrap().to_f32(), vec![0.5, -1.0, 1.5, 2.5, 3.5, 4.5]);
        assert_eq!(ws.get("c.bias", &[1]).unwrap().to_f32(), vec![-2.0]);
    }

    #[test]
    fn unfinished_or_duplicate_is_an_error() {
        let p = Path::new("x.safetensors");
        let w = SafetensorsWriter::new(Vec::new(), p, vec![TensorSpec::new("t", DType::F32, &[4])]).unwrap();
        let e = w.finish().unwrap_err().to_string();
        assert!(e.contains("`t`") && e.contains("0 of 4"), "{e}");
        let dup = vec![TensorSpec::new("t", DType::F32, &[1]), TensorSpec::new("t", DType::F32, &[1])];
        assert!(SafetensorsWriter::new(Vec::new(), p, dup).is_err());
    }
}
