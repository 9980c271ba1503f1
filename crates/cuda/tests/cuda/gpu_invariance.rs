//! GPU-only checks the shared op suite does not make: attention over contexts longer than one
//! partition (the split path: partials combined by the last partition block), compared with the reference, over an f32 and
//! a bf16 cache (and an fp8 one, against the reference's fp8 cache); and batch invariance, bit for bit: a token's attention output is the same alone
//! and in a batch with longer contexts (every cache type), and a matmul row is the same whatever the other rows, across every tile kernel (m16 / m64 /
//! m128), the split-K workspace fold and the in-register fold (kernels/matmul.cu's contract).
//! Without a driver each test prints SKIPPED; TANDEM_REQUIRE_CUDA=1 turns that into a failure.

use tandem_core::backend::prelude::*;
use tandem_core::backend::{AttnArgs, KvDtype, KvGeometry};
use tandem_core::config::Activation;
use tandem_core::DType;
use tandem_cuda::CudaBackend;
use tandem_reference::RefBackend;

fn backend(test: &str) -> Option<CudaBackend> {
    crate::gpu_or_skip(test)
}

/// splitmix64 normals in [-scale, scale) — enough for these checks.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn nmse(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// One layer's caches filled with random K/V; sequence s owns blocks 80s .. 80s + 80 (1280 tokens).
const MAX_BLOCKS: usize = 80;

struct Attn {
    g: KvGeometry,
    k: Vec<f32>,
    v: Vec<f32>,
    heads: usize,
}

impl Attn {
    fn new(rng: &mut Rng) -> Attn {
        let g = KvGeometry { num_blocks: 320, block_size: 16, num_kv_heads: 2, head_dim: 64 };
        let n = g.layer_elems();
        Attn { g, k: rng.vec(n, 1.0), v: rng.vec(n, 1.0), heads: 6 }
    }

    /// Runs attention for query tokens given as (sequence, position) over a cache of `dtype`.
    /// Returns out [T, heads, head_dim].
    fn run<B: Backend>(&self, b: &B, dtype: KvDtype, q: &[f32], toks: &[(u32, u32)], num_seqs: usize) -> Vec<f32> {
        let g = self.g;
        let max_blocks = MAX_BLOCKS;
        let mut kc = b.alloc_kv_as(g, dtype).unwrap();
        let mut vc = b.alloc_kv_as(g, dtype).unwrap();
        let all: Vec<u32> = (0..g.slots() as u32).collect();
        let up = |d: &[f32]| {
            let mut x = b.alloc_f32(d.len()).unwrap();
            b.write_f32(&mut x, d).unwrap();
            x
        };
        let upu = |d: &[u32]| {
            let mut x = b.alloc_u32(d.len()).unwrap();
            b.write_u32(&mut x, d).unwrap();
            x
        };
        let (kb, vb, sl) = (up(&self.k), up(&self.v), upu(&all));
        b.kv_write(&kb, &vb, &mut kc, &mut vc, &sl, g.slots(), g).unwrap();
        let tables: Vec<u32> = (0..num_seqs * max_blocks).map(|i| i as u32).collect();
        let positions: Vec<u32> = toks.iter().map(|t| t.1).collect();
        let seqs: Vec<u32> = toks.iter().map(|t| t.0).collect();
        let (qb, pb, sb, tb) = (up(q), upu(&positions), upu(&seqs), upu(&tables));
        let t = toks.len();
        let args = AttnArgs {
            q: &qb,
            k_cache: &kc,
            v_cache: &vc,
            positions: &pb,
            token_seq: &sb,
            block_tables: &tb,
            num_tokens: t,
            num_seqs,
            max_blocks,
            max_context: *positions.iter().max().unwrap() as usize + 1,
            decode_tokens: tandem_core::batch::leading_decodes(&seqs),
            num_heads: self.heads,
            geometry: g,
            scale: 1.0 / (g.head_dim as f32).sqrt(),
            window: 0,
        };
        let mut out = up(&vec![f32::NAN; t * self.heads * g.head_dim]);
        b.paged_attention(&args, &mut out).unwrap();
        b.read_f32(&out, t * self.heads * g.head_dim).unwrap()
    }
}

