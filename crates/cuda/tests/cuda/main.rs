//! Every integration test of this crate in one test binary, each file a module: the crate's
//! dependencies' generic code is compiled and linked once rather than once per file, which
//! is what a cold CI build spends its time on. Run one module with
//! `cargo test -p tandem-cuda --test cuda <module>::`.

mod emulation;
mod gpu_invariance;
mod graphs;
mod kernels_check;
mod launches;
mod no_driver;
mod ops;
mod sampling_emu;
