//! Every op of the wgpu backend against a plain CPU computation (f64) over fresh random
//! inputs, at sizes that are not multiples of any workgroup, with outputs poisoned first.
//! Run one op: `cargo test -p tandem-wgpu --test wgpu ops::<op>`.

use crate::common;

use common::{assert_close, backend, round_to, Rng, POISON};
use tandem_core::backend::prelude::*;
use tandem_core::backend::{AttnArgs, KvDest, KvGeometry, NormIn};
use tandem_core::config::Activation;
use tandem_core::DType;
use tandem_wgpu::{WgpuBackend, WgpuBuf, WgpuOptions};

mod fused;

const DTYPES: [DType; 3] = [DType::BF16, DType::F16, DType::F32];

fn f32_buf(b: &WgpuBackend, data: &[f32]) -> WgpuBuf {
    let mut buf = b.alloc_f32(data.len()).unwrap();
    b.write_f32(&mut buf, data).unwrap();
    buf
}

fn u32_buf(b: &WgpuBackend, data: &[u32]) -> WgpuBuf {
    let mut buf = b.alloc_u32(data.len().max(1)).unwrap();
    b.write_u32(&mut buf, data).unwrap();
    buf
}

fn poisoned(b: &WgpuBackend, len: usize) -> WgpuBuf {
    f32_buf(b, &vec![POISON; len])
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[test]
fn embedding() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("embedding");
    let (vocab, hidden, t) = (1003, 77, 13);
    for dtype in DTYPES {
        let table = rng.vec(vocab * hidden, 1.0);
        let ids: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
        let r = round_to(dtype, &table);
        let want: Vec<f64> =
            ids.iter().flat_map(|&i| r[i as usize * hidden..][..hidden].iter().map(|&x| x as f64)).collect();
        for w in weight_layouts(b, dtype, &table, vocab, hidden) {
            let mut out = poisoned(b, t * hidden);
            b.embedding(&w, &u32_buf(b, &ids), &mut out, t, hidden).unwrap();
            let got = b.read_f32(&out, t * hidden).unwrap();
            assert_close(&format!("embedding {} {}", dtype.name(), layout(b, &w)), &got, &want, 0.0);
        }
    }
}

/// A `[rows, cols]` weight row-major, and when its rows are whole 16-byte units tiled too: in a
/// buffer, and in a texture where the adapter can.
fn weight_layouts(b: &WgpuBackend, dtype: DType, values: &[f32], rows: usize, cols: usize) -> Vec<WgpuBuf> {
    let mut v = vec![b.weight_from_f32(dtype, values).unwrap()];
    let mut ways = vec![false];
    if b.can_hold_texels() {
        ways.push(true);
    }
    for texels in ways {
        let m = b.weight_matrix_from_f32_in(dtype, values, rows, cols, texels).unwrap();
        // Tiled when rows are whole 16-byte units (and a tile of 64 rows fits one binding).
        assert!(!b.is_tiled(&m) || (cols * dtype.size()).is_multiple_of(16), "[{rows}, {cols}] {}", dtype.name());
        if b.is_tiled(&m) {
            assert_eq!(b.is_texels(&m), texels);
            // Reading a tiled weight back gives the row-major values.
            assert_eq!(b.read_f32(&m, values.len()).unwrap(), round_to(dtype, values));
            v.push(m);
        }
    }
    v
}

/// The layout of a weight, for messages.
fn layout(b: &WgpuBackend, w: &WgpuBuf) -> &'static str {
    match (b.is_tiled(w), b.is_texels(w)) {
        (_, true) => "tiled texels",
        (true, false) => "tiled buffer",
        _ => "row-major",
    }
}

#[test]
fn gather_rows() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("gather_rows");
    let (src_rows, dim, n) = (19, 131, 7);
    let src = rng.vec(src_rows * dim, 1.0);
    let rows: Vec<u32> = (0..n).map(|_| rng.below(src_rows) as u32).collect();
    let mut out = poisoned(b, n * dim);
    b.gather_rows(&f32_buf(b, &src), &u32_buf(b, &rows), &mut out, n, dim).unwrap();
    let want: Vec<f64> = rows.iter().flat_map(|&r| src[r as usize * dim..][..dim].iter().map(|&x| x as f64)).collect();
    assert_close("gather_rows", &b.read_f32(&out, n * dim).unwrap(), &want, 0.0);
}