/// The harness itself, on the reference (runs everywhere): the token lists below fit the block
/// tables, and a single token's output does not depend on the rest of the batch there either.
#[test]
fn harness_runs_on_the_reference() {
    let r = RefBackend::new();
    let mut rng = Rng(5);
    let a = Attn::new(&mut rng);
    let row = a.heads * a.g.head_dim;
    let toks = [(0u32, 512u32), (1, 1023), (2, 1099), (3, 1279)];
    let q = rng.vec(toks.len() * row, 2.0);
    let all = a.run(&r, KvDtype::F32, &q, &toks, 4);
    let one = a.run(&r, KvDtype::F32, &q[row..2 * row], &toks[1..2], 4);
    assert!(all.iter().all(|x| x.is_finite()));
    assert_eq!(&all[row..2 * row], &one[..]);
}

#[test]
fn long_context_attention_matches_reference() {
    let Some(cuda) = backend("long_context_attention_matches_reference") else { return };
    let mut rng = Rng(7);
    let a = Attn::new(&mut rng);
    // Decodes at 513, 1024, 1100 and 640 tokens of context plus a prefill chunk that crosses
    // the 512 boundary (positions 500..530 of sequence 3).
    let mut toks = vec![(0u32, 512u32), (1, 1023), (2, 1099), (3, 639)];
    toks.extend((500..530).map(|p| (3u32, p)));
    let q = rng.vec(toks.len() * a.heads * a.g.head_dim, 2.0);
    let want = a.run(&RefBackend::new(), KvDtype::F32, &q, &toks, 4);
    // f32: the reference's arithmetic; bf16: each K/V element off by at most 2^-8 relative
    // (with the tensor-core kernel q and p too). The expected NMSE is at most 10 roundings'
    // worth (limits::ATTENTION_ROUNDINGS in crates/conformance: 2.75e-5), and with hundreds of
    // keys and 34 tokens it stays near that, so 5e-5 here (the op suite's limit, 2e-4, also
    // covers cases of a few keys); the emulator holds the kernel to a per-element bound.
    for (dtype, limit) in [(KvDtype::F32, 1e-7), (KvDtype::Bf16, 5e-5)] {
        let got = a.run(&cuda, dtype, &q, &toks, 4);
        assert!(got.iter().all(|x| x.is_finite()), "{dtype:?}: non-finite output");
        let e = nmse(&got, &want);
        println!("long-context attention, {dtype:?} cache: {} tokens, NMSE {e:.3e}", toks.len());
        assert!(e < limit, "{dtype:?} cache: NMSE {e:.3e}");
    }
    // An fp8 cache holds the reference's bytes (kv_write) and reads them back as it does.
    // Against the reference over the same fp8 cache, the tensor-core kernel's fp8 form (the
    // switch TANDEM_CUDA_ATTENTION_FP8=tc) rounds q, p and each decoded element times its scale to bf16, so
    // the bf16 cache's limit; the f32 kernel (TANDEM_CUDA_ATTENTION=f32) differs only in the f32
    // arithmetic's order.
    let f32_kernel = std::env::var("TANDEM_CUDA_ATTENTION").is_ok_and(|v| v == "f32")
        || !std::env::var("TANDEM_CUDA_ATTENTION_FP8").is_ok_and(|v| v == "tc");
    for dtype in [KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
        let want = a.run(&RefBackend::new(), dtype, &q, &toks, 4);
        let got = a.run(&cuda, dtype, &q, &toks, 4);
        assert!(got.iter().all(|x| x.is_finite()), "{dtype:?}: non-finite output");
        let e = nmse(&got, &want);
        println!("long-context attention, {dtype:?} cache against the reference's: NMSE {e:.3e}");
        let limit = if f32_kernel { 1e-7 } else { 5e-5 };
        assert!(e < limit, "{dtype:?} cache: NMSE {e:.3e}");
    }
}

