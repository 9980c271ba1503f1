//! Batch-1 greedy decode speed of a model on the wgpu backend, and where the time goes.
//!
//!     cargo run -p tandem-wgpu --example decode_bench -- [--model DIR] [--prompt N] [--steps N] [--profile]
//!
//! Without --model it uses models/SmolLM2-135M-Instruct when present, else writes a seeded
//! random model of the SmolLM2-135M shape (bf16) to a temp directory: same sizes, same work.
//! --profile then times every dispatch with device timestamps and prints a per-kernel table.
//! --ab "VAR=VAL ..." loads a second copy of the model on a backend opened with those
//! environment knobs (e.g. TANDEM_WGPU_FUSE_NORM=0) and times the two alternately, step by
//! step, in this one process: on a machine whose speed drifts, that compares like with like.

use std::path::PathBuf;
use std::time::Instant;

use tandem_core::model::LoadOptions;
use tandem_core::{DType, ForwardBatch, Model, ModelRunner};
use tandem_wgpu::WgpuBackend;

/// CPU time of every thread of this process (Linux). On a software Vulkan the device is this
/// process's threads, so this is the work done, whatever else the machine is running.
fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        * 1e-9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut model: Option<PathBuf> = None;
    let (mut prompt, mut steps, mut profile, mut ab) = (32usize, 64usize, false, None::<String>);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model = args.next().map(PathBuf::from),
            "--prompt" => prompt = args.next().and_then(|v| v.parse().ok()).ok_or("--prompt N")?,
            "--steps" => steps = args.next().and_then(|v| v.parse().ok()).ok_or("--steps N")?,
            "--profile" => profile = true,
            "--ab" => ab = Some(args.next().ok_or("--ab \"VAR=VAL ...\"")?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let dir = match model {
        Some(d) => d,
        None => {
            let real = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct");
            if real.join("config.json").exists() {
                real
            } else {
                let d = std::env::temp_dir().join("tandem-bench-smollm2-135m-random");
                if !d.join("model.safetensors").exists() {
                    eprintln!("no converted SmolLM2-135M; writing a random model of its shape to {}", d.display());
                    tandem_model_files::random_model::write_random_model(
                        &d,
                        tandem_model_files::random_model::Shape::Smollm2_135m,
                        7,
                        DType::BF16,
                    )?;
                }
                d
            }
        }
    };
    let backend = WgpuBackend::new()?;
    println!("adapter: {}", backend.adapter());
    println!("model:   {}", dir.display());
    let block_size = 16;
    let opts = LoadOptions {
        max_batch_tokens: prompt.max(16),
        max_seqs: 1,
        num_kv_blocks: (prompt + steps * 2).div_ceil(block_size) + 1,
        block_size,
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut m = Model::<WgpuBackend>::load(backend, &dir, opts)?;
    println!("load:    {:.2} s", t0.elapsed().as_secs_f64());
    let vocab = m.config().vocab_size as u32;
    let blocks: Vec<u32> = (0..opts.num_kv_blocks as u32).collect();

    let tokens: Vec<u32> = (0..prompt as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut b = ForwardBatch { max_blocks: blocks.len(), ..Default::default() };
    b.push_seq(&tokens, 0, &blocks, block_size, true);
    let t0 = Instant::now();
    let mut next = m.forward_argmax(&b)?[0];
    println!("prefill: {prompt} tokens in {:.3} s (first call compiles the pipelines)", t0.elapsed().as_secs_f64());

    let mut pos = prompt;
    let step =
        |m: &mut Model<WgpuBackend>, pos: &mut usize, next: &mut u32| -> Result<(), Box<dyn std::error::Error>> {
            let mut b = ForwardBatch { max_blocks: blocks.len(), ..Default::default() };
            b.push_seq(&[*next], *pos, &blocks, block_size, true);
            *next = m.forward_argmax(&b)?[0];
            *pos += 1;
            Ok(())
        };
    for _ in 0..2 {
        step(&mut m, &mut pos, &mut next)?; // warm-up
    }
    m.backend().reset_stats();
    let (t0, c0) = (Instant::now(), cpu_secs());
    for _ in 0..steps {
        step(&mut m, &mut pos, &mut next)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs() - c0;
    let st = m.backend().stats();
    println!(
        "decode:  {steps} tokens in {secs:.3} s = {:.2} tok/s ({:.2} ms/token), batch 1, context {}..{}",
        steps as f64 / secs,
        secs * 1e3 / steps as f64,
        prompt,
        pos
    );
    println!(
        "cpu:     {:.2} ms/token over all threads ({:.2} cores busy on average)",
        cpu * 1e3 / steps as f64,
        cpu / secs
    );
    // Recording (host side, before the submit) against waiting for the device.
    println!(
        "host:    {:.2} ms/token recording, {:.2} ms/token waiting for the device",
        (secs - st.wait_secs) * 1e3 / steps as f64,
        st.wait_secs * 1e3 / steps as f64
    );
    // Prefill again, pipelines warm: the same prompt over the same slots (the cache is rewritten
    // with the same values; the decode above is finished with it).
    let t0 = Instant::now();
    m.forward_argmax(&b)?;
    let warm = t0.elapsed().as_secs_f64();
    println!("prefill: {prompt} tokens in {warm:.3} s warm = {:.1} tok/s", prompt as f64 / warm);
    let total: u64 = st.dispatches.values().sum();
    println!(
        "per token: {:.0} dispatches, {:.1} submits",
        total as f64 / steps as f64,
        st.submits as f64 / steps as f64
    );
    for (k, n) in &st.dispatches {
        println!("  {k:<16} {:>6.1} dispatches/token", *n as f64 / steps as f64);
    }

    if let Some(knobs) = ab {
        // The same model on a backend opened under the other knobs (set only while it opens).
        let pairs: Vec<(String, String)> = knobs
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let saved: Vec<_> = pairs.iter().map(|(k, _)| (k.clone(), std::env::var_os(k))).collect();
        for (k, v) in &pairs {
            // SAFETY: single-threaded here; the backend reads its knobs while it opens.
            unsafe { std::env::set_var(k, v) };
        }
        let other = WgpuBackend::new();
        for (k, v) in saved {
            match v {
                // SAFETY: as above.
                Some(v) => unsafe { std::env::set_var(&k, v) },
                None => unsafe { std::env::remove_var(&k) },
            }
        }
        let mut m2 = Model::<WgpuBackend>::load(other?, &dir, opts)?;
        let mut next2 = m2.forward_argmax(&b)?[0];
        let mut pos2 = prompt;
        for _ in 0..2 {
            step(&mut m2, &mut pos2, &mut next2)?;
        }
        // A fresh default model, opened after the other: the first device opened in a process
        // measured ~5% slower in an A/A run (same knobs both sides), whichever it was.
        drop(m);
        let mut m = Model::<WgpuBackend>::load(WgpuBackend::new()?, &dir, opts)?;
        let mut next1 = m.forward_argmax(&b)?[0];
        let mut pos1 = prompt;
        for _ in 0..2 {
            step(&mut m, &mut pos1, &mut next1)?;
        }
        let (mut ta, mut tb) = (vec![], vec![]);
        // CPU time of the process during each side's steps: only one side runs at a time.
        let (mut ca, mut cb) = (0.0, 0.0);
        for i in 0..2 * steps {
            // ABBA order, so that neither side always runs right after the other.
            let first_a = (i / 2) % 2 == 0;
            let a_turn = (i % 2 == 0) == first_a;
            let (t0, c0) = (Instant::now(), cpu_secs());
            if a_turn {
                step(&mut m, &mut pos1, &mut next1)?;
                ta.push(t0.elapsed().as_secs_f64() * 1e3);
                ca += cpu_secs() - c0;
            } else {
                step(&mut m2, &mut pos2, &mut next2)?;
                tb.push(t0.elapsed().as_secs_f64() * 1e3);
                cb += cpu_secs() - c0;
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[0], v.iter().sum::<f64>() / v.len() as f64)
        };
        let ((ma, mina, meana), (mb, minb, meanb)) = (med(&mut ta), med(&mut tb));
        let (ca, cb) = (ca * 1e3 / steps as f64, cb * 1e3 / steps as f64);
        println!(
            "a/b over {steps} alternating steps each (ms/token): default median {ma:.2} min {mina:.2} mean {meana:.2} cpu {ca:.2} | {knobs}: median {mb:.2} min {minb:.2} mean {meanb:.2} cpu {cb:.2} | default/other median {:.3} cpu {:.3}",
            ma / mb,
            ca / cb
        );
        return Ok(());
    }

    if profile {
        if !m.backend().set_profiling(true) {
            println!("profile: the adapter has no timestamp queries");
            return Ok(());
        }
        m.backend().reset_stats();
        let t0 = Instant::now();
        for _ in 0..steps {
            step(&mut m, &mut pos, &mut next)?;
        }
        let wall = t0.elapsed().as_secs_f64();
        let st = m.backend().stats();
        let dev: f64 = st.device_secs.values().sum();
        println!(
            "profile over {steps} tokens: wall {:.2} ms/token, inside dispatches {:.2} ms/token",
            wall * 1e3 / steps as f64,
            dev * 1e3 / steps as f64
        );
        print_profile(&st, steps);
        m.backend().reset_stats();
        let t0 = Instant::now();
        m.forward_argmax(&b)?;
        let wall = t0.elapsed().as_secs_f64();
        let st = m.backend().stats();
        let dev: f64 = st.device_secs.values().sum();
        println!(
            "profile of one {prompt}-token prefill: wall {:.2} ms/token, inside dispatches {:.2} ms/token",
            wall * 1e3 / prompt as f64,
            dev * 1e3 / prompt as f64
        );
        print_profile(&st, prompt);
    }
    Ok(())
}

fn print_profile(st: &tandem_wgpu::Stats, per: usize) {
    let dev: f64 = st.device_secs.values().sum();
    let mut rows: Vec<_> = st.device_secs.iter().collect();
    rows.sort_by(|a, b| b.1.total_cmp(a.1));
    for (k, s) in rows {
        let n = st.dispatches.get(k).copied().unwrap_or(0);
        println!(
            "  {k:<16} {:>7.3} ms/token {:>5.1}%  {:>7.1} us/dispatch",
            s * 1e3 / per as f64,
            100.0 * s / dev,
            s * 1e6 / n.max(1) as f64
        );
    }
}
