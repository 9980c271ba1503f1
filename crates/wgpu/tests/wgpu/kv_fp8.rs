//! An fp8 KV cache on wgpu (`--kv-cache-dtype fp8` / `fp8_e5m2`): kv_write stores the
//! reference's bytes (ties, saturation and subnormals among the inputs), rope_kv_write takes rope
//! then kv_write with it, a type or a head_dim it cannot hold is refused by name, and through
//! the engine a greedy request's tokens alone equal its tokens in a crowd (prefix hits, chunked
//! prefill, preemption) while the model's cache holds only values of the format. The op suite's
//! `kv=fp8` cases (crates/conformance) check kv_write and attention against the reference too.
//! Needs a Vulkan adapter: SKIPPED without one, a failure under TANDEM_REQUIRE_WGPU=1.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::Rng;
use tandem_core::backend::prelude::*;
use tandem_core::backend::{KvDtype, KvGeometry};
use tandem_core::fp8::Fp8Format;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::{Engine, EngineConfig, FinishReason, Request, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

const FP8: [KvDtype; 2] = [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2];

/// `n` values: normals, every third one replaced by a tie between two fp8 neighbours, a value
/// past the largest finite one (infinity included) or a subnormal's multiple of a quarter.
fn inputs(rng: &mut Rng, f: Fp8Format, n: usize) -> Vec<f32> {
    let max = if f == Fp8Format::E4M3 { 0x7eu8 } else { 0x7b };
    (0..n)
        .map(|i| {
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            let x = match i % 6 {
                0 => {
                    let b = rng.below(max as usize) as u8;
                    (f.decode(b) + f.decode(b + 1)) / 2.0
                }
                2 => [f.decode(max) * 1.01, 1e6, f32::INFINITY][rng.below(3)],
                4 => f.decode(1) * rng.below(17) as f32 / 4.0,
                _ => rng.f32() * 4.0,
            };
            sign * x
        })
        .collect()
}

/// Both caches after `kv_write` of k, v at `slots` into fresh `kv` caches scaled by `scales`.
fn write<B: Backend>(
    b: &B,
    g: KvGeometry,
    kv: KvDtype,
    scales: [f32; 2],
    k: &[f32],
    v: &[f32],
    slots: &[u32],
) -> [Vec<f32>; 2] {
    let (mut kc, mut vc) = (b.alloc_kv_scaled(g, kv, scales[0]).unwrap(), b.alloc_kv_scaled(g, kv, scales[1]).unwrap());
    let (mut kb, mut vb, mut sb) =
        (b.alloc_f32(k.len()).unwrap(), b.alloc_f32(v.len()).unwrap(), b.alloc_u32(slots.len()).unwrap());
    b.write_f32(&mut kb, k).unwrap();
    b.write_f32(&mut vb, v).unwrap();
    b.write_u32(&mut sb, slots).unwrap();
    b.kv_write(&kb, &vb, &mut kc, &mut vc, &sb, slots.len(), g).unwrap();
    [b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap()]
}

#[test]
fn kv_write_stores_the_references_bytes() {
    let Some(b) = common::backend() else { return };
    assert_eq!(b.kv_dtypes(), [KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2]);
    let mut rng = Rng::new("kv fp8 write");
    let g = KvGeometry { num_blocks: 5, block_size: 16, num_kv_heads: 3, head_dim: 64 };
    let row = g.num_kv_heads * g.head_dim;
    for kv in FP8 {
        let f = kv.fp8().unwrap();
        // 37 tokens to scattered slots; the rest of the cache stays zero on both sides.
        let mut all: Vec<u32> = (0..g.slots() as u32).collect();
        rng.shuffle(&mut all);
        let slots = &all[..37];
        let (k, v) = (inputs(&mut rng, f, slots.len() * row), inputs(&mut rng, f, slots.len() * row));
        // Scale 1 (saturated values appear as they are), then scales as checkpoints bring
        // (not powers of two: the division must round as the reference's f32 `/`).
        for scales in [[1.0, 1.0], [0.37, 3.0], [0.0123, 17.25]] {
            let got = write(b, g, kv, scales, &k, &v, slots);
            let want = write(&RefBackend::new(), g, kv, scales, &k, &v, slots);
            for (what, got, want) in [("k", &got[0], &want[0]), ("v", &got[1], &want[1])] {
                let bad = got.iter().zip(want.iter()).position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(bad, None, "{} {what} cache, scales {scales:?}: element {bad:?} differs", kv.name());
            }
            if scales[0] == 1.0 {
                assert!(got[0].iter().any(|x| x.abs() == f.decode(if f == Fp8Format::E4M3 { 0x7e } else { 0x7b })));
            }
        }
    }
}

#[test]
fn what_an_fp8_cache_cannot_hold_is_refused_by_name() {
    let Some(b) = common::backend() else { return };
    let odd = KvGeometry { num_blocks: 2, block_size: 16, num_kv_heads: 1, head_dim: 6 };
    let e = b.alloc_kv_as(odd, KvDtype::Fp8E4m3).unwrap_err().to_string();
    assert!(e.contains("fp8_e4m3") && e.contains("head_dim 6"), "{e}");
    let g = KvGeometry { head_dim: 64, ..odd };
    let e = b.alloc_kv_as(g, KvDtype::Bf16).unwrap_err().to_string();
    assert!(e.contains("bf16") && e.contains("fp8_e5m2"), "{e}");
    // An fp8 cache beside an f32 one is no pair.
    let (mut kc, mut vc) = (b.alloc_kv_as(g, KvDtype::Fp8E4m3).unwrap(), b.alloc_kv(g).unwrap());
    let (k, slots) = (b.alloc_f32(64).unwrap(), b.alloc_u32(1).unwrap());
    let e = b.kv_write(&k, &k, &mut kc, &mut vc, &slots, 1, g).unwrap_err().to_string();
    assert!(e.contains("differ in kind"), "{e}");
    let e = b.read_f32(&kc, 4).unwrap_err().to_string();
    assert!(e.contains("read_kv"), "{e}");
}

#[test]
fn rope_kv_write_on_an_fp8_cache_is_rope_then_kv_write() {
    let Some(b) = common::backend() else { return };
    let mut rng = Rng::new("kv fp8 rope_kv_write");
    let g = KvGeometry { num_blocks: 4, block_size: 16, num_kv_heads: 2, head_dim: 64 };
    let (qh, t, hd) = (6, 9, g.head_dim);
    let kvd = g.num_kv_heads * hd;
    let (q0, k0, v0) = (rng.vec(t * qh * hd, 1.0), rng.vec(t * kvd, 1.0), rng.vec(t * kvd, 1.0));
    let positions: Vec<u32> = (0..t as u32).map(|i| i * 7 + 3).collect();
    let slots: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 2) % g.slots() as u32).collect();
    let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 10_000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
    let f32_buf = |v: &[f32]| {
        let mut x = b.alloc_f32(v.len()).unwrap();
        b.write_f32(&mut x, v).unwrap();
        x
    };
    let u32_buf = |v: &[u32]| {
        let mut x = b.alloc_u32(v.len()).unwrap();
        b.write_u32(&mut x, v).unwrap();
        x
    };
    let (pb, fb, sb) = (u32_buf(&positions), f32_buf(&inv_freq), u32_buf(&slots));
    for kv in FP8 {
        let (mut q, mut k, v) = (f32_buf(&q0), f32_buf(&k0), f32_buf(&v0));
        let (mut kc, mut vc) = (b.alloc_kv_as(g, kv).unwrap(), b.alloc_kv_as(g, kv).unwrap());
        b.rope_kv_write(&mut q, &mut k, &v, &mut kc, &mut vc, &pb, &fb, &sb, t, qh, g).unwrap();
        let (mut q2, mut k2) = (f32_buf(&q0), f32_buf(&k0));
        let (mut kc2, mut vc2) = (b.alloc_kv_as(g, kv).unwrap(), b.alloc_kv_as(g, kv).unwrap());
        b.rope(&mut q2, &mut k2, &pb, &fb, t, qh, g.num_kv_heads, hd).unwrap();
        b.kv_write(&k2, &v, &mut kc2, &mut vc2, &sb, t, g).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(b.read_f32(&q, q0.len()).unwrap()), bits(b.read_f32(&q2, q0.len()).unwrap()));
        assert_eq!(bits(b.read_kv(&kc, g).unwrap()), bits(b.read_kv(&kc2, g).unwrap()), "{}", kv.name());
        assert_eq!(bits(b.read_kv(&vc, g).unwrap()), bits(b.read_kv(&vc2, g).unwrap()), "{}", kv.name());
    }
}

