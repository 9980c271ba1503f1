//! Seeded random LoRA adapters in PEFT's format (`adapter_config.json`,
//! `adapter_model.safetensors`), for benchmarks: every projection of every layer (q, k, v, o,
//! gate, up, down; attention only over a mixture of experts), A and B both drawn nonzero, so
//! the adapter changes the answers and costs what a trained one costs. Same (model shape, rank,
//! seed): the same bytes, from [`crate::random_model`]'s generator.

use std::io::BufWriter;
use std::path::Path;

use serde_json::json;
use tandem_core::lora::Proj;
use tandem_core::{DType, Error, ModelConfig, Result};

use crate::convert::write_json;
use crate::random_model::{fnv1a, SplitMix64};
use crate::safetensors_writer::{SafetensorsWriter, TensorSpec};

/// Writes a rank-`rank` adapter over a model of `cfg` into `dir` (created), `lora_alpha` twice
/// the rank.
pub fn write_random_adapter(dir: &Path, cfg: &ModelConfig, rank: usize, seed: u64) -> Result<()> {
    if rank == 0 {
        return Err(Error::config(dir, "a LoRA adapter's rank must be positive"));
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let projs: Vec<Proj> = Proj::ALL.into_iter().filter(|p| cfg.moe.is_none() || p.index() < 4).collect();
    let module = |l: usize, p: Proj| {
        let block = if p.index() < 4 { "self_attn" } else { "mlp" };
        format!("base_model.model.model.layers.{l}.{block}.{}", p.hf_name())
    };
    // (name, shape, scale): A [r, in] ~ 1/sqrt(in), B [out, r] small, both nonzero.
    let mut plan = vec![];
    for l in 0..cfg.num_hidden_layers {
        for &p in &projs {
            let (out, inp) = p.shape(cfg);
            plan.push((format!("{}.lora_A.weight", module(l, p)), vec![rank, inp], 1.0 / (inp as f32).sqrt()));
            plan.push((format!("{}.lora_B.weight", module(l, p)), vec![out, rank], 0.02));
        }
    }
    let path = dir.join("adapter_model.safetensors");
    let file = std::fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
    let specs = plan.iter().map(|(n, s, _)| TensorSpec::new(n.clone(), DType::F32, s)).collect();
    let mut w = SafetensorsWriter::new(BufWriter::new(file), &path, specs)?;
    for spec in w.specs().to_vec() {
        let &(_, _, scale) = plan.iter().find(|(n, _, _)| *n == spec.name).expect("spec from the plan");
        let mut rng = SplitMix64(seed ^ fnv1a(&spec.name));
        let values: Vec<f32> = (0..spec.numel()).map(|_| scale * rng.normalish()).collect();
        w.push(&values)?;
    }
    w.finish()?;
    let targets: Vec<&str> = projs.iter().map(|p| p.hf_name()).collect();
    write_json(
        &dir.join("adapter_config.json"),
        &json!({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets,
            "bias": "none", "fan_in_fan_out": false, "use_rslora": false, "use_dora": false}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random_model::{write_random_model, Shape};
    use tandem_core::lora::LoraAdapter;

    #[test]
    fn a_random_adapter_loads_over_its_model_and_updates_every_projection() {
        let dir = std::env::temp_dir().join(format!("tandem-random-adapter-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        write_random_model(&dir.join("m"), Shape::Tiny, 1, DType::F32).unwrap();
        let cfg = ModelConfig::from_file(&dir.join("m/config.json")).unwrap();
        write_random_adapter(&dir.join("a"), &cfg, 8, 3).unwrap();
        let a = LoraAdapter::load(&dir.join("a"), &cfg).unwrap();
        assert_eq!((a.rank, a.scale, a.updated().count()), (8, 2.0, 7 * cfg.num_hidden_layers));
        let first = std::fs::read(dir.join("a/adapter_model.safetensors")).unwrap();
        write_random_adapter(&dir.join("b"), &cfg, 8, 3).unwrap();
        assert_eq!(first, std::fs::read(dir.join("b/adapter_model.safetensors")).unwrap(), "seeded");
        assert!(write_random_adapter(&dir.join("c"), &cfg, 0, 3).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
