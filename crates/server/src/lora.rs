//! The LoRA adapters the server answers to: a request whose `model` names one runs with that
//! adapter; `/v1/models` lists each with `parent` (the base model) and `root` (its directory),
//! as vLLM does; `vllm:lora_requests_info` names them.
//!
//! With `VLLM_ALLOW_RUNTIME_LORA_UPDATING` (vLLM's switch, [`runtime_updating_allowed`]),
//! `POST /v1/load_lora_adapter {"lora_name", "lora_path"}` and `POST /v1/unload_lora_adapter
//! {"lora_name"}` change the table while the server serves, answering as vLLM does: a plain
//! `Success: ...` text, or 400 for a name already served or a missing field, 404 for a path
//! without an adapter or an unknown name. Unloading removes the name at once (new requests
//! answer 404); the requests already running under it finish, as in vLLM, whose requests
//! carry their adapter; the engine empties its slot after them.
//!
//! The engine knows an adapter by an id (the slot of one loaded with the model, a fresh id
//! for one loaded later); this table maps names to ids.

use std::path::PathBuf;
use std::sync::RwLock;

use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};

use crate::body::ResponseBody;
use crate::engine_client::{EngineStats, LoraRefusal};
use crate::error::ApiError;
use crate::pipeline::read_body;
use crate::state::AppState;

/// vLLM's reading of `VLLM_ALLOW_RUNTIME_LORA_UPDATING`: on for `1` or `true`, any case.
pub fn runtime_updating_allowed() -> bool {
    std::env::var("VLLM_ALLOW_RUNTIME_LORA_UPDATING")
        .is_ok_and(|v| matches!(v.trim().to_lowercase().as_str(), "1" | "true"))
}

/// One adapter the server serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedAdapter {
    /// What a request's `model` names it by.
    pub name: String,
    /// Its directory, as given (`root` in `/v1/models`).
    pub root: String,
    /// `base_model_name` where one was given (`parent` in `/v1/models`; the served model's
    /// name otherwise).
    pub parent: Option<String>,
    /// The engine's id for it: its slot for the adapters loaded with the model.
    pub slot: u32,
}

/// The adapters served, by name.
#[derive(Debug, Default)]
pub struct LoraTable {
    adapters: RwLock<Vec<ServedAdapter>>,
    /// Held through each run-time load or unload, so that two of them never interleave.
    updating: tokio::sync::Mutex<()>,
}

impl LoraTable {
    pub fn new(adapters: Vec<ServedAdapter>) -> Self {
        LoraTable { adapters: RwLock::new(adapters), updating: tokio::sync::Mutex::new(()) }
    }

    fn add(&self, a: ServedAdapter) {
        self.adapters.write().unwrap_or_else(|e| e.into_inner()).push(a);
    }

    fn remove(&self, name: &str) -> Option<ServedAdapter> {
        let mut list = self.adapters.write().unwrap_or_else(|e| e.into_inner());
        let i = list.iter().position(|a| a.name == name)?;
        Some(list.remove(i))
    }

    /// The slot of the adapter named `name`, if one is.
    pub fn slot(&self, name: &str) -> Option<u32> {
        self.read().iter().find(|a| a.name == name).map(|a| a.slot)
    }

    /// The name of the adapter in `slot`, if one is.
    pub fn name_of(&self, slot: u32) -> Option<String> {
        self.read().iter().find(|a| a.slot == slot).map(|a| a.name.clone())
    }

    /// Every adapter, in the order they were given.
    pub fn list(&self) -> Vec<ServedAdapter> {
        self.read().clone()
    }

