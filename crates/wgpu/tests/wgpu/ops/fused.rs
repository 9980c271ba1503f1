//! The fused ops against the host and against the plain ops they replace: the q/k/v and
//! gate/up projections fused at load, the residual add and norm folded into projections,
//! rope and the KV write in the q/k/v projection's epilogue.
//! Run one: `cargo test -p tandem-wgpu --test wgpu ops::fused::<test>`.

use super::*;

/// The fused q/k/v projection (with and without biases) and the fused gate/up projection with
/// its activation, against the CPU, in textures and in buffers, at batch sizes that take the
/// decode and the prefill kernels, with row counts that are not multiples of a block.
#[test]
fn fused_qkv_and_gate_up() {
    let backends = texel_and_buffer_backends("fused ops");
    let mut rng = Rng::new("fused_qkv_and_gate_up");
    for b in &backends {
        let where_ = if b.texel_weights() { "texels" } else { "buffer" };
        for (dtype, nq, nkv, hidden, bias) in
            [(DType::BF16, 96, 32, 64, false), (DType::F16, 200, 40, 136, true), (DType::F32, 72, 24, 40, true)]
        {
            let mut ws = tandem_core::weights::Weights::empty();
            let parts: Vec<(String, usize)> = vec![("q".into(), nq), ("k".into(), nkv), ("v".into(), nkv)];
            let mut vals = Vec::new();
            for (n, rows) in &parts {
                let w = rng.vec(rows * hidden, 0.5);
                ws.replace(n, dtype, &[*rows, hidden], &w).unwrap();
                let bv = rng.vec(*rows, 0.5);
                ws.replace(&format!("{n}.bias"), DType::F32, &[*rows], &bv).unwrap();
                vals.push((round_to(dtype, &w), bv));
            }
            let view = |n: &str, shape: &[usize]| ws.get(n, shape).unwrap();
            let (qv, kv, vv) = (view("q", &[nq, hidden]), view("k", &[nkv, hidden]), view("v", &[nkv, hidden]));
            let (qb, kb, vb) = (view("q.bias", &[nq]), view("k.bias", &[nkv]), view("v.bias", &[nkv]));
            let (w, wb) = b
                .fuse_qkv(&qv, &kv, &vv, bias.then_some([&qb, &kb, &vb]))
                .unwrap()
                .expect("the wgpu backend fuses q/k/v");
            assert_eq!(wb.is_some(), bias);
            for m in [1, 2, 3, 33] {
                let x = rng.vec(m * hidden, 1.0);
                let (mut q, mut k, mut v) = (poisoned(b, m * nq), poisoned(b, m * nkv), poisoned(b, m * nkv));
                b.qkv_proj(&f32_buf(b, &x), &w, wb.as_ref(), &mut q, &mut k, &mut v, m, nq, nkv, hidden, None).unwrap();
                for ((got, rows), (wv, bv)) in [(&q, nq), (&k, nkv), (&v, nkv)].into_iter().zip(&vals) {
                    let want: Vec<f64> = (0..m * rows)
                        .map(|i| {
                            let (t, r) = (i / rows, i % rows);
                            let dot: f64 =
                                (0..hidden).map(|c| x[t * hidden + c] as f64 * wv[r * hidden + c] as f64).sum();
                            dot + if bias { bv[r] as f64 } else { 0.0 }
                        })
                        .collect();
                    let what = format!("qkv_proj {where_} {} m{m} rows {rows} bias {bias}", dtype.name());
                    assert_close(&what, &b.read_f32(got, m * rows).unwrap(), &want, 1e-10);
                }
            }
        }
        for (dtype, inter, hidden) in [(DType::BF16, 130, 64), (DType::F16, 64, 136), (DType::F32, 200, 40)] {
            let mut ws = tandem_core::weights::Weights::empty();
            let (g, u) = (rng.vec(inter * hidden, 0.5), rng.vec(inter * hidden, 0.5));
            ws.replace("gate", dtype, &[inter, hidden], &g).unwrap();
            ws.replace("up", dtype, &[inter, hidden], &u).unwrap();
            let w = b
                .fuse_gate_up(&ws.get("gate", &[inter, hidden]).unwrap(), &ws.get("up", &[inter, hidden]).unwrap())
                .unwrap()
                .expect("the wgpu backend fuses gate/up");
            let (wg, wu) = (
                b.upload_weight(&ws.get("gate", &[inter, hidden]).unwrap()).unwrap(),
                b.upload_weight(&ws.get("up", &[inter, hidden]).unwrap()).unwrap(),
            );
            let (g, u) = (round_to(dtype, &g), round_to(dtype, &u));
            for m in [1, 2, 5, 40] {
                let x = rng.vec(m * hidden, 1.0);
                let xb = f32_buf(b, &x);
                for act in [Activation::Silu, Activation::GeluTanh] {
                    let mut out = poisoned(b, m * inter);
                    b.gate_up_act(act, &xb, &w, &mut out, m, inter, hidden, None).unwrap();
                    let want: Vec<f64> = (0..m * inter)
                        .map(|i| {
                            let (t, r) = (i / inter, i % inter);
                            let dot = |w: &[f32]| -> f64 {
                                (0..hidden).map(|c| x[t * hidden + c] as f64 * w[r * hidden + c] as f64).sum()
                            };
                            let gv = dot(&g);
                            let a = match act {
                                Activation::Silu => gv / (1.0 + (-gv).exp()),
                                Activation::GeluTanh => {
                                    0.5 * gv
                                        * (1.0
                                            + ((2.0 / std::f64::consts::PI).sqrt() * (gv + 0.044715 * gv * gv * gv))
                                                .tanh())
                                }
                            };
                            a * dot(&u)
                        })
                        .collect();
                    let what = format!("gate_up_act {act:?} {where_} {} m{m} inter {inter}", dtype.name());
                    let got = b.read_f32(&out, m * inter).unwrap();
                    assert_close(&what, &got, &want, 1e-10);
                    // The activation is silu_mul's / gelu_tanh_mul's (shaders.rs GATED_ACTS):
                    // the two projections then the elementwise op give the same bits.
                    let (mut gb, mut ub, mut unfused) =
                        (poisoned(b, m * inter), poisoned(b, m * inter), poisoned(b, m * inter));
                    b.matmul(&xb, &wg, None, &mut gb, m, inter, hidden).unwrap();
                    b.matmul(&xb, &wu, None, &mut ub, m, inter, hidden).unwrap();
                    match act {
                        Activation::Silu => b.silu_mul(&gb, &ub, &mut unfused, m * inter),
                        Activation::GeluTanh => b.gelu_tanh_mul(&gb, &ub, &mut unfused, m * inter),
                    }
                    .unwrap();
                    let unfused = b.read_f32(&unfused, m * inter).unwrap();
                    let differ = got.iter().zip(&unfused).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    assert_eq!(
                        differ,
                        0,
                        "{what}: {differ} of {} values differ from matmul, matmul, then the activation op",
                        got.len()
                    );
                }
            }
            // A plain weight is refused, not misread.
            let plain = b.weight_matrix_from_f32(dtype, &g, inter, hidden).unwrap();
            assert!(b
                .gate_up_act(
                    Activation::Silu,
                    &f32_buf(b, &vec![0.0; hidden]),
                    &plain,
                    &mut poisoned(b, inter),
                    1,
                    inter,
                    hidden,
                    None
                )
                .is_err());
        }
    }
}

