//! The limits must not be tighter than honest implementations. A wrapper around the reference
//! recomputes ops the way a GPU kernel legitimately might (f32 accumulation in another order,
//! f32 sin/cos, activations rounded to the weight dtype as tensor cores do, a bf16 KV cache),
//! and the whole suite must still pass. The NMSE each variant reaches is printed, so the
//! headroom under each limit can be read off.

use tandem_conformance::run;
use tandem_core::backend::{AttnArgs, Backend, DType, Device, FusedOps, KvGeometry, Ops, Sampling, Storage};
use tandem_core::weights::TensorView;
use tandem_core::Result;
use tandem_reference::RefBackend;

/// A buffer of the variant backend: the inner buffer, plus the host values of a weight.
struct VBuf<T> {
    inner: T,
    weight: Option<(DType, Vec<f32>)>,
}

struct Variant<B: Backend> {
    inner: B,
}

impl<B: Backend> Variant<B> {
    fn wrap(&self, inner: B::Buf) -> VBuf<B::Buf> {
        VBuf { inner, weight: None }
    }
    fn weight<'a>(&self, b: &'a VBuf<B::Buf>) -> &'a (DType, Vec<f32>) {
        b.weight.as_ref().expect("the suite passes weights where weights are due")
    }
}

fn round(dtype: DType, v: &[f32]) -> Vec<f32> {
    dtype.to_f32(&dtype.from_f32(v))
}

impl<B: Backend> Device for Variant<B> {
    fn name(&self) -> &'static str {
        "variant"
    }
}

impl<B: Backend> Storage for Variant<B> {
    type Buf = VBuf<B::Buf>;
    fn upload_weight(&self, t: &TensorView) -> Result<Self::Buf> {
        Ok(VBuf { inner: self.inner.upload_weight(t)?, weight: Some((t.dtype, t.to_f32())) })
    }
    fn weight_from_f32(&self, dtype: DType, values: &[f32]) -> Result<Self::Buf> {
        Ok(VBuf { inner: self.inner.weight_from_f32(dtype, values)?, weight: Some((dtype, round(dtype, values))) })
    }
    fn alloc_f32(&self, len: usize) -> Result<Self::Buf> {
        Ok(self.wrap(self.inner.alloc_f32(len)?))
    }
    fn alloc_u32(&self, len: usize) -> Result<Self::Buf> {
        Ok(self.wrap(self.inner.alloc_u32(len)?))
    }
    fn alloc_kv(&self, g: KvGeometry) -> Result<Self::Buf> {
        Ok(self.wrap(self.inner.alloc_kv(g)?))
    }
    fn write_f32(&self, buf: &mut Self::Buf, data: &[f32]) -> Result<()> {
        self.inner.write_f32(&mut buf.inner, data)
    }
    fn write_u32(&self, buf: &mut Self::Buf, data: &[u32]) -> Result<()> {
        self.inner.write_u32(&mut buf.inner, data)
    }
    fn read_f32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<f32>> {
        self.inner.read_f32(&buf.inner, len)
    }
    fn read_u32(&self, buf: &Self::Buf, len: usize) -> Result<Vec<u32>> {
        self.inner.read_u32(&buf.inner, len)
    }
    fn read_kv(&self, buf: &Self::Buf, g: KvGeometry) -> Result<Vec<f32>> {
        self.inner.read_kv(&buf.inner, g)
    }
}

