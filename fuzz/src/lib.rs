//! What the fuzz targets share: scratch files (the loaders take paths, as a user's model
//! directory gives them), the model directory whose tokenizer the request target uses, and an
//! in-process server whose engine answers from the fuzz input.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

pub mod server;

/// A per-process scratch folder (on tmpfs when there is one: a target writes a file per input).
pub fn scratch_dir(name: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let dir = base.join(format!("tandem-fuzz-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    dir
}

/// Writes `data` to `dir/file` and returns its path.
pub fn write(dir: &Path, file: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(file);
    std::fs::write(&p, data).expect("scratch write");
    p
}

/// The model directory the request target serves: `TANDEM_FUZZ_MODEL_DIR`, else the default
/// model `cargo xtask fetch-model` installs under models/, else a tiny word-level tokenizer.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TANDEM_FUZZ_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct");
    if models.join("tokenizer.json").is_file() {
        return models;
    }
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = scratch_dir(&format!("tiny-tok-{}", N.fetch_add(1, Ordering::Relaxed)));
    tandem_server::test_support::write_tiny_tokenizer(&dir, 64).expect("tiny tokenizer");
    dir
}

/// Reads fuzz bytes as a few typed values without failing (short input reads as zeros).
pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from(self.u8()) | (u16::from(self.u8()) << 8)
    }
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) | (u32::from(self.u16()) << 16)
    }
    /// Up to `max` bytes.
    pub fn take(&mut self, max: usize) -> &'a [u8] {
        let n = (self.u8() as usize).min(max).min(self.data.len());
        let (a, b) = self.data.split_at(n);
        self.data = b;
        a
    }
    /// A short string (lossy UTF-8).
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.take(64)).into_owned()
    }
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}