/// The MLP half of a layer and the next layer's q/k/v as the model runs them when the backend
/// fuses norms (`fuses_norm`): `matmul_residual` writes h and h * gamma, the fused projections
/// apply 1 / rms(h). Against the same chain computed on the host in f64 (add, rms_norm, matmul,
/// silu): h, h * gamma, the activation and q/k/v; prefill shapes go through the batch paths.
#[test]
fn fused_residual_and_norm_chain() {
    let backends = texel_and_buffer_backends("fused norm chain");
    let mut rng = Rng::new("fused_residual_and_norm_chain");
    let (d, qd, nq, nkv, inter, eps) = (64, 96, 96, 32, 130, 1e-5f32);
    let dtype = DType::BF16;
    let mut ws = tandem_core::weights::Weights::empty();
    let mut put = |name: &str, shape: &[usize], scale: f32| -> Vec<f32> {
        let v = rng.vec(shape.iter().product(), scale);
        ws.replace(name, dtype, shape, &v).unwrap();
        round_to(dtype, &v)
    };
    let wo = put("o", &[d, qd], 0.3);
    let wg = put("gate", &[inter, d], 0.3);
    let wu = put("up", &[inter, d], 0.3);
    let wd = put("down", &[d, inter], 0.3);
    let wq = put("q", &[nq, d], 0.3);
    let wk = put("k", &[nkv, d], 0.3);
    let wv = put("v", &[nkv, d], 0.3);
    let g_post: Vec<f32> = round_to(dtype, &rng.vec(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>());
    let g_in: Vec<f32> = round_to(dtype, &rng.vec(d, 1.0).iter().map(|v| 1.0 + 0.5 * v).collect::<Vec<_>>());
    // Host f64 helpers: y[t, r] = sum_c x[t, c] w[r, c]; the norm of each row times gamma.
    let mm = |x: &[f64], w: &[f32], rows: usize, k: usize| -> Vec<f64> {
        let m = x.len() / k;
        (0..m * rows).map(|i| (0..k).map(|c| x[i / rows * k + c] * w[(i % rows) * k + c] as f64).sum()).collect()
    };
    let norm = |h: &[f64], g: &[f32]| -> Vec<f64> {
        h.chunks(d)
            .flat_map(|row| {
                let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps as f64).sqrt();
                row.iter().zip(g).map(move |(v, g)| v * inv * *g as f64).collect::<Vec<_>>()
            })
            .collect()
    };
    for b in &backends {
        assert!(b.fuses_norm(d, 1), "the wgpu backend fuses norms at hidden {d} for a decode step");
        let where_ = if b.texel_weights() { "texels" } else { "buffer" };
        let view = |n: &str, shape: &[usize]| ws.get(n, shape).unwrap();
        let upload = |name: &str, rows, cols| {
            let w = view(name, &[rows, cols]);
            b.upload_weight(&w).unwrap()
        };
        let (w_o, w_d) = (upload("o", d, qd), upload("down", d, inter));
        let w_gu =
            b.fuse_gate_up(&view("gate", &[inter, d]), &view("up", &[inter, d])).unwrap().expect("fused gate/up");
        let (w_qkv, _) = b
            .fuse_qkv(&view("q", &[nq, d]), &view("k", &[nkv, d]), &view("v", &[nkv, d]), None)
            .unwrap()
            .expect("fused qkv");
        let (gp, gi) = (b.weight_from_f32(dtype, &g_post).unwrap(), b.weight_from_f32(dtype, &g_in).unwrap());
        for m in [1, 2, 3, 37] {
            let what = |x: &str| format!("{x} {where_} m{m}");
            let (h0, attn) = (rng.vec(m * d, 1.0), rng.vec(m * qd, 1.0));
            // Host.
            let h1: Vec<f64> = f64s(&h0).iter().zip(mm(&f64s(&attn), &wo, d, qd)).map(|(a, b)| a + b).collect();
            let x1 = norm(&h1, &g_post);
            let act: Vec<f64> = mm(&x1, &wg, inter, d)
                .iter()
                .zip(mm(&x1, &wu, inter, d))
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let h2: Vec<f64> = h1.iter().zip(mm(&act, &wd, d, inter)).map(|(a, b)| a + b).collect();
            let x2 = norm(&h2, &g_in);
            let hg2: Vec<f64> = h2.iter().enumerate().map(|(i, v)| v * g_in[i % d] as f64).collect();
            // Device, as the model runs it.
            let (mut h, mut hg) = (f32_buf(b, &h0), poisoned(b, m * d));
            let mut act_d = poisoned(b, m * inter);
            b.matmul_residual(&f32_buf(b, &attn), &w_o, &mut h, Some((&gp, &mut hg)), m, d, qd).unwrap();
            b.gate_up_act(
                Activation::Silu,
                &hg,
                &w_gu,
                &mut act_d,
                m,
                inter,
                d,
                Some(NormIn { h: &h, gamma: &gp, eps }),
            )
            .unwrap();
            assert_close(&what("act"), &b.read_f32(&act_d, m * inter).unwrap(), &act, 1e-10);
            b.matmul_residual(&act_d, &w_d, &mut h, Some((&gi, &mut hg)), m, d, inter).unwrap();
            assert_close(&what("h"), &b.read_f32(&h, m * d).unwrap(), &h2, 1e-10);
            assert_close(&what("h * gamma"), &b.read_f32(&hg, m * d).unwrap(), &hg2, 1e-10);
            let (mut q, mut k, mut v) = (poisoned(b, m * nq), poisoned(b, m * nkv), poisoned(b, m * nkv));
            b.qkv_proj(
                &hg,
                &w_qkv,
                None,
                &mut q,
                &mut k,
                &mut v,
                m,
                nq,
                nkv,
                d,
                Some(NormIn { h: &h, gamma: &gi, eps }),
            )
            .unwrap();
            for (got, w, rows, name) in [(&q, &wq, nq, "q"), (&k, &wk, nkv, "k"), (&v, &wv, nkv, "v")] {
                assert_close(&what(name), &b.read_f32(got, m * rows).unwrap(), &mm(&x2, w, rows, d), 1e-10);
            }
            // The last layer's down projection: the residual alone.
            b.matmul_residual(&act_d, &w_d, &mut h, None, m, d, inter).unwrap();
            let h3: Vec<f64> = h2.iter().zip(mm(&act, &wd, d, inter)).map(|(a, b)| a + b).collect();
            assert_close(&what("h, no next norm"), &b.read_f32(&h, m * d).unwrap(), &h3, 1e-10);
        }
    }
}

