//! config.json: the parser, then what the loader derives from it (dimensions, rope table).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = tandem_core::ModelConfig::from_json(text) {
        let _ = (c.q_dim(), c.kv_dim());
        let _ = c.rope_inv_freq();
    }
});