fn runner(dir: &Path, kv: KvDtype, num_kv_blocks: usize, max_batch_tokens: usize) -> Option<Box<dyn ModelRunner>> {
    let opts = LoadOptions {
        max_batch_tokens,
        max_seqs: 8,
        num_kv_blocks,
        block_size: 16,
        kv_dtype: Some(kv),
        ..Default::default()
    };
    Some(Box::new(Model::load(common::open(Default::default())?, dir, opts).unwrap()))
}

fn run(runner: Box<dyn ModelRunner>, cfg: EngineConfig, reqs: &[Request]) -> (Vec<Vec<u32>>, u64, u64) {
    let text: tandem_engine::DecodeFn =
        Arc::new(|ids: &[u32]| ids.iter().map(|i| char::from(b'a' + (i % 26) as u8)).collect());
    let mut e = Engine::new(runner, text, cfg).unwrap();
    let mut streams: Vec<_> = reqs.iter().map(|r| e.add_request(r.clone()).unwrap()).collect();
    while e.has_work() {
        e.step();
    }
    let toks = streams
        .iter_mut()
        .map(|s| {
            let mut t = vec![];
            while let Some(o) = s.try_recv() {
                assert!(!matches!(o.finish_reason, Some(FinishReason::Error(_))), "{o:?}");
                t.extend(o.token_ids);
            }
            t
        })
        .collect();
    let st = e.stats();
    (toks, st.preemptions_total, st.prefix_cache_hits_total)
}

