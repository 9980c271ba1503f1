//! An fp8 KV cache on CUDA (`--kv-cache-dtype fp8` / `fp8_e5m2`): kv_write stores the
//! reference's bytes (ties, saturation and subnormals among the inputs, scales that are not
//! powers of two), rope_kv_write is rope then kv_write, the fused q/k/v projection writes what
//! the unfused ops write, what is no fp8 cache pair is refused by name, and attention over an
//! fp8 cache (paged_attention_tc's fp8 form) is bitwise the bf16 cache's over the decoded
//! cache. Attention over an fp8 cache is also checked against the reference's and for batch
//! invariance in gpu_invariance.rs, and by the op suite's `kv=fp8` cases (crates/conformance).
//! Needs a GPU (or the fake driver): SKIPPED without one, a failure under TANDEM_REQUIRE_CUDA=1.

use tandem_core::backend::prelude::*;
use tandem_core::backend::{KvDest, KvDtype, KvGeometry};
use tandem_core::fp8::Fp8Format;
use tandem_core::DType;
use tandem_reference::RefBackend;

const FP8: [KvDtype; 2] = [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2];

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// `n` values: normals, every third one a tie between two fp8 neighbours, a value past the
/// largest finite one (infinity included) or a multiple of a quarter of the smallest subnormal.
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

fn up<B: Backend>(b: &B, v: &[f32]) -> B::Buf {
    let mut x = b.alloc_f32(v.len()).unwrap();
    b.write_f32(&mut x, v).unwrap();
    x
}
fn up_u32<B: Backend>(b: &B, v: &[u32]) -> B::Buf {
    let mut x = b.alloc_u32(v.len()).unwrap();
    b.write_u32(&mut x, v).unwrap();
    x
}
fn bits(v: Vec<f32>) -> Vec<u32> {
    v.into_iter().map(f32::to_bits).collect()
}

/// Both caches after `kv_write` of k, v at `slots` into `kv` caches scaled by `scales`, zeroed first.
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
    let all: Vec<u32> = (0..g.slots() as u32).collect();
    let zeros = up(b, &vec![0.0; g.layer_elems()]);
    b.kv_write(&zeros, &zeros, &mut kc, &mut vc, &up_u32(b, &all), all.len(), g).unwrap();
    b.kv_write(&up(b, k), &up(b, v), &mut kc, &mut vc, &up_u32(b, slots), slots.len(), g).unwrap();
    [b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap()]
}

#[test]
fn kv_write_stores_the_references_bytes() {
    let Some(b) = crate::gpu_or_skip("kv_write_stores_the_references_bytes") else { return };
    assert_eq!(b.kv_dtypes(), [KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2]);
    let mut rng = Rng(31);
    let g = KvGeometry { num_blocks: 5, block_size: 16, num_kv_heads: 3, head_dim: 64 };
    let row = g.num_kv_heads * g.head_dim;
    for kv in FP8 {
        let f = kv.fp8().unwrap();
        // 37 tokens to distinct scattered slots (7 is coprime with the 80 slots).
        let slots: Vec<u32> = (0..37u32).map(|i| (i * 7 + 3) % g.slots() as u32).collect();
        let (k, v) = (inputs(&mut rng, f, slots.len() * row), inputs(&mut rng, f, slots.len() * row));
        for scales in [[1.0, 1.0], [0.37, 3.0], [0.0123, 17.25]] {
            let got = write(&b, g, kv, scales, &k, &v, &slots);
            let want = write(&RefBackend::new(), g, kv, scales, &k, &v, &slots);
            for (what, got, want) in [("k", &got[0], &want[0]), ("v", &got[1], &want[1])] {
                let bad = got.iter().zip(want.iter()).position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(bad, None, "{} {what} cache, scales {scales:?}: element {bad:?} differs", kv.name());
            }
            if scales[0] == 1.0 {
                let max = f.decode(if f == Fp8Format::E4M3 { 0x7e } else { 0x7b });
                assert!(got[0].iter().any(|x| x.abs() == max), "{}: no saturated value among the inputs", kv.name());
            }
        }
    }
}