#[test]
fn rms_norm_lane() {
    rms_norm_cases(true);
}

#[test]
fn rms_norm_workgroup() {
    rms_norm_cases(false);
}

fn rms_norm_cases(lane: bool) {
    let Some(b) = common::open(WgpuOptions { lane_kernels: Some(lane), ..Default::default() }) else { return };
    let b = &b;
    let mut rng = Rng::new(&format!("rms_norm lane={lane}"));
    // dim % 8 == 0 takes the vector path; the others the scalar one.
    for (rows, dim) in [(1, 576), (5, 77), (3, 2049), (70, 64), (2, 1540)] {
        for dtype in DTYPES {
            let x = rng.vec(rows * dim, 3.0);
            let w = rng.vec(dim, 1.0);
            let eps = 1e-5;
            let mut out = poisoned(b, rows * dim);
            b.rms_norm(&f32_buf(b, &x), &b.weight_from_f32(dtype, &w).unwrap(), &mut out, rows, dim, eps).unwrap();
            let wr = round_to(dtype, &w);
            let mut want = vec![0.0f64; rows * dim];
            for r in 0..rows {
                let row = &x[r * dim..][..dim];
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / dim as f64;
                let inv = 1.0 / (ms + eps as f64).sqrt();
                for i in 0..dim {
                    want[r * dim + i] = row[i] as f64 * inv * wr[i] as f64;
                }
            }
            assert_close(
                &format!("rms_norm {rows}x{dim} {}", dtype.name()),
                &b.read_f32(&out, rows * dim).unwrap(),
                &want,
                1e-12,
            );
        }
    }
}

#[test]
fn add() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("add");
    // 1003: the scalar kernel; 1004: the vec4 one, on a buffer longer than len.
    for n in [1003, 1004] {
        let (a0, x) = (rng.vec(n + 8, 1.0), rng.vec(n, 1.0));
        let mut acc = f32_buf(b, &a0);
        b.add(&mut acc, &f32_buf(b, &x), n).unwrap();
        let mut want: Vec<f64> = a0.iter().zip(&x).map(|(a, x)| (a + x) as f64).collect();
        want.extend(f64s(&a0[n..]));
        assert_close(&format!("add {n}"), &b.read_f32(&acc, n + 8).unwrap(), &want, 0.0);
    }
}

#[test]
fn silu_mul() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("silu_mul");
    for n in [1537, 1536] {
        let (g, u) = (rng.vec(n, 8.0), rng.vec(n, 2.0));
        let mut out = poisoned(b, n);
        b.silu_mul(&f32_buf(b, &g), &f32_buf(b, &u), &mut out, n).unwrap();
        let want: Vec<f64> =
            g.iter().zip(&u).map(|(&g, &u)| (g as f64) / (1.0 + (-g as f64).exp()) * u as f64).collect();
        assert_close(&format!("silu_mul {n}"), &b.read_f32(&out, n).unwrap(), &want, 1e-12);
    }
}

/// GeGLU against the tanh GELU in f64; gates up to ±40 saturate tanh (the shader's clamp).
#[test]
fn gelu_tanh_mul() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("gelu_tanh_mul");
    for n in [1537, 1536] {
        let (g, u) = (rng.vec(n, 8.0), rng.vec(n, 2.0));
        let mut out = poisoned(b, n);
        b.gelu_tanh_mul(&f32_buf(b, &g), &f32_buf(b, &u), &mut out, n).unwrap();
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let want: Vec<f64> = g
            .iter()
            .zip(&u)
            .map(|(&g, &u)| (g as f64, u as f64))
            .map(|(g, u)| 0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh()) * u)
            .collect();
        assert_close(&format!("gelu_tanh_mul {n}"), &b.read_f32(&out, n).unwrap(), &want, 1e-12);
    }
    let (g, u) = ([-40.0f32, -12.0, 0.0, 12.0, 40.0], [1.0f32; 5]);
    let mut out = poisoned(b, 5);
    b.gelu_tanh_mul(&f32_buf(b, &g), &f32_buf(b, &u), &mut out, 5).unwrap();
    let got = b.read_f32(&out, 5).unwrap();
    assert!(
        got[0] == 0.0 && got[1] == 0.0 && got[2] == 0.0 && got[3] == 12.0 && got[4] == 40.0,
        "saturated gelu_tanh: {got:?}"
    );
}

