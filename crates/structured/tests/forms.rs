//! Each structured-output form through the whole engine (reference backend): outputs of a
//! seeded random tiny model, greedy and sampled at several temperatures, all in one batch,
//! must parse and validate, and end with "stop" when the grammar completes; the real SmolLM2
//! (when installed) writes schema-valid JSON; bad specs are errors naming the form.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{json, Value};
use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::{tokenizer_decode_fn, Engine, EngineConfig, FinishReason, Request, RequestOutput, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;
use tandem_structured::{GuideSpec, Structured};

fn tiny(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-structured-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 3, DType::F32).unwrap();
    d
}

struct Setup {
    engine: Engine,
    tokenizer: Arc<Tokenizer>,
    structured: Structured,
}

fn setup(dir: &Path) -> Setup {
    let opts =
        LoadOptions { max_batch_tokens: 512, max_seqs: 64, num_kv_blocks: 2048, block_size: 16, ..Default::default() };
    let runner: Box<dyn ModelRunner> = Box::new(Model::load(RefBackend::new(), dir, opts).unwrap());
    let mut tok = Tokenizer::from_dir(dir).unwrap();
    tok.add_eos_ids(&runner.config().eos_token_ids);
    let tokenizer = Arc::new(tok);
    let structured = Structured::from_model_dir(dir, &tokenizer.eos_ids).unwrap();
    let engine = Engine::new(runner, tokenizer_decode_fn(tokenizer.clone()), EngineConfig::default()).unwrap();
    Setup { engine, tokenizer, structured }
}