#[test]
fn attention_is_batch_invariant() {
    let Some(cuda) = backend("attention_is_batch_invariant") else { return };
    let mut rng = Rng(11);
    let a = Attn::new(&mut rng);
    let row = a.heads * a.g.head_dim;
    // Token A (context 300: one partition) and token B (context 900: two partitions), alone
    // and together with a longer neighbour, which changes the launch's partition count.
    let qa = rng.vec(row, 2.0);
    let qb = rng.vec(row, 2.0);
    let qc = rng.vec(row, 2.0);
    let q: Vec<f32> = [qc.clone(), qa.clone(), qb.clone()].concat();
    for dtype in [KvDtype::Bf16, KvDtype::F32, KvDtype::Fp8E4m3, KvDtype::Fp8E5m2] {
        let alone_a = a.run(&cuda, dtype, &qa, &[(0, 299)], 3);
        let alone_b = a.run(&cuda, dtype, &qb, &[(1, 899)], 3);
        let batch = a.run(&cuda, dtype, &q, &[(2, 620), (0, 299), (1, 899)], 3);
        assert_eq!(&batch[row..2 * row], &alone_a[..], "{dtype:?} cache: short context differs alone vs in a batch");
        assert_eq!(&batch[2 * row..], &alone_b[..], "{dtype:?} cache: long context differs alone vs in a batch");
    }
}

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let Some(cuda) = backend("matmul_rows_do_not_depend_on_the_batch") else { return };
    let mut rng = Rng(3);
    // k = 2000 splits into several K slices (kernels/matmul.cu); k = 576 into one.
    for (n, k) in [(300, 576), (300, 2000), (2048, 2048)] {
        for dtype in [DType::BF16, DType::F16, DType::F32] {
            let w = cuda.weight_from_f32(dtype, &rng.vec(n * k, 0.05)).unwrap();
            let x = rng.vec(300 * k, 1.0);
            let run = |m: usize, first: usize| {
                let mut xb = cuda.alloc_f32(m * k).unwrap();
                cuda.write_f32(&mut xb, &x[first * k..(first + m) * k]).unwrap();
                let mut out = cuda.alloc_f32(m * n).unwrap();
                cuda.matmul(&xb, &w, None, &mut out, m, n, k).unwrap();
                cuda.read_f32(&out, m * n).unwrap()
            };
            // m = 1 and 16 take the m16 kernel, 17 and 128 the m64 one (both split K across
            // blocks), 300 the m128 one (slices folded in registers): every row must agree.
            // With TANDEM_CUDA_GEMM_LARGE=wgmma (gpu/tune.sh), m = 300 takes the wgmma + TMA
            // kernel (kernels/matmul_sm90.cu) for bf16 / f16: this is the hardware's bitwise
            // check of wgmma against mma.sync.
            let batches: Vec<(usize, Vec<f32>)> = [16, 17, 128, 300].iter().map(|&m| (m, run(m, 0))).collect();
            for r in [0, 5, 16, 100, 299] {
                let alone = run(1, r);
                for (m, out) in &batches {
                    if r < *m {
                        assert_eq!(
                            alone[..],
                            out[r * n..(r + 1) * n],
                            "{dtype:?} n {n} k {k}: row {r} alone != row {r} of m = {m}"
                        );
                    }
                }
            }
        }
    }
}

