//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-wgpu --test wgpu <module>::`.

#[path = "../common/mod.rs"]
mod common;

mod draft_head;
mod engine_sampling;
mod engine_speculative;
mod fp8;
mod int4;
mod kv_fp8;
mod lora;
mod model;
mod ops;
mod quant;
mod quant_tile;
