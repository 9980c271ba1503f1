//! `cargo xtask test`: every test, the way CI runs it.
//!
//! 1. The default model, fetched and converted once (cached), so the SmolLM2 golden tests run.
//! 2. The CUDA kernels' compile check (NVRTC + ptxas from pinned wheels), when the toolchain is
//!    installed (`bash kernels/install-toolchain.sh`; `.ci/run` does it): the cuda crate's
//!    `kernels_check` test, required (TANDEM_REQUIRE_CUDA_TOOLCHAIN=1) wherever the toolchain is
//!    there, and under CI. It ran here a second time before `cargo test`, for its table in CI's
//!    output, which cost 1.5-3 minutes; `cargo xtask kernels --check` prints that table.
//! 3. `cargo test --workspace`, with the environment the wgpu tests need.
//! 4. The official `openai` and `anthropic` Python clients and the OpenAI Agents SDK against our server
//!    (crates/server/tests/openai_client.sh).
//! 5. Tandem replicas behind vLLM's and SGLang's routers (tests/routers/router_test.py: spread,
//!    cache-aware prefix hits, a replica killed, a rolling restart, a loading worker, the default
//!    model's answers), and deploy/'s Kubernetes manifests against the bundled schemas
//!    (tests/routers/validate_deploy.py), and the KV-event contract vllm-router's `kv_aware`
//!    policy reads (tests/routers/kv_events_contract.py), from the pinned wheels in `.venv-routers`.
//! 6. The fuzz targets (`cargo xtask fuzz`): regression inputs, then about 20 s of each target
//!    (`TANDEM_FUZZ_SECONDS`); skipped, counted, without a nightly toolchain.
//! 7. The fake-driver group (xtask/src/fake_cuda.rs): the CUDA backend's host code on the fake
//!    driver (crates/fake-cuda), where the CUDA toolchain is installed; counted in the closing line.
//! 8. A count of the tests that skipped themselves (`tandem_core::skip::note` logs them).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Passed on to `cargo test` (e.g. `-p tandem-engine`, `-- --nocapture`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

