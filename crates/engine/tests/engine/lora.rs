//! LoRA adapters through the engine: requests under different adapters and the base model
//! share steps and the prefix cache, and each gets what it gets alone; the prefix cache keys
//! on the adapter (the same prompt under another adapter has other K/V).

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelConfig, ModelRunner};
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams, SubmitError};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-lora-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

/// A PEFT adapter of tests/golden/lora (made for the tiny shape, so it fits any tiny model).
fn adapter(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora").join(name)
}

/// The tiny model with `tiny-all` in slot 0 and `tiny-rs` in slot 1.
fn lora_model(dir: &Path, max_batch_tokens: usize, num_kv_blocks: usize) -> Model<RefBackend> {
    let opts = LoadOptions { max_batch_tokens, max_seqs: 8, num_kv_blocks, block_size: 16, ..Default::default() };
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let mut m = Model::load_with_lora(RefBackend::new(), dir, opts, limits).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    m.load_lora(0, &LoraAdapter::load(&adapter("tiny-all"), &cfg).unwrap()).unwrap();
    m.load_lora(1, &LoraAdapter::load(&adapter("tiny-rs"), &cfg).unwrap()).unwrap();
    m
}

fn request(prompt: &[u32], max_tokens: usize) -> Request {
    Request {
        prompt: prompt.to_vec(),
        params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(max_tokens) },
        priority: 0,
    }
}