#[test]
fn what_is_no_fp8_cache_pair_is_refused_by_name() {
    let Some(b) = crate::gpu_or_skip("what_is_no_fp8_cache_pair_is_refused_by_name") else { return };
    let g = KvGeometry { num_blocks: 2, block_size: 16, num_kv_heads: 1, head_dim: 64 };
    let e = b.alloc_kv_scaled(g, KvDtype::Fp8E4m3, 0.0).err().expect("a zero scale is refused").to_string();
    assert!(e.contains("fp8_e4m3") && e.contains("scale"), "{e}");
    let e = b.alloc_kv_scaled(g, KvDtype::Bf16, 2.0).err().expect("a scale on bf16 is refused").to_string();
    assert!(e.contains("bf16") && e.contains("scale"), "{e}");
    let (k, slots) = (up(&b, &[0.5; 64]), up_u32(&b, &[0]));
    for other in [KvDtype::Bf16, KvDtype::Fp8E5m2] {
        let (mut kc, mut vc) = (b.alloc_kv_as(g, KvDtype::Fp8E4m3).unwrap(), b.alloc_kv_as(g, other).unwrap());
        let e = b.kv_write(&k, &k, &mut kc, &mut vc, &slots, 1, g).unwrap_err().to_string();
        assert!(e.contains("k_cache") && e.contains("v_cache"), "{e}");
    }
    // Different scales for K and V are one pair (a checkpoint's k_scale and v_scale).
    let (mut kc, mut vc) =
        (b.alloc_kv_scaled(g, KvDtype::Fp8E4m3, 0.5).unwrap(), b.alloc_kv_scaled(g, KvDtype::Fp8E4m3, 2.0).unwrap());
    b.kv_write(&k, &k, &mut kc, &mut vc, &slots, 1, g).unwrap();
    let (kr, vr) = (b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap());
    assert_eq!((kr[0], vr[0]), (0.5, 0.5));
}

#[test]
fn rope_kv_write_on_an_fp8_cache_is_rope_then_kv_write() {
    let Some(b) = crate::gpu_or_skip("rope_kv_write_on_an_fp8_cache_is_rope_then_kv_write") else { return };
    let mut rng = Rng(37);
    let g = KvGeometry { num_blocks: 4, block_size: 16, num_kv_heads: 2, head_dim: 64 };
    let (qh, t, hd) = (6, 9, g.head_dim);
    let kvd = g.num_kv_heads * hd;
    let (q0, k0, v0) = (rng.vec(t * qh * hd), rng.vec(t * kvd), rng.vec(t * kvd));
    let positions: Vec<u32> = (0..t as u32).map(|i| i * 7 + 3).collect();
    let slots: Vec<u32> = (0..t as u32).map(|i| (i * 5 + 2) % g.slots() as u32).collect();
    let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 10_000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
    let (pb, fb, sb) = (up_u32(&b, &positions), up(&b, &inv_freq), up_u32(&b, &slots));
    for kv in FP8 {
        let (mut q, mut k, v) = (up(&b, &q0), up(&b, &k0), up(&b, &v0));
        let (mut kc, mut vc) = (b.alloc_kv_scaled(g, kv, 0.37).unwrap(), b.alloc_kv_scaled(g, kv, 3.0).unwrap());
        b.rope_kv_write(&mut q, &mut k, &v, &mut kc, &mut vc, &pb, &fb, &sb, t, qh, g).unwrap();
        let (mut q2, mut k2) = (up(&b, &q0), up(&b, &k0));
        let (mut kc2, mut vc2) = (b.alloc_kv_scaled(g, kv, 0.37).unwrap(), b.alloc_kv_scaled(g, kv, 3.0).unwrap());
        b.rope(&mut q2, &mut k2, &pb, &fb, t, qh, g.num_kv_heads, hd).unwrap();
        b.kv_write(&k2, &v, &mut kc2, &mut vc2, &sb, t, g).unwrap();
        assert_eq!(bits(b.read_f32(&q, q0.len()).unwrap()), bits(b.read_f32(&q2, q0.len()).unwrap()));
        // Slots rope_kv_write did not touch are unspecified on both sides: compare written rows.
        let (got_k, want_k) = (b.read_kv(&kc, g).unwrap(), b.read_kv(&kc2, g).unwrap());
        let (got_v, want_v) = (b.read_kv(&vc, g).unwrap(), b.read_kv(&vc2, g).unwrap());
        for &s in &slots {
            let r = s as usize * kvd..(s as usize + 1) * kvd;
            assert_eq!(bits(got_k[r.clone()].to_vec()), bits(want_k[r.clone()].to_vec()), "{} k slot {s}", kv.name());
            assert_eq!(bits(got_v[r.clone()].to_vec()), bits(want_v[r].to_vec()), "{} v slot {s}", kv.name());
        }
    }
}