/// The q/k/v projection with rope and the KV write in its epilogue against the two ops it
/// replaces (qkv_proj, rope_kv_write; each checked against the host above): the same sums and
/// the same rotation, so q and both caches must match exactly, untouched slots included. With
/// and without bias and input norm, decode and prefill shapes (head_dim 128 at prefill takes
/// the unfused path: its rows do not fit one lane's block), texels and buffers.
#[test]
fn qkv_rope_kv_write_equals_the_ops_it_fuses() {
    let backends = texel_and_buffer_backends("qkv rope");
    let mut rng = Rng::new("qkv_rope_kv_write");
    for b in &backends {
        let where_ = if b.texel_weights() { "texels" } else { "buffer" };
        for (qh, kvh, hd, hidden, bias) in [(9, 3, 64, 96, false), (4, 2, 64, 64, true), (4, 1, 128, 64, true)] {
            let (nq, nkv) = (qh * hd, kvh * hd);
            let g = KvGeometry { num_blocks: 6, block_size: 16, num_kv_heads: kvh, head_dim: hd };
            let mut ws = tandem_core::weights::Weights::empty();
            for (n, rows) in [("q", nq), ("k", nkv), ("v", nkv)] {
                ws.replace(n, DType::BF16, &[rows, hidden], &rng.vec(rows * hidden, 0.5)).unwrap();
                ws.replace(&format!("{n}.bias"), DType::F32, &[rows], &rng.vec(rows, 0.5)).unwrap();
            }
            let view = |n: &str, shape: &[usize]| ws.get(n, shape).unwrap();
            let biases = [view("q.bias", &[nq]), view("k.bias", &[nkv]), view("v.bias", &[nkv])];
            let (w, wb) = b
                .fuse_qkv(
                    &view("q", &[nq, hidden]),
                    &view("k", &[nkv, hidden]),
                    &view("v", &[nkv, hidden]),
                    bias.then_some([&biases[0], &biases[1], &biases[2]]),
                )
                .unwrap()
                .expect("fused qkv");
            let inv_freq =
                f32_buf(b, &(0..hd / 2).map(|i| 10_000f32.powf(-2.0 * i as f32 / hd as f32)).collect::<Vec<_>>());
            for (m, with_norm) in [(1, false), (2, true), (37, true)] {
                let x = rng.vec(m * hidden, 1.0);
                let h = f32_buf(b, &rng.vec(m * hidden, 1.0));
                let gamma = b.weight_from_f32(DType::BF16, &rng.vec(hidden, 1.0)).unwrap();
                let norm = with_norm.then_some(NormIn { h: &h, gamma: &gamma, eps: 1e-5 });
                let mut all: Vec<u32> = (0..g.slots() as u32).collect();
                rng.shuffle(&mut all);
                let slots = u32_buf(b, &all[..m]);
                let positions = u32_buf(b, &(0..m).map(|_| rng.below(4096) as u32).collect::<Vec<_>>());
                let (kc0, vc0) = (rng.vec(g.layer_elems(), 1.0), rng.vec(g.layer_elems(), 1.0));
                let run = |fused: bool| {
                    let (mut q, mut k, mut v) = (poisoned(b, m * nq), poisoned(b, m * nkv), poisoned(b, m * nkv));
                    let (mut kc, mut vc) = (b.alloc_kv(g).unwrap(), b.alloc_kv(g).unwrap());
                    b.write_f32(&mut kc, &kc0).unwrap();
                    b.write_f32(&mut vc, &vc0).unwrap();
                    let xb = f32_buf(b, &x);
                    if fused {
                        let kv = KvDest {
                            k_cache: &mut kc,
                            v_cache: &mut vc,
                            positions: &positions,
                            inv_freq: &inv_freq,
                            slots: &slots,
                            geometry: g,
                        };
                        b.qkv_rope_kv_write(&xb, &w, wb.as_ref(), &mut q, &mut k, &mut v, m, nq, hidden, norm, kv)
                            .unwrap();
                    } else {
                        b.qkv_proj(&xb, &w, wb.as_ref(), &mut q, &mut k, &mut v, m, nq, nkv, hidden, norm).unwrap();
                        b.rope_kv_write(&mut q, &mut k, &v, &mut kc, &mut vc, &positions, &inv_freq, &slots, m, qh, g)
                            .unwrap();
                    }
                    let k_written = b.read_f32(&k, m * nkv).unwrap().iter().any(|v| v.to_bits() != POISON.to_bits());
                    (b.read_f32(&q, m * nq).unwrap(), b.read_kv(&kc, g).unwrap(), b.read_kv(&vc, g).unwrap(), k_written)
                };
                let (want, got) = (run(false), run(true));
                // The epilogue never writes the k scratch: proof that the fused path ran where it
                // should (decode blocks hold 128 rows per lane group, prefill blocks 64), caches
                // in textures (K and V staged in workgroup memory) or in buffers.
                let fused_expected = hd == 64 || m <= 2;
                assert_eq!(!got.3, fused_expected, "hd{hd} m{m}: fused path taken = {}", !got.3);
                let what = |x: &str| format!("qkv_rope_kv_write {x} {where_} hd{hd} m{m} bias {bias} norm {with_norm}");
                assert_close(&what("q"), &got.0, &f64s(&want.0), 0.0);
                assert_close(&what("k_cache"), &got.1, &f64s(&want.1), 0.0);
                assert_close(&what("v_cache"), &got.2, &f64s(&want.2), 0.0);
            }
        }
    }
}
