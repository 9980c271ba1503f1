//! The EAGLE-3 head on the reference backend ([`DeviceHead`]) proposes the host head's drafts
//! (and PyTorch's: tests/golden/eagle3-tiny) for growing prefixes of the golden sequence,
//! through one head cache and from scratch.

use std::path::PathBuf;

use tandem_core::device_head::DeviceHead;
use tandem_core::eagle3::{Eagle3Head, HeadCache, HeadModel};
use tandem_core::ModelConfig;
use tandem_reference::RefBackend;

#[test]
fn the_device_head_proposes_the_host_heads_drafts() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny");
    let target = ModelConfig::from_json(
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 384, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
        })
        .to_string(),
    )
    .unwrap();
    let host = Eagle3Head::load(&dir, &target).unwrap();
    let b = RefBackend::new();
    let dev = DeviceHead::upload(&b, &host).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let aux: Vec<f32> = v["aux"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let w = dev.aux_width();
    let mut cache = HeadCache::default();
    let mut cases = 0;
    for n in 2..=tokens.len() {
        let want = host.propose(&mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, 4).unwrap();
        let from = cache.len().saturating_sub(1);
        let got = dev.propose(&b, &mut cache, &tokens[..n], &aux[from * w..(n - 1) * w], from, 4).unwrap().unwrap();
        assert_eq!(got, want, "prefix of {n} tokens, through the cache");
        let fresh = dev.propose(&b, &mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, 4).unwrap();
        assert_eq!(fresh.unwrap(), want, "prefix of {n} tokens, from scratch");
        cases += 1;
    }
    for case in v["cases"].as_array().unwrap() {
        let n = case["len"].as_u64().unwrap() as usize;
        let k = case["k"].as_u64().unwrap() as usize;
        let want: Vec<u32> = case["drafts"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let got = dev.propose(&b, &mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, k).unwrap();
        assert_eq!(got.unwrap(), want, "PyTorch's drafts after {n} tokens");
    }
    assert!(cases > 20);
    // Rows that do not match the tokens: no drafts, as the host head.
    assert!(dev.propose(&b, &mut HeadCache::default(), &tokens[..5], &aux[..3 * w], 0, 2).unwrap().is_none());
}