/// In place over the first len values only; bitwise the f32 products.
#[test]
fn scale() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("scale");
    for n in [77, 1152] {
        let x = rng.vec(n + 8, 1.0);
        let f = 1152f32.sqrt();
        let mut buf = f32_buf(b, &x);
        b.scale(&mut buf, f, n).unwrap();
        let got = b.read_f32(&buf, n + 8).unwrap();
        let want: Vec<f32> = x.iter().enumerate().map(|(i, &v)| if i < n { v * f } else { v }).collect();
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "scale {n}");
    }
}

fn check_matmul(b: &WgpuBackend, rng: &mut Rng, m: usize, n: usize, k: usize, dtype: DType, bias_dtype: Option<DType>) {
    let x = rng.vec(m * k, 1.0);
    let w = rng.vec(n * k, 1.0);
    let bias = rng.vec(n, 1.0);
    let bb = bias_dtype.map(|d| b.weight_from_f32(d, &bias).unwrap());
    // x lives in a longer buffer (as the model's scratch does): rows past m must not matter.
    let mut x_long = x.clone();
    x_long.extend(rng.vec(5 * k, 100.0));
    let x_buf = f32_buf(b, &x_long);
    let wr = round_to(dtype, &w);
    let br = bias_dtype.map(|d| round_to(d, &bias));
    let mut want = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s: f64 = (0..k).map(|l| x[i * k + l] as f64 * wr[j * k + l] as f64).sum();
            if let Some(br) = &br {
                s += br[j] as f64;
            }
            want[i * n + j] = s;
        }
    }
    for wb in weight_layouts(b, dtype, &w, n, k) {
        let mut out = poisoned(b, m * n);
        b.matmul(&x_buf, &wb, bb.as_ref(), &mut out, m, n, k).unwrap();
        let what = format!(
            "matmul m{m} n{n} k{k} {} bias {:?} {}",
            dtype.name(),
            bias_dtype.map(|d| d.name()),
            layout(b, &wb)
        );
        assert_close(&what, &b.read_f32(&out, m * n).unwrap(), &want, 1e-10);
    }
}

#[test]
fn matmul_decode_shapes() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("matmul_decode_shapes");
    for m in [1, 2, 3, 5, 16] {
        for (n, k) in [(67, 64), (130, 75), (193, 130)] {
            for dtype in DTYPES {
                check_matmul(b, &mut rng, m, n, k, dtype, None);
            }
        }
    }
}

/// A weight texture written in more than one band of texture rows (4100 x 576 bf16 is 299,520
/// units, 74 texture rows; a band is 64), and its embedding rows read back exactly.
#[test]
fn matmul_and_embedding_texels_across_bands() {
    let Some(b) = backend() else { return };
    if !b.can_hold_texels() {
        eprintln!("skipped: adapter {} cannot hold weights in textures", b.adapter());
        return;
    }
    let mut rng = Rng::new("matmul_texels_across_bands");
    check_matmul(b, &mut rng, 1, 4100, 576, DType::BF16, None);
    let (vocab, hidden) = (4100, 576);
    let table = rng.vec(vocab * hidden, 1.0);
    let w = b.weight_matrix_from_f32_in(DType::BF16, &table, vocab, hidden, true).unwrap();
    let ids: Vec<u32> = vec![0, 4099, 3641, 64, 63];
    let r = round_to(DType::BF16, &table);
    let want: Vec<f64> = ids.iter().flat_map(|&i| f64s(&r[i as usize * hidden..][..hidden])).collect();
    let mut out = poisoned(b, ids.len() * hidden);
    b.embedding(&w, &u32_buf(b, &ids), &mut out, ids.len(), hidden).unwrap();
    assert_close("embedding texels across bands", &b.read_f32(&out, ids.len() * hidden).unwrap(), &want, 0.0);
}

/// A backend holding weight matrices in textures (where the adapter can) and one holding them
/// in buffers; `what` names the test in the line that says a texture backend was skipped.
/// Both weight layouts, with the norm fusion on (off by default; these tests check the fused ops).
fn texel_and_buffer_backends(what: &str) -> Vec<WgpuBackend> {
    let mut backends = Vec::new();
    for texels in [true, false] {
        if let Some(b) =
            common::open(WgpuOptions { texel_weights: Some(texels), fuse_norm: Some(true), ..Default::default() })
        {
            if texels && !b.can_hold_texels() {
                eprintln!("{what} in textures skipped: adapter {} cannot hold weights in textures", b.adapter());
                continue;
            }
            backends.push(b);
        }
    }
    backends
}

