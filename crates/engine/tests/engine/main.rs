//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-engine --test engine <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod bounded;
mod draft_heads;
mod engine;
mod guided;
mod kv_fp8;
mod lora;
mod overlap;
mod property;
mod reference;
mod scheduler;
mod speculative;
mod speculative_eagle3;
mod speculative_kinds;
mod speculative_mtp;
mod speculative_sampled;
