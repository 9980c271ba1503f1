//! A safetensors file of a model directory: the header, the tensor table, each tensor's view.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

fuzz_target!(|data: &[u8]| {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| tandem_fuzz::scratch_dir("safetensors"));
    let path = tandem_fuzz::write(dir, "model.safetensors", data);
    let mut w = tandem_core::weights::Weights::empty();
    if w.add_file(&path).is_ok() {
        let names: Vec<String> = w.names().map(String::from).collect();
        for name in names {
            // The shape a loader would ask for is the one the header gives; a wrong one must be
            // refused, not read.
            if let Ok(t) = w.get(&name, &[1]) {
                let _ = t.to_f32();
            }
            if let Some(shape) = w.shape(&name).map(<[usize]>::to_vec) {
                if let Ok(t) = w.get(&name, &shape) {
                    let _ = t.to_f32();
                }
            }
        }
    }
    // The same bytes as a whole directory (the loader's entry point).
    let _ = tandem_core::weights::Weights::open(dir);
});
