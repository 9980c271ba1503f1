//! `tandem bench serve`: a load generator against `tandem serve` over loopback HTTP, streaming
//! (like vLLM's `benchmark_serving`). Requests arrive as a Poisson process at `--request-rate`
//! (or all at once), optionally capped at `--max-concurrency` in flight. Each is timed from
//! its send: TTFT (first streamed chunk), ITL (gaps between chunks), TPOT ((E2E - TTFT) /
//! (tokens - 1), tokens from the final `usage`), E2E. `--spawn` starts the server itself.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::http_client::{self, loopback};
use super::model_source::{self, RandomModelArgs};
use super::offline::{RequestRecord, RunResult};
use super::progress::Progress;
use super::report::{self, markdown_table};
use super::workload::{Prompt, SplitMix64, WorkloadArgs};
use super::OutputArgs;
use crate::serve::EngineArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Loopback only: 127.0.0.1, ::1 or localhost.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    #[arg(long, default_value = "/v1/completions")]
    endpoint: String,
    /// Mean arrivals per second (Poisson); `inf` sends every request at once.
    #[arg(long, default_value = "inf")]
    request_rate: f64,
    /// Most requests in flight.
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Start `tandem serve` on a free loopback port with the engine flags below, and stop it
    /// after the run. Without it, a server must already listen at --host/--port.
    #[arg(long)]
    spawn: bool,
    /// Seconds `--spawn` waits for the server's /health.
    #[arg(long, default_value_t = 600)]
    startup_timeout_s: u64,
    /// The vocabulary to draw prompt ids from, when neither --model nor --random-shape names
    /// the served model.
    #[arg(long)]
    vocab_size: Option<usize>,
    /// Give up on the whole run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
    /// Requests sent (and not counted) before the timed run.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    #[command(flatten)]
    engine: EngineArgs,
    #[command(flatten)]
    random: RandomModelArgs,
    #[command(flatten)]
    workload: WorkloadArgs,
    #[command(flatten)]
    out: OutputArgs,
}

/// A spawned server, stopped when dropped.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for the server's /health. A spawned server that exits first (a backend it cannot
/// open, a model that does not load: its stderr is ours) fails at once, saying how it ended,
/// instead of waiting out the start-up timeout.
async fn wait_for_server(addr: SocketAddr, mut spawned: Option<&mut Spawned>, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = spawned.as_mut() {
            if let Some(status) = s.0.try_wait().context("checking the spawned server")? {
                bail!("the spawned tandem serve exited ({status}) before it was healthy; its error is above");
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if http_client::wait_healthy(addr, left.min(Duration::from_millis(500))).await.is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the server at {addr} was not healthy within {} s", timeout.as_secs());
        }
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn run(a: Args) -> Result<()> {
    if a.request_rate.is_nan() || a.request_rate <= 0.0 {
        bail!("--request-rate must be positive (or inf)");
    }
    if a.max_concurrency == Some(0) {
        bail!("--max-concurrency must be at least 1");
    }
    let named = a.engine.model.is_some() || a.random.random_shape.is_some();
    let model =
        if named || a.spawn { Some(model_source::resolve(a.engine.model.as_deref(), &a.random)?) } else { None };
    let (vocab, max_len) = match (&model, a.vocab_size) {
        (Some(m), _) => (m.config.vocab_size, m.config.max_position_embeddings),
        (None, Some(v)) => (v, usize::MAX),
        (None, None) => bail!("give --model, --random-shape or --vocab-size, so prompt ids fit the served model"),
    };
    let prompts = a.workload.prompts(vocab, max_len)?;
    let n = prompts.len();

    let (addr, mut server) = if a.spawn {
        let m = model.as_ref().expect("resolved above");
        let addr = loopback("127.0.0.1", free_port()?)?;
        let exe = std::env::current_exe().context("finding the tandem binary")?;
        let mut cmd = Command::new(exe);
        cmd.args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &addr.port().to_string(),
            "--max-queued-requests",
            &n.max(256).to_string(),
        ])
        .args(model_source::engine_flags(&a.engine, &m.dir))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        eprintln!("spawning tandem serve on {addr} ({} on {})", m.label, a.engine.backend.name());
        (addr, Some(Spawned(cmd.spawn().context("spawning tandem serve")?)))
    } else {
        (loopback(&a.host, a.port)?, None)
    };

    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let res = rt.block_on(async {
        let wait = if a.spawn { a.startup_timeout_s } else { 10 };
        wait_for_server(addr, server.as_mut(), Duration::from_secs(wait)).await?;
        for p in prompts.iter().take(a.warmup) {
            let r =
                one_request(addr, &a.endpoint, &Prompt { ids: p.ids.clone(), output_len: p.output_len.min(4) }).await;
            if let Some(e) = r.error {
                bail!("warm-up request failed: {e}");
            }
        }
        tokio::time::timeout(Duration::from_secs(a.timeout_s), drive(addr, &a, &prompts))
            .await
            .with_context(|| format!("the run did not finish within {} s", a.timeout_s))?
    })?;
    drop(server);

    let f = res.figures();
    let results = res.to_json();
    let rows = vec![vec![
        format!("{}/{n}", f.completed),
        f.errors.to_string(),
        format!("{:.2}", f.requests_per_s),
        format!("{:.1}", f.output_tokens_per_s),
        format!("{:.1}", f.total_tokens_per_s),
        format!("{:.2}", res.wall_s),
    ]];
    let backend = match &model {
        Some(_) if a.spawn => {
            json!({"name": a.engine.backend.name(), "device": "see the server's log", "spawned": true})
        }
        _ => json!({"name": "unknown (external server)", "device": "unknown"}),
    };
    let model_json = model.as_ref().map_or(json!({"vocab_size": vocab}), |m| m.to_json(&a.random));
    let settings = json!({
        "endpoint": a.endpoint,
        "request_rate": if a.request_rate.is_finite() { json!(a.request_rate) } else { json!("inf") },
        "max_concurrency": a.max_concurrency,
        "spawn": a.spawn,
        "engine": if a.spawn { model_source::engine_json(&a.engine) } else { Value::Null },
        "workload": a.workload.to_json(),
        "warmup": a.warmup,
    });
    let rep = report::build("serve", backend, model_json, settings, results);
    let label = model.as_ref().map_or("external".to_string(), |m| m.label.clone());
    report::write_json(&a.out, &format!("serve-{label}"), &rep)?;
    let rate = if a.request_rate.is_finite() { format!("{} req/s", a.request_rate) } else { "all at once".into() };
    println!(
        "### serve: {label} over HTTP ({}; arrivals {rate}; max concurrency {})\n",
        a.workload.describe(),
        a.max_concurrency.map_or("none".into(), |c| c.to_string())
    );
    println!("{}", markdown_table(&["completed", "errors", "req/s", "output tok/s", "total tok/s", "wall (s)"], &rows));
    println!("{}", super::throughput::latency_table(&f));
    if f.errors > 0 {
        bail!(
            "{} of {n} requests failed; first: {}",
            f.errors,
            res.records.iter().find_map(|r| r.error.clone()).unwrap_or_default()
        );
    }
    Ok(())
}