#[test]
fn adapters_share_steps_and_the_prefix_cache_and_each_gets_its_own_answer() {
    let dir = model_dir("mixed");
    let steps = 8;
    let long: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 384).collect();
    let short: Vec<u32> = vec![7, 8, 9, 250];
    // Each prompt under each adapter alone: the oracle.
    let oracle = |prompt: &[u32], a: Option<u32>| -> Vec<u32> {
        let mut m = lora_model(&dir, 64, 16);
        let s = tandem_core::greedy::generate_with(&mut m, a, prompt, steps, &[], false, |_| {}).unwrap();
        s.iter().map(|s| s.id).collect()
    };
    let adapters = [None, Some(0), Some(1)];
    let want_long: Vec<Vec<u32>> = adapters.iter().map(|&a| oracle(&long, a)).collect();
    let want_short: Vec<Vec<u32>> = adapters.iter().map(|&a| oracle(&short, a)).collect();
    assert!(want_long[0] != want_long[1] && want_long[0] != want_long[2] && want_long[1] != want_long[2]);

    // 12-token chunks: the long prompt is prefilled over several steps beside the others.
    let mut e = Engine::new(Box::new(lora_model(&dir, 12, 64)), letters(), EngineConfig::default()).unwrap();
    let run = |e: &mut Engine, reqs: &[(&[u32], Option<u32>)]| -> Vec<Vec<u32>> {
        let mut streams: Vec<_> =
            reqs.iter().map(|&(p, a)| e.add_request_with_adapter(request(p, steps), a).unwrap()).collect();
        run_to_idle(e);
        streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect()
    };
    // The base model first: its full blocks of the long prompt enter the prefix cache.
    assert_eq!(run(&mut e, &[(&long, None)]), vec![want_long[0].clone()]);
    let hits_before = e.stats().prefix_cache_hits_total;
    // The same prompt under each adapter must not take the base model's blocks.
    let got = run(&mut e, &[(&long, Some(0)), (&short, Some(1)), (&long, Some(1)), (&short, None)]);
    assert_eq!(got, vec![want_long[1].clone(), want_short[2].clone(), want_long[2].clone(), want_short[0].clone()]);
    assert_eq!(e.stats().prefix_cache_hits_total, hits_before, "no hit across adapters");
    // Again, all mixed: now each finds its own adapter's blocks.
    let got = run(&mut e, &[(&long, Some(1)), (&long, None), (&short, Some(0)), (&long, Some(0))]);
    assert_eq!(got, vec![want_long[2].clone(), want_long[0].clone(), want_short[1].clone(), want_long[1].clone()]);
    assert!(e.stats().prefix_cache_hits_total > hits_before, "each adapter hits its own prefix");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_request_for_an_empty_slot_is_refused_at_submit() {
    let dir = model_dir("refused");
    let opts =
        LoadOptions { max_batch_tokens: 16, max_seqs: 4, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let mut m = Model::load_with_lora(RefBackend::new(), &dir, opts, limits).unwrap();
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    m.load_lora(1, &LoraAdapter::load(&adapter("tiny-rs"), &cfg).unwrap()).unwrap();
    let mut e = Engine::new(Box::new(m), letters(), EngineConfig::default()).unwrap();
    for slot in [0, 2] {
        let r = e.add_request_with_adapter(request(&[1, 2, 3], 2), Some(slot));
        assert_eq!(r.err(), Some(SubmitError::UnknownAdapter { slot }));
    }
    let mut ok = e.add_request_with_adapter(request(&[1, 2, 3], 2), Some(1)).unwrap();
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut ok), 1).tokens[0].len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_stats_name_the_adapters_running_and_waiting() {
    let dir = model_dir("stats");
    let cfg = EngineConfig { max_num_seqs: Some(1), ..Default::default() };
    let mut e = Engine::new(Box::new(lora_model(&dir, 16, 16)), letters(), cfg).unwrap();
    let mut a = e.add_request_with_adapter(request(&[1, 2, 3], 4), Some(1)).unwrap();
    let mut b = e.add_request_with_adapter(request(&[4, 5, 6], 4), Some(0)).unwrap();
    e.step();
    let st = e.stats();
    assert_eq!((st.running_adapters, st.waiting_adapters), (vec![1], vec![0]));
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut a), 1).tokens[0].len(), 4);
    assert_eq!(collect(&drain(&mut b), 1).tokens[0].len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tiny model's `name` adapter, read for loading at run time.
fn read_adapter(dir: &Path, name: &str) -> LoraAdapter {
    let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
    LoraAdapter::load(&adapter(name), &cfg).unwrap()
}

#[test]
fn an_adapter_loaded_into_a_freed_slot_never_takes_the_old_adapters_prefix() {
    let dir = model_dir("reload");
    let steps = 6;
    let long: Vec<u32> = (0..40u32).map(|i| (i * 29 + 3) % 384).collect();
    let alone = |a: Option<u32>| -> Vec<u32> {
        let mut m = lora_model(&dir, 64, 16);
        let s = tandem_core::greedy::generate_with(&mut m, a, &long, steps, &[], false, |_| {}).unwrap();
        s.iter().map(|s| s.id).collect()
    };
    let (want_all, want_rs) = (alone(Some(0)), alone(Some(1)));
    assert_ne!(want_all, want_rs);
    let mut e = Engine::new(Box::new(lora_model(&dir, 64, 16)), letters(), EngineConfig::default()).unwrap();
    let run = |e: &mut Engine, a: u32| {
        let mut s = e.add_request_with_adapter(request(&long, steps), Some(a)).unwrap();
        run_to_idle(e);
        collect(&drain(&mut s), 1).tokens[0].clone()
    };
    // tiny-all's blocks of the prompt enter the prefix cache under slot 0.
    assert_eq!(run(&mut e, 0), want_all);
    e.unload_adapter(0).unwrap();
    assert_eq!(e.scheduler().adapters.slot_of(0), None, "nothing held it: freed at once");
    // tiny-rs into the same slot, under a new id: the cached blocks are tiny-all's K/V.
    let id = e.load_adapter(read_adapter(&dir, "tiny-rs")).unwrap();
    assert_eq!((id, e.scheduler().adapters.slot_of(id)), (2, Some(0)));
    let hits = e.stats().prefix_cache_hits_total;
    assert_eq!(run(&mut e, id), want_rs);
    assert_eq!(e.stats().prefix_cache_hits_total, hits, "no hit on the unloaded adapter's blocks");
    assert_eq!(e.scheduler().kv_usage(), 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unloading_refuses_new_requests_and_frees_the_slot_after_the_running_ones() {
    let dir = model_dir("unload");
    let steps = 8;
    let prompt: Vec<u32> = vec![11, 12, 13, 14, 15];
    let mut m = lora_model(&dir, 64, 16);
    let s = tandem_core::greedy::generate_with(&mut m, Some(1), &prompt, steps, &[], false, |_| {}).unwrap();
    let want: Vec<u32> = s.iter().map(|s| s.id).collect();
    for async_scheduling in [false, true] {
        let cfg = EngineConfig { async_scheduling, ..Default::default() };
        let mut e = Engine::new(Box::new(lora_model(&dir, 64, 16)), letters(), cfg).unwrap();
        let mut running = e.add_request_with_adapter(request(&prompt, steps), Some(1)).unwrap();
        let mut waiting = e.add_request_with_adapter(request(&prompt, steps), Some(1)).unwrap();
        e.step();
        e.step();
        e.unload_adapter(1).unwrap();
        assert!(e.unload_adapter(1).unwrap_err().contains("no LoRA adapter 1"));
        let r = e.add_request_with_adapter(request(&prompt, 2), Some(1));
        assert_eq!(r.err(), Some(SubmitError::UnknownAdapter { slot: 1 }), "async {async_scheduling}");
        assert_eq!(e.scheduler().adapters.slot_of(1), Some(1), "its requests still run");
        // Slot 0's adapter came with the model (no directory to come back from), slot 1
        // frees once its requests end: a new adapter waits for it.
        let waits = e.load_adapter(read_adapter(&dir, "tiny-all")).unwrap();
        assert_eq!(e.scheduler().adapters.slot_of(waits), None);
        run_to_idle(&mut e);
        for s in [&mut running, &mut waiting] {
            assert_eq!(collect(&drain(s), 1).tokens[0], want, "async {async_scheduling}");
        }
        assert_eq!(e.scheduler().adapters.slot_of(1), None, "freed after its last request");
        assert_eq!(e.scheduler().kv_usage(), 0.0, "no block leaked");
        let id = e.load_adapter(read_adapter(&dir, "tiny-rs")).unwrap();
        assert_eq!(e.scheduler().adapters.slot_of(id), Some(1));
    }
    // Both slots hold adapters put there before the engine started: nothing can take one.
    let mut e = Engine::new(Box::new(lora_model(&dir, 64, 16)), letters(), EngineConfig::default()).unwrap();
    let pinned = e.load_adapter(read_adapter(&dir, "tiny-rs")).unwrap_err();
    assert!(pinned.contains("cannot be swapped out"), "{pinned}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_adapters_over_one_slot_take_turns_and_each_answers_as_alone() {
    let dir = model_dir("swap");
    let steps = 6;
    let prompts: [Vec<u32>; 3] = [vec![21, 22, 23, 24], vec![5, 6, 7, 8, 9, 10], vec![100, 101, 102]];
    let alone = |p: &[u32], a: Option<u32>| -> Vec<u32> {
        let mut m = lora_model(&dir, 64, 16);
        let s = tandem_core::greedy::generate_with(&mut m, a, p, steps, &[], false, |_| {}).unwrap();
        s.iter().map(|s| s.id).collect()
    };
    // tiny-all is slot 0 of the oracle model, tiny-rs slot 1.
    let want = [alone(&prompts[0], Some(0)), alone(&prompts[1], Some(1)), alone(&prompts[2], None)];
    assert_ne!(want[0], want[1]);
    for async_scheduling in [false, true] {
        let opts =
            LoadOptions { max_batch_tokens: 64, max_seqs: 8, num_kv_blocks: 16, block_size: 16, ..Default::default() };
        let m = Model::load_with_lora(RefBackend::new(), &dir, opts, LoraLimits { max_loras: 1, max_rank: 8 }).unwrap();
        let cfg = EngineConfig { async_scheduling, max_cpu_loras: Some(2), ..Default::default() };
        let mut e = Engine::new(Box::new(m), letters(), cfg).unwrap();
        let all = e.load_adapter(read_adapter(&dir, "tiny-all")).unwrap();
        let rs = e.load_adapter(read_adapter(&dir, "tiny-rs")).unwrap();
        assert_eq!((e.scheduler().adapters.slot_of(all), e.scheduler().adapters.slot_of(rs)), (Some(0), None));
        // A third adapter is served too; --max-cpu-loras 2 keeps two CPU copies (vLLM's LRU),
        // so tiny-rs, the oldest outside a slot, is read again from its directory below.
        let third = e.load_adapter(read_adapter(&dir, "tiny-all")).unwrap();
        assert_eq!((e.scheduler().adapters.slot_of(third), e.scheduler().adapters.num_copies()), (None, 2));
        assert!(e.scheduler().adapters.source(rs).is_some_and(|(copy, _)| copy.is_none()));
        // tiny-rs first in the queue: it takes the slot, tiny-all waits, and takes it back.
        let mut streams: Vec<_> = [(&prompts[1], Some(rs)), (&prompts[0], Some(all)), (&prompts[2], None)]
            .into_iter()
            .map(|(p, a)| e.add_request_with_adapter(request(p, steps), a).unwrap())
            .collect();
        run_to_idle(&mut e);
        let got: Vec<Vec<u32>> = streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect();
        assert_eq!(got, vec![want[1].clone(), want[0].clone(), want[2].clone()], "async {async_scheduling}");
        assert_eq!(e.scheduler().adapters.slot_of(all), Some(0), "tiny-all swapped back in");
        assert_eq!(e.scheduler().kv_usage(), 0.0, "no block leaked");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn adapters_named_at_start_beyond_the_slots_are_swapped_in_and_answer_as_alone() {
    let dir = model_dir("named");
    let steps = 6;
    let prompts: [Vec<u32>; 4] = [vec![21, 22, 23, 24], vec![5, 6, 7, 8, 9, 10], vec![100, 101, 102], vec![9, 8, 7]];
    let alone = |p: &[u32], a: Option<u32>| -> Vec<u32> {
        let mut m = lora_model(&dir, 64, 16);
        let s = tandem_core::greedy::generate_with(&mut m, a, p, steps, &[], false, |_| {}).unwrap();
        s.iter().map(|s| s.id).collect()
    };
    // The oracle has tiny-all in slot 0 and tiny-rs in slot 1; the engine below one slot, with
    // tiny-rs, tiny-all and tiny-rs again named at start (ids 0, 1, 2).
    let want = [alone(&prompts[0], Some(1)), alone(&prompts[1], Some(0)), alone(&prompts[2], None)];
    let want_again = alone(&prompts[3], Some(1));
    for async_scheduling in [false, true] {
        let opts =
            LoadOptions { max_batch_tokens: 64, max_seqs: 8, num_kv_blocks: 16, block_size: 16, ..Default::default() };
        let mut m =
            Model::load_with_lora(RefBackend::new(), &dir, opts, LoraLimits { max_loras: 1, max_rank: 8 }).unwrap();
        m.load_lora(0, &read_adapter(&dir, "tiny-rs")).unwrap();
        let cfg = EngineConfig {
            async_scheduling,
            max_cpu_loras: Some(1),
            lora_modules: vec![adapter("tiny-rs"), adapter("tiny-all"), adapter("tiny-rs")],
            ..Default::default()
        };
        let mut e = Engine::new(Box::new(m), letters(), cfg).unwrap();
        let a = &e.scheduler().adapters;
        assert_eq!((a.slot_of(0), a.slot_of(1), a.slot_of(2), a.num_copies()), (Some(0), None, None, 0));
        // tiny-all waits for the slot, then tiny-rs comes back into it under id 2.
        let reqs = [(&prompts[0], Some(0)), (&prompts[1], Some(1)), (&prompts[2], None), (&prompts[3], Some(2))];
        let mut streams: Vec<_> =
            reqs.into_iter().map(|(p, a)| e.add_request_with_adapter(request(p, steps), a).unwrap()).collect();
        run_to_idle(&mut e);
        let got: Vec<Vec<u32>> = streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect();
        let mut all = want.to_vec();
        all.push(want_again.clone());
        assert_eq!(got, all, "async {async_scheduling}");
        assert!(e.scheduler().adapters.num_copies() <= 1, "--max-cpu-loras 1");
        assert_eq!(e.scheduler().kv_usage(), 0.0, "no block leaked");
    }
    let bad = EngineConfig { lora_modules: vec![adapter("tiny-rs")], ..Default::default() };
    let m = Model::load_with_lora(
        RefBackend::new(),
        &dir,
        LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 4, ..Default::default() },
        LoraLimits { max_loras: 1, max_rank: 8 },
    )
    .unwrap();
    let e = Engine::new(Box::new(m), letters(), bad).err().unwrap().to_string();
    assert!(e.contains("not in slot 0"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Logits of two sequences over a prefill and three decodes (each step's argmax fed back),
/// sequence `i` under `adapters[i]` (empty: the batch names none).
fn two_seq_logits(m: &mut dyn ModelRunner, adapters: &[Option<u32>]) -> Vec<Vec<f32>> {
    let vocab = m.config().vocab_size;
    let prompts: [&[u32]; 2] = [&[5, 9, 77, 300, 2, 18, 40], &[100, 3, 8, 250]];
    let mut lens: Vec<usize> = prompts.iter().map(|p| p.len()).collect();
    let mut batch = ForwardBatch { max_blocks: 1, ..Default::default() };
    for (i, p) in prompts.iter().enumerate() {
        batch.push_seq(p, 0, &[i as u32], 16, true);
    }
    let mut steps = Vec::new();
    for _ in 0..4 {
        batch.adapters = adapters.to_vec();
        let logits = m.forward(&batch).unwrap();
        let mut next = ForwardBatch { max_blocks: 1, ..Default::default() };
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            next.push_seq(&[tandem_core::backend::argmax_row(row)], lens[i], &[i as u32], 16, true);
            lens[i] += 1;
        }
        steps.push(logits);
        batch = next;
    }
    steps
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A step where no row names an adapter runs no LoRA op: its logits are bit for bit those of
/// the model loaded without LoRA, and a base row's are those it gets beside a row whose
/// adapter makes the op run (the op leaves a row without a slot as it is).
#[test]
fn a_step_without_adapters_gives_the_bits_of_lora_off() {
    let dir = model_dir("base-only");
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 8, num_kv_blocks: 16, block_size: 16, ..Default::default() };
    let off = two_seq_logits(&mut Model::load(RefBackend::new(), &dir, opts).unwrap(), &[]);
    let skipped = two_seq_logits(&mut lora_model(&dir, 64, 16), &[]);
    let named_none = two_seq_logits(&mut lora_model(&dir, 64, 16), &[None, None]);
    let mixed = two_seq_logits(&mut lora_model(&dir, 64, 16), &[None, Some(0)]);
    let vocab = ModelConfig::from_file(&dir.join("config.json")).unwrap().vocab_size;
    for (step, want) in off.iter().enumerate() {
        assert_eq!(bits(&skipped[step]), bits(want), "step {step}: no adapters named");
        assert_eq!(bits(&named_none[step]), bits(want), "step {step}: every row under the base model");
        let (base, adapted) = mixed[step].split_at(vocab);
        assert_eq!(bits(base), bits(&want[..vocab]), "step {step}: the base row beside an adapter's");
        assert_ne!(bits(adapted), bits(&want[vocab..]), "step {step}: the adapter's row changes");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