impl<B: Backend> Ops for Variant<B> {
    fn embedding(
        &self,
        table: &Self::Buf,
        ids: &Self::Buf,
        out: &mut Self::Buf,
        t: usize,
        hidden: usize,
    ) -> Result<()> {
        self.inner.embedding(&table.inner, &ids.inner, &mut out.inner, t, hidden)
    }
    fn gather_rows(&self, src: &Self::Buf, rows: &Self::Buf, out: &mut Self::Buf, n: usize, dim: usize) -> Result<()> {
        self.inner.gather_rows(&src.inner, &rows.inner, &mut out.inner, n, dim)
    }
    /// f32 sum of squares, in order; f32 reciprocal square root.
    fn rms_norm(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let xs = self.read_f32(x, rows * dim)?;
        let (_, wv) = self.weight(w);
        let mut o = vec![0f32; rows * dim];
        for r in 0..rows {
            let row = &xs[r * dim..][..dim];
            let ms = row.iter().fold(0f32, |s, v| s + v * v) / dim as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for i in 0..dim {
                o[r * dim + i] = row[i] * wv[i] * inv;
            }
        }
        self.write_f32(out, &o)
    }
    fn add(&self, acc: &mut Self::Buf, x: &Self::Buf, len: usize) -> Result<()> {
        self.inner.add(&mut acc.inner, &x.inner, len)
    }
    /// Activations rounded to the weight dtype (as bf16/f16 tensor cores take them), f32
    /// accumulation in plain order, bias added last.
    fn matmul(
        &self,
        x: &Self::Buf,
        w: &Self::Buf,
        bias: Option<&Self::Buf>,
        out: &mut Self::Buf,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        let (dtype, wv) = self.weight(w);
        let xs = round(*dtype, &self.read_f32(x, m * k)?);
        let bv = bias.map(|b| &self.weight(b).1);
        let mut o = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s = (0..k).fold(0f32, |s, l| s + xs[i * k + l] * wv[j * k + l]);
                o[i * n + j] = s + bv.map_or(0.0, |b| b[j]);
            }
        }
        self.write_f32(out, &o)
    }
    /// Angles, sin and cos all in f32.
    fn rope(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        pos: &Self::Buf,
        inv_freq: &Self::Buf,
        t: usize,
        qh: usize,
        kh: usize,
        hd: usize,
    ) -> Result<()> {
        let pos = self.read_u32(pos, t)?;
        let freq = self.read_f32(inv_freq, hd / 2)?;
        for (buf, heads) in [(q, qh), (k, kh)] {
            let mut v = self.read_f32(buf, t * heads * hd)?;
            for (i, head) in v.chunks_exact_mut(hd).enumerate() {
                let p = pos[i / heads] as f32;
                for d in 0..hd / 2 {
                    let (s, c) = (p * freq[d]).sin_cos();
                    let (a, b) = (head[d], head[d + hd / 2]);
                    head[d] = a * c - b * s;
                    head[d + hd / 2] = b * c + a * s;
                }
            }
            self.write_f32(buf, &v)?;
        }
        Ok(())
    }
    fn silu_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()> {
        let (g, u) = (self.read_f32(gate, len)?, self.read_f32(up, len)?);
        let o: Vec<f32> = g.iter().zip(&u).map(|(&x, &y)| x * (1.0 / (1.0 + (-x).exp())) * y).collect();
        self.write_f32(out, &o)
    }
    /// tanh in f64, rounded once (a GPU's tanhf differs from the host's by an ulp or two), and
    /// the products in another order.
    fn gelu_tanh_mul(&self, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf, len: usize) -> Result<()> {
        let (g, u) = (self.read_f32(gate, len)?, self.read_f32(up, len)?);
        let gelu = |x: f32| {
            let inner = 0.797_884_6f32 * (x + 0.044_715 * (x * x * x));
            x * (0.5 * (1.0 + (inner as f64).tanh() as f32))
        };
        let o: Vec<f32> = g.iter().zip(&u).map(|(&x, &y)| y * gelu(x)).collect();
        self.write_f32(out, &o)
    }
    fn scale(&self, x: &mut Self::Buf, factor: f32, len: usize) -> Result<()> {
        self.inner.scale(&mut x.inner, factor, len)
    }
    /// A bf16 cache: values are rounded on the way in.
    fn kv_write(
        &self,
        k: &Self::Buf,
        v: &Self::Buf,
        kc: &mut Self::Buf,
        vc: &mut Self::Buf,
        slots: &Self::Buf,
        t: usize,
        g: KvGeometry,
    ) -> Result<()> {
        let row = g.num_kv_heads * g.head_dim;
        let mut kb = self.inner.alloc_f32(t * row)?;
        let mut vb = self.inner.alloc_f32(t * row)?;
        self.inner.write_f32(&mut kb, &round(DType::BF16, &self.read_f32(k, t * row)?))?;
        self.inner.write_f32(&mut vb, &round(DType::BF16, &self.read_f32(v, t * row)?))?;
        self.inner.kv_write(&kb, &vb, &mut kc.inner, &mut vc.inner, &slots.inner, t, g)
    }
    /// As the tensor-core kernel computes it (kernels/paged_attention.cu, "2." of its header):
    /// q rounded to bf16, scores in f32 over dims in order, an online softmax in base 2 over
    /// 64-key tiles, `l` summing the f32 p, and `o` summing bf16(p) times V. (The kernel's
    /// partitions and their fold are left out: they move only f32 roundings.)
    fn paged_attention(&self, a: &AttnArgs<'_, Self>, out: &mut Self::Buf) -> Result<()> {
        let g = a.geometry;
        let (t, heads, hd) = (a.num_tokens, a.num_heads, g.head_dim);
        let q = round(DType::BF16, &self.read_f32(a.q, t * heads * hd)?);
        let kc = self.read_kv(a.k_cache, g)?;
        let vc = self.read_kv(a.v_cache, g)?;
        let pos = self.read_u32(a.positions, t)?;
        let seq = self.read_u32(a.token_seq, t)?;
        let tables = self.read_u32(a.block_tables, a.num_seqs * a.max_blocks)?;
        let group = heads / g.num_kv_heads;
        let log2e = std::f32::consts::LOG2_E;
        let mut o = vec![0f32; t * heads * hd];
        for i in 0..t {
            let ctx = pos[i] as usize + 1;
            // The window's first key (HF's sliding window: the last `window` positions).
            let first = if a.window > 0 { ctx.saturating_sub(a.window) } else { 0 };
            let table = &tables[seq[i] as usize * a.max_blocks..][..a.max_blocks];
            let row = |j: usize, kh: usize| {
                (table[j / g.block_size] as usize * g.block_size + j % g.block_size) * g.num_kv_heads * hd + kh * hd
            };
            for h in 0..heads {
                let kh = h / group;
                let qh = &q[(i * heads + h) * hd..][..hd];
                let (mut m, mut l, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; hd]);
                for tile in (first / 64 * 64..ctx).step_by(64) {
                    let keys = tile.max(first)..(tile + 64).min(ctx);
                    let s: Vec<f32> = keys
                        .clone()
                        .map(|j| {
                            qh.iter().zip(&kc[row(j, kh)..][..hd]).fold(0f32, |s, (x, y)| s + x * y) * a.scale * log2e
                        })
                        .collect();
                    let m2 = s.iter().fold(m, |x, &y| x.max(y));
                    let alpha = (m - m2).exp2();
                    let p: Vec<f32> = s.iter().map(|&x| (x - m2).exp2()).collect();
                    l = l * alpha + p.iter().sum::<f32>();
                    let pb = round(DType::BF16, &p);
                    for d in 0..hd {
                        acc[d] = keys.clone().zip(&pb).fold(acc[d] * alpha, |s, (j, &w)| s + w * vc[row(j, kh) + d]);
                    }
                    m = m2;
                }
                for d in 0..hd {
                    o[(i * heads + h) * hd + d] = acc[d] / l;
                }
            }
        }
        self.write_f32(out, &o)
    }
}

