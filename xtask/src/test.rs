//! `cargo xtask test`: every test, the way CI runs it.
//!
//! 1. `cargo fmt --check` over the workspace and over fuzz/ (its own workspace).
//! 2. The default model, fetched and converted once (cached), so the SmolLM2 golden tests run.
//! 3. The CUDA kernels' compile check (NVRTC + ptxas from pinned wheels), when the toolchain is
//!    installed (`bash kernels/install-toolchain.sh`; `.ci/run` does it): the cuda crate's
//!    `kernels_check` test, required (TANDEM_REQUIRE_CUDA_TOOLCHAIN=1) wherever the toolchain is
//!    there, and under CI. `cargo xtask kernels --check` prints its table.
//! 4. `cargo test --workspace`, with the environment the wgpu tests need.
//! 5. The op suite through the binary on wgpu (`tandem test-ops --backend wgpu`), case by case.
//! 6. The official `openai` and `anthropic` Python clients and the OpenAI Agents SDK against our
//!    server (crates/server/tests/openai_client.sh), at pinned versions.
//! 7. Tandem replicas behind vLLM's and SGLang's routers (tests/routers/router_test.py: spread,
//!    cache-aware prefix hits, a replica killed, a rolling restart, a loading worker, the default
//!    model's answers), and deploy/'s Kubernetes manifests against the bundled schemas
//!    (tests/routers/validate_deploy.py), and the KV-event contract vllm-router's `kv_aware`
//!    policy reads (tests/routers/kv_events_contract.py), from the pinned wheels in `.venv-routers`.
//! 8. The fuzz targets (`cargo xtask fuzz`): regression inputs, then each target's committed
//!    corpus replayed and a few seconds of fresh mutations (`TANDEM_FUZZ_SECONDS`, default
//!    [`crate::fuzz::CI_SECONDS`]); each target a skip without a nightly toolchain.
//! 9. The fake-driver group (xtask/src/fake_cuda.rs): the CUDA backend's host code on the fake
//!    driver (crates/fake-cuda), where the CUDA toolchain is installed.
//! 10. `cargo clippy --workspace --all-targets -- -D warnings`.
//!
//! Every check of every step appears once in the closing line, `tandem: P passed, F failed, S
//! skipped`, printed after the reasons for each skip and failure (test/count.rs). A step that
//! fails does not stop the ones after it.

mod count;
mod echo;

pub(crate) use count::{libtest, Tally};
pub(crate) use echo::run_echoed;

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

#[derive(clap::Args)]
pub struct Args {
    /// Passed on to `cargo test` (e.g. `-p tandem-engine`, `-- --nocapture`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    extra: Vec<String>,
}

/// The random inputs' seed of every test the command runs (the op suites on each backend, the
/// wgpu tests' data, the fake driver's op suite), unless `TANDEM_TEST_SEED` is set: a commit's
/// test command passes or fails the same way on every run. `cargo test` and `tandem test-ops`
/// run by hand still draw a fresh seed each time and print it; that is where new ground is found.
pub const TEST_SEED: u64 = 1;