/// The fused projections' rows do not depend on the batch either: gate/up with silu and with GeGLU, and the
/// residual add with the next norm's product (h * gamma) at m = 300 (the large kernel; with
/// TANDEM_CUDA_GEMM_LARGE=wgmma, gpu/tune.sh, the wgmma kernel's epilogues: the hardware's
/// bitwise check of them against mma.sync) and m = 17, against each row alone (m16, split K).
#[test]
fn fused_gemm_rows_do_not_depend_on_the_batch() {
    let Some(cuda) = backend("fused_gemm_rows_do_not_depend_on_the_batch") else { return };
    let mut rng = Rng(5);
    let (h, inter, rows) = (576, 200, 300);
    for dtype in [DType::BF16, DType::F16] {
        let mut ws = tandem_core::weights::Weights::empty();
        ws.replace("gate", dtype, &[inter, h], &rng.vec(inter * h, 0.05)).unwrap();
        ws.replace("up", dtype, &[inter, h], &rng.vec(inter * h, 0.05)).unwrap();
        let wgu = cuda
            .fuse_gate_up(&ws.get("gate", &[inter, h]).unwrap(), &ws.get("up", &[inter, h]).unwrap())
            .unwrap()
            .expect("cuda fuses gate/up");
        let wo = cuda.weight_from_f32(dtype, &rng.vec(h * h, 0.05)).unwrap();
        let gamma = cuda.weight_from_f32(dtype, &rng.vec(h, 1.0)).unwrap();
        let (x, h0) = (rng.vec(rows * h, 1.0), rng.vec(rows * h, 2.0));
        let run = |m: usize, first: usize| {
            let mut xb = cuda.alloc_f32(m * h).unwrap();
            cuda.write_f32(&mut xb, &x[first * h..(first + m) * h]).unwrap();
            let mut act = cuda.alloc_f32(m * inter).unwrap();
            cuda.gate_up_act(Activation::Silu, &xb, &wgu, &mut act, m, inter, h, None).unwrap();
            let mut geglu = cuda.alloc_f32(m * inter).unwrap();
            cuda.gate_up_act(Activation::GeluTanh, &xb, &wgu, &mut geglu, m, inter, h, None).unwrap();
            let mut hb = cuda.alloc_f32(m * h).unwrap();
            cuda.write_f32(&mut hb, &h0[first * h..(first + m) * h]).unwrap();
            let mut hg = cuda.alloc_f32(m * h).unwrap();
            cuda.matmul_residual(&xb, &wo, &mut hb, Some((&gamma, &mut hg)), m, h, h).unwrap();
            (
                cuda.read_f32(&act, m * inter).unwrap(),
                cuda.read_f32(&hb, m * h).unwrap(),
                cuda.read_f32(&hg, m * h).unwrap(),
                cuda.read_f32(&geglu, m * inter).unwrap(),
            )
        };
        let batches: Vec<_> = [17, rows].iter().map(|&m| (m, run(m, 0))).collect();
        for r in [0, 16, 200, 299] {
            let (a, hh, g, gg) = run(1, r);
            for (m, (ba, bh, bg, bgg)) in &batches {
                if r < *m {
                    assert_eq!(
                        a[..],
                        ba[r * inter..(r + 1) * inter],
                        "{dtype:?} gate_up_act silu: row {r} alone != row {r} of m = {m}"
                    );
                    assert_eq!(
                        gg[..],
                        bgg[r * inter..(r + 1) * inter],
                        "{dtype:?} gate_up_act GeGLU: row {r} alone != row {r} of m = {m}"
                    );
                    assert_eq!(
                        hh[..],
                        bh[r * h..(r + 1) * h],
                        "{dtype:?} matmul_residual h: row {r} alone != row {r} of m = {m}"
                    );
                    assert_eq!(
                        g[..],
                        bg[r * h..(r + 1) * h],
                        "{dtype:?} matmul_residual h * gamma: row {r} alone != row {r} of m = {m}"
                    );
                }
            }
        }
    }
}