impl<B: Backend> FusedOps for Variant<B> {}

impl<B: Backend> Sampling for Variant<B> {}

#[test]
fn honest_variants_pass_every_limit() {
    let mut out = Vec::new();
    let rep = run(&Variant { inner: RefBackend::new() }, None, 2024, &mut out);
    let text = String::from_utf8(out).unwrap();
    print!("{text}");
    assert!(
        rep.ok(),
        "{}",
        rep.failures().map(|r| format!("{} {}: {:?}\n", r.op, r.params, r.failure)).collect::<String>()
    );
    // The variants really differ from the reference where they should (else this test proves
    // nothing about the limits): f32 matmul order, bf16 activations, bf16 cache, f32 rope.
    let nmse_of = |op: &str, part: &str| {
        rep.results
            .iter()
            .filter(|r| r.op == op && r.params.contains(part) && r.skipped.is_none())
            .map(|r| r.nmse.unwrap())
            .fold(0.0, f64::max)
    };
    assert!(nmse_of("matmul", "w=f32") > 0.0);
    assert!(nmse_of("matmul", "w=bf16") > 1e-7, "bf16 activations should cost ~1e-6");
    assert!(nmse_of("kv_write", "") > 1e-7, "a bf16 cache should cost ~1e-6");
    assert!(nmse_of("paged_attention", "") > 1e-7, "q and p in bf16 should cost ~1e-6");
    assert!(nmse_of("rope", "") > 0.0);
    assert!(nmse_of("gelu_tanh_mul", "") > 0.0);
}

