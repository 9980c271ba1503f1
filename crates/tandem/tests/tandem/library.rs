//! The library's promises on a tiny random model (reference backend): outputs in prompt order,
//! chat through the template, streams equal to offline outputs, a dropped stream aborts its
//! request and frees its KV blocks, a bad parameter is an error value naming the field.

use crate::common;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tandem::{ChatOptions, Error, FinishReason, Message, Prompt, SamplingParams};

const PROMPTS: [&str; 5] =
    ["The capital of France is", "1, 2, 3,", "def main():", "Once upon a time, in a land far away, there lived", "a"];

fn sampled(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        seed: Some(42),
        max_tokens: Some(max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

#[test]
fn generate_returns_one_output_per_prompt_in_order() {
    let llm = common::builder().build().unwrap();
    let params = sampled(12);
    let batch = llm.generate(PROMPTS, &params).unwrap();
    assert_eq!(batch.len(), PROMPTS.len());
    for (p, out) in PROMPTS.iter().zip(&batch) {
        assert_eq!(out.prompt_token_ids, llm.tokenizer().encode(p, true).unwrap(), "{p:?}");
        // Alone, each prompt gives what it gave in the batch (a seed's stream is the request's
        // own), so a batch in any other order would show here.
        let alone = llm.generate([*p], &params).unwrap().remove(0);
        assert_eq!(out.completions, alone.completions, "{p:?}");
        let c = &out.completions[0];
        assert_eq!((c.token_ids.len(), &c.finish_reason), (12, &FinishReason::Length));
        assert_eq!(out.usage.completion_tokens, 12);
        assert_eq!(out.usage.prompt_tokens, out.prompt_token_ids.len());
        assert_eq!(
            c.text,
            llm.tokenizer().decode(&c.token_ids, true).unwrap(),
            "the streamed text pieces add up to the decoded whole"
        );
        assert!(c.logprobs.is_none(), "not asked for");
    }
    // Different prompts, different samples: the outputs are not all one.
    assert!(batch.iter().any(|o| o.completions[0].token_ids != batch[0].completions[0].token_ids));
}

#[test]
fn n_completions_and_logprobs() {
    let llm = common::builder().build().unwrap();
    let params = SamplingParams { n: 3, logprobs: Some(2), ..sampled(6) };
    let out = llm.generate(["The capital of France is"], &params).unwrap().remove(0);
    assert_eq!(out.completions.len(), 3);
    for (i, c) in out.completions.iter().enumerate() {
        assert_eq!(c.index, i);
        let lp = c.logprobs.as_ref().expect("asked for");
        assert_eq!(lp.len(), c.token_ids.len());
        for (l, &t) in lp.iter().zip(&c.token_ids) {
            assert_eq!(l.token, t);
            assert!(l.logprob <= 0.0 && l.top.len() == 2, "{l:?}");
        }
    }
    assert_eq!(out.usage.completion_tokens, 18);
    assert!(
        out.completions[0].token_ids != out.completions[1].token_ids
            || out.completions[1].token_ids != out.completions[2].token_ids,
        "three streams of one seed differ"
    );
}

#[test]
fn chat_goes_through_the_template() {
    let llm = common::builder().build().unwrap();
    let convo = vec![Message::system("You are terse."), Message::user("What is the capital of France?")];
    let params = SamplingParams::greedy(10);
    let out = llm.chat([convo.clone()], &params).unwrap().remove(0);
    let msgs: Vec<serde_json::Value> =
        convo.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
    let rendered = llm.tokenizer().apply_chat_template(&msgs, true).unwrap();
    assert!(rendered.ends_with("<|im_start|>assistant\n"), "{rendered:?}");
    let ids = llm.tokenizer().encode(&rendered, false).unwrap();
    assert_eq!(out.prompt_token_ids, ids);
    let direct = llm.generate([Prompt::Tokens(ids)], &params).unwrap().remove(0);
    assert_eq!(out.completions, direct.completions);
    assert!(!out.completions[0].token_ids.is_empty());
}

/// vLLM's `LLM.chat` options: `continue_final_message` leaves the assistant's message open
/// (the prompt ends with its content), `add_generation_prompt: false` closes it without a new
/// turn, both true is refused.
#[test]
fn chat_continues_the_final_message() {
    let llm = common::builder().build().unwrap();
    let convo = vec![Message::user("Name a colour."), Message::assistant("The colour is")];
    let params = SamplingParams::greedy(4);
    let cont = ChatOptions { add_generation_prompt: false, continue_final_message: true };
    let out = llm.chat_with([convo.clone()], &params, &cont).unwrap().remove(0);
    let msgs: Vec<serde_json::Value> =
        convo.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect();
    let closed = llm.tokenizer().apply_chat_template(&msgs, false).unwrap();
    let open = &closed[..closed.rfind("The colour is").unwrap() + "The colour is".len()];
    assert!(open.len() < closed.len(), "the template closes the turn: {closed:?}");
    assert_eq!(out.prompt_token_ids, llm.tokenizer().encode(open, false).unwrap());
    let direct = llm.generate([Prompt::Tokens(out.prompt_token_ids.clone())], &params).unwrap().remove(0);
    assert_eq!(out.completions, direct.completions);
    let no_gen = ChatOptions { add_generation_prompt: false, continue_final_message: false };
    assert_eq!(
        llm.chat_with([convo.clone()], &params, &no_gen).unwrap()[0].prompt_token_ids,
        llm.tokenizer().encode(&closed, false).unwrap()
    );
    let both = ChatOptions { add_generation_prompt: true, continue_final_message: true };
    assert!(llm.chat_with([convo], &params, &both).unwrap_err().to_string().contains("Cannot set both"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_gives_what_generate_gives() {
    let llm = common::builder().build().unwrap();
    let params = SamplingParams { logprobs: Some(1), ..sampled(16) };
    let want = llm.generate([PROMPTS[3]], &params).unwrap().remove(0);
    let engine = llm.to_async();
    let mut stream = engine.generate(PROMPTS[3], &params).unwrap();
    let (mut text, mut ids, mut items, mut finish, mut last_finished) = (String::new(), vec![], 0, None, false);
    while let Some(o) = stream.next().await {
        assert!(!last_finished, "nothing after the final item");
        items += 1;
        text.push_str(&o.text);
        ids.extend(o.token_ids);
        finish = o.finish_reason.or(finish);
        last_finished = o.finished;
    }
    assert!(last_finished);
    assert_eq!(items, 16, "one item per token");
    let c = &want.completions[0];
    assert_eq!((text.as_str(), &ids, finish.as_ref()), (c.text.as_str(), &c.token_ids, Some(&c.finish_reason)));
    // The same through collect_output.
    let again = engine.generate(PROMPTS[3], &params).unwrap().collect_output().await;
    assert_eq!(again, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_stream_aborts_the_request_and_frees_its_blocks() {
    let llm = common::builder().build_async().unwrap();
    // Long enough that it cannot end by itself before the drop reaches the engine.
    let params = SamplingParams { max_tokens: Some(1800), ..sampled(0) };
    let mut s = llm.generate("Once upon a time", &params).unwrap();
    for _ in 0..3 {
        assert!(s.next().await.unwrap().finish_reason.is_none());
    }
    let held = llm.stats();
    assert_eq!(held.num_running, 1);
    assert!(held.kv_usage > 0.0, "the running request holds blocks: {held:?}");
    drop(s);
    let t = Instant::now();
    let stats = loop {
        let st = llm.stats();
        if st.requests_abort_total == 1 && st.num_running == 0 {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the abort never reached the engine: {st:?}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    assert_eq!(stats.kv_usage, 0.0, "every block is free again: {stats:?}");
    assert_eq!(stats.requests_length_total, 0);
    assert!(stats.generation_tokens_total < 1800, "it stopped early: {stats:?}");
    // The engine goes on serving.
    let out = llm.generate("a", &sampled(4)).unwrap().collect_output().await;
    assert_eq!(out.completions[0].token_ids.len(), 4);
}

#[test]
fn a_bad_parameter_is_an_error_naming_the_field() {
    let llm = common::builder().build().unwrap();
    let cases: [(SamplingParams, &str); 8] = [
        (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
        (SamplingParams { temperature: -1.0, ..Default::default() }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..Default::default() }, "temperature"),
        (SamplingParams { n: 0, ..Default::default() }, "n"),
        (SamplingParams { max_tokens: Some(0), ..Default::default() }, "max_tokens"),
        (SamplingParams { logprobs: Some(21), ..Default::default() }, "logprobs"),
        (SamplingParams { stop: vec![String::new()], ..Default::default() }, "stop"),
        (SamplingParams { min_tokens: 9, max_tokens: Some(4), ..Default::default() }, "min_tokens"),
    ];
    let engine = llm.to_async();
    for (p, field) in cases {
        let e = llm.generate(["hello"], &p).unwrap_err();
        assert!(matches!(e, Error::InvalidParam(_)), "{e:?}");
        assert_eq!(e.field(), Some(field), "{e}");
        assert!(e.to_string().contains(&format!("`{field}`")), "{e}");
        assert_eq!(engine.generate("hello", &p).err().and_then(|e| e.field()), Some(field));
        assert_eq!(llm.chat([[Message::user("hi")]], &p).unwrap_err().field(), Some(field));
    }
    // Prompts the engine refuses name their index; nothing was left running.
    let vocab = llm.tokenizer().vocab_size() as u32;
    let e = llm
        .generate([Prompt::from("fine"), Prompt::Tokens(vec![1, vocab + 5])], &SamplingParams::greedy(4))
        .unwrap_err();
    assert!(matches!(e, Error::Refused { index: 1, source: tandem::SubmitError::TokenOutOfVocab { .. } }), "{e:?}");
    let e = llm.generate([Prompt::Tokens(vec![])], &SamplingParams::greedy(4)).unwrap_err();
    assert!(matches!(e, Error::Refused { index: 0, source: tandem::SubmitError::EmptyPrompt }), "{e:?}");
    let e = llm.generate(["hi"], &SamplingParams::greedy(100_000)).unwrap_err();
    assert!(matches!(e, Error::Refused { index: 0, source: tandem::SubmitError::TooLong { .. } }), "{e:?}");
    assert_eq!(llm.stats().num_running + llm.stats().num_waiting, 0);
}

#[test]
fn bad_builder_settings_are_errors() {
    for (b, what) in [
        (common::builder().block_size(8), "block_size"),
        (common::builder().max_num_seqs(0), "max_num_seqs"),
        (common::builder().num_kv_blocks(0), "num_kv_blocks"),
        (common::builder().gpu_memory_utilization(1.5), "gpu_memory_utilization"),
    ] {
        let e = b.build().err().expect("refused");
        assert!(matches!(e, Error::Config(_)) && e.to_string().contains(what), "{e}");
    }
    let e = tandem::LlmBuilder::new("/nonexistent/model").build().err().expect("refused");
    assert!(e.to_string().contains("/nonexistent/model"), "{e}");
}

/// Structured output through the library: a JSON schema compiled by `Llm::guide` gives JSON
/// that parses into the schema's shape, greedy and sampled; a bad spec is `Error::Guide`.
#[test]
fn guided_generation_through_the_library() {
    let dir = std::env::temp_dir().join(format!("tandem-lib-guided-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tandem_model_files::random_model::write_random_model(
        &dir,
        tandem_model_files::random_model::Shape::Tiny,
        4,
        tandem_core::DType::F32,
    )
    .unwrap();
    let llm = tandem::LlmBuilder::new(&dir)
        .backend(tandem::Backend::Reference)
        .max_num_seqs(8)
        .num_kv_blocks(256)
        .build()
        .unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["ok", "n"], "additionalProperties": false});
    let guided = llm.guide(&tandem::GuideSpec::JsonSchema(schema)).unwrap();
    for (t, seed) in [(0.0, 0), (1.0, 1), (1.0, 2)] {
        let params = tandem::SamplingParams {
            temperature: t,
            seed: Some(seed),
            max_tokens: Some(300),
            guided: Some(guided.clone()),
            ..Default::default()
        };
        let out = llm.generate(["Reply in JSON:"], &params).unwrap();
        let text = out[0].text();
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(
            v["ok"].is_boolean() && v["n"].as_u64().is_some_and(|n| n <= 9) && v.as_object().unwrap().len() == 2,
            "{v}"
        );
    }
    let err = llm.guide(&tandem::GuideSpec::Regex("[a-".into())).unwrap_err();
    assert!(matches!(err, tandem::Error::Guide(ref g) if g.kind == "regex"), "{err}");
    drop(llm);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The KV element type reaches the load: f32 is the reference's and builds; bf16 is CUDA's and
/// the reference refuses it, saying what it stores.
#[test]
fn the_kv_cache_dtype_reaches_the_load() {
    assert_eq!(common::builder().load_options().unwrap().kv_dtype, None, "default: the backend's choice");
    assert_eq!(
        common::builder().kv_cache_dtype(tandem::KvDtype::F32).load_options().unwrap().kv_dtype,
        Some(tandem::KvDtype::F32)
    );
    let llm = common::builder().kv_cache_dtype(tandem::KvDtype::F32).build().unwrap();
    assert_eq!(llm.kv_cache_dtype(), tandem::KvDtype::F32);
    let e = common::builder().kv_cache_dtype(tandem::KvDtype::Bf16).build().err().expect("refused");
    assert!(e.to_string().contains("a bf16 KV cache is not supported on reference (it stores f32"), "{e}");
}

/// The model's generation_config.json gives `default_sampling_params` (vLLM's
/// `get_default_sampling_params`): its valid fields over the defaults, an invalid one left at
/// the default; `generate` with them follows them (max_new_tokens caps the output), and a
/// call with its own params is not changed by the file. Without the file: the plain defaults.
#[test]
fn generation_config_gives_the_default_sampling_params() {
    let plain = common::builder().build().unwrap();
    let d = plain.default_sampling_params();
    let base = SamplingParams::default();
    assert_eq!(
        (d.temperature, d.top_p, d.top_k, d.max_tokens),
        (base.temperature, base.top_p, base.top_k, base.max_tokens),
        "the tiny model's file has no sampling fields"
    );

    let dir = std::env::temp_dir().join(format!("tandem-lib-genconfig-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(common::tiny_model()).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let cfg = serde_json::json!({"eos_token_id": 2, "temperature": 0.6, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": -1.0, "max_new_tokens": 7});
    std::fs::write(dir.join("generation_config.json"), cfg.to_string()).unwrap();
    let llm = common::builder_for(&dir).build().unwrap();
    let d = llm.default_sampling_params();
    assert_eq!((d.temperature, d.top_p, d.top_k, d.min_p, d.max_tokens), (0.6, 0.9, 20, 0.05, Some(7)));
    assert_eq!(d.repetition_penalty, base.repetition_penalty, "an invalid field stays at its default");
    let out = llm.generate(["Once upon a time"], &SamplingParams { ignore_eos: true, seed: Some(1), ..d }).unwrap();
    assert_eq!(out[0].completions[0].token_ids.len(), 7, "max_new_tokens is the default max_tokens");
    let own = llm.generate(["Once upon a time"], &sampled(11)).unwrap();
    assert_eq!(own[0].completions[0].token_ids.len(), 11, "a call's own params are used as given");

    std::fs::write(dir.join("generation_config.json"), "{not json").unwrap();
    let e = common::builder_for(&dir).build().err().expect("a broken generation_config.json is refused");
    assert!(e.to_string().contains("generation_config.json"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// No step budget given: the backend's default (the reference backend runs on the CPU:
/// `CPU_BATCH_TOKENS`, a short step); a given budget wins. Issue 29: the default follows the
/// backend's speed.
#[test]
fn the_step_budget_defaults_to_the_backends() {
    use tandem::{load_model, Backend, LoadOptions};
    let opts = |n| LoadOptions { max_batch_tokens: n, max_seqs: 8, num_kv_blocks: 64, ..LoadOptions::default() };
    let m = load_model(Backend::Reference, common::tiny_model(), opts(0)).unwrap();
    assert_eq!(m.runner.max_batch_tokens(), tandem::backend::CPU_BATCH_TOKENS);
    let m = load_model(Backend::Reference, common::tiny_model(), opts(100)).unwrap();
    assert_eq!(m.runner.max_batch_tokens(), 100);
    // Through the builder: none given is the backend's, and the engine runs with it.
    let llm = tandem::LlmBuilder::new(common::tiny_model())
        .backend(Backend::Reference)
        .max_num_seqs(8)
        .num_kv_blocks(64)
        .build()
        .unwrap();
    let out = llm
        .generate(
            [Prompt::Tokens((0..100).map(|i| 10 + i % 50).collect())],
            &SamplingParams { max_tokens: Some(2), ..Default::default() },
        )
        .unwrap();
    assert_eq!(out[0].prompt_token_ids.len(), 100);
    // 100 prompt tokens in steps of 32: four prefill steps at least (the last also samples),
    // where a 512-token budget takes one; the decode step may land after `generate` returns.
    let steps = llm.stats().steps_total;
    assert!(steps >= 4, "a 100-token prompt ran in {steps} steps: not in steps of the default budget");
}
