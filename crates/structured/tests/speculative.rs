//! Structured output under speculative decoding, through the whole engine (reference backend,
//! a seeded random tiny model with its tokenizer): a JSON schema, a regex and a choice list,
//! greedy, greedy with a repetition penalty (sampled on the host) and seeded sampled, give the
//! same tokens, text and finish with n-gram or suffix drafts as without; drafts are proposed,
//! cut where the grammar rejects them, and some are accepted.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::speculative::SpeculativeConfig;
use tandem_engine::{
    tokenizer_decode_fn, Engine, EngineConfig, FinishReason, Request, RequestOutput, SamplingParams, Stats,
};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;
use tandem_structured::{GuideSpec, Structured};

fn tiny(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-structured-spec-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 3, DType::F32).unwrap();
    d
}

fn engine(dir: &Path, spec: Option<SpeculativeConfig>) -> (Engine, Arc<Tokenizer>, Structured) {
    let opts =
        LoadOptions { max_batch_tokens: 512, max_seqs: 64, num_kv_blocks: 2048, block_size: 16, ..Default::default() };
    let runner: Box<dyn ModelRunner> = Box::new(Model::load(RefBackend::new(), dir, opts).unwrap());
    let mut tok = Tokenizer::from_dir(dir).unwrap();
    tok.add_eos_ids(&runner.config().eos_token_ids);
    let tok = Arc::new(tok);
    let structured = Structured::from_model_dir(dir, &tok.eos_ids).unwrap();
    let cfg = EngineConfig { speculative: spec, ..Default::default() };
    let e = Engine::new(runner, tokenizer_decode_fn(tok.clone()), cfg).unwrap();
    (e, tok, structured)
}

/// One request's tokens, text and finish.
type Answer = (Vec<u32>, String, FinishReason);

fn run(e: &mut Engine, reqs: Vec<Request>) -> Vec<Answer> {
    let mut streams: Vec<_> = reqs.into_iter().map(|r| e.add_request(r).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    streams
        .iter_mut()
        .map(|s| {
            let outs: Vec<RequestOutput> = std::iter::from_fn(|| s.try_recv()).collect();
            let tokens = outs.iter().flat_map(|o| o.token_ids.iter().copied()).collect();
            let text = outs.iter().map(|o| o.text.as_str()).collect();
            let fin = outs.last().and_then(|o| o.finish_reason.clone()).expect("a final output");
            (tokens, text, fin)
        })
        .collect()
}

/// Each form greedy and seeded at temperature 0.8, and with `host` greedy with a repetition
/// penalty too (which has every row of its steps sampled on the host).
fn requests(tok: &Tokenizer, s: &Structured, host: bool) -> Vec<Request> {
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", "none"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4}
        },
        "required": ["name", "age", "pet", "tags"],
        "additionalProperties": false
    });
    let forms = [
        GuideSpec::JsonSchema(schema),
        GuideSpec::Regex("(ab|cd)[0-9]{2,6}(-(ab|cd)[0-9]{2,6}){0,3}".into()),
        // Every position allows a token or two: a row sampled under another row's mask shows.
        GuideSpec::Regex("(abc|xyz){4,12}".into()),
        GuideSpec::Choice(vec!["red".into(), "blue sky blue sky blue sky".into(), "green sea green sea".into()]),
    ];
    let prompt = tok.encode("Answer:", false).unwrap();
    let mut reqs = vec![];
    for f in &forms {
        let mut kinds = vec![(0.0, 1.0, None), (0.8, 1.0, Some(5))];
        if host {
            kinds.push((0.0, 1.3, None));
        }
        for (temperature, repetition_penalty, seed) in kinds {
            let params = SamplingParams {
                temperature,
                repetition_penalty,
                seed,
                max_tokens: Some(160),
                guided: Some(s.compile(f).unwrap()),
                ..Default::default()
            };
            reqs.push(Request { prompt: prompt.clone(), params, priority: 0 });
        }
    }
    reqs
}

/// A batch sampled on the device, one with a row that needs the host (so all its rows are
/// sampled there), and the first again (by then the suffix tree holds the earlier outputs, so
/// its drafts are long and right).
fn answers(dir: &Path, spec: Option<SpeculativeConfig>) -> (Vec<Answer>, Stats) {
    let (mut e, tok, s) = engine(dir, spec);
    let mut got = run(&mut e, requests(&tok, &s, false));
    got.extend(run(&mut e, requests(&tok, &s, true)));
    got.extend(run(&mut e, requests(&tok, &s, false)));
    (got, e.stats())
}

#[test]
fn structured_output_is_the_same_with_drafts_as_without() {
    let dir = tiny("same");
    let (want, _) = answers(&dir, None);
    assert!(want.iter().any(|a| matches!(a.2, FinishReason::Stop { .. })), "no answer ended by its grammar: {want:?}");
    let ngram = SpeculativeConfig { prompt_lookup_min: 1, prompt_lookup_max: 3, ..SpeculativeConfig::ngram(3) };
    for spec in [ngram, SpeculativeConfig::suffix(6)] {
        let method = spec.method.as_str();
        let (got, st) = answers(&dir, Some(spec));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "{method}: request {i}");
        }
        println!(
            "{method}: {} drafts, {} draft tokens, {} accepted",
            st.spec_decode_num_drafts_total,
            st.spec_decode_num_draft_tokens_total,
            st.spec_decode_num_accepted_tokens_total
        );
        assert!(st.spec_decode_num_drafts_total > 0, "{method}: no drafts under structured output: {st:?}");
        if method == "suffix" {
            assert!(st.spec_decode_num_accepted_tokens_total > 0, "{method}: nothing accepted: {st:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