/// Batched matmuls recorded from several threads at once on one backend: each must read its
/// own x (a batch's x goes through a scratch texture on CPU adapters, shared by all matmuls).
#[test]
fn matmul_batches_from_threads() {
    let Some(b) = backend() else { return };
    let (m, n, k) = (9, 70, 64);
    let mut rng = Rng::new("matmul_batches_from_threads");
    let w = rng.vec(n * k, 0.5);
    let wb = b.weight_matrix_from_f32(DType::BF16, &w, n, k).unwrap();
    let wr = round_to(DType::BF16, &w);
    let xs: Vec<Vec<f32>> = (0..4).map(|_| rng.vec(m * k, 1.0)).collect();
    std::thread::scope(|s| {
        for x in &xs {
            let (wb, wr) = (&wb, &wr);
            s.spawn(move || {
                let want: Vec<f64> = (0..m * n)
                    .map(|i| (0..k).map(|l| x[i / n * k + l] as f64 * wr[i % n * k + l] as f64).sum())
                    .collect();
                let xb = f32_buf(b, x);
                for _ in 0..25 {
                    let mut out = poisoned(b, m * n);
                    b.matmul(&xb, wb, None, &mut out, m, n, k).unwrap();
                    assert_close("matmul from a thread", &b.read_f32(&out, m * n).unwrap(), &want, 1e-10);
                }
            });
        }
    });
}

/// A long k that is not a multiple of 8: the scalar path, with fewer rows per invocation on
/// lavapipe so its loops stay under the driver's iteration limit.
#[test]
fn matmul_long_odd_k() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("matmul_long_odd_k");
    check_matmul(b, &mut rng, 2, 37, 20001, DType::BF16, None);
}

#[test]
fn matmul_prefill_shapes_and_bias() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("matmul_prefill_shapes_and_bias");
    check_matmul(b, &mut rng, 77, 300, 576, DType::BF16, None);
    check_matmul(b, &mut rng, 33, 129, 63, DType::F32, None);
    check_matmul(b, &mut rng, 9, 97, 96, DType::BF16, Some(DType::BF16));
    check_matmul(b, &mut rng, 1, 97, 96, DType::F16, Some(DType::F32));
}

/// Weights larger than one storage binding are bound in row chunks.
#[test]
fn matmul_and_embedding_chunked_weights() {
    // Textures are never chunked: buffers here.
    let Some(b) =
        common::open(WgpuOptions { max_storage_binding: Some(4096), texel_weights: Some(false), ..Default::default() })
    else {
        return;
    };
    let mut rng = Rng::new("matmul_chunked");
    // 300 rows x 96 bf16 = 57600 bytes: about 15 chunks of 4096 bytes. A tile of 64 such rows
    // is 12 KiB, more than a binding, so that matrix stays row-major.
    check_matmul(&b, &mut rng, 3, 300, 96, DType::BF16, None);
    check_matmul(&b, &mut rng, 1, 70, 75, DType::F32, None);
    // 300 rows of 32 bytes: tiles of 2 KiB, two per chunk; the last chunk and tile are partial.
    check_matmul(&b, &mut rng, 2, 300, 16, DType::BF16, None);
    check_matmul(&b, &mut rng, 3, 300, 8, DType::F32, None);
    assert!(
        b.is_tiled(&b.weight_matrix_from_f32(DType::BF16, &[0.5; 300 * 16], 300, 16).unwrap()),
        "the tiled chunk path ran"
    );
    let (vocab, hidden, t) = (500, 40, 9);
    let table = rng.vec(vocab * hidden, 1.0);
    let mut ids: Vec<u32> = (0..t).map(|_| rng.below(vocab) as u32).collect();
    ids[0] = vocab as u32 - 1;
    let r = round_to(DType::BF16, &table);
    let want: Vec<f64> = ids.iter().flat_map(|&i| f64s(&r[i as usize * hidden..][..hidden])).collect();
    // 40 bf16 = 80 bytes a row: a tile of 5 KiB exceeds the 4 KiB binding, so the matrix
    // stays row-major and is bound in chunks.
    let mut out = poisoned(&b, t * hidden);
    b.embedding(&b.weight_from_f32(DType::BF16, &table).unwrap(), &u32_buf(&b, &ids), &mut out, t, hidden).unwrap();
    assert_close("embedding chunked", &b.read_f32(&out, t * hidden).unwrap(), &want, 0.0);
    assert!(!b.is_tiled(&b.weight_matrix_from_f32(DType::BF16, &table, vocab, hidden).unwrap()));
    // 8 bf16 a row: tiles of 1 KiB, chunks of four tiles.
    let (vocab, hidden) = (1000, 8);
    let table = rng.vec(vocab * hidden, 1.0);
    let r = round_to(DType::BF16, &table);
    let want: Vec<f64> = ids.iter().flat_map(|&i| f64s(&r[i as usize * hidden..][..hidden])).collect();
    let tiled = b.weight_matrix_from_f32(DType::BF16, &table, vocab, hidden).unwrap();
    assert!(b.is_tiled(&tiled));
    let mut out = poisoned(&b, t * hidden);
    b.embedding(&tiled, &u32_buf(&b, &ids), &mut out, t, hidden).unwrap();
    assert_close("embedding chunked tiled", &b.read_f32(&out, t * hidden).unwrap(), &want, 0.0);
}

