//! Int4 checkpoints on the reference against HF transformers: tests/golden/int4, made by
//! tests/int4_golden.py (compressed-tensors' own compressor writes `ct`; the same 4-bit values
//! are written in AWQ's and GPTQ's layouts to `awq` and `gptq`), kept 4-bit at load.

use tandem_conformance::golden::{self, GoldenFile};
use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;
use tandem_reference::RefBackend;

const FORMATS: [&str; 3] = ["ct", "awq", "gptq"];

fn open(format: &str) -> (std::path::PathBuf, Weights) {
    let dir = golden::golden_dir().join("int4").join(format);
    let w = Weights::open(&dir).unwrap_or_else(|e| panic!("{format}: {e}"));
    (dir, w)
}

/// Every projection of the two layers (7 a layer) is kept 4-bit in groups of 32, in fewer
/// bytes than 16-bit weights would take.
#[test]
fn int4_checkpoints_load_kept_quantized() {
    for f in FORMATS {
        let (_, w) = open(f);
        let layouts: Vec<(&str, QuantLayout)> = w.quantized().collect();
        assert_eq!(layouts.len(), 14, "{f}: {layouts:?}");
        assert!(layouts.iter().all(|(_, l)| *l == QuantLayout::Int4Group { group: 32 }), "{f}: {layouts:?}");
        let up = w.get("model.layers.0.mlp.up_proj.weight", &[160, 64]).unwrap();
        // 160 rows of 2 groups, each 8 bytes of scale and zero and 16 of nibbles.
        assert_eq!(up.bytes().len(), 160 * 2 * 24, "{f}");
        assert!(
            !w.contains("model.layers.0.mlp.up_proj.qweight")
                && !w.contains("model.layers.0.mlp.up_proj.weight_packed")
        );
    }
}

/// The three formats hold the same values, so the layout kept from each is the same bytes:
/// a wrong nibble order, zero offset or scale index in one reader would show here.
#[test]
fn the_three_formats_give_the_same_bytes() {
    let (_, ct) = open("ct");
    for f in ["awq", "gptq"] {
        let (_, other) = open(f);
        for (name, _) in ct.quantized() {
            let a = ct.get(name, ct.shape(name).unwrap()).unwrap();
            let b = other.get(name, ct.shape(name).unwrap()).unwrap_or_else(|e| panic!("{f}: {e}"));
            assert!(a.bytes() == b.bytes(), "{f}: `{name}` differs from compressed-tensors'");
        }
    }
}

/// Each format passes the golden HF transformers wrote on compressed-tensors' dequantized
/// weights: greedy ids equal on every prompt, log-probabilities within 1e-3.
#[test]
fn int4_checkpoints_pass_hf_golden() {
    let g = GoldenFile::load(&golden::golden_dir().join("int4/ct.json")).unwrap();
    for f in FORMATS {
        let (dir, w) = open(f);
        let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let lines = golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3).unwrap_or_else(|e| panic!("{f}: {e}"));
        println!("{f}: {lines:?}");
        assert!(lines.iter().all(|l| l.contains("diverged at None")), "{f}: {lines:?}");
    }
}

/// The golden tells a zero point off by one: the GPTQ checkpoint read as `gptq_v2` (zeros
/// stored as they are rather than minus one) must fail it.
#[test]
fn int4_golden_catches_zero_points_off_by_one() {
    let (src, _) = open("gptq");
    let dir = std::env::temp_dir().join(format!("tandem-int4-gptq-v2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    let config = std::fs::read_to_string(src.join("config.json")).unwrap();
    assert!(config.contains(r#""checkpoint_format": "gptq""#), "{config}");
    std::fs::write(
        dir.join("config.json"),
        config.replace(r#""checkpoint_format": "gptq""#, r#""checkpoint_format": "gptq_v2""#),
    )
    .unwrap();
    let w = Weights::open(&dir).unwrap();
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
    let g = GoldenFile::load(&golden::golden_dir().join("int4/ct.json")).unwrap();
    let told = match golden::check_weights(RefBackend::new(), cfg, &w, &g, 1e-3) {
        Err(e) => e,
        Ok(lines) => {
            lines.into_iter().find(|l| !l.contains("diverged at None")).expect("zeros off by one must be told")
        }
    };
    println!("gptq read as gptq_v2: {told}");
    std::fs::remove_dir_all(&dir).unwrap();
}