/// The cases judged on few values, where the NMSE is no average and one sum that nearly
/// cancels can magnify an honest rounding: the single-column GEMMs (n = 1, k = 1000; on the
/// H200, 2026-12-04, f16 m = 1 once measured 1.49e-6 against its limit of 1e-6, and this
/// variant failed bf16 m = 1 and 3 at seed 0 before their x was drawn exact in the weight
/// type) and the residual/norm/gate-up chain at 1-2 tokens (1.25e-5 on the H200 against a
/// former 1e-5), and attention with q, p and the cache in bf16 as the tensor-core kernel rounds
/// them (a peaked softmax magnifies a rounded score). Over many seeds the rounding variant must pass them all; the worst NMSE of each
/// case is printed (the headroom under its limit).
#[test]
fn few_value_cases_pass_over_many_seeds() {
    // 300 seeds when the limits were set (2026-12-04: bf16 residual chain worst 1.75e-5, now
    // against its derived 3.1e-5); 150 in CI, half a minute.
    const SEEDS: u64 = 150;
    let variant = Variant { inner: RefBackend::new() };
    for filter in ["n=1 k=1000", "residual_norm_gate_up", "paged_attention"] {
        let mut worst: std::collections::BTreeMap<String, f64> = Default::default();
        for seed in 0..SEEDS {
            let mut out = Vec::new();
            let rep = run(&variant, Some(filter), seed, &mut out);
            assert!(rep.ok(), "seed {seed}: {}", String::from_utf8_lossy(&out));
            for r in &rep.results {
                let w = worst.entry(r.params.clone()).or_default();
                *w = w.max(r.nmse.unwrap_or(0.0));
            }
        }
        assert!(!worst.is_empty(), "no case matched {filter}");
        for (p, w) in &worst {
            println!("{filter} {p}: worst NMSE over {SEEDS} seeds {w:.3e}");
        }
    }
}

/// The constants the limits are derived from (crates/conformance/src/ops/mod.rs, `limits`):
/// one bf16 or f16 rounding's NMSE on normal draws, and silu's gain on an error in its input.
#[test]
fn the_limits_derivations_hold() {
    use tandem_conformance::ops::limits;
    // Deterministic normal-ish draws: a sum of 12 uniforms (SplitMix64), less 6.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut uniform = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let xs: Vec<f32> = (0..200_000).map(|_| ((0..12).map(|_| uniform()).sum::<f64>() - 6.0) as f32).collect();
    for dtype in [DType::BF16, DType::F16] {
        let r = round(dtype, &xs);
        let num: f64 = xs.iter().zip(&r).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
        let den: f64 = xs.iter().map(|&a| (a as f64).powi(2)).sum();
        let (got, want) = (num / den, limits::rounding(dtype));
        println!("{dtype:?}: one rounding's NMSE {got:.3e}, derived {want:.3e}");
        assert!((got / want - 1.0).abs() < 0.03, "{dtype:?}: measured {got:.3e}, derived {want:.3e}");
    }
    // W8A8's activation rounding: rows of 576 (SmolLM2's hidden) quantized to e4m3 with their
    // own scale amax / 448 (crates/core fp8_round.rs, the rounding CUDA's kernel does).
    {
        use tandem_core::fp8::Fp8Format;
        use tandem_core::fp8_round::{dequantize, quantize};
        let (mut num, mut den) = (0f64, 0f64);
        for row in xs.chunks_exact(576) {
            let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = (amax / 448.0).max(1.0 / (448.0 * 512.0));
            for &v in row {
                let q = dequantize(Fp8Format::E4M3, quantize(Fp8Format::E4M3, v, s), s);
                num += (v as f64 - q as f64).powi(2);
                den += (v as f64).powi(2);
            }
        }
        let (got, want) = (num / den, limits::e4m3_rounding());
        println!("e4m3 per token: one rounding's NMSE {got:.3e}, derived {want:.3e}");
        assert!((got / want - 1.0).abs() < 0.05, "e4m3: measured {got:.3e}, derived {want:.3e}");
    }
    // sigma^2 E[silu'(g)^2] / E[silu(g)^2], g ~ N(0, sigma^2), by the trapezoid rule.
    for var in [1.0f64, 1.09] {
        let (mut a, mut b) = (0.0, 0.0);
        let (n, span) = (20_000, 12.0 * var.sqrt());
        for i in 0..=n {
            let g = -span + 2.0 * span * i as f64 / n as f64;
            let w = (-g * g / (2.0 * var)).exp();
            let sig = 1.0 / (1.0 + (-g).exp());
            a += w * (g * sig).powi(2);
            b += w * (sig * (1.0 + g * (1.0 - sig))).powi(2);
        }
        let gain = var * b / a;
        println!("silu's gain at variance {var}: {gain:.4}");
        assert!((gain / limits::SILU_GAIN - 1.0).abs() < 0.01, "silu's gain {gain:.4} at variance {var}");
    }
}