#[test]
fn rope() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("rope");
    for (head_dim, qh, kvh) in [(64, 9, 3), (128, 8, 2)] {
        let t = 7;
        let half = head_dim / 2;
        let theta = 10000.0f64;
        let inv_freq: Vec<f32> =
            (0..half).map(|i| (1.0 / theta.powf(2.0 * i as f64 / head_dim as f64)) as f32).collect();
        let mut positions: Vec<u32> = (0..t).map(|_| rng.below(8192) as u32).collect();
        positions[0] = 0;
        let q0 = rng.vec(t * qh * head_dim, 1.0);
        let k0 = rng.vec(t * kvh * head_dim, 1.0);
        let (mut q, mut k) = (f32_buf(b, &q0), f32_buf(b, &k0));
        b.rope(&mut q, &mut k, &u32_buf(b, &positions), &f32_buf(b, &inv_freq), t, qh, kvh, head_dim).unwrap();
        let rot = |v: &[f32], heads: usize| -> Vec<f64> {
            let mut out = f64s(v);
            for (tt, &pos) in positions.iter().enumerate() {
                for h in 0..heads {
                    let base = (tt * heads + h) * head_dim;
                    for i in 0..half {
                        // The angle is the f32 product, as in the HF implementation.
                        let a = (pos as f32 * inv_freq[i]) as f64;
                        let (x1, x2) = (v[base + i] as f64, v[base + i + half] as f64);
                        out[base + i] = x1 * a.cos() - x2 * a.sin();
                        out[base + i + half] = x2 * a.cos() + x1 * a.sin();
                    }
                }
            }
            out
        };
        assert_close(&format!("rope q hd{head_dim}"), &b.read_f32(&q, q0.len()).unwrap(), &rot(&q0, qh), 1e-11);
        assert_close(&format!("rope k hd{head_dim}"), &b.read_f32(&k, k0.len()).unwrap(), &rot(&k0, kvh), 1e-11);
    }
}

#[test]
fn kv_write() {
    // Caches in textures (CPU adapters) and in buffers.
    for b in &texel_and_buffer_backends("kv_write") {
        kv_write_on(b);
    }
}

fn kv_write_on(b: &WgpuBackend) {
    let mut rng = Rng::new("kv_write");
    let g = KvGeometry { num_blocks: 7, block_size: 16, num_kv_heads: 3, head_dim: 64 };
    let kvd = g.num_kv_heads * g.head_dim;
    let t = 11;
    let mut all: Vec<u32> = (0..g.slots() as u32).collect();
    rng.shuffle(&mut all);
    let slots = &all[..t];
    let (k, v) = (rng.vec(t * kvd, 1.0), rng.vec(t * kvd, 1.0));
    let (kc0, vc0) = (rng.vec(g.layer_elems(), 1.0), rng.vec(g.layer_elems(), 1.0));
    let mut kc = b.alloc_kv(g).unwrap();
    let mut vc = b.alloc_kv(g).unwrap();
    b.write_f32(&mut kc, &kc0).unwrap();
    b.write_f32(&mut vc, &vc0).unwrap();
    b.kv_write(&f32_buf(b, &k), &f32_buf(b, &v), &mut kc, &mut vc, &u32_buf(b, slots), t, g).unwrap();
    let (mut wk, mut wv) = (f64s(&kc0), f64s(&vc0));
    for (i, &s) in slots.iter().enumerate() {
        for e in 0..kvd {
            wk[s as usize * kvd + e] = k[i * kvd + e] as f64;
            wv[s as usize * kvd + e] = v[i * kvd + e] as f64;
        }
    }
    assert_close("kv_write k", &b.read_kv(&kc, g).unwrap(), &wk, 0.0);
    assert_close("kv_write v", &b.read_kv(&vc, g).unwrap(), &wv, 0.0);
}

