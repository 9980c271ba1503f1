//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-cli --test cli <module>::`.

mod batch_invariance;
mod bench;
mod generate_guided;
mod golden_wgpu;
mod gpu_scripts;
mod lora_golden_wgpu;
mod ops_wgpu;
mod serve_flags;
mod serve_kv_fp8;
mod serve_wgpu;
