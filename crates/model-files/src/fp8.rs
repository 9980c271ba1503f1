//! Writes FP8 checkpoints in the layout Qwen3-*-FP8 and DeepSeek-V3 ship (HF's
//! FineGrainedFP8Config): each projection `X.weight` in e4m3 with one f32 scale per block,
//! `X.weight_scale_inv` [ceil(n/bn), ceil(k/bk)] (a block's largest |w| maps to 448, e4m3's
//! largest), and `quantization_config` in config.json. For tests and benchmarks of the loader
//! (tandem_core::fp8 reads it back): `gen-model --dtype fp8` / `fp8-f32`.

use std::io::BufWriter;
use std::path::Path;

use tandem_core::fp8::Fp8Format;
use tandem_core::weights::Weights;
use tandem_core::{Error, Result};

use crate::safetensors_writer::{SafetensorsWriter, TensorSpec};

/// e4m3's largest finite value.
const E4M3_MAX: f32 = 448.0;

/// The nearest e4m3 byte to `x` (ties to the even code; beyond ±448 saturates; NaN to NaN), as
/// torch's `.to(torch.float8_e4m3fn)` rounds.
pub fn encode_e4m3(x: f32) -> u8 {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    let t = TABLE.get_or_init(|| Fp8Format::E4M3.table());
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Codes 0x00..=0x7e are the non-negative finite values, ascending.
    let i = t[..0x7f].partition_point(|&v| v < a);
    let code = if i == 0 || t[i] == a {
        i
    } else {
        let (lo, hi) = (a - t[i - 1], t[i] - a);
        if lo < hi || (lo == hi && (i - 1) % 2 == 0) {
            i - 1
        } else {
            i
        }
    };
    sign | code as u8
}

/// Whether a tensor is a projection that FP8 checkpoints store in 8 bits: the attention and MLP
/// projections and experts (never the embedding, the head, norms or a router).
fn quantized(name: &str, shape: &[usize]) -> bool {
    shape.len() == 2
        && name.starts_with("model.layers.")
        && (name.ends_with("_proj.weight")
            || [".w1.weight", ".w2.weight", ".w3.weight"].iter().any(|s| name.ends_with(s)))
}