/// Greedy tokens alone equal those among the others: the rounding on write depends on the value
/// alone, so where a token's K and V were computed cannot change them.
#[test]
fn fp8_greedy_tokens_are_the_same_alone_and_in_a_batch_on_wgpu() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-kvfp8-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(probe) = runner(&dir, KvDtype::Fp8E4m3, 4, 16) else { return };
    let vocab = probe.config().vocab_size as u32;
    drop(probe);
    let shared: Vec<u32> = (0..35).map(|i| (i * 37 + 5) % vocab).collect();
    let reqs: Vec<Request> = (0..4u32)
        .map(|i| {
            let mut p = if i % 2 == 0 { shared.clone() } else { vec![] };
            p.extend((0..3 + i * 9).map(|j| (j * 101 + i * 7 + 1) % vocab));
            Request {
                prompt: p,
                params: SamplingParams { ignore_eos: true, ..SamplingParams::greedy(10) },
                priority: 0,
            }
        })
        .collect();
    let kv = KvDtype::Fp8E4m3;
    let mut want = Vec::new();
    for r in &reqs {
        let cfg = EngineConfig { enable_prefix_caching: false, ..Default::default() };
        want.push(run(runner(&dir, kv, 32, 256).unwrap(), cfg, std::slice::from_ref(r)).0.remove(0));
    }
    let mut distinct: Vec<u32> = want.concat();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 6, "a degenerate model would prove nothing: {want:?}");
    // 6 blocks for 4 sequences of 13-85 tokens: preemption; 24 tokens a step: chunks.
    let cfg = EngineConfig { max_num_batched_tokens: Some(24), ..Default::default() };
    let (got, preemptions, hits) = run(runner(&dir, kv, 6, 24).unwrap(), cfg, &reqs);
    assert!(preemptions > 0, "the pool should force preemption");
    assert!(hits > 0, "the shared prefix should hit the cache");
    assert_eq!(got, want);

    // The model's cache holds values of the format only (an f32 cache's would not be).
    let opts =
        LoadOptions { max_batch_tokens: 64, max_seqs: 4, num_kv_blocks: 8, block_size: 16, ..Default::default() };
    for kv in [KvDtype::F32, KvDtype::Fp8E5m2] {
        let b = common::open(Default::default()).unwrap();
        let mut m = Model::load(b, &dir, LoadOptions { kv_dtype: Some(kv), ..opts }).unwrap();
        assert_eq!(m.kv_dtype(), kv);
        tandem_core::greedy::generate(&mut m, &(1..30).collect::<Vec<u32>>(), 1, &[], false, |_| {}).unwrap();
        let nonzero: Vec<f32> = m.read_kv_pool().unwrap().into_iter().filter(|v| *v != 0.0).collect();
        assert!(nonzero.len() > 100, "{}: the prefill wrote {} values", kv.name(), nonzero.len());
        let f = Fp8Format::E5M2;
        let representable = nonzero.iter().filter(|&&v| f.decode(tandem_core::fp8_round::encode(f, v)) == v).count();
        match kv {
            KvDtype::F32 => assert!(representable < nonzero.len() / 2, "f32 cache: {representable} fp8 values"),
            _ => assert_eq!(representable, nonzero.len(), "every fp8 cache element is an e5m2 value"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint's per-layer KV scales on wgpu: every cached value is a fixed point of the fp8
/// rounding with its own layer's scale.
#[test]
fn checkpoint_kv_scales_scale_the_fp8_cache_on_wgpu() {
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-kvfp8-scales-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_random_model(&dir, Shape::Tiny, 11, DType::F32).unwrap();
    let Some(b) = common::open(Default::default()) else { return };
    let layers = tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap().num_hidden_layers;
    let scales: Vec<[f32; 2]> = (0..layers).map(|i| [0.037 * (i + 1) as f32, 0.011 + 0.3 * i as f32]).collect();
    tandem_model_files::fp8::add_kv_scales(&dir, &scales).unwrap();
    let opts = LoadOptions {
        max_batch_tokens: 64,
        max_seqs: 4,
        num_kv_blocks: 8,
        block_size: 16,
        kv_dtype: Some(KvDtype::Fp8E4m3),
        ..Default::default()
    };
    let mut m = Model::load(b, &dir, opts).unwrap();
    tandem_core::greedy::generate(&mut m, &(1..30).collect::<Vec<u32>>(), 1, &[], false, |_| {}).unwrap();
    let pool = m.read_kv_pool().unwrap();
    let per = pool.len() / (2 * layers);
    let f = Fp8Format::E4M3;
    let fixed =
        |v: f32, s: f32| tandem_core::fp8_round::dequantize(f, tandem_core::fp8_round::quantize(f, v, s), s) == v;
    for (l, [ks, vs]) in scales.iter().enumerate() {
        for (c, s) in [(0, ks), (1, vs)] {
            let nonzero: Vec<f32> = pool[(2 * l + c) * per..][..per].iter().copied().filter(|v| *v != 0.0).collect();
            assert!(nonzero.len() > 50, "layer {l}: {} values", nonzero.len());
            assert!(nonzero.iter().all(|&v| fixed(v, *s)), "layer {l} cache {c}: not scaled by {s}");
            let unscaled = nonzero.iter().filter(|&&v| fixed(v, 1.0)).count();
            assert!(unscaled < nonzero.len() / 2, "layer {l} cache {c}: {unscaled} values as if unscaled");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
