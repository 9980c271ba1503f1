//! Batch invariance on a real forward pass: the reference backend over a seeded random tiny
//! model. Greedy tokens of each prompt run alone (no prefix cache, no chunking, ample pool)
//! must equal the tokens of the same prompt among all the others with prefix-cache hits,
//! chunked prefill and preemption; seeded sampled tokens likewise.

use crate::common;

use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelRunner};
use tandem_engine::{Engine, EngineConfig, Request, RequestOutput, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

/// A model of its own per test (tests run in parallel and each removes its directory).
fn model_dir(test: &str) -> PathBuf {
    model_dir_of(test, Shape::Tiny)
}

fn model_dir_of(test: &str, shape: Shape) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-ref-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, shape, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize) -> Box<dyn ModelRunner> {
    runner_padded(dir, num_kv_blocks, max_batch_tokens, false)
}

/// With `pad_decode`, decode steps are padded to their batch-size bucket (what CUDA graphs
/// replay; crates/core/src/model.rs, `Padding`).
fn runner_padded(dir: &Path, num_kv_blocks: usize, max_batch_tokens: usize, pad_decode: bool) -> Box<dyn ModelRunner> {
    let opts =
        LoadOptions { max_batch_tokens, max_seqs: 16, num_kv_blocks, block_size: 16, pad_decode, ..Default::default() };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

fn run(e: &mut Engine, reqs: &[Request]) -> (Vec<Vec<u32>>, u64, u64) {
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    run_to_idle(e);
    let toks = streams.iter_mut().map(|s| collect(&drain(s), 1).tokens[0].clone()).collect();
    let st = e.stats();
    (toks, st.preemptions_total, st.prefix_cache_hits_total)
}

#[test]
fn greedy_tokens_are_the_same_alone_and_in_a_batch() {
    greedy_invariance(&model_dir("batch"));
}

/// The same for each family beyond Llama (its own pieces: Qwen3's per-head q/k norms).
#[test]
fn qwen3_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    greedy_invariance(&model_dir_of("batch-qwen3", Shape::TinyQwen3));
}

/// Mixtures of experts: a token's experts run over the whole batch, its bits from its own routing.
#[test]
fn moe_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    greedy_invariance(&model_dir_of("batch-qwen3-moe", Shape::TinyQwen3Moe));
    greedy_invariance(&model_dir_of("batch-mixtral", Shape::TinyMixtral));
}

/// Sliding windows (16 keys, shorter than the prompts): Mistral's, and Qwen2's on one layer.
#[test]
fn window_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    greedy_invariance(&model_dir_of("batch-mistral", Shape::TinyMistral));
    greedy_invariance(&model_dir_of("batch-qwen2", Shape::TinyQwen2));
}

/// Gemma 3: a sliding and a global layer with their own ropes, GeGLU, sandwich norms.
#[test]
fn gemma3_greedy_tokens_are_the_same_alone_and_in_a_batch() {
    greedy_invariance(&model_dir_of("batch-gemma3", Shape::TinyGemma3));
}

fn greedy_invariance(dir: &Path) {
    let dir = dir.to_path_buf();
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..10u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 5).map(|j| (j * 101 + i * 7 + 1) % vocab));
            Request {
                prompt: p,
                params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) },
                priority: 0,
            }
        })
        .collect();

    let mut want = Vec::new();
    for r in &reqs {
        let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
        let mut alone = Engine::new(runner(&dir, 64, 256), letters(), cfg).unwrap();
        want.push(run(&mut alone, std::slice::from_ref(r)).0.remove(0));
    }

    let mut distinct: Vec<u32> = want.concat();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 10, "a degenerate model would prove nothing: {want:?}");

    // 14 blocks for 10 sequences of 38-95 tokens: preemption; 24 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let mut crowd = Engine::new(runner(&dir, 14, 24), letters(), cfg.clone()).unwrap();
    let (got, preemptions, hits) = run(&mut crowd, &reqs);
    assert!(preemptions > 0, "the pool should force preemption");
    assert!(hits > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want);
    // Again with decode steps padded to their bucket: the same tokens, and the pool the engine
    // sees is the 14 blocks asked for (the padding's scratch block is the model's own).
    let padded = runner_padded(&dir, 14, 24, true);
    assert_eq!(padded.kv_geometry().num_blocks, 14);
    let mut crowd = Engine::new(padded, letters(), cfg).unwrap();
    let (got, preemptions, _) = run(&mut crowd, &reqs);
    assert!(preemptions > 0);
    assert_eq!(got, want, "padded decode steps changed the tokens");
    let _ = std::fs::remove_dir_all(&dir);
}

