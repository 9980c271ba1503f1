//! Speculative decoding on wgpu never changes a greedy answer: the same requests run with and
//! without drafts (n-gram and suffix, several draft lengths) give the same tokens, text and
//! finish reasons, in one batch and each alone, and the streamed pieces join into the same
//! answer; and so do requests with logprobs, penalties that grow with each drafted copy, and
//! n > 1. The verification forward scores `1 + k` rows a sequence, so this leans on the
//! backend's batch invariance across row counts. Needs a Vulkan adapter: SKIPPED without one,
//! a failure under TANDEM_REQUIRE_WGPU=1.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{Engine, EngineConfig, FinishReason, Request, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};

fn runner(dir: &Path) -> Option<Box<dyn ModelRunner>> {
    let opts =
        LoadOptions { max_batch_tokens: 256, max_seqs: 8, num_kv_blocks: 64, block_size: 16, ..Default::default() };
    Some(Box::new(Model::load(common::open(Default::default())?, dir, opts).unwrap()))
}

fn engine(runner: Box<dyn ModelRunner>, speculative: Option<SpeculativeConfig>) -> Engine {
    let text: tandem_engine::DecodeFn =
        Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect());
    Engine::new(runner, text, EngineConfig { speculative, ..Default::default() }).unwrap()
}

/// Each request's tokens, text and finish reason; also checks that the streamed pieces were
/// one final message and that no block leaked.
type Answer = (Vec<u32>, String, Option<FinishReason>);

fn run(e: &mut Engine, reqs: &[Request]) -> Vec<Answer> {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    let mut steps = 0;
    while e.has_work() {
        e.step();
        steps += 1;
        assert!(steps < 10_000, "the engine does not finish");
    }
    let bm = &e.scheduler().bm;
    assert_eq!(bm.num_free(), bm.num_blocks(), "a block leaked");
    streams
        .iter_mut()
        .map(|s| {
            let (mut tokens, mut text, mut finish, mut finals) = (vec![], String::new(), None, 0);
            while let Some(o) = s.try_recv() {
                assert!(!matches!(o.finish_reason, Some(FinishReason::Error(_))), "{o:?}");
                tokens.extend(&o.token_ids);
                text += &o.text;
                if o.finish_reason.is_some() {
                    finish = o.finish_reason.clone();
                }
                finals += o.finished as usize;
            }
            assert_eq!(finals, 1, "one final message");
            (tokens, text, finish)
        })
        .collect()
}

