//! The CUDA backend: kernels/*.cu compiled with NVRTC, launched through cudarc.
//!
//! - [`sources`]: the kernel files, built in or read from `TANDEM_KERNEL_DIR`.
//! - [`toolchain`]: where libnvrtc, the CUDA headers and ptxas are.
//! - [`compile`]: NVRTC to PTX, cached on disk by source hash and architecture.
//! - [`check`]: the GPU-less compile check (NVRTC + `ptxas -v` register/spill report).
//! - [`backend`]: [`CudaBackend`], the `tandem_core::Backend` on an NVIDIA GPU.
//!
//! Architecture invariant: this crate builds and links without any CUDA installed (cudarc
//! loads libcuda and libnvrtc at run time); without a driver, [`CudaBackend::new`] returns an
//! error that says so, never a panic.

pub mod backend;
pub mod check;
pub mod compile;
pub mod sources;
pub mod toolchain;

pub use backend::{CudaBackend, CudaBuf};
pub use check::{check_kernels, KernelReport};