/// log_softmax of one row, in f64 (the oracle for prompt logprobs).
fn log_softmax_at(row: &[f32], token: u32) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    row[token as usize] as f64 - lse
}

#[test]
fn prompt_logprobs_match_one_whole_forward_when_chunked_among_others() {
    let dir = model_dir("scoring");
    let mut whole = runner(&dir, 16, 64);
    let vocab = whole.config().vocab_size;
    let prompt: Vec<u32> = (0..45u32).map(|i| (i * 53 + 3) % vocab as u32).collect();
    // The oracle: every position's logits from one forward of the whole prompt.
    let mut b = ForwardBatch { max_blocks: 3, ..Default::default() };
    b.push_seq(&prompt, 0, &[0, 1, 2], 16, false);
    b.logit_rows = (0..prompt.len() as u32).collect();
    let rows = {
        let opts = LoadOptions {
            max_batch_tokens: 64,
            max_seqs: 16,
            num_kv_blocks: 16,
            block_size: 16,
            prompt_logit_rows: 64,
            ..Default::default()
        };
        whole = Box::new(Model::load(RefBackend::new(), &dir, opts).unwrap());
        whole.forward(&b).unwrap()
    };
    let want: Vec<f64> =
        (1..prompt.len()).map(|i| log_softmax_at(&rows[(i - 1) * vocab..i * vocab], prompt[i])).collect();

    // Scored in chunks of at most 1 + 4 rows, beside greedy requests that share its prefix (a
    // cache hit it must not take) under a 12-token budget.
    let opts = LoadOptions {
        max_batch_tokens: 12,
        max_seqs: 4,
        num_kv_blocks: 40,
        block_size: 16,
        prompt_logit_rows: 4,
        ..Default::default()
    };
    let mut e =
        Engine::new(Box::new(Model::load(RefBackend::new(), &dir, opts).unwrap()), letters(), EngineConfig::default())
            .unwrap();
    let greedy = Request {
        prompt: prompt[..40].to_vec(),
        params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(6) },
        priority: 0,
    };
    let mut first = e.add_request(greedy.clone()).unwrap();
    run_to_idle(&mut e);
    let alone = collect(&drain(&mut first), 1).tokens[0].clone();
    let scored = |max_tokens| Request {
        prompt: prompt.clone(),
        params: SamplingParams { prompt_logprobs: Some(2), ignore_eos: true, ..SamplingParams::greedy(max_tokens) },
        priority: 0,
    };
    let mut s0 = e.add_request(scored(0)).unwrap();
    let mut s1 = e.add_request(scored(3)).unwrap();
    let mut g = e.add_request(greedy).unwrap();
    run_to_idle(&mut e);
    assert_eq!(collect(&drain(&mut g), 1).tokens[0], alone, "a scored neighbour changed a greedy request");
    for (s, max_tokens) in [(&mut s0, 0), (&mut s1, 3)] {
        let outs = drain(s);
        let c = collect(&outs, 1);
        assert_eq!(c.tokens[0].len(), max_tokens);
        assert_eq!(c.finals[0].finish_reason, Some(tandem_engine::FinishReason::Length));
        let with: Vec<_> = outs.iter().filter(|o| o.prompt_logprobs.is_some()).collect();
        assert_eq!(with.len(), 1, "prompt logprobs come once");
        let lps = with[0].prompt_logprobs.as_ref().unwrap();
        assert_eq!(lps.len(), prompt.len());
        assert!(lps[0].is_none());
        for (i, lp) in lps.iter().enumerate().skip(1) {
            let lp = lp.as_ref().unwrap();
            assert_eq!(lp.token, prompt[i]);
            assert!((lp.logprob as f64 - want[i - 1]).abs() < 1e-4, "position {i}: {} vs {}", lp.logprob, want[i - 1]);
            assert_eq!(lp.top.len(), 2);
            assert!(lp.top[0].1 >= lp.top[1].1 && lp.top[0].1 >= lp.logprob);
        }
    }
    assert_eq!(e.scheduler().bm.num_free(), 40, "every block is back");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seeded sampling on a real forward pass: each seeded request (temperature, top-k, top-p,
/// min-p, `n = 2`, one with a repetition penalty so its steps take the host path) gives the same
/// tokens alone and among the others, with prefix-cache hits, chunked prefill and preemption
/// (recompute draws again with the same (seed, completion, token index)). And a row sampled
/// where the logits are gives the token the host gives: the same request asking for logprobs
/// (which sends its steps' logits to the host) has the same tokens.
#[test]
fn seeded_tokens_are_the_same_alone_and_in_a_batch() {
    let dir = model_dir("seeded");
    let vocab = runner(&dir, 4, 16).config().vocab_size as u32;
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..8u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 5).map(|j| (j * 101 + i * 7 + 1) % vocab));
            let mut params = SamplingParams {
                temperature: [1.0, 0.7, 1.3][i as usize % 3],
                seed: Some(1000 + i as u64),
                ignore_eos: true,
                max_tokens: Some(12),
                ..Default::default()
            };
            match i {
                1 => params.top_k = 5,
                2 => params.top_p = 0.8,
                3 => params.min_p = 0.1,
                4 => params.n = 2,
                5 => params.repetition_penalty = 1.2,
                6 => (params.top_k, params.top_p) = (20, 0.9),
                7 => {
                    (params.presence_penalty, params.frequency_penalty) = (0.5, 0.3);
                    params.logit_bias = vec![(3, 2.0), (7, -1.5)];
                }
                _ => {}
            }
            Request { prompt: p, params, priority: 0 }
        })
        .collect();
    let run_all = |e: &mut Engine, reqs: &[Request]| -> Vec<Vec<Vec<u32>>> {
        let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
        run_to_idle(e);
        streams.iter_mut().zip(reqs).map(|(s, r)| collect(&drain(s), r.params.n).tokens).collect()
    };

    let mut want = Vec::new();
    for r in &reqs {
        let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
        let mut alone = Engine::new(runner(&dir, 64, 256), letters(), cfg).unwrap();
        want.push(run_all(&mut alone, std::slice::from_ref(r)).remove(0));
    }
    let greedy: Vec<u32> = {
        let r =
            Request { params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(12) }, ..reqs[0].clone() };
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap();
        run_all(&mut e, &[r]).remove(0).remove(0)
    };
    assert_ne!(want[0][0], greedy, "temperature 1 should not reproduce the greedy text");
    assert_ne!(want[4][0], want[4][1], "the two completions of a request draw differently");

    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let mut crowd = Engine::new(runner(&dir, 14, 24), letters(), cfg).unwrap();
    let got = run_all(&mut crowd, &reqs);
    let st = crowd.stats();
    assert!(st.preemptions_total > 0, "the pool should force preemption");
    assert!(st.prefix_cache_hits_total > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want);

    // Prompt logprobs send a step's logits to the host, where penalties, logit_bias, the
    // sampler and the logprobs run on the host; without them the rows sample (edited, and with
    // their logprobs) where the logits are: the same tokens and the same logprobs, bit for bit.
    let run_lp = |r: &Request| -> Vec<RequestOutput> {
        let mut e = Engine::new(runner(&dir, 64, 256), letters(), EngineConfig::default()).unwrap();
        let mut s = e.add_request(r.clone()).unwrap();
        run_to_idle(&mut e);
        drain(&mut s)
    };
    for (r, w) in reqs.iter().zip(&want) {
        let device = Request { params: SamplingParams { logprobs: Some(3), ..r.params.clone() }, ..r.clone() };
        let host =
            Request { params: SamplingParams { prompt_logprobs: Some(0), ..device.params.clone() }, ..r.clone() };
        let (d, h) = (run_lp(&device), run_lp(&host));
        let tokens = |o: &[RequestOutput]| collect(o, r.params.n).tokens;
        assert_eq!(&tokens(&d), w, "device path with logprobs and alone differ");
        assert_eq!(&tokens(&h), w, "host path (prompt logprobs) and alone differ");
        // (completion, token, logprob bits, top ids and logprob bits) of every output token.
        type Bits = (usize, u32, u32, Vec<(u32, u32)>);
        let lps = |o: &[RequestOutput]| {
            let mut v: Vec<Bits> = o
                .iter()
                .flat_map(|o| {
                    o.logprobs.iter().map(move |l| {
                        (o.index, l.token, l.logprob.to_bits(), l.top.iter().map(|(t, x)| (*t, x.to_bits())).collect())
                    })
                })
                .collect();
            v.sort();
            v
        };
        assert!(!lps(&d).is_empty() && lps(&d) == lps(&h), "logprobs differ between the device and host paths");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reference backend with device memory of `total` bytes: every allocation counts, and
/// `reserve_workspace` takes `workspace` bytes, so the model's KV sizing sees what a GPU
/// would (weights, then activations and workspace, then the pool).
struct Metered {
    inner: RefBackend,
    total: u64,
    /// The context and other processes.
    other: u64,
    workspace: u64,
    used: std::sync::atomic::AtomicU64,
    reserved: std::sync::Mutex<Option<tandem_core::WorkspaceLimits>>,
}

mod metered {
    use super::Metered;
    use std::sync::atomic::Ordering;
    use tandem_core::backend::{AttnArgs, Device, FusedOps, KvGeometry, Ops, Sampling, Storage};
    use tandem_core::weights::TensorView;
    use tandem_core::{DType, Result, WorkspaceLimits};
    use tandem_reference::RefBuf;

    impl Metered {
        fn take(&self, bytes: usize) {
            self.used.fetch_add(bytes as u64, Ordering::Relaxed);
        }
    }

    impl Device for Metered {
        fn name(&self) -> &'static str {
            "metered"
        }
        fn total_memory(&self) -> Option<u64> {
            Some(self.total)
        }
        fn free_memory(&self) -> Option<u64> {
            Some(self.total.saturating_sub(self.other + self.used.load(Ordering::Relaxed)))
        }
        fn reserve_workspace(&self, l: &WorkspaceLimits) -> Result<u64> {
            *self.reserved.lock().unwrap() = Some(*l);
            self.take(self.workspace as usize);
            Ok(self.workspace)
        }
    }

    impl Storage for Metered {
        type Buf = RefBuf;
        fn upload_weight(&self, t: &TensorView) -> Result<RefBuf> {
            self.take(t.bytes().len());
            self.inner.upload_weight(t)
        }
        fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<RefBuf> {
            self.take(values.len() * dtype.size());
            self.inner.weight_from_f32(dtype, values)
        }
        fn alloc_f32(&self, len: usize) -> Result<RefBuf> {
            self.take(len * 4);
            self.inner.alloc_f32(len)
        }
        fn alloc_u32(&self, len: usize) -> Result<RefBuf> {
            self.take(len * 4);
            self.inner.alloc_u32(len)
        }
        fn alloc_kv(&self, g: KvGeometry) -> Result<RefBuf> {
            self.take(g.layer_elems() * 4);
            self.inner.alloc_kv(g)
        }
        fn write_f32(&self, buf: &mut RefBuf, data: &[f32]) -> Result<()> {
            self.inner.write_f32(buf, data)
        }
        fn write_u32(&self, buf: &mut RefBuf, data: &[u32]) -> Result<()> {
            self.inner.write_u32(buf, data)
        }
        fn read_f32(&self, buf: &RefBuf, len: usize) -> Result<Vec<f32>> {
            self.inner.read_f32(buf, len)
        }
        fn read_u32(&self, buf: &RefBuf, len: usize) -> Result<Vec<u32>> {
            self.inner.read_u32(buf, len)
        }
        fn read_kv(&self, buf: &RefBuf, g: KvGeometry) -> Result<Vec<f32>> {
            self.inner.read_kv(buf, g)
        }
    }

    impl Ops for Metered {
        fn embedding(&self, table: &RefBuf, ids: &RefBuf, out: &mut RefBuf, t: usize, hidden: usize) -> Result<()> {
            self.inner.embedding(table, ids, out, t, hidden)
        }
        fn gather_rows(&self, src: &RefBuf, rows: &RefBuf, out: &mut RefBuf, n: usize, dim: usize) -> Result<()> {
            self.inner.gather_rows(src, rows, out, n, dim)
        }
        fn rms_norm(&self, x: &RefBuf, w: &RefBuf, out: &mut RefBuf, rows: usize, dim: usize, eps: f32) -> Result<()> {
            self.inner.rms_norm(x, w, out, rows, dim, eps)
        }
        fn add(&self, acc: &mut RefBuf, x: &RefBuf, len: usize) -> Result<()> {
            self.inner.add(acc, x, len)
        }
        fn matmul(
            &self,
            x: &RefBuf,
            w: &RefBuf,
            bias: Option<&RefBuf>,
            out: &mut RefBuf,
            m: usize,
            n: usize,
            k: usize,
        ) -> Result<()> {
            self.inner.matmul(x, w, bias, out, m, n, k)
        }
        fn rope(
            &self,
            q: &mut RefBuf,
            k: &mut RefBuf,
            positions: &RefBuf,
            inv_freq: &RefBuf,
            t: usize,
            qh: usize,
            kh: usize,
            d: usize,
        ) -> Result<()> {
            self.inner.rope(q, k, positions, inv_freq, t, qh, kh, d)
        }
        fn silu_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
            self.inner.silu_mul(gate, up, out, len)
        }
        fn gelu_tanh_mul(&self, gate: &RefBuf, up: &RefBuf, out: &mut RefBuf, len: usize) -> Result<()> {
            self.inner.gelu_tanh_mul(gate, up, out, len)
        }
        fn scale(&self, x: &mut RefBuf, factor: f32, len: usize) -> Result<()> {
            self.inner.scale(x, factor, len)
        }
        fn kv_write(
            &self,
            k: &RefBuf,
            v: &RefBuf,
            kc: &mut RefBuf,
            vc: &mut RefBuf,
            slots: &RefBuf,
            t: usize,
            g: KvGeometry,
        ) -> Result<()> {
            self.inner.kv_write(k, v, kc, vc, slots, t, g)
        }
        fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut RefBuf) -> Result<()> {
            let r = AttnArgs {
                q: a.q,
                k_cache: a.k_cache,
                v_cache: a.v_cache,
                positions: a.positions,
                token_seq: a.token_seq,
                block_tables: a.block_tables,
                num_tokens: a.num_tokens,
                num_seqs: a.num_seqs,
                max_blocks: a.max_blocks,
                max_context: a.max_context,
                decode_tokens: a.decode_tokens,
                num_heads: a.num_heads,
                geometry: a.geometry,
                scale: a.scale,
                window: a.window,
            };
            self.inner.paged_attention(&r, out)
        }
    }

    impl FusedOps for Metered {}

    impl Sampling for Metered {}
}

