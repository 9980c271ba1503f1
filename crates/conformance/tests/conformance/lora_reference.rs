//! LoRA adapters on the reference backend: each against HF transformers + peft
//! (tests/golden/lora), a mixed batch against each request alone, bit for bit, and the
//! adapters and batches that must be refused.

use std::path::Path;

use tandem_conformance::golden::golden_model;
use tandem_conformance::lora_golden::{adapter_dir, check_lora, check_lora_mixed, lora_load_options, LORA_GOLDEN};
use tandem_core::backend::argmax_row;
use tandem_core::lora::{AdapterConfig, LoraAdapter, LoraLimits};
use tandem_core::model::ModelRunner;
use tandem_core::weights::Weights;
use tandem_core::{DType, ForwardBatch, Model, ModelConfig};
use tandem_reference::RefBackend;

fn check(name: &str) {
    match check_lora(RefBackend::new(), name, 1e-3) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn every_adapter_is_listed_and_has_its_files() {
    for (name, _) in LORA_GOLDEN {
        let dir = adapter_dir(name);
        assert!(dir.join("adapter_config.json").exists() && dir.join("adapter_model.safetensors").exists(), "{name}");
    }
}

#[test]
fn lora_all_projections_matches_peft() {
    check("tiny-all");
}

#[test]
fn lora_rslora_regex_targets_matches_peft() {
    check("tiny-rs");
}

#[test]
fn lora_phi3_fused_projections_matches_peft() {
    check("tiny-phi3-fused");
}

#[test]
fn lora_qwen3_qk_norm_matches_peft() {
    check("tiny-qwen3-attn");
}

#[test]
fn lora_gemma3_sandwich_norms_matches_peft() {
    check("tiny-gemma3-all");
}

/// Each golden case under tiny-all, under the base model and under tiny-rs, in one batch:
/// every row as alone, the adapter's by the golden rule, the base's HF's ids.
#[test]
fn lora_goldens_mixed_with_the_base_and_another_adapter() {
    for (name, other) in [("tiny-all", Some("tiny-rs")), ("tiny-phi3-fused", None)] {
        println!("{}", check_lora_mixed(RefBackend::new(), name, other, 1e-3).unwrap_or_else(|e| panic!("{e}")));
    }
}

fn tiny() -> (ModelConfig, Weights) {
    let dir = golden_model("tiny");
    (ModelConfig::from_file(&dir.join("config.json")).unwrap(), Weights::open(&dir).unwrap())
}

/// The tiny model with `tiny-all` in slot 0 and `tiny-rs` in slot 1.
fn tiny_with_two(seqs: usize) -> Model<RefBackend> {
    let (cfg, w) = tiny();
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let mut m = Model::from_weights_lora(RefBackend::new(), cfg.clone(), &w, lora_load_options(64, seqs), Some(limits))
        .unwrap();
    m.load_lora(0, &LoraAdapter::load(&adapter_dir("tiny-all"), &cfg).unwrap()).unwrap();
    m.load_lora(1, &LoraAdapter::load(&adapter_dir("tiny-rs"), &cfg).unwrap()).unwrap();
    m
}

/// Four requests, two adapters and the base model among them: prefilled together (one chunk
/// holds them all), then decoded together; every row's logits equal, bit for bit, those of the
/// request run alone.
#[test]
fn a_mixed_batch_equals_each_request_alone_bitwise() {
    let prompts: [&[u32]; 4] = [&[5, 9, 77], &[100, 3], &[42, 42, 7, 300], &[11]];
    let adapters = [Some(0), None, Some(1), Some(0)];
    let steps = 6;
    let mut alone = vec![];
    for (p, a) in prompts.iter().zip(adapters) {
        let mut m = tiny_with_two(1);
        let s = tandem_core::greedy::generate_with(&mut m, a, p, steps, &[], true, |_| {}).unwrap();
        alone.push(s);
    }
    let mut m = tiny_with_two(4);
    let vocab = m.config().vocab_size;
    let block = 16;
    // Sequence i owns block i.
    let tables: Vec<Vec<u32>> = (0..4).map(|i| vec![i as u32]).collect();
    let mut b = ForwardBatch { max_blocks: 1, ..Default::default() };
    for (i, p) in prompts.iter().enumerate() {
        b.push_seq(p, 0, &tables[i], block, true);
    }
    b.adapters = adapters.to_vec();
    let mut logits = m.forward(&b).unwrap();
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    for step in 0..steps {
        let mut next = ForwardBatch { max_blocks: 1, ..Default::default() };
        for (i, (row, run)) in logits.chunks_exact(vocab).zip(&alone).enumerate() {
            let want = &run[step];
            assert_eq!(
                row.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.logits.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "request {i} (adapter {:?}), step {step}: its logits differ from its run alone",
                adapters[i]
            );
            let id = argmax_row(row);
            assert_eq!(id, want.id);
            next.push_seq(&[id], lens[i], &tables[i], block, true);
            lens[i] += 1;
        }
        next.adapters = adapters.to_vec();
        logits = m.forward(&next).unwrap();
    }
    // The adapters matter: each request's ids differ from the base model's on the same prompt.
    for (i, (p, a)) in prompts.iter().zip(adapters).enumerate() {
        if a.is_some() {
            let mut m = tiny_with_two(1);
            let base = tandem_core::greedy::generate(&mut m, p, steps, &[], false, |_| {}).unwrap();
            let ids = |s: &[tandem_core::greedy::Step]| s.iter().map(|s| s.id).collect::<Vec<_>>();
            assert_ne!(ids(&base), ids(&alone[i]), "request {i}: adapter {a:?} changed nothing");
        }
    }
}

#[test]
fn an_adapter_that_does_not_fit_is_refused_naming_what() {
    let (cfg, w) = tiny();
    // Rank over the limit.
    let small = LoraLimits { max_loras: 1, max_rank: 4 };
    let mut m =
        Model::from_weights_lora(RefBackend::new(), cfg.clone(), &w, lora_load_options(32, 1), Some(small)).unwrap();
    let all = LoraAdapter::load(&adapter_dir("tiny-all"), &cfg).unwrap();
    let e = m.load_lora(0, &all).unwrap_err().to_string();
    assert!(e.contains("rank 8") && e.contains("--max-lora-rank") && e.contains("tiny-all"), "{e}");
    // A slot beyond --max-loras.
    let rs = LoraAdapter::load(&adapter_dir("tiny-rs"), &cfg).unwrap();
    let e = m.load_lora(1, &rs).unwrap_err().to_string();
    assert!(e.contains("--max-loras"), "{e}");
    // An adapter made for another model: the first tensor whose shape does not fit is named.
    let phi3 = golden_model("tiny-phi3");
    let other = ModelConfig::from_file(&phi3.join("config.json")).unwrap();
    if other.intermediate_size != cfg.intermediate_size || other.hidden_size != cfg.hidden_size {
        let e = LoraAdapter::load(&adapter_dir("tiny-all"), &other).err().expect("shapes differ").to_string();
        assert!(e.contains("lora_") && e.contains("shape"), "{e}");
    }
    // The config's rank against the tensors' shapes.
    let path = Path::new("adapter_config.json");
    let conf = AdapterConfig::from_json(r#"{"r":4,"lora_alpha":8,"target_modules":["q_proj"]}"#, path).unwrap();
    let mut t = Weights::empty();
    t.replace("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType::F32, &[8, 64], &[0.1; 512])
        .unwrap();
    t.replace("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", DType::F32, &[64, 8], &[0.1; 512])
        .unwrap();
    let e = LoraAdapter::from_parts(Path::new("bad"), &conf, &t, &cfg).err().unwrap().to_string();
    assert!(e.contains("q_proj.lora_A.weight") && e.contains("[8, 64]") && e.contains("[4, 64]"), "{e}");
    // A module that is not a projection, a module the config does not target, a layer too many.
    let module = |m: &str, conf: &AdapterConfig| {
        let mut t = Weights::empty();
        t.replace(&format!("base_model.model.{m}.lora_A.weight"), DType::F32, &[4, 64], &[0.1; 256]).unwrap();
        t.replace(&format!("base_model.model.{m}.lora_B.weight"), DType::F32, &[64, 4], &[0.1; 256]).unwrap();
        LoraAdapter::from_parts(Path::new("bad"), conf, &t, &cfg).err().unwrap().to_string()
    };
    let e = module("lm_head", &conf);
    assert!(e.contains("lm_head") && e.contains("not a projection"), "{e}");
    let e = module("model.layers.0.self_attn.k_proj", &conf);
    assert!(e.contains("k_proj") && e.contains("target_modules"), "{e}");
    let e = module("model.layers.5.self_attn.q_proj", &conf);
    assert!(e.contains("layer 5") && e.contains("2 layers"), "{e}");
    let conf = AdapterConfig::from_json(r#"{"r":4,"target_modules":"all-linear"}"#, path).unwrap();
    let e = module("model.layers.0.mlp.w1", &conf);
    assert!(e.contains("w1") && e.contains("not supported"), "{e}");
}

#[test]
fn a_batch_naming_an_adapter_that_is_not_there_is_refused() {
    let (cfg, w) = tiny();
    let opts = lora_load_options(32, 1);
    let mut b = ForwardBatch { max_blocks: 1, ..Default::default() };
    b.push_seq(&[1, 2], 0, &[0], 16, true);
    b.adapters = vec![Some(0)];
    let mut plain = Model::from_weights(RefBackend::new(), cfg.clone(), &w, opts).unwrap();
    let e = plain.forward(&b).unwrap_err().to_string();
    assert!(e.contains("LoRA is not enabled"), "{e}");
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let mut m = Model::from_weights_lora(RefBackend::new(), cfg.clone(), &w, opts, Some(limits)).unwrap();
    let e = m.forward(&b).unwrap_err().to_string();
    assert!(e.contains("slot 0") && e.contains("holds no adapter"), "{e}");
    m.load_lora(0, &LoraAdapter::load(&adapter_dir("tiny-all"), &cfg).unwrap()).unwrap();
    m.forward(&b).unwrap();
    m.unload_lora(0);
    assert!(m.forward(&b).is_err(), "an unloaded slot is refused again");
    b.adapters = vec![None, None];
    let e = m.forward(&b).unwrap_err().to_string();
    assert!(e.contains("2 adapters for 1 sequences"), "{e}");
}

#[test]
fn the_lora_op_gives_a_row_alone_its_bits_in_a_mixed_batch() {
    use tandem_conformance::ops::{lora_rows_alone, Lora};
    for operand in [DType::F32, DType::BF16] {
        let case = Lora { rows: 37, inp: 576, out: 192, max_loras: 4, max_rank: 16, operand };
        lora_rows_alone(&RefBackend::new(), &case, 7).unwrap();
    }
}
