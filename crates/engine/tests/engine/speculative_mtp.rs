//! MTP layers in the engine, on the reference backend's real forward of
//! tests/golden/mtp-tiny (a random MiMo model made by tests/mtp_golden.py: a Qwen2 model saved
//! by transformers with random MTP layer weights, whose proposals core's tests check against
//! a plain PyTorch MTP layer): greedy (and seeded) answers are the same with the layer's
//! drafts as without, in a batch, alone and under preemption; the hidden states the forward
//! keeps for the layer are transformers'; a model without MTP layers is refused.

use crate::common;
use crate::draft_heads::*;

use std::path::PathBuf;

use common::*;
use tandem_core::DType;
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, EngineError};
use tandem_model_files::random_model::{write_random_model, Shape};

fn golden() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/mtp-tiny")
}

#[test]
fn answers_are_the_same_with_mtp_layers() {
    let reqs = requests();
    let spec = SpeculativeConfig::mtp(golden(), 3);
    let (want, _) = run(&golden(), 256, None, &reqs);
    let (got, st) = run(&golden(), 256, Some(spec.clone()), &reqs);
    assert_eq!(got, want, "in a batch");
    assert!(st.spec_decode_num_drafts_total > 0, "the MTP layer proposed nothing: {st:?}");
    println!(
        "{} drafts, {} draft tokens, {} accepted",
        st.spec_decode_num_drafts_total,
        st.spec_decode_num_draft_tokens_total,
        st.spec_decode_num_accepted_tokens_total
    );
    for (r, w) in reqs.iter().zip(&want) {
        assert_eq!(&run(&golden(), 256, Some(spec.clone()), std::slice::from_ref(r)).0[0], w, "alone");
    }
    let (got, st) = run(&golden(), 10, Some(spec), &reqs);
    assert_eq!(got, want, "under preemption");
    assert!(st.preemptions_total > 0, "nothing was preempted: {st:?}");
}

/// The last layer's output the forward keeps for the MTP layer (before the final norm) is
/// the hidden state transformers computes there for the same model and tokens
/// (tests/golden/mtp-tiny/expected.json), in a prefill chunked in two.
#[test]
fn the_kept_hidden_states_are_transformers_last_layer_output() {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden().join("expected.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let want: Vec<f32> = v["hidden"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let mut r = runner(&golden(), 16);
    let layers = r.config().num_hidden_layers;
    assert!(r.set_aux_layers(&[layers + 1]).is_err(), "past the output is no layer");
    r.set_aux_layers(&[layers]).unwrap();
    let (d, cut) = (64, 9);
    let mut got = vec![];
    for (start, chunk) in [(0, &tokens[..cut]), (cut, &tokens[cut..])] {
        let mut b = tandem_core::ForwardBatch { max_blocks: 2, ..Default::default() };
        b.push_seq(chunk, start, &[0, 1], 16, true);
        r.forward(&b).unwrap();
        got.extend(r.take_aux_hidden());
    }
    assert_eq!(got.len(), tokens.len() * d);
    // expected.json holds every position's but the last.
    for (t, row) in want.chunks_exact(d).enumerate() {
        let mine = &got[t * d..(t + 1) * d];
        let err = mine.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-4, "token {t}: max |diff| {err}");
    }
}

#[test]
fn a_model_without_mtp_layers_is_refused() {
    let dir = std::env::temp_dir().join(format!("tandem-engine-mtp-refused-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let cfg = EngineConfig { speculative: Some(SpeculativeConfig::mtp(&dir, 2)), ..Default::default() };
    match Engine::new(runner(&dir, 64), letters(), cfg) {
        Err(EngineError::Config(e)) => assert!(e.contains("num_nextn_predict_layers"), "{e}"),
        Ok(_) => panic!("a model without MTP layers was accepted"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}
