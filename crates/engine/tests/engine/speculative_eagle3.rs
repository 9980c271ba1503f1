//! EAGLE-3 draft heads in the engine, on the reference backend's real forward of the `tiny`
//! random target: greedy (and seeded) answers are the same with the head's drafts as without,
//! in a batch, alone, with n > 1 and under preemption; a head built to propose what the
//! target says gets its drafts accepted; a head that does not fit the target is refused.
//! The head is tests/golden/eagle3-tiny (made by tests/eagle3_golden.py, whose plain PyTorch
//! head core's tests check the proposals against).

use crate::common;
use crate::draft_heads::*;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::DType;
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, EngineError, Request};
use tandem_model_files::random_model::{write_random_model, Shape};

fn golden_head() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny")
}

fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-eagle3-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn model_dir(test: &str, shape: Shape) -> PathBuf {
    let d = scratch(test);
    write_random_model(&d, shape, 11, DType::F32).unwrap();
    d
}

/// The head on the backend (the default) and on the host (the oracle): the same answers as
/// without drafts, and the same drafts (every counter equal).
#[test]
fn answers_are_the_same_with_an_eagle3_head() {
    let dir = model_dir("same", Shape::Tiny);
    let reqs = requests();
    let (want, _) = run(&dir, 256, None, &reqs);
    let mut counters = vec![];
    for on_device in [true, false] {
        let spec = SpeculativeConfig { head_on_device: on_device, ..SpeculativeConfig::eagle3(golden_head(), 3) };
        let (got, st) = run(&dir, 256, Some(spec.clone()), &reqs);
        assert_eq!(got, want, "in a batch, on device {on_device}");
        assert!(st.spec_decode_num_drafts_total > 0, "the head proposed nothing: {st:?}");
        counters.push((
            st.spec_decode_num_drafts_total,
            st.spec_decode_num_draft_tokens_total,
            st.spec_decode_num_accepted_tokens_per_pos.clone(),
        ));
        for (r, w) in reqs.iter().zip(&want) {
            assert_eq!(&run(&dir, 256, Some(spec.clone()), std::slice::from_ref(r)).0[0], w, "alone");
        }
        // A pool of 10 blocks for 5 sequences of up to 70 tokens: some are preempted and
        // recomputed, and their drafts start again from the kept rows.
        let (got, st) = run(&dir, 10, Some(spec), &reqs);
        assert_eq!(got, want, "under preemption, on device {on_device}");
        assert!(st.preemptions_total > 0, "nothing was preempted: {st:?}");
    }
    assert_eq!(counters[0], counters[1], "the device head's drafts are the host head's");
    println!("(verifications, draft tokens, accepted per position): {:?}", counters[0]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same prompt twice, one after the other: the second's first two blocks come from the
/// prefix cache, and its head drafts from the rows kept with them exactly what it drafted
/// for the first (the same drafts, accepted at the same positions; the answer unchanged).
#[test]
fn a_prefix_cache_hit_drafts_as_the_first_run_did() {
    let dir = model_dir("prefix", Shape::Tiny);
    let req = Request { prompt: (0..40).map(|i| (i * 37 + 11) % 384).collect(), params: greedy(30), priority: 0 };
    let (want, _) = run(&dir, 256, None, std::slice::from_ref(&req));
    for on_device in [true, false] {
        let spec = SpeculativeConfig { head_on_device: on_device, ..SpeculativeConfig::eagle3(golden_head(), 3) };
        let cfg = EngineConfig { speculative: Some(spec), ..Default::default() };
        let mut e = Engine::new(runner(&dir, 256), letters(), cfg).unwrap();
        let mut once = || {
            let before = e.stats();
            let mut s = e.add_request(req.clone()).unwrap();
            run_to_idle(&mut e);
            let after = e.stats();
            let per_pos: Vec<u64> = (0..after.spec_decode_num_accepted_tokens_per_pos.len())
                .map(|i| {
                    after.spec_decode_num_accepted_tokens_per_pos[i]
                        - before.spec_decode_num_accepted_tokens_per_pos.get(i).copied().unwrap_or(0)
                })
                .collect();
            let counts = (
                after.spec_decode_num_drafts_total - before.spec_decode_num_drafts_total,
                after.spec_decode_num_draft_tokens_total - before.spec_decode_num_draft_tokens_total,
                after.spec_decode_num_accepted_tokens_total - before.spec_decode_num_accepted_tokens_total,
                per_pos,
            );
            let hits = after.prefix_cache_hits_total - before.prefix_cache_hits_total;
            (collect(&drain(&mut s), 1).tokens[0].clone(), counts, hits)
        };
        let (first, drafted, hits) = once();
        assert_eq!(hits, 0);
        let (second, again, hits) = once();
        assert_eq!(hits, 32, "the second run's first two blocks come from the prefix cache");
        assert!(drafted.1 > 0, "the head proposed nothing: {drafted:?}");
        assert_eq!(again, drafted, "(verifications, draft tokens, accepted, accepted per position)");
        assert_eq!(first, want[0][0].0);
        assert_eq!(second, want[0][0].0);
        println!("drafts after a prefix-cache hit, on device {on_device}: {again:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes `tensors` (name, shape, little-endian bytes, safetensors dtype) as a safetensors file.
fn write_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<u8>, &str)]) {
    let mut header = serde_json::Map::new();
    let mut off = 0;
    for (name, shape, bytes, dtype) in tensors {
        let entry = serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + bytes.len()]});
        header.insert(name.to_string(), entry);
        off += bytes.len();
    }
    let h = serde_json::Value::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    tensors.iter().for_each(|t| out.extend_from_slice(&t.2));
    std::fs::write(path, out).unwrap();
}

