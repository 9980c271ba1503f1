//! Batch invariance on the wgpu backend (issue: "the engine against itself"): the greedy tokens
//! of 32 requests run alone (no prefix cache, no chunking, ample pool) must equal their tokens
//! when all 32 run together, with shared prefixes hitting the prefix cache, a long prompt
//! prefilled in chunks, and a pool small enough to force preemption.
//!
//! Needs a Vulkan adapter: skipped (with a printed reason) where there is none, a failure
//! where `TANDEM_REQUIRE_WGPU` is set.

use std::path::Path;

use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams};

fn wgpu() -> Option<tandem_wgpu::WgpuBackend> {
    match tandem_wgpu::WgpuBackend::new() {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("TANDEM_REQUIRE_WGPU").is_none() => {
            tandem_core::skip::note(format!("wgpu batch invariance: no adapter ({e})"));
            None
        }
        Err(e) => panic!("TANDEM_REQUIRE_WGPU is set but wgpu cannot start: {e}"),
    }
}

fn runner(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize, max_seqs: usize) -> Option<Box<dyn ModelRunner>> {
    let opts = LoadOptions { max_batch_tokens, max_seqs, num_kv_blocks, block_size: 16, ..Default::default() };
    Some(Box::new(Model::load(wgpu()?, dir, opts).unwrap()))
}

/// Runs `reqs` to the end on `e`; the tokens of each, and the engine's counters.
fn run(e: &mut Engine, reqs: &[Request]) -> (Vec<Vec<u32>>, tandem_engine::Stats) {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    let toks = streams
        .iter_mut()
        .map(|s| {
            let mut t = vec![];
            while let Some(o) = s.try_recv() {
                assert!(!matches!(o.finish_reason, Some(tandem_engine::FinishReason::Error(_))), "{o:?}");
                t.extend(o.token_ids);
            }
            t
        })
        .collect();
    (toks, e.stats())
}

fn no_text() -> tandem_engine::DecodeFn {
    std::sync::Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect())
}

#[test]
fn wgpu_greedy_tokens_are_the_same_alone_and_among_31_others() {
    invariance(tandem_model_files::random_model::Shape::Tiny);
}

/// The same for each family beyond Llama.
#[test]
fn wgpu_qwen3_greedy_tokens_are_the_same_alone_and_among_31_others() {
    invariance(tandem_model_files::random_model::Shape::TinyQwen3);
}

#[test]
fn wgpu_moe_greedy_tokens_are_the_same_alone_and_among_31_others() {
    invariance(tandem_model_files::random_model::Shape::TinyQwen3Moe);
    invariance(tandem_model_files::random_model::Shape::TinyMixtral);
}

/// Sliding windows of 16 keys, shorter than the prompts.
#[test]
fn wgpu_window_greedy_tokens_are_the_same_alone_and_among_31_others() {
    invariance(tandem_model_files::random_model::Shape::TinyMistral);
    invariance(tandem_model_files::random_model::Shape::TinyQwen2);
}

/// Gemma 3: a sliding and a global layer with their own ropes, GeGLU, sandwich norms.
#[test]
fn wgpu_gemma3_greedy_tokens_are_the_same_alone_and_among_31_others() {
    invariance(tandem_model_files::random_model::Shape::TinyGemma3);
}

fn invariance(shape: tandem_model_files::random_model::Shape) {
    let dir = std::env::temp_dir().join(format!("tandem-invariance-{}-{}", shape.name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tandem_model_files::random_model::write_random_model(&dir, shape, 1, DType::F32).unwrap();
    let Some(probe) = runner(&dir, 4, 16, 1) else { return };
    let vocab = probe.config().vocab_size as u32;
    drop(probe);

    let shared: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..32u32)
        .map(|i| {
            let mut p = if i % 3 == 0 { shared.clone() } else { vec![] };
            // Request 7 is long: 300 tokens, prefilled in chunks of the 64-token budget.
            let extra = if i == 7 { 300 } else { 2 + (i * 7) % 29 };
            p.extend((0..extra).map(|j| (j * 101 + i * 13 + 1) % vocab));
            Request {
                prompt: p,
                params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) },
                priority: 0,
            }
        })
        .collect();

    let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
    let mut alone = Engine::new(runner(&dir, 64, 512, 1).unwrap(), no_text(), cfg).unwrap();
    let want: Vec<Vec<u32>> = reqs.iter().map(|r| run(&mut alone, std::slice::from_ref(r)).0.remove(0)).collect();
    let mut distinct = want.concat();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 20, "a degenerate model would prove nothing: {want:?}");

    // 40 blocks of 16 for 32 sequences of 12-350 tokens: preemption. 64 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(64), max_num_seqs: Some(32), ..Default::default() };
    let mut crowd = Engine::new(runner(&dir, 40, 64, 32).unwrap(), no_text(), cfg).unwrap();
    let (got, st) = run(&mut crowd, &reqs);
    println!(
        "preemptions {}, prefix-cache hits {} of {} tokens, {} steps",
        st.preemptions_total, st.prefix_cache_hits_total, st.prefix_cache_queries_total, st.steps_total
    );
    assert!(st.preemptions_total > 0, "the pool should force preemption");
    assert!(st.prefix_cache_hits_total > 0, "the shared prefix should hit the cache");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "request {i} ({} prompt tokens) differs in the batch", reqs[i].prompt.len());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