/// Runs every request to its end; returns each one's text and finish reason.
fn run(e: &mut Engine, reqs: Vec<Request>) -> Vec<(String, FinishReason)> {
    let mut streams: Vec<_> = reqs.into_iter().map(|r| e.add_request(r).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    streams
        .iter_mut()
        .map(|s| {
            let outs: Vec<RequestOutput> = std::iter::from_fn(|| s.try_recv()).collect();
            let text: String = outs.iter().map(|o| o.text.as_str()).collect();
            let fin = outs.last().and_then(|o| o.finish_reason.clone()).expect("a final output");
            (text, fin)
        })
        .collect()
}

/// 15 requests: greedy and 14 seeded samples at temperatures 0.5 to 1.5.
fn variants(prompt: &[u32], spec: &GuideSpec, s: &Structured, max_tokens: usize) -> Vec<Request> {
    (0..15u64)
        .map(|i| {
            let temperature = if i == 0 { 0.0 } else { 0.5 + (i % 3) as f32 * 0.5 };
            let params = SamplingParams {
                temperature,
                seed: Some(i),
                max_tokens: Some(max_tokens),
                guided: Some(s.compile(spec).unwrap()),
                ..Default::default()
            };
            Request { prompt: prompt.to_vec(), params, priority: 0 }
        })
        .collect()
}

/// Finished by the grammar, or by the model's EOS where the grammar allowed it.
fn ended_by_grammar(f: &FinishReason) -> bool {
    matches!(f, FinishReason::Stop { stop_string: None, .. })
}

#[test]
fn every_form_gives_valid_text_greedy_and_sampled() {
    let dir = tiny("forms");
    let mut s = setup(&dir);
    let prompt = s.tokenizer.encode("Answer:", false).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "pet": {"enum": ["cat", "dog", "none"]},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "pet", "ok"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let rx = "[a-c]{2,5}-[0-9]{1,3}";
    let choices = vec!["red".to_string(), "green".into(), "blue \"sky\"\n".into(), "r".into()];
    let lark = "start: \"[\" num (\",\" num)? (\",\" num)? \"]\"\nnum: /[0-9]{1,2}/";

    let forms = [
        GuideSpec::JsonSchema(schema.clone()),
        GuideSpec::Regex(rx.into()),
        GuideSpec::Choice(choices.clone()),
        GuideSpec::Lark(lark.into()),
    ];
    let mut reqs = vec![];
    for f in &forms {
        reqs.extend(variants(&prompt, f, &s.structured, 600));
    }
    // One batch of 60: the forms share steps with each other.
    let got = run(&mut s.engine, reqs);
    let whole_rx = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    let lark_rx = regex::Regex::new(r"^\[[0-9]{1,2}(,[0-9]{1,2}){0,2}\]$").unwrap();
    for (k, (text, fin)) in got.iter().enumerate() {
        let form = forms[k / 15].kind();
        assert!(ended_by_grammar(fin), "{form} #{k}: finished with {fin:?}, text {text:?}");
        match k / 15 {
            0 => {
                let v: Value =
                    serde_json::from_str(text).unwrap_or_else(|e| panic!("{form} #{k}: {text:?} is not JSON: {e}"));
                assert!(validator.is_valid(&v), "{form} #{k}: {v} does not validate");
            }
            1 => assert!(whole_rx.is_match(text), "{form} #{k}: {text:?}"),
            2 => assert!(choices.contains(text), "{form} #{k}: {text:?}"),
            _ => assert!(lark_rx.is_match(text), "{form} #{k}: {text:?}"),
        }
    }
    // Sampling explores: the 15 texts of a form are not all one.
    for (i, f) in forms.iter().enumerate() {
        let mut distinct: Vec<&String> = got[i * 15..(i + 1) * 15].iter().map(|g| &g.0).collect();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() >= 2, "{}: every sample gave {:?}", f.kind(), distinct);
    }
    let st = s.engine.stats();
    assert!(st.guided_masks_total > 60, "masks were computed: {}", st.guided_masks_total);
    assert_eq!(s.engine.scheduler().bm.usage(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_object_mode_gives_an_object_or_a_prefix_of_one() {
    let dir = tiny("object");
    let mut s = setup(&dir);
    let prompt = s.tokenizer.encode("{", false).unwrap();
    let got = run(&mut s.engine, variants(&prompt, &GuideSpec::JsonObject, &s.structured, 120));
    let mut whole = 0;
    for (text, fin) in &got {
        assert!(text.trim_start().starts_with('{'), "{text:?}");
        if ended_by_grammar(fin) {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object(), "{v}");
            whole += 1;
        } else {
            // Random text may fill max_tokens inside a string; what came out is still a prefix
            // the grammar allowed, so it never parses as something else.
            assert_eq!(fin, &FinishReason::Length, "{text:?}");
        }
    }
    eprintln!("json_object: {whole} of {} ended by the grammar within 120 tokens", got.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_constrained_batch_leaves_an_unconstrained_request_as_it_is_alone() {
    let dir = tiny("mixed");
    let mut s = setup(&dir);
    let prompt = s.tokenizer.encode("Hello there", false).unwrap();
    let free = || Request {
        prompt: prompt.clone(),
        params: SamplingParams {
            temperature: 0.8,
            seed: Some(99),
            max_tokens: Some(24),
            ignore_eos: true,
            ..Default::default()
        },
        priority: 0,
    };
    let alone = run(&mut s.engine, vec![free()]);
    let mut reqs = variants(&prompt, &GuideSpec::Regex("[0-9]{3,8}".into()), &s.structured, 24);
    reqs.insert(7, free());
    let together = run(&mut s.engine, reqs);
    assert_eq!(together[7], alone[0]);
    for (i, (t, f)) in together.iter().enumerate().filter(|(i, _)| *i != 7) {
        assert!(
            ended_by_grammar(f) && (3..=8).contains(&t.len()) && t.chars().all(|c| c.is_ascii_digit()),
            "#{i}: {f:?} {t:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_specs_are_errors_naming_the_form() {
    let dir = tiny("bad");
    let s = setup(&dir);
    let cases = [
        (GuideSpec::Regex("(ab".into()), "regex"),
        (GuideSpec::JsonSchema(json!({"type": "strin"})), "json_schema"),
        (GuideSpec::JsonSchema(json!("not a schema")), "json_schema"),
        (
            GuideSpec::JsonSchema(
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}),
            ),
            "json_schema",
        ),
        (GuideSpec::Lark("start: foo".into()), "grammar"),
        (GuideSpec::Lark("start: \"a".into()), "grammar"),
        (GuideSpec::Choice(vec![]), "choice"),
    ];
    for (spec, kind) in cases {
        let e = s.structured.compile(&spec).err().unwrap_or_else(|| panic!("{spec:?} compiled"));
        assert_eq!(e.kind, kind, "{spec:?}: {e}");
        assert!(!e.message.is_empty());
        eprintln!("{spec:?} -> {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn smollm2() -> Option<PathBuf> {
    tandem_model_files::fetch::installed_default(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"))
}

#[test]
fn smollm2_writes_schema_valid_json() {
    let Some(dir) = smollm2() else { return };
    let mut s = setup(&dir);
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}, "population_millions": {"type": "number"}},
        "required": ["city", "country", "population_millions"],
        "additionalProperties": false
    });
    let validator = jsonschema::validator_for(&schema).unwrap();
    let msgs = [
        json!({"role": "user", "content": "Give the capital of France as JSON with city, country and population_millions."}),
    ];
    let text = s.tokenizer.apply_chat_template(&msgs, true).unwrap();
    let prompt = s.tokenizer.encode(&text, false).unwrap();
    let reqs: Vec<Request> = (0..4u64)
        .map(|i| Request {
            prompt: prompt.clone(),
            params: SamplingParams {
                temperature: [0.0, 0.7, 1.0, 1.3][i as usize],
                seed: Some(i),
                max_tokens: Some(80),
                guided: Some(s.structured.compile(&GuideSpec::JsonSchema(schema.clone())).unwrap()),
                ..Default::default()
            },
            priority: 0,
        })
        .collect();
    for (k, (text, fin)) in run(&mut s.engine, reqs).into_iter().enumerate() {
        assert!(ended_by_grammar(&fin), "#{k}: {fin:?} {text:?}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("#{k}: {text:?}: {e}"));
        assert!(validator.is_valid(&v), "#{k}: {v}");
        eprintln!("#{k}: {v}");
    }
}