pub fn run(a: Args) -> Result<()> {
    let extra = &a.extra;
    let root = crate::workspace_root();
    let t_model = std::time::Instant::now();
    let model = tandem_models::fetch::fetch_default(&root.join("models")).context("fetching the default model")?;
    println!("default model ready in {:.0} s", t_model.elapsed().as_secs_f64());
    let t0 = std::time::Instant::now();
    let ci = std::env::var_os("CI").is_some();

    // Without the toolchain the kernels_check test skips itself, and says so.
    let toolchain = root.join(".venv-cuda").exists();
    if !toolchain && ci {
        bail!("CI: the CUDA compile-check toolchain is missing; run `bash kernels/install-toolchain.sh`");
    }

    let skip_log = std::env::temp_dir().join(format!("tandem-skips-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&skip_log);
    let runtime_dir = std::env::temp_dir().join(format!("tandem-xdg-{}", std::process::id()));
    std::fs::create_dir_all(&runtime_dir)?;
    let mut child = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra)
        .env("TANDEM_SMOLLM2_DIR", &model)
        .env("TANDEM_REQUIRE_MODEL", "1")
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("WGPU_BACKEND", "vulkan")
        .env("TANDEM_SKIP_LOG", &skip_log)
        .env("TANDEM_REQUIRE_CUDA_TOOLCHAIN", if toolchain { "1" } else { "0" })
        .stdout(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        // "test result: ok. 14 passed; 0 failed; 0 ignored; ..."
        if let Some(rest) = line.strip_prefix("test result: ") {
            let count = |word: &str| {
                rest.split(';')
                    .find_map(|p| p.trim().strip_suffix(word)?.trim().rsplit(' ').next()?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            passed += count(" passed");
            failed += count(" failed");
        }
    }
    let status = child.wait()?;
    let skipped: Vec<String> =
        std::fs::read_to_string(&skip_log).unwrap_or_default().lines().map(String::from).collect();
    println!("\n{} test(s) skipped themselves:", skipped.len());
    for s in &skipped {
        println!("  {s}");
    }
    println!("cargo test took {:.0} s", t0.elapsed().as_secs_f64());
    if !status.success() {
        bail!("cargo test failed");
    }
    // The op suite once more through the binary, for its per-case log and count in CI's output.
    // A whole-workspace `cargo test` has just built the binary (the cli tests run it), with the
    // workspace's features; `cargo run -p tandem-cli` would resolve features for that package
    // alone and recompile much of the workspace. A filtered run (`extra`) may not have built it.
    let t1 = std::time::Instant::now();
    let target = std::env::var_os("CARGO_TARGET_DIR").map(|d| root.join(d)).unwrap_or_else(|| root.join("target"));
    let built = target.join("debug/tandem");
    let whole = extra.is_empty();
    let mut ops = if whole && built.is_file() {
        Command::new(&built)
    } else {
        let mut c = Command::new(env!("CARGO"));
        c.args(["run", "--quiet", "-p", "tandem-cli", "--bin", "tandem", "--"]);
        c
    };
    let st =
        ops.current_dir(&root).args(["test-ops", "--backend", "wgpu"]).env("XDG_RUNTIME_DIR", &runtime_dir).status()?;
    if !st.success() {
        bail!("tandem test-ops --backend wgpu failed");
    }
    println!("test-ops --backend wgpu took {:.0} s", t1.elapsed().as_secs_f64());
    let t2 = std::time::Instant::now();
    let examples = target.join("debug/examples");
    openai_client(
        &root,
        (whole && examples.join("fake_server").is_file() && examples.join("tiny_server").is_file())
            .then_some(examples.as_path()),
    )?;
    println!("the openai client check took {:.0} s", t2.elapsed().as_secs_f64());
    let (mut passed, mut failed, mut skipped) = (passed, failed, skipped);
    // Replicas behind vLLM's and SGLang's routers, and deploy/'s manifests (tests/routers).
    let t_routers = std::time::Instant::now();
    if let Some(why) = router_check(&root, (whole && built.is_file()).then_some(built.as_path()), &model)? {
        println!("SKIPPED the router scenarios: {why}");
        skipped.push(format!("the router scenarios (tests/routers/router_test.py): {why}"));
    }
    println!("the router check took {:.0} s", t_routers.elapsed().as_secs_f64());
    // The fuzz targets (fuzz/): each finding's input replayed, then a short run of each.
    if whole {
        let t4 = std::time::Instant::now();
        let seconds = std::env::var("TANDEM_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
        let o = crate::fuzz::fuzz(&root, None, seconds, false)?;
        passed += o.passed;
        if let Some(why) = o.skipped {
            skipped.push(format!("the fuzz targets (cargo xtask fuzz): {why}"));
            println!("SKIPPED the fuzz targets: {why}");
        }
        println!("the fuzz targets took {:.0} s", t4.elapsed().as_secs_f64());
    }
    // The CUDA backend on the fake driver (crates/fake-cuda), where NVRTC is installed.
    if toolchain && whole {
        let t3 = std::time::Instant::now();
        let fake = crate::fake_cuda::group(&root, built.is_file().then_some(built.clone()))?;
        passed += fake.passed;
        failed += fake.failed;
        println!("the fake-driver group took {:.0} s", t3.elapsed().as_secs_f64());
    } else {
        let why = if toolchain { "a filtered run" } else { "no CUDA toolchain (bash kernels/install-toolchain.sh)" };
        skipped.push(format!("the fake-driver group (cargo xtask fake-cuda --group): {why}"));
        println!("SKIPPED the fake-driver group: {why}");
    }
    // The one closing line a CI reader looks for.
    println!("tandem: {passed} passed, {failed} failed, {} skipped", skipped.len());
    if failed > 0 {
        bail!("{failed} test(s) failed");
    }
    Ok(())
}

/// The `anthropic` SDK the Messages API check runs (pinned: its event accumulation is what is
/// checked).
const ANTHROPIC_SDK: &str = "anthropic==2.17.0";

/// The official `openai` and `anthropic` Python clients and the OpenAI Agents SDK (clients we
/// did not write) against our server: completions, chat, responses, messages, streaming, tools. The packages go into `.venv-openai`
/// (git-ignored).
fn openai_client(root: &std::path::Path, examples: Option<&std::path::Path>) -> Result<()> {
    let venv = root.join(".venv-openai");
    let py = venv.join("bin/python");
    let pinned = format!(
        "import agents, anthropic, openai; assert anthropic.__version__ == {:?}",
        ANTHROPIC_SDK.trim_start_matches("anthropic==")
    );
    if !py.exists() || !Command::new(&py).args(["-c", &pinned]).status()?.success() {
        let ok = (py.exists() || Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?.success())
            && Command::new(&py)
                .args(["-m", "pip", "install", "-q", "openai", ANTHROPIC_SDK, "openai-agents"])
                .status()?
                .success();
        if !ok {
            bail!("could not install the openai, anthropic and openai-agents packages into {}", venv.display());
        }
    }
    let mut cmd = Command::new("bash");
    cmd.current_dir(root).arg("crates/server/tests/openai_client.sh").arg(&py);
    if let Some(dir) = examples {
        cmd.env("TANDEM_EXAMPLES_DIR", dir);
    }
    let st = cmd.status()?;
    if !st.success() {
        bail!("the openai / anthropic client check failed");
    }
    Ok(())
}

/// The routers and the schema validator the router check runs (pinned: what the scenarios and
/// docs/scale-out.md describe is these versions' behaviour).
/// pyzmq and msgpack: the stand-in KV-event publisher of tests/routers/kv_events_contract.py.
const ROUTER_PACKAGES: [&str; 5] =
    ["vllm-router==0.1.17", "sglang-router==0.3.2", "kubernetes-validate==1.37.0", "pyzmq==27.3.0", "msgpack==1.2.4"];

/// tests/routers: deploy/ validated, then the router scenarios against `tandem` (a built
/// binary; without one they are skipped, and the reason returned). The packages go into
/// `.venv-routers` (git-ignored).
fn router_check(
    root: &std::path::Path,
    tandem: Option<&std::path::Path>,
    model: &std::path::Path,
) -> Result<Option<String>> {
    let venv = root.join(".venv-routers");
    let py = venv.join("bin/python");
    let pins = ROUTER_PACKAGES
        .iter()
        .map(|p| p.split_once("==").expect("pinned"))
        .map(|(n, v)| format!("m.version({n:?}) == {v:?}"))
        .collect::<Vec<_>>()
        .join(" and ");
    let pinned = format!("import importlib.metadata as m, sys; sys.exit(0 if {pins} else 1)");
    if !py.exists() || !Command::new(&py).args(["-c", &pinned]).status()?.success() {
        let ok = (py.exists() || Command::new("python3").arg("-m").arg("venv").arg(&venv).status()?.success())
            && Command::new(&py).args(["-m", "pip", "install", "-q"]).args(ROUTER_PACKAGES).status()?.success();
        if !ok {
            bail!("could not install {} into {}", ROUTER_PACKAGES.join(", "), venv.display());
        }
    }
    if !Command::new(&py)
        .current_dir(root)
        .args(["tests/routers/validate_deploy.py", "--self-test"])
        .status()?
        .success()
    {
        bail!("deploy/ failed validation (tests/routers/validate_deploy.py)");
    }
    let Some(tandem) = tandem else {
        return Ok(Some("no built tandem binary (a filtered run); run it by hand: .venv-routers/bin/python tests/routers/router_test.py --tandem target/debug/tandem".into()));
    };
    let st = Command::new(&py)
        .current_dir(root)
        .arg("tests/routers/router_test.py")
        .arg("--tandem")
        .arg(tandem)
        .arg("--bin-dir")
        .arg(venv.join("bin"))
        .arg("--real-model")
        .arg(model)
        .status()?;
    if !st.success() {
        bail!("the router scenarios failed (tests/routers/router_test.py)");
    }
    let st = Command::new(&py)
        .current_dir(root)
        .arg("tests/routers/kv_events_contract.py")
        .arg("--tandem")
        .arg(tandem)
        .arg("--bin-dir")
        .arg(venv.join("bin"))
        .status()?;
    if !st.success() {
        bail!("the KV-event contract check failed (tests/routers/kv_events_contract.py)");
    }
    Ok(None)
}
