//! The HTTP server (hyper): OpenAI-compatible API, /generate, health, metrics. The only crate that knows HTTP and JSON.