/// Sends every prompt on its Poisson schedule, at most `max_concurrency` in flight.
async fn drive(addr: SocketAddr, a: &Args, prompts: &[Prompt]) -> Result<RunResult> {
    let n = prompts.len();
    let sem = Arc::new(tokio::sync::Semaphore::new(a.max_concurrency.unwrap_or(tokio::sync::Semaphore::MAX_PERMITS)));
    let done = Arc::new(AtomicUsize::new(0));
    let mut rng = SplitMix64(a.workload.seed ^ 0xA11_1A1);
    let start = Instant::now();
    let mut set = tokio::task::JoinSet::new();
    let mut progress = Progress::new("serve", n);
    let mut records = vec![RequestRecord::default(); n];
    let mut next_send = Duration::ZERO;
    let endpoint: Arc<str> = a.endpoint.as_str().into();
    for (i, p) in prompts.iter().enumerate() {
        if a.request_rate.is_finite() {
            // Exponential gaps: a Poisson process of the given rate.
            next_send += Duration::from_secs_f64(-rng.unit().ln() / a.request_rate);
            tokio::time::sleep_until(tokio::time::Instant::from_std(start + next_send)).await;
        }
        let permit = sem.clone().acquire_owned().await?;
        let (p, counter, endpoint) = (p.clone(), done.clone(), endpoint.clone());
        set.spawn(async move {
            let r = one_request(addr, &endpoint, &p).await;
            drop(permit);
            counter.fetch_add(1, Ordering::Relaxed);
            (i, r)
        });
        progress.update(done.load(Ordering::Relaxed), "");
    }
    while let Some(r) = set.join_next().await {
        let (i, rec) = r.context("a request task failed")?;
        records[i] = rec;
        progress.update(done.load(Ordering::Relaxed), "");
    }
    let wall_s = start.elapsed().as_secs_f64();
    progress.finish(done.load(Ordering::Relaxed), "");
    Ok(RunResult { records, wall_s, kv_usage_peak: None, preemptions: None })
}

/// The request body: token ids in, greedy, the output forced to its length.
fn body(p: &Prompt) -> String {
    json!({
        "prompt": p.ids,
        "max_tokens": p.output_len,
        "temperature": 0.0,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

async fn one_request(addr: SocketAddr, endpoint: &str, p: &Prompt) -> RequestRecord {
    let t0 = Instant::now();
    let mut rec = RequestRecord { prompt_tokens: p.ids.len(), ..Default::default() };
    let mut last = None;
    let mut usage_tokens = None;
    let mut done = false;
    let r = http_client::post_stream(addr, endpoint, body(p), |data| {
        let now = t0.elapsed().as_secs_f64();
        if data == "[DONE]" {
            done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            rec.error.get_or_insert_with(|| format!("not JSON in the stream: {data}"));
            return;
        };
        if let Some(e) = v.get("error") {
            rec.error.get_or_insert_with(|| e.to_string());
        }
        let has_text = v["choices"].as_array().is_some_and(|cs| {
            cs.iter().any(|c| c["text"].as_str().or(c["delta"]["content"].as_str()).is_some_and(|t| !t.is_empty()))
        });
        if has_text {
            match last {
                None => rec.ttft = Some(now),
                Some(l) => rec.itl.push(now - l),
            }
            last = Some(now);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            usage_tokens = u["completion_tokens"].as_u64().map(|t| t as usize);
        }
    })
    .await;
    rec.e2e = t0.elapsed().as_secs_f64();
    rec.output_tokens = usage_tokens.unwrap_or(0);
    if let Err(e) = r {
        rec.error.get_or_insert_with(|| format!("{e:#}"));
    } else if !done {
        rec.error.get_or_insert_with(|| "the stream ended without [DONE]".into());
    } else if usage_tokens.is_none() {
        rec.error.get_or_insert_with(|| "no usage in the stream".into());
    } else if rec.output_tokens != p.output_len {
        rec.error.get_or_insert_with(|| format!("asked for {} tokens, got {}", p.output_len, rec.output_tokens));
    }
    rec
}