/// The fused projection (whose GEMM epilogue writes an f32 or bf16 cache) over an fp8 cache
/// writes what qkv_proj then rope_kv_write write.
#[test]
fn fused_qkv_rope_kv_write_on_an_fp8_cache_is_the_unfused_ops() {
    let Some(b) = crate::gpu_or_skip("fused_qkv_rope_kv_write_on_an_fp8_cache_is_the_unfused_ops") else { return };
    let mut rng = Rng(41);
    let g = KvGeometry { num_blocks: 4, block_size: 16, num_kv_heads: 1, head_dim: 64 };
    let (qh, m, hidden) = (3, 5, 64);
    let (nq, nkv) = (qh * g.head_dim, g.num_kv_heads * g.head_dim);
    let w = rng.vec((nq + 2 * nkv) * hidden);
    let wb = b.weight_from_f32(DType::BF16, &w).unwrap();
    let x = up(&b, &rng.vec(m * hidden));
    let positions: Vec<u32> = (0..m as u32).map(|i| i * 3 + 1).collect();
    let slots: Vec<u32> = (0..m as u32).map(|i| i * 9 + 4).collect();
    let inv_freq: Vec<f32> = (0..g.head_dim / 2).map(|i| 10_000f32.powf(-2.0 * i as f32 / g.head_dim as f32)).collect();
    let (pb, fb, sb) = (up_u32(&b, &positions), up(&b, &inv_freq), up_u32(&b, &slots));
    for kv in FP8 {
        let (mut q, mut k, mut v) =
            (up(&b, &vec![0.0; m * nq]), up(&b, &vec![0.0; m * nkv]), up(&b, &vec![0.0; m * nkv]));
        let (mut kc, mut vc) = (b.alloc_kv_scaled(g, kv, 0.25).unwrap(), b.alloc_kv_scaled(g, kv, 0.5).unwrap());
        let dest =
            KvDest { k_cache: &mut kc, v_cache: &mut vc, positions: &pb, inv_freq: &fb, slots: &sb, geometry: g };
        b.qkv_rope_kv_write(&x, &wb, None, &mut q, &mut k, &mut v, m, nq, hidden, None, dest).unwrap();
        let (mut q2, mut k2, mut v2) =
            (up(&b, &vec![0.0; m * nq]), up(&b, &vec![0.0; m * nkv]), up(&b, &vec![0.0; m * nkv]));
        let (mut kc2, mut vc2) = (b.alloc_kv_scaled(g, kv, 0.25).unwrap(), b.alloc_kv_scaled(g, kv, 0.5).unwrap());
        b.qkv_proj(&x, &wb, None, &mut q2, &mut k2, &mut v2, m, nq, nkv, hidden, None).unwrap();
        b.rope_kv_write(&mut q2, &mut k2, &v2, &mut kc2, &mut vc2, &pb, &fb, &sb, m, qh, g).unwrap();
        assert_eq!(bits(b.read_f32(&q, m * nq).unwrap()), bits(b.read_f32(&q2, m * nq).unwrap()), "{} q", kv.name());
        let (got_k, want_k) = (b.read_kv(&kc, g).unwrap(), b.read_kv(&kc2, g).unwrap());
        let (got_v, want_v) = (b.read_kv(&vc, g).unwrap(), b.read_kv(&vc2, g).unwrap());
        for &s in &slots {
            let r = s as usize * nkv..(s as usize + 1) * nkv;
            assert_eq!(bits(got_k[r.clone()].to_vec()), bits(want_k[r.clone()].to_vec()), "{} k slot {s}", kv.name());
            assert_eq!(bits(got_v[r.clone()].to_vec()), bits(want_v[r].to_vec()), "{} v slot {s}", kv.name());
        }
    }
}

