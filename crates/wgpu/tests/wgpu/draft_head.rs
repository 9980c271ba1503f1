//! An EAGLE-3 head on wgpu: its drafts are the host head's on the golden head
//! (tests/golden/eagle3-tiny), and with the head on the device greedy answers are the same as
//! without drafts, and its drafts the host head's (the same counters). Needs a Vulkan
//! adapter: SKIPPED without one, a failure under TANDEM_REQUIRE_WGPU=1.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tandem_core::device_head::DeviceHead;
use tandem_core::eagle3::{Eagle3Head, HeadCache, HeadModel};
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelConfig, ModelRunner};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams, Stats};
use tandem_model_files::random_model::{write_random_model, Shape};

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny")
}

#[test]
fn wgpu_device_head_proposes_the_host_heads_drafts() {
    let Some(b) = common::open(Default::default()) else { return };
    let target = ModelConfig::from_json(
        &serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 384, "rms_norm_eps": 1e-5, "max_position_embeddings": 2048,
        })
        .to_string(),
    )
    .unwrap();
    let host = Eagle3Head::load(&golden(), &target).unwrap();
    let dev = DeviceHead::upload(&b, &host).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden().join("expected.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let aux: Vec<f32> = v["aux"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let w = dev.aux_width();
    let mut cache = HeadCache::default();
    for n in 2..=tokens.len() {
        let want = host.propose(&mut HeadCache::default(), &tokens[..n], &aux[..(n - 1) * w], 0, 4).unwrap();
        let from = cache.len().saturating_sub(1);
        let got = dev.propose(&b, &mut cache, &tokens[..n], &aux[from * w..(n - 1) * w], from, 4).unwrap();
        assert_eq!(got.unwrap(), want, "prefix of {n} tokens");
    }
}

fn run(dir: &Path, spec: Option<SpeculativeConfig>, reqs: &[Request]) -> Option<(Vec<Vec<u32>>, Stats)> {
    let opts =
        LoadOptions { max_batch_tokens: 256, max_seqs: 8, num_kv_blocks: 64, block_size: 16, ..Default::default() };
    let runner: Box<dyn ModelRunner> = Box::new(Model::load(common::open(Default::default())?, dir, opts).unwrap());
    let text: tandem_engine::DecodeFn =
        Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect());
    let mut e = Engine::new(runner, text, EngineConfig { speculative: spec, ..Default::default() }).unwrap();
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    let out = streams
        .iter_mut()
        .map(|s| {
            let mut t = vec![];
            while let Some(o) = s.try_recv() {
                t.extend(&o.token_ids);
            }
            t
        })
        .collect();
    Some((out, e.stats()))
}

#[test]
fn wgpu_greedy_answers_are_identical_with_a_device_head() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-draft-head-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(30) };
    let reqs: Vec<Request> = [vec![1, 2, 3], (10..40).collect(), vec![7; 20]]
        .into_iter()
        .map(|prompt| Request { prompt, params: params.clone(), priority: 0 })
        .collect();
    let Some((want, _)) = run(&dir, None, &reqs) else { return };
    let mut counters = vec![];
    for on_device in [true, false] {
        let spec = SpeculativeConfig { head_on_device: on_device, ..SpeculativeConfig::eagle3(golden(), 3) };
        let (got, st) = run(&dir, Some(spec), &reqs).unwrap();
        assert_eq!(got, want, "on device {on_device}");
        assert!(st.spec_decode_num_drafts_total > 0, "the head proposed nothing: {st:?}");
        counters.push((st.spec_decode_num_draft_tokens_total, st.spec_decode_num_accepted_tokens_per_pos));
    }
    assert_eq!(counters[0], counters[1], "the device head's drafts are the host head's");
    let _ = std::fs::remove_dir_all(&dir);
}
