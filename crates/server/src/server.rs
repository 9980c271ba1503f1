//! The listener: accepts HTTP/1.1 connections on tokio, serves each with hyper, and shuts down
//! gracefully (stop accepting, let running requests finish within a deadline, abort the rest).
//!
//! On shutdown a connection with no request in progress (idle keep-alive, or headers still
//! arriving) is closed at once, so the process exits as soon as the last response ends; one
//! whose request is in progress (its body being read, or its response being sent) drains
//! within the grace period. "In progress" is counted here, from the moment hyper hands a
//! request to the service until its response body is dropped, because hyper's own idle test
//! counts a fresh connection as busy until its first request ends.

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tandem_core::tokenizer::Tokenizer;
use tandem_structured::Structured;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::body::ResponseBody;
use crate::config::ServerConfig;
use crate::engine_client::{EngineClient, RequestId};
use crate::metrics::Metrics;
use crate::response_store::ResponseStore;
use crate::state::AppState;

/// A bound server, not yet serving: lets tests bind port 0 and learn the address first.
pub struct Server {
    listener: TcpListener,
    state: Arc<AppState>,
}

impl Server {
    pub async fn bind(
        config: ServerConfig,
        engine: Arc<dyn EngineClient>,
        tokenizer: Arc<Tokenizer>,
        model_name: String,
    ) -> std::io::Result<Server> {
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.addr)))?;
        // Response ids only need to differ between restarts, not be secret.
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let state = Arc::new(AppState {
            lora: crate::lora::LoraTable::new(config.lora_adapters.clone()),
            metrics: Metrics::for_model(&model_name, config.max_model_len),
            responses: ResponseStore::new(config.responses_capacity, config.responses_max_bytes, config.responses_ttl),
            config,
            engine,
            tokenizer,
            model_name,
            queued: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            tokens_in_flight: AtomicUsize::new(0),
            live: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            structured: OnceLock::new(),
        });
        Ok(Server { listener, state })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Gives the server structured output (`Ok`), or the reason it has none (`Err`: answered
    /// with each structured request's 400). Later calls are ignored.
    pub fn set_structured(&self, s: Result<Arc<Structured>, String>) {
        let _ = self.state.structured.set(s);
    }

    /// Serves until `shutdown` resolves, then drains (see the module comment).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> std::io::Result<()> {
        let Server { listener, state } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        let mut builder = http1::Builder::new();
        // A client that trickles its headers (slowloris) is cut off instead of holding a task.
        builder.keep_alive(true).timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(30));
        let builder = Arc::new(builder);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                accepted = listener.accept() => {
                    let (stream, _peer) = match accepted {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: back off instead of spinning.
                            tracing::warn!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    // Each SSE event must leave at once, not wait for Nagle.
                    let _ = stream.set_nodelay(true);
                    while conns.try_join_next().is_some() {}
                    let state = state.clone();
                    let builder = builder.clone();
                    let mut stop = stop_rx.clone();
                    conns.spawn(async move {
                        let busy = Arc::new(AtomicUsize::new(0));
                        let counter = busy.clone();
                        let svc = service_fn(move |req| {
                            let guard = Busy::enter(&counter);
                            let state = state.clone();
                            async move {
                                let r = crate::router::handle(state, req).await?;
                                Ok::<_, std::convert::Infallible>(r.map(|inner| TrackedBody { inner, _busy: guard }))
                            }
                        });
                        let conn = builder.serve_connection(TokioIo::new(stream), svc);
                        tokio::pin!(conn);
                        if !*stop.borrow_and_update() {
                            tokio::select! {
                                _ = conn.as_mut() => return,
                                _ = stop.changed() => {}
                            }
                        }
                        // Nothing to drain: dropping the connection closes the socket.
                        if busy.load(Ordering::SeqCst) == 0 {
                            return;
                        }
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    });
                }
            }
        }
        drop(listener);
        let _ = stop_tx.send(true);
        let grace = state.config.shutdown_grace;
        tracing::info!(
            "shutting down: {} connections open, {}s for running requests",
            conns.len(),
            grace.as_secs_f32()
        );
        let drained = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
        if drained.is_err() {
            let ids: Vec<RequestId> = state.live.lock().unwrap_or_else(|e| e.into_inner()).iter().copied().collect();
            tracing::warn!("shutdown deadline passed: aborting {} requests", ids.len());
            for id in ids {
                state.engine.abort(id);
            }
            // Aborted streams end promptly; a client that stopped reading does not hold us.
            if tokio::time::timeout(Duration::from_secs(2), async { while conns.join_next().await.is_some() {} })
                .await
                .is_err()
            {
                conns.abort_all();
            }
        }
        tracing::info!("server stopped");
        Ok(())
    }
}

/// One request in progress on a connection, from the service call until its response body is
/// dropped (sent whole, or the connection gone).
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::SeqCst);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted as in progress.
struct TrackedBody {
    inner: ResponseBody,
    _busy: Busy,
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Binds `config.addr` and serves until `shutdown` resolves.
pub async fn serve(
    config: ServerConfig,
    engine: Arc<dyn EngineClient>,
    tokenizer: Arc<Tokenizer>,
    model_name: String,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let server = Server::bind(config, engine, tokenizer, model_name).await?;
    tracing::info!("listening on http://{}", server.local_addr()?);
    server.run(shutdown).await
}

/// Resolves on Ctrl-C or SIGTERM: pass it to [`serve`] as the shutdown future.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        _ = term => tracing::info!("SIGTERM: shutting down"),
    }
}