/// Attention over an fp8 cache runs paged_attention_tc's fp8 form wherever a bf16 cache runs
/// tc (kernels/paged_attention_fp8.cu): its output is bitwise the bf16 cache's attention over
/// the decoded cache (each byte's value times the layer's scale, rounded to bf16: here the fp8
/// cache read back and kv_write into a bf16 cache), for decodes over one and several
/// partitions, prefill chunks over a prefix, GQA 3, head_dim 64 and 128 (and 256 under
/// TANDEM_CUDA_ATTENTION_D256=tc), scales 1 and not 1. Under TANDEM_CUDA_ATTENTION=f32 (the f32
/// kernel, which keeps the product in f32) only scale 1, whose decoded values are bf16 values,
/// gives the same bits.
#[test]
fn attention_over_an_fp8_cache_is_tc_over_the_decoded_cache() {
    let test = "kv_fp8::attention_over_an_fp8_cache_is_tc_over_the_decoded_cache";
    let var = |n: &str| std::env::var(n).unwrap_or_default();
    if var("TANDEM_CUDA_ATTENTION_FP8") != "tc" {
        // The default f32 kernel keeps the decoded product in f32: bitwise tc needs the switch
        // (the fake-driver group and gpu/tune.sh run this file with it).
        tandem_core::skip::note(format!("{test}: TANDEM_CUDA_ATTENTION_FP8=tc is not set"));
        return;
    }
    let Some(b) = crate::gpu_or_skip(test) else { return };
    let f32_kernel = var("TANDEM_CUDA_ATTENTION") == "f32";
    let mut rng = Rng(43);
    // (sequence, position): decodes at 1, 18 and 301 keys (five 64-key partitions), a prefill
    // chunk of 13 tokens over a 40-token prefix; every context under 1024 keys, where tc_deep
    // cuts tc's partitions (the bf16 cache's kernel under TANDEM_CUDA_ATTENTION=tc_deep).
    let mut toks: Vec<(u32, u32)> = vec![(0, 0), (1, 17), (2, 300)];
    toks.extend((40..53).map(|p| (3u32, p)));
    let (num_seqs, max_blocks, heads) = (4usize, 24usize, 6usize);
    let mut dims = vec![64, 128];
    if var("TANDEM_CUDA_ATTENTION_D256") == "tc" {
        dims.push(256);
    }
    for head_dim in dims {
        let g = KvGeometry { num_blocks: num_seqs * max_blocks, block_size: 16, num_kv_heads: 2, head_dim };
        let n = g.layer_elems();
        let (k, v) = (rng.vec(n), rng.vec(n));
        let q: Vec<f32> = rng.vec(toks.len() * heads * head_dim).into_iter().map(|x| 2.0 * x).collect();
        // Sequence s's blocks scattered over the cache (7 is coprime with its 96 blocks).
        let tables: Vec<u32> = (0..num_seqs * max_blocks).map(|i| ((i * 7 + 3) % g.num_blocks) as u32).collect();
        let all: Vec<u32> = (0..g.slots() as u32).collect();
        let positions: Vec<u32> = toks.iter().map(|t| t.1).collect();
        let seqs: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let (qb, pb, sb, tb, ab) =
            (up(&b, &q), up_u32(&b, &positions), up_u32(&b, &seqs), up_u32(&b, &tables), up_u32(&b, &all));
        let attend = |kc: &tandem_cuda::CudaBuf, vc: &tandem_cuda::CudaBuf| {
            let args = tandem_core::backend::AttnArgs {
                q: &qb,
                k_cache: kc,
                v_cache: vc,
                positions: &pb,
                token_seq: &sb,
                block_tables: &tb,
                num_tokens: toks.len(),
                num_seqs,
                max_blocks,
                max_context: *positions.iter().max().unwrap() as usize + 1,
                decode_tokens: tandem_core::batch::leading_decodes(&seqs),
                num_heads: heads,
                geometry: g,
                scale: 1.0 / (head_dim as f32).sqrt(),
                window: 0,
            };
            let mut out = up(&b, &vec![f32::NAN; toks.len() * heads * head_dim]);
            b.paged_attention(&args, &mut out).unwrap();
            b.read_f32(&out, toks.len() * heads * head_dim).unwrap()
        };
        for kv in FP8 {
            for scales in [[1.0f32, 1.0], [0.37, 3.0]] {
                if f32_kernel && scales != [1.0, 1.0] {
                    continue;
                }
                let (mut kc, mut vc) =
                    (b.alloc_kv_scaled(g, kv, scales[0]).unwrap(), b.alloc_kv_scaled(g, kv, scales[1]).unwrap());
                b.kv_write(&up(&b, &k), &up(&b, &v), &mut kc, &mut vc, &ab, all.len(), g).unwrap();
                let (kd, vd) = (b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap());
                let (mut kh, mut vh) =
                    (b.alloc_kv_as(g, KvDtype::Bf16).unwrap(), b.alloc_kv_as(g, KvDtype::Bf16).unwrap());
                b.kv_write(&up(&b, &kd), &up(&b, &vd), &mut kh, &mut vh, &ab, all.len(), g).unwrap();
                let (got, want) = (attend(&kc, &vc), attend(&kh, &vh));
                assert!(got.iter().all(|x| x.is_finite()), "{} d{head_dim}: non-finite output", kv.name());
                let bad = bits(got).iter().zip(bits(want)).position(|(a, b)| *a != b);
                assert_eq!(bad, None, "{} head_dim {head_dim} scales {scales:?}: element {bad:?} differs", kv.name());
            }
        }
    }
}
