//! A GGUF file served as it is: `LlmBuilder::new(FILE.gguf)` builds the tokenizer and config from
//! the file's metadata and keeps its Q8_0 weights quantized on the reference; its greedy output
//! is its converted bf16 directory's (every value of the tiny file is exact in bf16).

use tandem::{Backend, LlmBuilder, SamplingParams};

fn greedy_ids(model: &std::path::Path) -> Vec<Vec<u32>> {
    let llm = LlmBuilder::new(model)
        .backend(Backend::Reference)
        .max_num_seqs(4)
        .max_num_batched_tokens(64)
        .num_kv_blocks(64)
        .build()
        .unwrap();
    let params = SamplingParams { temperature: 0.0, max_tokens: Some(8), ignore_eos: true, ..Default::default() };
    let prompts = ["hello world", "wo wo w", "abc"];
    llm.generate(prompts, &params).unwrap().into_iter().map(|o| o.completions[0].token_ids.clone()).collect()
}

#[test]
fn a_gguf_file_serves_kept_quantized_as_its_converted_directory() {
    let root = std::env::temp_dir().join(format!("tandem-lib-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let gguf = root.join("tiny-q8_0.gguf");
    tandem_model_files::tiny_gguf::write_tiny_gguf(&gguf, 1).unwrap();
    let dir = tandem::model_dir(&gguf).unwrap();
    assert!(tandem::is_gguf_dir(&dir) && dir.join("tokenizer.json").exists(), "{}", dir.display());
    let kept = greedy_ids(&gguf);
    let converted = root.join("converted");
    tandem_model_files::convert_gguf(&gguf, &converted, &mut |_, _, _| {}).unwrap();
    assert_eq!(kept, greedy_ids(&converted));
    assert!(kept.iter().flatten().any(|&i| i != kept[0][0]), "the output varies: {kept:?}");
    // The metadata directory (under the user's cache, named after this file) is this test's.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
}