/// Rewrites the model in `dir` (its safetensors and config.json) with its projections in FP8,
/// blocks of `block` = [rows, cols]; other tensors keep their type. Returns how many tensors
/// were quantized.
pub fn quantize_dir(dir: &Path, block: [usize; 2]) -> Result<usize> {
    let [br, bc] = block;
    if br == 0 || bc == 0 {
        return Err(Error::config(dir, "FP8 block size must be positive"));
    }
    let w = Weights::open(dir)?;
    let mut specs = vec![];
    let mut count = 0;
    for name in w.names() {
        let shape = w.shape(name).expect("listed").to_vec();
        if quantized(name, &shape) {
            specs.push(TensorSpec::e4m3(name, &shape));
            specs.push(TensorSpec::new(
                format!("{}_scale_inv", name),
                tandem_core::DType::F32,
                &[shape[0].div_ceil(br), shape[1].div_ceil(bc)],
            ));
            count += 1;
        } else {
            specs.push(TensorSpec::new(name, w.get(name, &shape)?.dtype, &shape));
        }
    }
    let tmp = dir.join("model.safetensors.fp8-tmp");
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut out = SafetensorsWriter::new(BufWriter::with_capacity(1 << 20, file), &tmp, specs)?;
    // Each weight's scales wait here for their own tensor (the writer's order is by name).
    let mut scales: std::collections::HashMap<String, Vec<f32>> = Default::default();
    let order = out.specs().to_vec();
    for spec in &order {
        if let Some(s) = scales.remove(&spec.name) {
            out.push(&s)?;
            continue;
        }
        let values = w.get(&spec.name, &spec.shape)?.to_f32();
        if !spec.e4m3 {
            out.push(&values)?;
            continue;
        }
        let (rows, cols) = (spec.shape[0], spec.shape[1]);
        let (gr, gc) = (rows.div_ceil(br), cols.div_ceil(bc));
        let block = |i: usize| (i / cols / br) * gc + (i % cols) / bc;
        // Max |w| per block, then the scale that maps it to 448 (an all-zero block keeps 1).
        let mut amax = vec![0.0f32; gr * gc];
        for (i, v) in values.iter().enumerate() {
            amax[block(i)] = amax[block(i)].max(v.abs());
        }
        let s: Vec<f32> = amax.iter().map(|&a| if a > 0.0 { a / E4M3_MAX } else { 1.0 }).collect();
        let codes: Vec<u8> = values.iter().enumerate().map(|(i, v)| encode_e4m3(v / s[block(i)])).collect();
        out.push_raw(&codes)?;
        scales.insert(format!("{}_scale_inv", spec.name), s);
    }
    out.finish()?;
    drop(w);
    let st = dir.join("model.safetensors");
    std::fs::rename(&tmp, &st).map_err(|e| Error::io(&st, e))?;
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
    let mut cfg: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::config(&cfg_path, format!("not valid JSON: {e}")))?;
    cfg["quantization_config"] = serde_json::json!({ "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [br, bc] });
    crate::convert::write_json(&cfg_path, &cfg)?;
    Ok(count)
}

/// Gives the single-file checkpoint in `dir` per-layer fp8 KV-cache scales, as FP8 checkpoints
/// ship them (`model.layers.{i}.self_attn.k_scale` / `v_scale`, f32 scalars; what
/// `tandem_core::kv_scales` reads): `kv_scales.safetensors` beside `model.safetensors`, and a
/// `model.safetensors.index.json` naming both. For tests of an fp8 KV cache with scales.
pub fn add_kv_scales(dir: &Path, scales: &[[f32; 2]]) -> Result<()> {
    let index = dir.join("model.safetensors.index.json");
    if index.exists() {
        return Err(Error::config(&index, "add_kv_scales takes a single-file checkpoint"));
    }
    let mut map = serde_json::Map::new();
    for name in Weights::open(dir)?.names() {
        map.insert(name.to_string(), "model.safetensors".into());
    }
    let path = dir.join("kv_scales.safetensors");
    let mut specs = vec![];
    let mut value = std::collections::HashMap::new();
    for (i, [k, v]) in scales.iter().enumerate() {
        for (n, s) in [("k_scale", k), ("v_scale", v)] {
            let name = format!("model.layers.{i}.self_attn.{n}");
            map.insert(name.clone(), "kv_scales.safetensors".into());
            value.insert(name.clone(), *s);
            specs.push(TensorSpec::new(name, tandem_core::DType::F32, &[]));
        }
    }
    let file = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
    let mut w = SafetensorsWriter::new(BufWriter::new(file), &path, specs)?;
    while let Some(name) = w.current().map(|s| s.name.clone()) {
        w.push(&[value[&name]])?;
    }
    w.finish()?;
    let text = serde_json::json!({ "weight_map": map }).to_string();
    std::fs::write(&index, text).map_err(|e| Error::io(&index, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_rounds_to_the_nearest_code() {
        let t = Fp8Format::E4M3.table();
        // Every finite code encodes to itself.
        for b in 0..=255u8 {
            if !t[b as usize].is_nan() && b != 0x80 {
                assert_eq!(encode_e4m3(t[b as usize]), b, "code {b:#04x}");
            }
        }
        // Midpoints go to the even code; just off them, to the nearer.
        for b in 0..0x7eu8 {
            let (lo, hi) = (t[b as usize], t[b as usize + 1]);
            let mid = (lo + hi) / 2.0;
            let even = if b % 2 == 0 { b } else { b + 1 };
            assert_eq!(encode_e4m3(mid), even, "midpoint above {b:#04x}");
            assert_eq!(encode_e4m3(f32::from_bits(mid.to_bits() - 1)), b);
            assert_eq!(encode_e4m3(f32::from_bits(mid.to_bits() + 1)), b + 1);
        }
        assert_eq!(encode_e4m3(1e6), 0x7e);
        assert_eq!(encode_e4m3(-1e6), 0xfe);
        assert_eq!(encode_e4m3(-1.0), 0xb8);
        assert_eq!(encode_e4m3(f32::NAN), 0x7f);
    }

    #[test]
    fn quantized_model_reads_back_within_e4m3_error() {
        let dir = std::env::temp_dir().join(format!("tandem-fp8-q-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        crate::random_model::write_random_model(&dir, crate::random_model::Shape::Tiny, 3, tandem_core::DType::F32)
            .unwrap();
        let before = Weights::open(&dir).unwrap();
        let orig: Vec<(String, Vec<usize>, Vec<f32>)> = before
            .names()
            .map(|n| {
                let s = before.shape(n).unwrap().to_vec();
                (n.to_string(), s.clone(), before.get(n, &s).unwrap().to_f32())
            })
            .collect();
        drop(before);
        let n = quantize_dir(&dir, [32, 32]).unwrap();
        assert_eq!(n, 2 * 7, "7 projections a layer, 2 layers");
        let after = Weights::open(&dir).unwrap();
        for (name, shape, want) in &orig {
            let got = after.get(name, shape).unwrap();
            assert_eq!(got.dtype, tandem_core::DType::F32, "{name}: dequantized to the embedding's type");
            let got = got.to_f32();
            if !quantized(name, shape) {
                assert_eq!(&got, want, "{name} unchanged");
                continue;
            }
            // e4m3 keeps 3 mantissa bits: within 2^-4 relative of the value, or of the block's
            // smallest normal (scale * 2^-6) near zero, with the scale up to max|w| / 448.
            let amax = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let mut worst = 0.0f32;
            for (g, w) in got.iter().zip(want) {
                let bound = (w.abs() / 16.0).max(amax / 448.0 * 2f32.powi(-9));
                assert!((g - w).abs() <= bound * 1.0001, "{name}: {g} vs {w}");
                worst = worst.max((g - w).abs() / amax);
            }
            assert!(worst > 0.0, "{name}: rounding happened");
        }
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["quantization_config"]["weight_block_size"], serde_json::json!([32, 32]));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Files the loader must refuse, each with the file, the tensor and the reason.
    #[test]
    fn bad_fp8_files_are_named() {
        let dir = std::env::temp_dir().join(format!("tandem-fp8-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let st = dir.join("model.safetensors");
        let write = |specs: Vec<TensorSpec>| {
            let mut w = SafetensorsWriter::new(std::fs::File::create(&st).unwrap(), &st, specs).unwrap();
            for s in w.specs().to_vec() {
                if s.e4m3 {
                    w.push_raw(&vec![0x38; s.numel()]).unwrap()
                } else {
                    w.push(&vec![0.5; s.numel()]).unwrap()
                }
            }
            w.finish().unwrap();
        };
        let up = "model.layers.0.mlp.up_proj.weight";
        let cases: Vec<(Vec<TensorSpec>, &str)> = vec![
            (vec![TensorSpec::e4m3(up, &[4, 6])], "no `model.layers.0.mlp.up_proj.weight_scale_inv` or `model.layers.0.mlp.up_proj.weight_scale` beside it"),
            (vec![TensorSpec::e4m3(up, &[4, 6]), TensorSpec::new(format!("{up}_scale_inv"), tandem_core::DType::F32, &[3, 3])], "scale grid [3, 3] does not divide [4, 6]"),
            (vec![TensorSpec::e4m3("model.layers.0.mlp.up_proj.bias", &[4])], "only `.weight` tensors may be FP8"),
        ];
        for (specs, want) in cases {
            write(specs);
            let e = Weights::open(&dir).err().expect("refused").to_string();
            assert!(e.contains(want) && e.contains("model.safetensors") && e.contains("F8_E4M3"), "{e}");
        }
        // A per-tensor scale, then the same weight read back.
        write(vec![
            TensorSpec::e4m3(up, &[4, 6]),
            TensorSpec::new(format!("{up}_scale"), tandem_core::DType::F32, &[1]),
        ]);
        let w = Weights::open(&dir).unwrap();
        assert_eq!(w.get(up, &[4, 6]).unwrap().to_f32(), vec![0.5; 24], "1.0 * 0.5, in bf16 (no embedding to follow)");
        assert_eq!(w.get(up, &[4, 6]).unwrap().dtype, tandem_core::DType::BF16);
        std::fs::remove_dir_all(&dir).ok();
    }
}