/// A head whose weights are all zero: every logit ties, draft id 0 wins, and `d2t` maps it to
/// `token`; so it always proposes `token`.
fn head_proposing(dir: &Path, token: u32) {
    std::fs::create_dir_all(dir).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_head().join("config.json")).unwrap()).unwrap();
    cfg["draft_vocab_size"] = serde_json::json!(1);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let zeros = |shape: &[usize]| vec![0u8; shape.iter().product::<usize>() * 4];
    let (d, q, kv, inter) = (64, 64, 32, 96);
    let mut t: Vec<(&str, Vec<usize>, Vec<u8>, &str)> = [
        ("embed_tokens.weight", vec![384, d]),
        ("fc.weight", vec![d, 3 * d]),
        ("midlayer.input_layernorm.weight", vec![d]),
        ("midlayer.hidden_norm.weight", vec![d]),
        ("midlayer.self_attn.q_proj.weight", vec![q, 2 * d]),
        ("midlayer.self_attn.k_proj.weight", vec![kv, 2 * d]),
        ("midlayer.self_attn.v_proj.weight", vec![kv, 2 * d]),
        ("midlayer.self_attn.o_proj.weight", vec![d, q]),
        ("midlayer.post_attention_layernorm.weight", vec![d]),
        ("midlayer.mlp.gate_proj.weight", vec![inter, d]),
        ("midlayer.mlp.up_proj.weight", vec![inter, d]),
        ("midlayer.mlp.down_proj.weight", vec![d, inter]),
        ("norm.weight", vec![d]),
        ("lm_head.weight", vec![1, d]),
    ]
    .into_iter()
    .map(|(n, s)| {
        let z = zeros(&s);
        (n, s, z, "F32")
    })
    .collect();
    t.push(("d2t", vec![1], (token as i64).to_le_bytes().to_vec(), "I64"));
    write_safetensors(&dir.join("model.safetensors"), &t);
}

#[test]
fn a_head_built_to_propose_the_targets_token_is_accepted() {
    let dir = model_dir("accept", Shape::Tiny);
    // After 4 tokens the target says 283 to the end (found with transformers on the same
    // seeded model): a head that always proposes it is right from there on.
    let reqs = vec![Request { prompt: vec![119; 4], params: greedy(60), priority: 0 }];
    let (want, _) = run(&dir, 256, None, &reqs);
    let out = &want[0][0].0;
    let top = *out.iter().max_by_key(|&&t| out.iter().filter(|&&x| x == t).count()).unwrap();
    assert!(out[10..].iter().all(|&t| t == top), "the target's answer changed: {out:?}");
    let head = scratch("accept-head");
    head_proposing(&head, top);
    let (got, st) = run(&dir, 256, Some(SpeculativeConfig::eagle3(&head, 3)), &reqs);
    assert_eq!(got, want);
    println!(
        "token {top} said {} times of {}: {} drafts, {} draft tokens, {} accepted",
        out.iter().filter(|&&x| x == top).count(),
        out.len(),
        st.spec_decode_num_drafts_total,
        st.spec_decode_num_draft_tokens_total,
        st.spec_decode_num_accepted_tokens_total
    );
    // Some 50 tokens of the answer are the head's: most are accepted drafts.
    assert!(st.spec_decode_num_accepted_tokens_total >= 30, "too little accepted: {st:?}");
    assert_eq!(st.spec_decode_num_accepted_tokens_per_pos.len(), 3);
    assert!(st.spec_decode_num_accepted_tokens_per_pos[0] > 0);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&head);
}

#[test]
fn a_head_that_does_not_fit_the_target_is_refused() {
    // tiny-hd128: hidden 256 where the head was made for 64.
    let dir = model_dir("refused", Shape::TinyHd128);
    let cfg = EngineConfig { speculative: Some(SpeculativeConfig::eagle3(golden_head(), 3)), ..Default::default() };
    match Engine::new(runner(&dir, 64), letters(), cfg) {
        Err(EngineError::Config(e)) => assert!(e.contains("hidden size") && e.contains("256"), "{e}"),
        Ok(_) => panic!("a head of the wrong width was accepted"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hidden states the forward keeps for a head are HF transformers' `output_hidden_states`
/// (entry `l`: the input to layer `l`) of the same seeded target and prompt
/// (tests/golden/eagle3-tiny/target_hidden.json, from tests/eagle3_golden.py --target), in a
/// prefill chunked in two.
#[test]
fn aux_hidden_states_are_transformers_hidden_states() {
    let dir = model_dir("aux", Shape::Tiny);
    let text = std::fs::read_to_string(golden_head().join("target_hidden.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let layers: Vec<usize> = v["layers"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let want: Vec<Vec<f32>> = v["hidden"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    let mut r = runner(&dir, 16);
    r.set_aux_layers(&layers).unwrap();
    let (d, w, cut) = (64, 64 * layers.len(), 5);
    let mut got = vec![];
    for (start, chunk) in [(0, &tokens[..cut]), (cut, &tokens[cut..])] {
        let mut b = tandem_core::ForwardBatch { max_blocks: 1, ..Default::default() };
        b.push_seq(chunk, start, &[0], 16, true);
        r.forward(&b).unwrap();
        got.extend(r.take_aux_hidden());
    }
    assert_eq!(got.len(), tokens.len() * w);
    for (j, hf) in want.iter().enumerate() {
        for (t, row) in hf.chunks_exact(d).enumerate() {
            let mine = &got[t * w + j * d..t * w + (j + 1) * d];
            let err = mine.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(err < 1e-4, "layer {} token {t}: max |diff| {err}", layers[j]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
