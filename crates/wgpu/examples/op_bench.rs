//! Times single ops at SmolLM2-135M decode shapes (or `--m N` rows), for tuning one kernel:
//!
//!     TANDEM_SHADER_DIR=shaders cargo run -p tandem-wgpu --example op_bench -- [--m 1] [--reps 50] [--only matmul]
//!
//! Each op is recorded `reps` times and submitted once; the figure is wall time per call
//! (device work plus recording), with napkin-math bandwidth for the matmuls.

use std::time::Instant;

use tandem_core::backend::prelude::*;
use tandem_core::backend::{AttnArgs, KvGeometry};
use tandem_core::DType;
use tandem_wgpu::WgpuBackend;

/// CPU time of every thread of this process so far (Linux; 0 elsewhere). On a software
/// Vulkan the device is this process's own threads, so CPU time measures the kernels even on a
/// machine busy with other work, where wall time does not.
fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        * 1e-9
}

/// (wall, cpu) seconds per call.
fn time(
    b: &WgpuBackend,
    reps: usize,
    mut f: impl FnMut() -> tandem_core::Result<()>,
) -> tandem_core::Result<(f64, f64)> {
    f()?;
    b.sync()?; // compile and warm
    let (t0, c0) = (Instant::now(), cpu_secs());
    for _ in 0..reps {
        f()?;
    }
    b.sync()?;
    Ok((t0.elapsed().as_secs_f64() / reps as f64, (cpu_secs() - c0) / reps as f64))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut m, mut reps, mut only) = (1usize, 50usize, String::new());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--m" => m = args.next().and_then(|v| v.parse().ok()).ok_or("--m N")?,
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).ok_or("--reps N")?,
            "--only" => only = args.next().ok_or("--only OP")?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let b = WgpuBackend::new()?;
    println!("adapter: {}; m = {m}", b.adapter());
    let want = |op: &str| only.is_empty() || op.starts_with(&only);
    let fill = |n: usize| -> Vec<f32> { (0..n).map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5).collect() };

    if want("matmul") {
        // Laid out as the model's weights are (tiled; in a texture on CPU adapters); the fused
        // shapes are q/k/v (960) and gate/up (3072).
        for (n, k) in [(576, 576), (192, 576), (960, 576), (1536, 576), (3072, 576), (576, 1536), (49152, 576)] {
            let w = b.weight_matrix_from_f32(DType::BF16, &fill(n * k), n, k)?;
            let mut x = b.alloc_f32(m * k)?;
            b.write_f32(&mut x, &fill(m * k))?;
            let mut out = b.alloc_f32(m * n)?;
            let (s, c) = time(&b, reps, || b.matmul(&x, &w, None, &mut out, m, n, k))?;
            println!(
                "matmul {n:>5}x{k:<5} bf16: {:>8.1} us wall {:>8.1} us cpu  {:>6.2} GB/s weights  {:>6.2} GFLOP/s (wall)",
                s * 1e6,
                c * 1e6,
                (n * k * 2) as f64 / s / 1e9,
                (2 * m * n * k) as f64 / s / 1e9
            );
        }
    }
    if want("paged_attention") {
        for ctx in [64usize, 512] {
            let g = KvGeometry { num_blocks: ctx.div_ceil(16) + 1, block_size: 16, num_kv_heads: 3, head_dim: 64 };
            let mut kc = b.alloc_kv(g)?;
            let mut vc = b.alloc_kv(g)?;
            b.write_f32(&mut kc, &fill(g.layer_elems()))?;
            b.write_f32(&mut vc, &fill(g.layer_elems()))?;
            let mut q = b.alloc_f32(m * 9 * 64)?;
            b.write_f32(&mut q, &fill(m * 9 * 64))?;
            let mut pos = b.alloc_u32(m)?;
            b.write_u32(&mut pos, &(0..m as u32).map(|i| (ctx - m) as u32 + i).collect::<Vec<_>>())?;
            let mut seq = b.alloc_u32(m)?;
            b.write_u32(&mut seq, &vec![0; m])?;
            let mut bt = b.alloc_u32(g.num_blocks)?;
            b.write_u32(&mut bt, &(0..g.num_blocks as u32).collect::<Vec<_>>())?;
            let mut out = b.alloc_f32(m * 9 * 64)?;
            let s = time(&b, reps, || {
                let a = AttnArgs::<WgpuBackend> {
                    q: &q,
                    k_cache: &kc,
                    v_cache: &vc,
                    positions: &pos,
                    token_seq: &seq,
                    block_tables: &bt,
                    num_tokens: m,
                    num_seqs: 1,
                    max_blocks: g.num_blocks,
                    max_context: ctx,
                    decode_tokens: usize::from(m == 1),
                    num_heads: 9,
                    geometry: g,
                    scale: 0.125,
                    window: 0,
                };
                b.paged_attention(&a, &mut out)
            })?;
            println!("paged_attention ctx {ctx:>4} 9x64 heads: {:>8.1} us wall {:>8.1} us cpu", s.0 * 1e6, s.1 * 1e6);
        }
    }
    if want("rms_norm") || want("add") {
        let mut x = b.alloc_f32(m * 576)?;
        b.write_f32(&mut x, &fill(m * 576))?;
        let w = b.weight_from_f32(DType::BF16, &fill(576))?;
        let mut out = b.alloc_f32(m * 576)?;
        let s = time(&b, reps, || b.rms_norm(&x, &w, &mut out, m, 576, 1e-5))?;
        println!("rms_norm {m}x576: {:>8.1} us wall {:>8.1} us cpu", s.0 * 1e6, s.1 * 1e6);
        let s = time(&b, reps, || b.add(&mut out, &x, m * 576))?;
        println!("add {}: {:>8.1} us wall {:>8.1} us cpu", m * 576, s.0 * 1e6, s.1 * 1e6);
    }
    Ok(())
}