#[test]
fn rope_kv_write_equals_rope_then_kv_write() {
    // The fused kernel against the two ops it replaces (each checked against the CPU above):
    // the same rotation, so q and both caches must match exactly, untouched slots included.
    for b in &texel_and_buffer_backends("rope_kv_write") {
        rope_kv_write_on(b);
    }
}

fn rope_kv_write_on(b: &WgpuBackend) {
    let mut rng = Rng::new("rope_kv_write");
    for (g, qh, t) in [
        (KvGeometry { num_blocks: 7, block_size: 16, num_kv_heads: 3, head_dim: 64 }, 9, 11),
        (KvGeometry { num_blocks: 4, block_size: 32, num_kv_heads: 2, head_dim: 128 }, 8, 1),
    ] {
        let (kvd, hd) = (g.num_kv_heads * g.head_dim, g.head_dim);
        let mut all: Vec<u32> = (0..g.slots() as u32).collect();
        rng.shuffle(&mut all);
        let slots = u32_buf(b, &all[..t]);
        let positions: Vec<u32> = (0..t).map(|_| rng.below(4096) as u32).collect();
        let positions = u32_buf(b, &positions);
        let inv_freq: Vec<f32> = (0..hd / 2).map(|i| 10_000f32.powf(-2.0 * i as f32 / hd as f32)).collect();
        let inv_freq = f32_buf(b, &inv_freq);
        let (q0, k0, v0) = (rng.vec(t * qh * hd, 1.0), rng.vec(t * kvd, 1.0), rng.vec(t * kvd, 1.0));
        let (kc0, vc0) = (rng.vec(g.layer_elems(), 1.0), rng.vec(g.layer_elems(), 1.0));
        let run = |fused: bool| {
            let (mut q, mut k, v) = (f32_buf(b, &q0), f32_buf(b, &k0), f32_buf(b, &v0));
            let (mut kc, mut vc) = (b.alloc_kv(g).unwrap(), b.alloc_kv(g).unwrap());
            b.write_f32(&mut kc, &kc0).unwrap();
            b.write_f32(&mut vc, &vc0).unwrap();
            if fused {
                b.rope_kv_write(&mut q, &mut k, &v, &mut kc, &mut vc, &positions, &inv_freq, &slots, t, qh, g).unwrap();
            } else {
                b.rope(&mut q, &mut k, &positions, &inv_freq, t, qh, g.num_kv_heads, hd).unwrap();
                b.kv_write(&k, &v, &mut kc, &mut vc, &slots, t, g).unwrap();
            }
            (b.read_f32(&q, q0.len()).unwrap(), b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap())
        };
        let (want, got) = (run(false), run(true));
        assert_close("rope_kv_write q", &got.0, &f64s(&want.0), 0.0);
        assert_close("rope_kv_write k_cache", &got.1, &f64s(&want.1), 0.0);
        assert_close("rope_kv_write v_cache", &got.2, &f64s(&want.2), 0.0);
        // And the rotation did happen: some cached K differs from the raw k rows.
        assert_ne!(got.1, kc0, "k_cache unchanged");
    }
}