#[test]
fn wgpu_greedy_answers_are_identical_with_and_without_drafts() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-speculative-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(probe) = runner(&dir) else { return };
    let vocab = probe.config().vocab_size as u32;
    drop(probe);

    // Prompts that repeat (drafts found and accepted) and prompts that do not.
    let motif: Vec<u32> = (0..7).map(|i| (i * 41 + 3) % vocab).collect();
    let mut prompts = vec![motif.repeat(4), motif.repeat(2)];
    prompts.extend((0..3u32).map(|i| (0..9 + i * 6).map(|j| (j * 101 + i * 7 + 1) % vocab).collect()));
    let reqs: Vec<Request> = prompts
        .into_iter()
        .map(|prompt| Request {
            prompt,
            params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(32) },
            priority: 0,
        })
        .collect();

    let want = run(&mut engine(runner(&dir).unwrap(), None), &reqs);
    for spec in [SpeculativeConfig::ngram(2), SpeculativeConfig::ngram(4), SpeculativeConfig::suffix(4)] {
        let mut e = engine(runner(&dir).unwrap(), Some(spec.clone()));
        assert_eq!(run(&mut e, &reqs), want, "{spec:?}, in a batch");
        let st = e.stats();
        println!(
            "{:?} k={}: {} drafts, {} draft tokens, {} accepted",
            spec.method,
            spec.num_speculative_tokens,
            st.spec_decode_num_drafts_total,
            st.spec_decode_num_draft_tokens_total,
            st.spec_decode_num_accepted_tokens_total
        );
        assert!(st.spec_decode_num_accepted_tokens_total > 0, "{spec:?}: no draft was accepted");
        assert!(
            st.spec_decode_num_accepted_tokens_total < st.spec_decode_num_draft_tokens_total,
            "{spec:?}: no draft was rejected"
        );
        for (r, w) in reqs.iter().zip(&want) {
            let mut e = engine(runner(&dir).unwrap(), Some(spec.clone()));
            assert_eq!(&run(&mut e, std::slice::from_ref(r))[0], w, "{spec:?}, alone");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An EAGLE-3 head (tests/golden/eagle3-tiny, made for this target's shape) drafting from the
/// hidden states the wgpu forward keeps: the same greedy answers, in a batch and alone.
#[test]
fn wgpu_greedy_answers_are_identical_with_an_eagle3_head() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-eagle3-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(probe) = runner(&dir) else { return };
    drop(probe);
    let head = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/eagle3-tiny");
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
    let reqs: Vec<Request> = [vec![119; 4], vec![1, 2, 3], (10..30).collect()]
        .into_iter()
        .map(|prompt| Request { prompt, params: params.clone(), priority: 0 })
        .collect();
    let want = run(&mut engine(runner(&dir).unwrap(), None), &reqs);
    let spec = SpeculativeConfig::eagle3(head, 3);
    let mut e = engine(runner(&dir).unwrap(), Some(spec.clone()));
    assert_eq!(run(&mut e, &reqs), want, "in a batch");
    let st = e.stats();
    assert!(st.spec_decode_num_drafts_total > 0, "the head proposed nothing: {st:?}");
    for (r, w) in reqs.iter().zip(&want) {
        let mut e = engine(runner(&dir).unwrap(), Some(spec.clone()));
        assert_eq!(&run(&mut e, std::slice::from_ref(r))[0], w, "alone");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hidden states the wgpu forward keeps for a draft head are the reference's (two
/// prefills, then a decode beside a 3-token verification chunk), on whichever residual path
/// the backend takes; and the plain forward after turning them off keeps none.
#[test]
fn wgpu_aux_hidden_states_match_the_reference() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-aux-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(mut gpu) = runner(&dir) else { return };
    let opts =
        LoadOptions { max_batch_tokens: 256, max_seqs: 8, num_kv_blocks: 64, block_size: 16, ..Default::default() };
    let mut cpu = Model::load(tandem_reference::RefBackend::new(), &dir, opts).unwrap();
    let layers = [0, 1, 1];
    gpu.set_aux_layers(&layers).unwrap();
    cpu.set_aux_layers(&layers).unwrap();
    let mut prefill = tandem_core::ForwardBatch { max_blocks: 2, ..Default::default() };
    prefill.push_seq(&(1..21).collect::<Vec<u32>>(), 0, &[0, 1], 16, true);
    prefill.push_seq(&[7, 8, 9], 0, &[2, 3], 16, true);
    let mut next = tandem_core::ForwardBatch { max_blocks: 2, ..Default::default() };
    next.push_seq(&[40], 20, &[0, 1], 16, true);
    next.push_seq(&[50, 51, 52], 3, &[2, 3], 16, true);
    for (i, batch) in [prefill, next].iter().enumerate() {
        gpu.forward(batch).unwrap();
        cpu.forward(batch).unwrap();
        let (got, want) = (gpu.take_aux_hidden(), cpu.take_aux_hidden());
        assert_eq!(want.len(), batch.num_tokens() * layers.len() * 64, "step {i}: the reference's rows");
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        common::assert_close(&format!("aux hidden states, step {i}"), &got, &want64, 1e-7);
    }
    gpu.set_aux_layers(&[]).unwrap();
    let mut decode = tandem_core::ForwardBatch { max_blocks: 2, ..Default::default() };
    decode.push_seq(&[41], 21, &[0, 1], 16, true);
    gpu.forward(&decode).unwrap();
    assert!(gpu.take_aux_hidden().is_empty(), "aux rows kept after turning them off");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each completion's tokens and printed logprobs.
fn run_kinds(e: &mut Engine, reqs: &[Request]) -> Vec<Vec<(Vec<u32>, Vec<String>)>> {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    streams
        .iter_mut()
        .zip(reqs)
        .map(|(s, r)| {
            let mut c = vec![(vec![], vec![]); r.params.n];
            while let Some(o) = s.try_recv() {
                assert!(!matches!(o.finish_reason, Some(FinishReason::Error(_))), "{o:?}");
                c[o.index].0.extend(&o.token_ids);
                c[o.index].1.extend(o.logprobs.iter().map(|l| format!("{l:?}")));
            }
            c
        })
        .collect()
}

#[test]
fn wgpu_logprobs_penalties_and_n_keep_their_answers_with_drafts() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-speculative-kinds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(probe) = runner(&dir) else { return };
    let vocab = probe.config().vocab_size as u32;
    drop(probe);

    let t = 17 % vocab;
    let motif: Vec<u32> = (0..7).map(|i| (i * 41 + 3) % vocab).collect();
    let greedy = |f: &dyn Fn(&mut SamplingParams)| {
        let mut p = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(24) };
        f(&mut p);
        p
    };
    let reqs = vec![
        Request { prompt: motif.repeat(4), params: greedy(&|p| p.logprobs = Some(2)), priority: 0 },
        // A token pushed up repeats until its growing frequency penalty ends the run.
        Request {
            prompt: vec![t; 12],
            params: greedy(&|p| {
                p.logit_bias = vec![(t, 12.0)];
                p.frequency_penalty = 0.2;
            }),
            priority: 0,
        },
        Request {
            prompt: motif.repeat(3),
            params: greedy(&|p| {
                p.n = 2;
                p.temperature = 0.8;
                p.seed = Some(4);
                p.logprobs = Some(1);
            }),
            priority: 0,
        },
    ];
    let want = run_kinds(&mut engine(runner(&dir).unwrap(), None), &reqs);
    let mut e = engine(runner(&dir).unwrap(), Some(SpeculativeConfig::ngram(3)));
    assert_eq!(run_kinds(&mut e, &reqs), want);
    let st = e.stats();
    assert!(st.spec_decode_num_accepted_tokens_total > 0, "no draft was accepted: {st:?}");
    assert_eq!(want[0][0].1.len(), 24, "one logprobs entry a token");
    let _ = std::fs::remove_dir_all(&dir);
}