pub fn run(a: Args) -> Result<()> {
    let extra = &a.extra;
    let root = crate::workspace_root();
    if std::env::var_os("TANDEM_TEST_SEED").is_none() {
        // Before any thread is started: nothing else reads the environment concurrently.
        std::env::set_var("TANDEM_TEST_SEED", TEST_SEED.to_string());
    }
    println!("test seed {} (TANDEM_TEST_SEED)", std::env::var("TANDEM_TEST_SEED").unwrap_or_default());
    let mut tally = Tally::default();
    format_check(&root, &mut tally)?;
    let t_model = Instant::now();
    let model = tandem_model_files::fetch::fetch_default(&root.join("models")).context("fetching the default model")?;
    println!("default model ready in {:.0} s", t_model.elapsed().as_secs_f64());
    let t0 = Instant::now();
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
    let mut cargo_test = Command::new(env!("CARGO"));
    cargo_test
        .current_dir(&root)
        .args(["test", "--workspace", "--no-fail-fast"])
        .args(extra)
        .env("TANDEM_SMOLLM2_DIR", &model)
        .env("TANDEM_REQUIRE_MODEL", "1")
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("WGPU_BACKEND", "vulkan")
        .env("TANDEM_SKIP_LOG", &skip_log)
        .env("TANDEM_REQUIRE_CUDA_TOOLCHAIN", if toolchain { "1" } else { "0" });
    let (lines, ok) = run_echoed(cargo_test, "cargo test")?;
    let tests = count::libtest(&lines, &std::fs::read_to_string(&skip_log).unwrap_or_default());
    let died = !ok && tests.failed.is_empty();
    println!(
        "cargo test: {} passed, {} failed, {} skipped in {:.0} s",
        tests.passed,
        tests.failed_count(),
        tests.skipped_count(),
        t0.elapsed().as_secs_f64()
    );
    tally.add(tests);
    if died {
        tally.fail(1, "cargo test exited with an error and no failing test (a build error?)");
    }
    // The op suite once more through the binary, for its per-case log and count in CI's output.
    // A whole-workspace `cargo test` has just built the binary (the cli tests run it), with the
    // workspace's features; `cargo run -p tandem-cli` would resolve features for that package
    // alone and recompile much of the workspace. A filtered run (`extra`) may not have built it.
    let t1 = Instant::now();
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
    // Its skipped cases' reasons (one line per op and reason) come through the skip log.
    let ops_log = std::env::temp_dir().join(format!("tandem-skips-ops-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&ops_log);
    ops.current_dir(&root)
        .args(["test-ops", "--backend", "wgpu"])
        .env("XDG_RUNTIME_DIR", &runtime_dir)
        .env("TANDEM_SKIP_LOG", &ops_log);
    let what = "the op suite on wgpu (tandem test-ops)";
    match run_echoed(ops, what) {
        Ok((lines, ok)) => {
            let why = std::fs::read_to_string(&ops_log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.rsplit('\t').next().map(String::from))
                .collect::<Vec<_>>()
                .join("; ");
            tally.counted_step(what, &lines, ok, Some(why.as_str()).filter(|w| !w.is_empty()));
        }
        Err(e) => tally.fail(1, format!("{what}: {e:#}")),
    }
    println!("test-ops --backend wgpu took {:.0} s", t1.elapsed().as_secs_f64());
    let t2 = Instant::now();
    let examples = target.join("debug/examples");
    let what = "the openai / anthropic / agents client checks (crates/server/tests/openai_client.sh)";
    match openai_client(
        &root,
        (whole && examples.join("fake_server").is_file() && examples.join("tiny_server").is_file())
            .then_some(examples.as_path()),
    ) {
        Ok((lines, ok)) => tally.counted_step(what, &lines, ok, None),
        Err(e) => tally.fail(1, format!("{what}: {e:#}")),
    }
    println!("the openai client check took {:.0} s", t2.elapsed().as_secs_f64());
    // Replicas behind vLLM's and SGLang's routers, and deploy/'s manifests (tests/routers).
    let t_routers = Instant::now();
    match router_check(&root, (whole && built.is_file()).then_some(built.as_path()), &model) {
        Ok(t) => tally.add(t),
        Err(e) => tally.fail(1, format!("tests/routers: {e:#}")),
    }
    println!("the router check took {:.0} s", t_routers.elapsed().as_secs_f64());
    // The fuzz targets (fuzz/): each finding's input replayed, then a short run of each.
    let targets = crate::fuzz::TARGETS.len() as u64;
    if whole {
        let t4 = Instant::now();
        let seconds =
            std::env::var("TANDEM_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(crate::fuzz::CI_SECONDS);
        match crate::fuzz::fuzz(&root, None, seconds, false, crate::fuzz::CI_SEED) {
            Ok(o) => {
                tally.pass(o.passed);
                if let Some(why) = o.skipped {
                    tally.skip(targets, format!("the fuzz targets (cargo xtask fuzz): {why}"));
                }
            }
            Err(e) => tally.fail(1, format!("the fuzz targets: {e:#}")),
        }
        println!("the fuzz targets took {:.0} s", t4.elapsed().as_secs_f64());
    } else {
        tally.skip(targets, "the fuzz targets (cargo xtask fuzz): a filtered run");
    }
    // The CUDA backend on the fake driver (crates/fake-cuda), where NVRTC is installed.
    if toolchain && whole {
        let t3 = Instant::now();
        match crate::fake_cuda::group(&root, built.is_file().then_some(built.clone())) {
            Ok(t) => tally.add(t),
            Err(e) => tally.fail(1, format!("the fake-driver group: {e:#}")),
        }
        println!("the fake-driver group took {:.0} s", t3.elapsed().as_secs_f64());
    } else {
        let why = if toolchain { "a filtered run" } else { "no CUDA toolchain (bash kernels/install-toolchain.sh)" };
        tally.skip(1, format!("the fake-driver group (cargo xtask fake-cuda --group): {why}"));
    }
    // Last: it checks what every step above built, and a failure here leaves them their say.
    let what = "cargo clippy --workspace --all-targets -- -D warnings";
    if whole {
        let t5 = Instant::now();
        let mut clippy = Command::new(env!("CARGO"));
        clippy.current_dir(&root).args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]);
        match run_echoed(clippy, what) {
            Ok((_, ok)) => tally.step(what, ok),
            Err(e) => tally.fail(1, format!("{what}: {e:#}")),
        }
        println!("clippy took {:.0} s", t5.elapsed().as_secs_f64());
    } else {
        tally.skip(1, format!("{what}: a filtered run"));
    }
    // The one closing line a CI reader looks for, after the reasons.
    println!("\n{}", tally.report());
    if !tally.failed.is_empty() {
        bail!("{} check(s) failed", tally.failed_count());
    }
    Ok(())
}

/// `cargo fmt --check` over the workspace, and over fuzz/ (its own workspace; the root's
/// rustfmt.toml applies there too): one check each.
fn format_check(root: &Path, tally: &mut Tally) -> Result<()> {
    for (what, dir) in
        [("cargo fmt --check (the workspace)", root.to_path_buf()), ("cargo fmt --check (fuzz/)", root.join("fuzz"))]
    {
        let mut fmt = Command::new(env!("CARGO"));
        fmt.current_dir(dir).args(["fmt", "--all", "--check"]);
        let (_, ok) = run_echoed(fmt, what)?;
        tally.step(what, ok);
    }
    Ok(())
}

/// The clients the client checks run, pinned: what is checked is these versions' behaviour
/// (the `anthropic` SDK's event accumulation; `openai`'s `chat.completions.parse` and
/// `responses.parse`, which older clients lack; the Agents SDK's calls through it).
const CLIENT_PACKAGES: [&str; 3] = ["openai==3.60.0", "anthropic==2.17.0", "openai-agents==0.24.0"];

/// A Python that imports `packages` at their pinned versions: `venv`'s, with them installed
/// there when it has not.
fn pinned_venv(venv: &Path, packages: &[&str]) -> Result<std::path::PathBuf> {
    let py = venv.join("bin/python");
    let pins = packages
        .iter()
        .map(|p| p.split_once("==").expect("pinned"))
        .map(|(n, v)| format!("m.version({n:?}) == {v:?}"))
        .collect::<Vec<_>>()
        .join(" and ");
    let pinned = format!("import importlib.metadata as m, sys; sys.exit(0 if {pins} else 1)");
    if !py.exists() || !Command::new(&py).args(["-c", &pinned]).status()?.success() {
        let ok = (py.exists() || Command::new("python3").arg("-m").arg("venv").arg(venv).status()?.success())
            && Command::new(&py).args(["-m", "pip", "install", "-q"]).args(packages).status()?.success();
        if !ok {
            bail!("could not install {} into {}", packages.join(", "), venv.display());
        }
    }
    Ok(py)
}

/// The official `openai` and `anthropic` Python clients and the OpenAI Agents SDK (clients we
/// did not write) against our server: completions, chat, responses, messages, streaming, tools.
/// The packages go into `.venv-openai` (git-ignored). Each script prints its count.
fn openai_client(root: &Path, examples: Option<&Path>) -> Result<(Vec<String>, bool)> {
    let py = pinned_venv(&root.join(".venv-openai"), &CLIENT_PACKAGES)?;
    let mut cmd = Command::new("bash");
    cmd.current_dir(root).arg("crates/server/tests/openai_client.sh").arg(&py);
    if let Some(dir) = examples {
        cmd.env("TANDEM_EXAMPLES_DIR", dir);
    }
    run_echoed(cmd, "crates/server/tests/openai_client.sh")
}

/// The routers and the schema validator the router check runs (pinned: what the scenarios and
/// docs/scale-out.md describe is these versions' behaviour).
/// pyzmq and msgpack: the stand-in KV-event publisher of tests/routers/kv_events_contract.py.
const ROUTER_PACKAGES: [&str; 5] =
    ["vllm-router==0.1.17", "sglang-router==0.3.2", "kubernetes-validate==1.37.0", "pyzmq==27.3.0", "msgpack==1.2.4"];

/// tests/routers: deploy/ validated (each resource set and each deliberate break a check), then
/// the router scenarios (each scenario on each router a check) and the KV-event contract
/// against `tandem` (a built binary; without one they are skipped). The packages go into
/// `.venv-routers` (git-ignored).
fn router_check(root: &Path, tandem: Option<&Path>, model: &Path) -> Result<Tally> {
    let venv = root.join(".venv-routers");
    let py = pinned_venv(&venv, &ROUTER_PACKAGES)?;
    let mut t = Tally::default();
    let mut deploy = Command::new(&py);
    deploy.current_dir(root).args(["tests/routers/validate_deploy.py", "--self-test"]);
    let what = "deploy/'s manifests (tests/routers/validate_deploy.py)";
    let (lines, ok) = run_echoed(deploy, what)?;
    t.counted_step(what, &lines, ok, None);
    let scenarios = "the router scenarios (tests/routers/router_test.py)";
    let contract = "the KV-event contract (tests/routers/kv_events_contract.py)";
    let Some(tandem) = tandem else {
        let why = "no built tandem binary (a filtered run); run it by hand: .venv-routers/bin/python tests/routers/router_test.py --tandem target/debug/tandem";
        t.skip(1, format!("{scenarios}: {why}"));
        t.skip(1, format!("{contract}: {why}"));
        return Ok(t);
    };
    let mut cmd = Command::new(&py);
    cmd.current_dir(root)
        .arg("tests/routers/router_test.py")
        .arg("--tandem")
        .arg(tandem)
        .arg("--bin-dir")
        .arg(venv.join("bin"))
        .arg("--real-model")
        .arg(model);
    let (lines, ok) = run_echoed(cmd, scenarios)?;
    t.counted_step(scenarios, &lines, ok, None);
    let mut cmd = Command::new(&py);
    cmd.current_dir(root)
        .arg("tests/routers/kv_events_contract.py")
        .arg("--tandem")
        .arg(tandem)
        .arg("--bin-dir")
        .arg(venv.join("bin"));
    let (lines, ok) = run_echoed(cmd, contract)?;
    t.counted_step(contract, &lines, ok, None);
    Ok(t)
}