/// One attention case: `seqs` = (context length, tokens of it in this batch), so a sequence
/// with n tokens in the batch has queries at positions len-n..len (a decode token when n = 1,
/// a prefill chunk over a cached prefix when n < len, a fresh prefill when n = len).
fn check_attention(
    b: &WgpuBackend,
    rng: &mut Rng,
    head_dim: usize,
    block_size: usize,
    kv_heads: usize,
    gqa: usize,
    seqs: &[(usize, usize)],
) {
    let heads = kv_heads * gqa;
    let max_blocks = seqs.iter().map(|s| s.0.div_ceil(block_size)).max().unwrap() + 1;
    let num_blocks = seqs.iter().map(|s| s.0.div_ceil(block_size)).sum::<usize>() + 3;
    let g = KvGeometry { num_blocks, block_size, num_kv_heads: kv_heads, head_dim };
    let mut free: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut free);
    let mut tables = vec![0u32; seqs.len() * max_blocks];
    let (mut positions, mut token_seq) = (vec![], vec![]);
    for (s, &(len, n)) in seqs.iter().enumerate() {
        for j in 0..len.div_ceil(block_size) {
            tables[s * max_blocks + j] = free.pop().unwrap();
        }
        for p in len - n..len {
            positions.push(p as u32);
            token_seq.push(s as u32);
        }
    }
    let t = positions.len();
    let kvd = kv_heads * head_dim;
    let kc0 = rng.vec(g.layer_elems(), 1.0);
    let vc0 = rng.vec(g.layer_elems(), 1.0);
    let q = rng.vec(t * heads * head_dim, 1.0);
    let (mut kc, mut vc) = (b.alloc_kv(g).unwrap(), b.alloc_kv(g).unwrap());
    b.write_f32(&mut kc, &kc0).unwrap();
    b.write_f32(&mut vc, &vc0).unwrap();
    let (qb, pb, sb, tb) = (f32_buf(b, &q), u32_buf(b, &positions), u32_buf(b, &token_seq), u32_buf(b, &tables));
    let scale = 1.0 / (head_dim as f32).sqrt();
    let max_context = *positions.iter().max().unwrap() as usize + 1;
    let args = AttnArgs::<WgpuBackend> {
        q: &qb,
        k_cache: &kc,
        v_cache: &vc,
        positions: &pb,
        token_seq: &sb,
        block_tables: &tb,
        num_tokens: t,
        num_seqs: seqs.len(),
        max_blocks,
        max_context,
        decode_tokens: tandem_core::batch::leading_decodes(&token_seq),
        num_heads: heads,
        geometry: g,
        scale,
        window: 0,
    };
    let mut out = poisoned(b, t * heads * head_dim);
    b.paged_attention(&args, &mut out).unwrap();

    let mut want = vec![0.0f64; t * heads * head_dim];
    for tt in 0..t {
        let s = token_seq[tt] as usize;
        let n_keys = positions[tt] as usize + 1;
        for h in 0..heads {
            let kvh = h / gqa;
            let qv = &q[(tt * heads + h) * head_dim..][..head_dim];
            let slot = |j: usize| tables[s * max_blocks + j / block_size] as usize * block_size + j % block_size;
            let scores: Vec<f64> = (0..n_keys)
                .map(|j| {
                    let kv = &kc0[slot(j) * kvd + kvh * head_dim..][..head_dim];
                    qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64
                })
                .collect();
            let mx = scores.iter().cloned().fold(f64::MIN, f64::max);
            let ps: Vec<f64> = scores.iter().map(|s| (s - mx).exp()).collect();
            let sum: f64 = ps.iter().sum();
            for d in 0..head_dim {
                let acc: f64 = (0..n_keys).map(|j| ps[j] * vc0[slot(j) * kvd + kvh * head_dim + d] as f64).sum();
                want[(tt * heads + h) * head_dim + d] = acc / sum;
            }
        }
    }
    let what = format!("paged_attention hd{head_dim} bs{block_size} kvh{kv_heads} gqa{gqa} seqs{seqs:?}");
    assert_close(&what, &b.read_f32(&out, want.len()).unwrap(), &want, 1e-10);
}

fn attention_cases(lane: bool) {
    // KV caches in textures (where the adapter can hold them: CPU adapters) and in buffers.
    for texels in [true, false] {
        let Some(b) =
            common::open(WgpuOptions { lane_kernels: Some(lane), texel_weights: Some(texels), ..Default::default() })
        else {
            return;
        };
        if texels && !b.can_hold_texels() {
            eprintln!("paged_attention with caches in textures skipped: adapter {} cannot hold them", b.adapter());
            continue;
        }
        if std::env::var_os("TANDEM_WGPU_KV_TEXELS").is_none() {
            let in_texture = b
                .alloc_kv(KvGeometry { num_blocks: 1, block_size: 16, num_kv_heads: 1, head_dim: 64 })
                .unwrap()
                .in_texture();
            assert_eq!(in_texture, texels, "KV cache in a texture");
        }
        attention_cases_on(&b, lane, texels);
    }
}