/// Masked sampling on the GPU gives the host's ids (structured output), for greedy and sampled
/// rows, masked or not, on a 49k vocabulary.
#[test]
fn masked_sampling_matches_the_host() {
    use tandem_core::sampling::{sample_rows_masked, RowMasks, SampleSpec};
    let Some(b) = backend("masked_sampling_matches_the_host") else { return };
    let (rows, vocab) = (16, 49152);
    let mut rng = Rng(7);
    let logits = rng.vec(rows * vocab, 8.0);
    let specs: Vec<SampleSpec> = (0..rows)
        .map(|r| SampleSpec {
            temperature: [0.0, 0.7, 1.0, 1.5][r % 4],
            top_k: [0, 40][r % 2],
            top_p: [1.0, 0.9][r % 3 / 2],
            min_p: 0.0,
            seed: 11 + r as u64,
            completion: 0,
            token_index: r as u32,
        })
        .collect();
    let mut masks = RowMasks::none(rows, vocab);
    for r in (0..rows).filter(|r| r % 3 != 0) {
        let m: Vec<u32> = (0..masks.words).map(|w| if (w + r) % 5 == 0 { 0x5555_5555 } else { 0 }).collect();
        masks.set(r, &m);
    }
    let mut buf = b.alloc_f32(rows * vocab).unwrap();
    b.write_f32(&mut buf, &logits).unwrap();
    let got = b.sample_masked(&buf, rows, vocab, &specs, &masks).unwrap();
    assert_eq!(got, sample_rows_masked(&logits, vocab, &specs, &masks));
    // Greedy rows alone (the argmax kernel, or argmax_partial + argmax_fold under
    // TANDEM_CUDA_ARGMAX=multi: 12 chunks a row), with ties across chunks and NaNs planted.
    let mut planted = logits.clone();
    for r in 0..rows {
        let row = &mut planted[r * vocab..(r + 1) * vocab];
        row[(r * 4099) % vocab] = 100.0;
        row[vocab - 1 - r] = 100.0;
        row[r] = f32::NAN;
    }
    b.write_f32(&mut buf, &planted).unwrap();
    let want: Vec<u32> = planted.chunks_exact(vocab).map(tandem_core::backend::argmax_row).collect();
    assert_eq!(b.argmax(&buf, rows, vocab).unwrap(), want, "argmax");
    b.write_f32(&mut buf, &logits).unwrap();
    // Penalties, logit_bias and bans (`logit_edits` in place first), with and without masks:
    // every fourth token of a row edited, the row's best one banned now and then.
    use tandem_core::sampling::LogitEdit;
    for r in 0..rows {
        let edits = (0..vocab as u32)
            .filter(|t| (*t as usize + r).is_multiple_of(4))
            .map(|token| LogitEdit {
                token,
                repetition: (token % 3 == 0).then_some(1.3),
                subtract: (token % 5 == 0).then_some(0.7),
                bias: (token % 7 == 0).then_some(4.0),
                ban: token % 11 == 0,
            })
            .collect();
        masks.set_edits(r, edits);
    }
    b.write_f32(&mut buf, &logits).unwrap();
    let got = b.sample_masked(&buf, rows, vocab, &specs, &masks).unwrap();
    assert_eq!(got, sample_rows_masked(&logits, vocab, &specs, &masks), "edited rows");
    // Logprobs of the raw logits (the edits undone first), bitwise the host's.
    let top_n: Vec<Option<usize>> = (0..rows).map(|r| [None, Some(0), Some(1), Some(5), Some(20)][r % 5]).collect();
    b.write_f32(&mut buf, &logits).unwrap();
    let (ids, lps) = b.sample_logprobs(&buf, rows, vocab, &specs, &masks, &top_n).unwrap();
    assert_eq!(ids, sample_rows_masked(&logits, vocab, &specs, &masks), "ids with logprobs");
    for r in 0..rows {
        let want =
            top_n[r].map(|n| tandem_core::sampling::logprobs_row(&logits[r * vocab..(r + 1) * vocab], ids[r], n));
        let bits = |l: &Option<tandem_core::sampling::TokenLogprobs>| {
            l.as_ref().map(|l| {
                (l.token, l.logprob.to_bits(), l.top.iter().map(|(t, x)| (*t, x.to_bits())).collect::<Vec<_>>())
            })
        };
        assert_eq!(bits(&lps[r]), bits(&want), "row {r} logprobs");
    }
}
