//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-server --test server <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod anthropic;
mod endpoints;
mod errors;
mod lifecycle;
mod lora;
mod parity;
mod parsers;
mod responses;
mod scoring;
mod structured;
mod timeouts;
mod vllm_api;
mod worker_api;
