//! A GGUF file as a llama.cpp user downloads it: the reader, every tensor's bytes and
//! dequantisation, and the whole conversion to a Hugging Face directory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| tandem_fuzz::scratch_dir("gguf"));
    let path = tandem_fuzz::write(dir, "model.gguf", data);
    if let Ok(g) = tandem_model_files::gguf::GgufFile::open(&path) {
        for t in &g.tensors {
            let _ = g.tensor_f32(t);
        }
    }
    let out = dir.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let _ = tandem_model_files::convert::convert_gguf(&path, &out, &mut |_, _, _| {});
});
