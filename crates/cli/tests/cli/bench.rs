//! `tandem bench` through the built binary at tiny sizes, so the benchmarks cannot rot: each
//! test runs one subcommand on the reference backend with a tiny random model and checks the
//! JSON report it writes (and the PNG, where there is one).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-tests").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `tandem bench <args> --output-dir <out>`; panics with its output on failure.
fn bench(out: &Path, args: &[&str]) -> String {
    bench_env(out, args, &[])
}

fn bench_env(out: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-models");
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("bench")
        .args(args)
        .args(["--output-dir", out.to_str().unwrap(), "--model-cache", cache.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .expect("run tandem");
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "tandem bench {args:?} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    stdout
}

fn report(out: &Path, stem: &str) -> Value {
    let path = out.join(format!("{stem}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    assert!(v["git_commit"].as_str().is_some_and(|c| !c.is_empty()));
    v
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000, "{} is not a PNG plot", path.display());
}

const TINY: &[&str] = &["--random-shape", "tiny", "--backend", "reference"];

#[test]
fn throughput_reports_positive_throughput_and_every_token() {
    let out = dir("throughput");
    let md = bench(
        &out,
        &[&["throughput"], TINY, &["--num-prompts", "8", "--input-len", "16", "--output-len", "8"]].concat(),
    );
    let v = report(&out, "throughput-reference-tiny");
    let r = &v["results"];
    assert_eq!(r["completed"], 8);
    assert_eq!(r["errors"], 0);
    assert_eq!(r["prompt_tokens"], 8 * 16);
    assert_eq!(r["output_tokens"], 8 * 8);
    assert!(r["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["requests_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["total_tokens_per_s"].as_f64().unwrap() > r["output_tokens_per_s"].as_f64().unwrap());
    assert!(r["kv_usage_peak"].as_f64().unwrap() > 0.0);
    assert_eq!(r["tpot_ms"]["n"], 8);
    assert_eq!(v["backend"]["name"], "reference");
    // What the cache stored, as the runner reports it (gpu/summarize.py counts KV bytes by it).
    assert_eq!(
        (v["backend"]["kv_cache_dtype"].as_str(), v["backend"]["kv_elem_bytes"].as_u64()),
        (Some("f32"), Some(4))
    );
    assert_eq!(v["model"]["random_shape"], "tiny");
    assert!(md.contains("| tandem (reference) | 8/8 |"), "{md}");
}

/// `bench lora`: the base run and the adapter runs in one report, every request answered,
/// the ratios against the base run of the same invocation.
#[test]
fn lora_runs_the_base_and_each_adapter_count() {
    let out = dir("lora");
    let small = ["--num-prompts", "6", "--input-len", "12", "--output-len", "4", "--warmup", "1"];
    let md = bench(&out, &[&["lora"], TINY, &small, &["--adapters", "0,1,3"]].concat());
    let v = report(&out, "lora-reference-tiny");
    let runs = v["results"]["runs"].as_array().unwrap();
    let counts: Vec<u64> = runs.iter().map(|r| r["adapters"].as_u64().unwrap()).collect();
    assert_eq!(counts, vec![0, 1, 3]);
    for r in runs {
        assert_eq!((r["completed"].as_u64(), r["output_tokens"].as_u64()), (Some(6), Some(24)), "{r}");
        assert!(r["output_tokens_per_s_vs_base"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert_eq!(runs[0]["output_tokens_per_s_vs_base"], 1.0);
    assert_eq!(runs[2]["ranks"], serde_json::json!([8, 16, 8]));
    assert!(out.join("lora-adapters/tiny-a2-r8/adapter_model.safetensors").exists());
    assert!(md.contains("| 0 (base, LoRA off) | - |") && md.contains("| 3 | 16, 8 |"), "{md}");
}

#[test]
fn compare_and_sweep_write_tables_and_plots() {
    let out = dir("compare");
    let small = ["--num-prompts", "8", "--min-len", "4", "--max-len", "40", "--warmup", "1"];
    let md = bench(&out, &[&["compare"], TINY, &small, &["--concurrency", "2,4"]].concat());
    let v = report(&out, "compare-reference-tiny");
    let runs = v["results"]["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "two concurrencies x two schedulers");
    for r in runs {
        assert_eq!(r["result"]["completed"], 8, "{r}");
        assert!(r["result"]["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["settings"]["workload"]["workload"], "mixed");
    assert!(md.contains("static tok/s"), "{md}");
    assert_png(&out.join("compare-reference-tiny.png"));

    let md = bench(
        &out,
        &[
            &["sweep"],
            TINY,
            &["--num-prompts", "8", "--input-len", "8", "--output-len", "6", "--max-num-seqs-values", "2,8"],
        ]
        .concat(),
    );
    let v = report(&out, "sweep-reference-tiny");
    let runs = v["results"]["runs"].as_array().unwrap();
    assert_eq!(runs.iter().map(|r| r["max_num_seqs"].as_u64().unwrap()).collect::<Vec<_>>(), [2, 8]);
    assert!(runs.iter().all(|r| r["result"]["output_tokens"] == 48));
    assert!(md.contains("| 8 |"), "{md}");
    assert_png(&out.join("sweep-reference-tiny.png"));

    // Where no font can be found the plot is still drawn, without text.
    bench_env(
        &out,
        &[
            &["sweep"],
            TINY,
            &[
                "--num-prompts",
                "4",
                "--input-len",
                "8",
                "--output-len",
                "4",
                "--max-num-seqs-values",
                "2,4",
                "--name",
                "no-font",
            ],
        ]
        .concat(),
        &[("TANDEM_PLOT_FONT", "none")],
    );
    assert_png(&out.join("no-font.png"));
}

#[test]
fn serve_streams_from_a_spawned_server() {
    let out = dir("serve");
    let md = bench(
        &out,
        &[
            &["serve", "--spawn"],
            TINY,
            &[
                "--num-prompts",
                "6",
                "--input-len",
                "12",
                "--output-len",
                "5",
                "--max-concurrency",
                "3",
                "--request-rate",
                "50",
            ],
        ]
        .concat(),
    );
    let v = report(&out, "serve-tiny");
    let r = &v["results"];
    assert_eq!(r["completed"], 6, "{r}");
    assert_eq!(r["output_tokens"], 30);
    assert!(r["output_tokens_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["ttft_ms"]["median"].as_f64().unwrap() > 0.0);
    assert_eq!(v["settings"]["max_concurrency"], 3);
    assert!(md.contains("TTFT (ms)"), "{md}");
}

#[test]
fn serve_fails_at_once_when_its_spawned_server_exits() {
    // The reference backend refuses a bf16 KV cache at load, so the spawned server exits; the
    // run must say so now, not after --startup-timeout-s (600 s by default).
    let out = dir("serve-exits");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-models");
    let t = std::time::Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "bench",
            "serve",
            "--spawn",
            "--random-shape",
            "tiny",
            "--backend",
            "reference",
            "--kv-cache-dtype",
            "bf16",
            "--num-prompts",
            "1",
        ])
        .args(["--output-dir", out.to_str().unwrap(), "--model-cache", cache.to_str().unwrap()])
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("exited") && err.contains("before it was healthy"), "{err}");
    assert!(t.elapsed().as_secs() < 120, "took {:?}", t.elapsed());
}

#[test]
fn mixed_throughput_writes_the_prompts_it_ran_with_their_own_output_range() {
    let out = dir("mixed-prompts");
    let file = out.join("prompts.json");
    let args = [
        "--workload",
        "mixed",
        "--num-prompts",
        "6",
        "--min-len",
        "4",
        "--max-len",
        "20",
        "--min-output-len",
        "2",
        "--max-output-len",
        "5",
    ];
    bench(
        &out,
        &[&["throughput"], TINY, &args, &["--write-prompts", file.to_str().unwrap(), "--name", "mixed"]].concat(),
    );
    let v = report(&out, "mixed");
    assert_eq!(v["settings"]["workload"]["max_output_len"], 5, "{}", v["settings"]);
    let p: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let prompts = p["prompts"].as_array().unwrap();
    assert_eq!(prompts.len(), 6);
    let wants: Vec<u64> = prompts.iter().map(|q| q["output_len"].as_u64().unwrap()).collect();
    assert!(wants.iter().all(|n| (2..=5).contains(n)), "{wants:?}");
    assert!(prompts.iter().all(|q| (4..=20).contains(&q["ids"].as_array().unwrap().len())), "{p}");
    // What bench/hf_baseline.py reads is what ran: every request got its output length.
    assert_eq!(v["results"]["completed"], 6);
    assert_eq!(v["results"]["output_tokens"].as_u64().unwrap(), wants.iter().sum::<u64>(), "{}", v["results"]);
}

#[test]
fn serve_refuses_hosts_that_are_not_loopback() {
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "serve", "--host", "10.1.2.3", "--vocab-size", "100", "--num-prompts", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("loopback"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn load_and_decode_report_their_figures() {
    let out = dir("load");
    bench(&out, &["load", "--random-shape", "tiny", "--runs", "3"]);
    let v = report(&out, "load-tiny");
    assert!(v["results"]["total"]["median_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(v["results"]["runs_total_ms"].as_array().unwrap().len(), 3);
    assert!(v["results"]["tensors"].as_u64().unwrap() > 10);

    // A 20-token prompt in chunks of 8: the prefill packs and splits prompts across forwards.
    let md = bench(
        &out,
        &[
            &["decode"],
            TINY,
            &[
                "--prompt-len",
                "20",
                "--max-tokens",
                "10",
                "--runs",
                "2",
                "--batch-sizes",
                "1,4",
                "--max-num-batched-tokens",
                "8",
            ],
        ]
        .concat(),
    );
    let v = report(&out, "decode-reference-tiny");
    let r = &v["results"];
    assert!(r["prefill_tokens_per_s"]["median"].as_f64().unwrap() > 0.0);
    for b in ["1", "4"] {
        assert!(r["decode_by_batch"][b]["median"].as_f64().unwrap() > 0.0, "batch {b}: {r}");
        assert!(r["runs"].as_array().unwrap().iter().all(|run| run["decode_s"][b].as_f64().unwrap() > 0.0));
    }
    // The smallest batch size stays where earlier reports kept batch 1.
    assert_eq!(r["decode_tokens_per_s"]["batch_size"], 1);
    assert!(r["decode_tokens_per_s"]["median"].as_f64().unwrap() > 0.0);
    assert_eq!(r["decode_steps"], 9);
    assert_eq!(
        (v["backend"]["kv_cache_dtype"].as_str(), v["backend"]["kv_elem_bytes"].as_u64()),
        (Some("f32"), Some(4))
    );
    assert_eq!(r["runs"].as_array().unwrap().len(), 2);
    assert!(r.get("hf_baseline").is_none());
    assert!(md.contains("| decode tok/s batch 4 |") && md.contains("| - | - |"), "{md}");
}

#[test]
fn decode_reports_its_figures_when_the_hf_baseline_fails() {
    let out = dir("decode-hf");
    let md = bench(
        &out,
        &[
            &["decode"],
            TINY,
            &[
                "--prompt-len",
                "8",
                "--max-tokens",
                "3",
                "--runs",
                "1",
                "--hf-baseline",
                "--hf-script",
                "no/such/hf_decode.py",
            ],
        ]
        .concat(),
    );
    let v = report(&out, "decode-reference-tiny");
    let r = &v["results"];
    assert!(r["hf_baseline"]["error"].as_str().is_some_and(|e| e.contains("no/such/hf_decode.py")), "{r}");
    assert!(r["decode_by_batch"]["1"]["median"].as_f64().unwrap() > 0.0);
    assert!(md.contains("| prefill tok/s |"), "{md}");
}

/// The baseline runs once after each of our runs (one round each) and its figure is the median
/// of its rounds: a stand-in script reports decode rates 10, 30, 20 in turn, so the table's HF
/// column must say 20.0, and the report keeps the three rounds.
#[test]
fn decode_interleaves_the_hf_rounds_and_takes_their_median() {
    let out = dir("decode-hf-rounds");
    let script = out.join("fake_hf.py");
    let counter = out.join("calls");
    std::fs::write(
        &script,
        format!(
            "import json, os, sys\n\
             p = {counter:?}\n\
             n = int(open(p).read()) if os.path.exists(p) else 0\n\
             open(p, 'w').write(str(n + 1))\n\
             assert '--runs' in sys.argv and sys.argv[sys.argv.index('--runs') + 1] == '1'\n\
             rate = [10.0, 30.0, 20.0][n]\n\
             print(json.dumps({{'prefill_tokens_per_s': 100.0 + n, 'decode_tokens_per_s': {{'1': rate}}, 'transformers': 'stand-in', 'torch': '-', 'dtype': 'float32', 'device': 'cpu', 'threads': 1}}))\n"
        ),
    )
    .unwrap();
    let md = bench(
        &out,
        &[
            &["decode"],
            TINY,
            &[
                "--prompt-len",
                "8",
                "--max-tokens",
                "3",
                "--runs",
                "3",
                "--hf-baseline",
                "--python",
                "python3",
                "--hf-script",
                script.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    let r = &report(&out, "decode-reference-tiny")["results"];
    assert_eq!(std::fs::read_to_string(&counter).unwrap(), "3", "one HF round per run");
    assert_eq!(r["hf_baseline"]["decode_tokens_per_s"]["1"].as_f64(), Some(20.0), "{r}");
    assert_eq!(r["hf_baseline"]["prefill_tokens_per_s"].as_f64(), Some(101.0), "{r}");
    assert_eq!(r["hf_baseline"]["rounds"].as_array().map(|v| v.len()), Some(3), "{r}");
    let ours = r["decode_by_batch"]["1"]["median"].as_f64().unwrap();
    assert!((r["ratio_vs_hf"]["decode"]["1"].as_f64().unwrap() - ours / 20.0).abs() < 1e-9, "{r}");
    assert!(md.contains("| 20.0 |"), "{md}");
}

/// `--guided-fraction 0.5`: half the requests constrained by the benchmark's JSON schema still
/// write every token, and the report counts one mask per constrained token with its times.
#[test]
fn throughput_with_half_the_requests_guided_reports_the_mask_cost() {
    let out = dir("throughput-guided");
    let md = bench(
        &out,
        &[
            &["throughput"],
            TINY,
            &["--num-prompts", "8", "--input-len", "16", "--output-len", "8", "--guided-fraction", "0.5"],
        ]
        .concat(),
    );
    let v = report(&out, "throughput-reference-tiny");
    let (r, g) = (&v["results"], &v["results"]["guided"]);
    assert_eq!(
        (r["completed"].as_u64(), r["errors"].as_u64(), r["output_tokens"].as_u64()),
        (Some(8), Some(0), Some(64)),
        "{r}"
    );
    assert_eq!(g["requests"], 4);
    assert_eq!(g["masks"], 4 * 8, "one mask per constrained token: {g}");
    assert!(
        g["mask_us_p99"].as_f64().unwrap() >= g["mask_us_p50"].as_f64().unwrap()
            && g["mask_us_p50"].as_f64().unwrap() > 0.0,
        "{g}"
    );
    assert!(md.contains("guided: 4 of 8 requests, 32 masks"), "{md}");
}

/// The kernel lab runs on any backend: the reference at the tiny shape, every GEMM at each m
/// and both attention kinds, then argmax and sampling, then the LoRA update, with floors and fractions when the
/// ceilings are given; `--only-sampling` the last alone.
#[test]
fn kernel_lab_times_every_case() {
    let out = dir("kernels");
    let args = [
        "bench",
        "kernels",
        "--backend",
        "reference",
        "--shape",
        "tiny",
        "--m",
        "1,7",
        "--attn-batch",
        "2",
        "--attn-context",
        "40",
        "--attn-prefill",
        "33",
        "--verify-batch",
        "2",
        "--verify-k",
        "3",
        "--sample-batch",
        "3",
        "--lora-m",
        "1,3",
        "--min-ms",
        "1",
        "--bandwidth-gbs",
        "10",
        "--peak-tflops",
        "0.1",
        "--output-dir",
        out.to_str().unwrap(),
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_tandem")).args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = report(&out, "kernels-reference-tiny");
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 5 * 2 + 4 + 3 + 2 * 2, "{rows:?}");
    for r in rows {
        let (us, frac) = (r["us"].as_f64().unwrap(), r["frac_of_floor"].as_f64().unwrap());
        assert!(us > 0.0 && frac > 0.0 && r["torch"]["kind"].is_string(), "{r}");
    }
    assert_eq!(rows[0]["torch"], serde_json::json!({"kind": "gemm", "m": 1, "n": 128, "k": 64, "x_dtype": "f32"}));
    // Each decode case over an fp8 cache right after it (the reference's fp8 KV).
    assert_eq!(
        (rows[11]["op"].as_str(), rows[11]["torch"]["kv"].as_str()),
        (Some("attention decode fp8"), Some("fp8_e4m3"))
    );
    assert_eq!(rows[12]["op"], "attention verify");
    assert_eq!(rows[12]["torch"]["q_len"], 4, "k = 3: the last token and 3 drafts");
    assert_eq!(rows[13]["op"], "attention prefill");
    assert_eq!(rows[14]["torch"], serde_json::json!({"kind": "argmax", "batch": 3, "vocab": 384}));
    assert_eq!(
        (rows[15]["op"].as_str(), rows[16]["op"].as_str()),
        (Some("sample top-p 0.9"), Some("sample top-k 50 top-p 0.9"))
    );
    // The segmented LoRA update last: q then down, at each --lora-m, over 4 slots of rank 16.
    assert_eq!(
        rows[17]["torch"],
        serde_json::json!({"kind": "lora", "m": 1, "in": 64, "out": 64, "slots": 4, "rank": 16})
    );
    assert_eq!((rows[19]["op"].as_str(), rows[20]["torch"]["m"].as_u64()), (Some("lora down"), Some(3)));
    let only = dir("kernels-sampling");
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "bench",
            "kernels",
            "--backend",
            "reference",
            "--shape",
            "tiny",
            "--only-sampling",
            "--sample-batch",
            "1,2",
            "--min-ms",
            "1",
            "--output-dir",
            only.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = report(&only, "kernels-reference-tiny");
    let ops: Vec<&str> = v["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["argmax", "sample top-p 0.9", "sample top-k 50 top-p 0.9"].repeat(2), "{v}");
    // --only-attention: the decode, verification and prefill attention cases alone (gpu/tune.sh's
    // variants); by default verification at b of 1, 8, 32 and k of 2, 4.
    let only = dir("kernels-attention");
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "bench",
            "kernels",
            "--backend",
            "reference",
            "--shape",
            "tiny",
            "--only-attention",
            "--attn-batch",
            "2",
            "--attn-context",
            "40",
            "--attn-prefill",
            "33,17",
            "--min-ms",
            "1",
            "--output-dir",
            only.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = report(&only, "kernels-reference-tiny");
    let ops: Vec<&str> = v["results"].as_array().unwrap().iter().map(|r| r["op"].as_str().unwrap()).collect();
    // The decode case again over an fp8 cache (the reference stores one).
    let mut want = vec!["attention decode", "attention decode fp8"];
    want.extend(["attention verify"; 6]);
    want.extend(["attention prefill"; 2]);
    assert_eq!(ops, want, "{v}");
    let bad = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "kernels", "--backend", "reference", "--shape", "llama-9"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("known shapes"));
}

/// The kernel lab's quantized decode GEMVs: each layer GEMM on int4 weights at m = 1 and the
/// verification width k + 1, the bytes those of the kept blocks; a layout the shape's k is not
/// whole blocks of (groups of 128 at the tiny shape's k of 64) is left out, saying so.
#[test]
fn kernel_lab_times_quantized_gemvs() {
    let out = dir("kernels-quant");
    let o = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "bench",
            "kernels",
            "--backend",
            "reference",
            "--shape",
            "tiny",
            "--m",
            "1",
            "--attn-batch",
            "1",
            "--attn-context",
            "16",
            "--attn-prefill",
            "16",
            "--verify-batch",
            "1",
            "--verify-k",
            "3",
            "--sample-batch",
            "1",
            "--quant-gemv",
            "int4_g32,int4_g128",
            "--min-ms",
            "1",
            "--output-dir",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("qkv (k = 64) is not whole int4_g128 blocks"), "{stderr}");
    let v = report(&out, "kernels-reference-tiny");
    let rows: Vec<&serde_json::Value> =
        v["results"].as_array().unwrap().iter().filter(|r| r["op"].as_str().unwrap().starts_with("gemv")).collect();
    let cases: Vec<(&str, &str)> =
        rows.iter().map(|r| (r["op"].as_str().unwrap(), r["case"].as_str().unwrap())).collect();
    assert_eq!(
        cases,
        [
            ("gemv qkv int4_g32", "m=1 n=128 k=64"),
            ("gemv qkv int4_g32", "m=4 n=128 k=64"),
            ("gemv o int4_g32", "m=1 n=64 k=64"),
            ("gemv o int4_g32", "m=4 n=64 k=64"),
            ("gemv gate_up int4_g32", "m=1 n=320 k=64"),
            ("gemv gate_up int4_g32", "m=4 n=320 k=64"),
            ("gemv down int4_g32", "m=1 n=64 k=160"),
            ("gemv down int4_g32", "m=4 n=64 k=160"),
        ]
    );
    // qkv at m = 1: 128 rows of 2 blocks of 24 bytes, x and out in f32 on the reference.
    assert_eq!(rows[0]["bytes"].as_f64(), Some((128 * 2 * 24 + 64 * 4 + 128 * 4) as f64), "{}", rows[0]);
    assert_eq!(rows[0]["torch"]["weights"], "int4_g32");
    assert!(rows.iter().all(|r| r["us"].as_f64().unwrap() > 0.0));
    let bad = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["bench", "kernels", "--backend", "reference", "--shape", "tiny", "--quant-gemv", "int3"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--quant-gemv int3"));
}
