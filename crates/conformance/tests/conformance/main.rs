//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-conformance --test conformance <module>::`.

mod broken;
mod fp8_reference;
mod golden_reference;
mod int4_reference;
mod lora_reference;
mod reference_self;
mod tolerance;