/// Start-up on a device of known size: the pool takes what `gpu_memory_utilization` of the
/// total leaves after weights, activations and workspace (which are reserved first, for the
/// engine's limits); a device too small is refused with what to lower, never a panic.
#[test]
fn the_kv_pool_is_what_the_utilization_of_total_memory_leaves() {
    let dir = model_dir("memory");
    let metered = |total: u64, workspace: u64| Metered {
        inner: RefBackend::new(),
        total,
        other: 1 << 20,
        workspace,
        used: 0.into(),
        reserved: Default::default(),
    };
    let opts = LoadOptions {
        max_batch_tokens: 64,
        max_seqs: 4,
        num_kv_blocks: 0,
        block_size: 16,
        gpu_memory_utilization: 0.5,
        max_model_len: Some(100),
        ..Default::default()
    };
    // On a large device the pool is all any sequence could use: 4 sequences x 7 blocks.
    let big = Model::load(metered(1 << 30, 3 << 20), &dir, opts).unwrap();
    assert_eq!(big.kv_geometry().num_blocks, 4 * 7);
    assert_eq!(big.max_context(), 112);
    let l = big.backend().reserved.lock().unwrap().expect("the model reserves its workspace");
    assert_eq!(
        (l.max_tokens, l.max_seqs, l.max_context),
        (64, 4, 112),
        "limits from the load options (100 tokens in 16-token blocks)"
    );
    let cfg = big.config();
    let block_bytes = (2 * cfg.num_hidden_layers * 16 * cfg.kv_dim() * 4) as u64;
    let resident = big.backend().used.load(std::sync::atomic::Ordering::Relaxed) - 28 * block_bytes + (1 << 20);
    // A device whose half holds everything else and 10.5 blocks: the pool gets 10. Sized from
    // free memory instead, it would get half of what is free (far more than 10).
    let total = 2 * (resident + 10 * block_bytes + block_bytes / 2);
    let m = Model::load(metered(total, 3 << 20), &dir, opts).unwrap();
    assert_eq!(m.kv_geometry().num_blocks, 10, "{resident} bytes resident of {total}");

    // Workspace beyond the budget: refused, saying what to lower.
    let err = Model::load(metered(64 << 20, 40 << 20), &dir, opts).err().expect("cannot fit").to_string();
    assert!(
        err.contains("max_num_batched_tokens")
            && err.contains("max_model_len")
            && err.contains("gpu_memory_utilization"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
