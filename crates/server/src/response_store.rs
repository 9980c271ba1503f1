//! The Responses API's store: answers kept for `GET /v1/responses/{id}`, `DELETE` and
//! `previous_response_id`, bounded by a count, by bytes and by age (the oldest go first when it
//! is full; any older than the age limit go when next looked at). Evictions are counted, and the
//! store's size and evictions are series in /metrics.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

/// A stored response: the object `GET` answers, and the conversation a follow-up continues.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    at: Instant,
    /// Bytes it holds, roughly (its JSON's length), for the store's byte bound.
    size: usize,
    pub(crate) response: Value,
    /// Template messages: the input (after any previous response's) and the answer.
    pub(crate) messages: Vec<Value>,
}

/// Stored responses, bounded by count, by bytes and by age: the oldest go first when it is
/// full, and any older than the age limit go when next looked at. Evictions are counted.
pub struct ResponseStore {
    max: usize,
    max_bytes: usize,
    ttl: Duration,
    inner: Mutex<StoreInner>,
    evicted: AtomicU64,
}

#[derive(Default)]
struct StoreInner {
    map: HashMap<String, Stored>,
    bytes: usize,
    /// Insertion order; an id deleted since (or replaced) is skipped when it comes up.
    order: VecDeque<(Instant, String)>,
}

impl ResponseStore {
    pub fn new(max: usize, max_bytes: usize, ttl: Duration) -> Self {
        ResponseStore { max, max_bytes, ttl, inner: Mutex::new(StoreInner::default()), evicted: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, StoreInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops what is past its age, then the oldest while more than `keep` remain or more than
    /// `keep_bytes` are held.
    fn evict(&self, s: &mut StoreInner, now: Instant, keep: usize, keep_bytes: usize) {
        while let Some((at, id)) = s.order.front().cloned() {
            let live = s.map.get(&id).is_some_and(|e| e.at == at);
            if !live {
                s.order.pop_front();
                continue;
            }
            if now.duration_since(at) <= self.ttl && s.map.len() <= keep && s.bytes <= keep_bytes {
                break;
            }
            s.order.pop_front();
            if let Some(e) = s.map.remove(&id) {
                s.bytes -= e.size;
            }
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn insert(&self, id: String, response: Value, messages: Vec<Value>) {
        let size = response.to_string().len() + messages.iter().map(|m| m.to_string().len()).sum::<usize>();
        if self.max == 0 || size > self.max_bytes {
            if self.max > 0 {
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let now = Instant::now();
        let mut s = self.lock();
        self.evict(&mut s, now, self.max - 1, self.max_bytes - size);
        s.order.push_back((now, id.clone()));
        s.bytes += size;
        if let Some(old) = s.map.insert(id, Stored { at: now, size, response, messages }) {
            s.bytes -= old.size;
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<Stored> {
        let mut s = self.lock();
        self.evict(&mut s, Instant::now(), self.max, self.max_bytes);
        s.map.get(id).cloned()
    }

    pub(crate) fn remove(&self, id: &str) -> bool {
        let mut s = self.lock();
        self.evict(&mut s, Instant::now(), self.max, self.max_bytes);
        match s.map.remove(id) {
            Some(e) => {
                s.bytes -= e.size;
                true
            }
            None => false,
        }
    }

    /// The store's series in the Prometheus text format.
    pub fn render(&self, model: &str) -> String {
        let (len, bytes) = {
            let s = self.lock();
            (s.map.len(), s.bytes)
        };
        // The labels every other series carries (vLLM's: the model name and engine 0).
        let label = format!("{{model_name=\"{}\",engine=\"0\"}}", model.replace('\\', "\\\\").replace('"', "\\\""));
        format!(
            "# HELP tandem:responses_stored Responses held for previous_response_id and GET /v1/responses/{{id}}.\n# TYPE tandem:responses_stored gauge\ntandem:responses_stored{label} {len}\n\
             # HELP tandem:responses_stored_bytes The stored responses' size (their JSON's length).\n# TYPE tandem:responses_stored_bytes gauge\ntandem:responses_stored_bytes{label} {bytes}\n\
             # HELP tandem:responses_evicted_total Stored responses dropped for the store's size or age limit.\n# TYPE tandem:responses_evicted_total counter\ntandem:responses_evicted_total{label} {}\n",
            self.evicted.load(Ordering::Relaxed)
        )
    }
}