    /// vLLM's `vllm:lora_requests_info`: a gauge whose labels name the adapters of the running
    /// and of the waiting requests (comma-separated) and `--max-loras`, its value the time of
    /// the report (Unix seconds).
    pub fn render_info(&self, max_loras: usize, stats: &EngineStats, now: u64) -> String {
        let names = |slots: &[u32]| slots.iter().filter_map(|&s| self.name_of(s)).collect::<Vec<_>>().join(",");
        format!(
            "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{{max_lora=\"{max_loras}\",waiting_lora_adapters=\"{}\",running_lora_adapters=\"{}\"}} {now}\n",
            names(&stats.waiting_lora_adapters),
            names(&stats.running_lora_adapters),
        )
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<ServedAdapter>> {
        // A writer that panicked left the table as it was (each write is one push or remove).
        self.adapters.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// The string field `name` of a JSON body ("" where absent; an error where it is not a string).
fn field(body: &serde_json::Value, name: &str) -> Result<String, ApiError> {
    match body.get(name) {
        None | Some(serde_json::Value::Null) => Ok(String::new()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(ApiError::invalid(name, format!("'{name}' must be a string"))),
    }
}

fn parse(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn success(text: String) -> Response<ResponseBody> {
    let mut r = Response::new(ResponseBody::full(text));
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

fn refused(name: &str, r: LoraRefusal) -> ApiError {
    match r {
        LoraRefusal::NotFound(m) => {
            ApiError::vllm(StatusCode::NOT_FOUND, "NotFoundError", format!("Loading lora {name} failed: {m}"))
        }
        LoraRefusal::Invalid(m) => {
            ApiError::vllm(StatusCode::BAD_REQUEST, "BadRequestError", format!("Loading lora {name} failed: {m}"))
        }
    }
}

/// `POST /v1/load_lora_adapter`.
pub(crate) async fn load(state: &AppState, req: Request<Incoming>) -> Result<Response<ResponseBody>, ApiError> {
    let body = parse(&read_body(state, req).await?)?;
    let (lora_name, lora_path) = (field(&body, "lora_name")?, field(&body, "lora_path")?);
    if lora_name.is_empty() || lora_path.is_empty() {
        let m = "Both 'lora_name' and 'lora_path' must be provided.";
        return Err(ApiError::vllm(StatusCode::BAD_REQUEST, "InvalidUserInput", m));
    }
    let _one_at_a_time = state.lora.updating.lock().await;
    if state.lora.slot(&lora_name).is_some() || state.serves(&lora_name) {
        let m = format!("The lora adapter '{}' has already been loaded.", lora_name);
        return Err(ApiError::vllm(StatusCode::BAD_REQUEST, "InvalidUserInput", m));
    }
    let id = state.engine.load_lora(PathBuf::from(&lora_path)).await.map_err(|r| refused(&lora_name, r))?;
    tracing::info!(name = %lora_name, path = %lora_path, id, "loaded a LoRA adapter");
    state.lora.add(ServedAdapter { name: lora_name.clone(), root: lora_path, parent: None, slot: id });
    Ok(success(format!("Success: LoRA adapter '{}' added successfully.", lora_name)))
}

/// `POST /v1/unload_lora_adapter`.
pub(crate) async fn unload(state: &AppState, req: Request<Incoming>) -> Result<Response<ResponseBody>, ApiError> {
    let lora_name = field(&parse(&read_body(state, req).await?)?, "lora_name")?;
    if lora_name.is_empty() {
        let m = "either 'lora_name' and 'lora_int_id' needs to be provided.";
        return Err(ApiError::vllm(StatusCode::BAD_REQUEST, "InvalidUserInput", m));
    }
    let _one_at_a_time = state.lora.updating.lock().await;
    let Some(a) = state.lora.remove(&lora_name) else {
        let m = format!("The lora adapter '{}' cannot be found.", lora_name);
        return Err(ApiError::vllm(StatusCode::NOT_FOUND, "NotFoundError", m));
    };
    // The name is gone; the engine lets the requests already under it finish.
    if let Err(e) = state.engine.unload_lora(a.slot).await {
        tracing::warn!(name = %a.name, id = a.slot, "the engine did not unload the adapter: {e:?}");
    }
    tracing::info!(name = %a.name, id = a.slot, "unloaded a LoRA adapter");
    Ok(success(format!("Success: LoRA adapter '{}' removed successfully.", lora_name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_slots_and_back() {
        let a = |name: &str, slot| ServedAdapter { name: name.into(), root: "/d".into(), parent: None, slot };
        let t = LoraTable::new(vec![a("sql", 0), a("rs", 1)]);
        assert_eq!((t.slot("rs"), t.slot("nope")), (Some(1), None));
        assert_eq!((t.name_of(0).as_deref(), t.name_of(5)), (Some("sql"), None));
        assert_eq!(t.list().len(), 2);
    }

    #[test]
    fn lora_requests_info_names_running_and_waiting_adapters() {
        let a = |name: &str, slot| ServedAdapter { name: name.into(), root: "/d".into(), parent: None, slot };
        let t = LoraTable::new(vec![a("sql", 0), a("rs", 1)]);
        let st =
            EngineStats { running_lora_adapters: vec![0, 1], waiting_lora_adapters: vec![1], ..Default::default() };
        let text = t.render_info(2, &st, 1700000000);
        let want = "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"rs\",running_lora_adapters=\"sql,rs\"} 1700000000";
        assert!(text.lines().any(|l| l == want), "{text}");
        assert!(text.contains("# TYPE vllm:lora_requests_info gauge"), "{text}");
    }
}