fn attention_cases_on(b: &WgpuBackend, lane: bool, texels: bool) {
    let mut rng = Rng::new(&format!("paged_attention lane={lane} texels={texels}"));
    // Decode tokens.
    check_attention(b, &mut rng, 64, 16, 3, 3, &[(1, 1), (37, 1), (200, 1)]);
    check_attention(b, &mut rng, 128, 32, 2, 4, &[(65, 1), (33, 1)]);
    check_attention(b, &mut rng, 64, 32, 4, 1, &[(129, 1)]);
    // A fresh prefill, a chunk over a cached prefix ending mid-block, and a decode token together.
    check_attention(b, &mut rng, 64, 16, 3, 3, &[(45, 45), (83, 19), (30, 1)]);
    check_attention(b, &mut rng, 128, 32, 1, 4, &[(70, 70), (100, 37)]);
    check_attention(b, &mut rng, 128, 16, 2, 1, &[(17, 5), (3, 3)]);
    // Eight query heads of 256 dims on one kv head: the lane kernel's grouped workgroup memory
    // (8 splits x 8 heads x 1 KiB) exceeds the adapter's, so it serves one head a workgroup.
    check_attention(b, &mut rng, 256, 16, 1, 8, &[(40, 1), (21, 21)]);
}

/// Long contexts: on lavapipe, whose loops stop after 65535 iterations per invocation, the
/// backend must pick kernels that stay under that (the lane kernel does not at 1024 x 128).
#[test]
fn paged_attention_long_context() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("paged_attention_long_context");
    check_attention(b, &mut rng, 128, 16, 1, 2, &[(1024, 1), (700, 3)]);
}

/// The kernel GPUs use: a workgroup per (token, head), keys in tiles through workgroup memory.
#[test]
fn paged_attention_workgroup() {
    attention_cases(false);
}

/// The kernel CPU adapters use: one invocation per (token, head).
#[test]
fn paged_attention_lane() {
    attention_cases(true);
}

#[test]
fn argmax() {
    let Some(b) = backend() else { return };
    let mut rng = Rng::new("argmax");
    let (rows, vocab) = (4, 49157);
    let mut logits = rng.vec(rows * vocab, 10.0);
    // Row 1: a tie between two maxima, the lower index must win. Row 2: the max at the end.
    logits[vocab + 40000] = 50.0;
    logits[vocab + 777] = 50.0;
    logits[2 * vocab + vocab - 1] = 60.0;
    logits[3 * vocab] = 70.0;
    let got = b.argmax(&f32_buf(b, &logits), rows, vocab).unwrap();
    let want: Vec<u32> = logits.chunks_exact(vocab).map(tandem_core::backend::argmax_row).collect();
    assert_eq!(got, want);
    assert_eq!(got[1], 777);
}

/// A write issued after some ops were recorded must not be seen by those ops.
#[test]
fn write_after_record_is_not_seen_by_earlier_ops() {
    let Some(b) = backend() else { return };
    let mut acc = f32_buf(b, &[1.0, 2.0, 3.0]);
    let mut x = f32_buf(b, &[10.0, 20.0, 30.0]);
    b.add(&mut acc, &x, 3).unwrap();
    b.write_f32(&mut x, &[100.0, 200.0, 300.0]).unwrap();
    b.add(&mut acc, &x, 3).unwrap();
    assert_eq!(b.read_f32(&acc, 3).unwrap(), vec![111.0, 222.0, 333.0]);
}

#[test]
fn bad_calls_are_errors() {
    let Some(b) = backend() else { return };
    let x = f32_buf(b, &[1.0; 8]);
    let w = b.weight_from_f32(DType::BF16, &[1.0; 8]).unwrap();
    let mut small = b.alloc_f32(3).unwrap();
    let e = b.matmul(&x, &w, None, &mut small, 2, 2, 4).unwrap_err().to_string();
    assert!(e.contains("matmul") && e.contains("out"), "{e}");
    let ids = b.alloc_u32(2).unwrap();
    let e = b.embedding(&x, &ids, &mut small, 1, 3).unwrap_err().to_string();
    assert!(e.contains("must be a weight"), "{e}");
    assert!(b.read_f32(&small, 4).is_err());
    assert!(b.read_u32(&x, 1).is_err());
}
