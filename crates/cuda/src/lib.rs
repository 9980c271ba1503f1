//! The CUDA backend: kernels/*.cu compiled with NVRTC, launched through cudarc.
//!
//! - [`sources`]: the kernel files, built in or read from `TANDEM_KERNEL_DIR`.
//! - [`toolchain`]: where libnvrtc, the CUDA headers and ptxas are.
//! - [`compile`]: NVRTC to PTX, cached on disk by source hash and architecture.
//! - [`check`]: the GPU-less compile check (NVRTC + `ptxas -v` register/spill report).
//! - `device`: [`CudaBackend`], the `tandem_core::Backend` on an NVIDIA GPU: the context,
//!   the stream, memory and graphs (its [`Device`](tandem_core::backend::Device)).
//! - `buf`: [`CudaBuf`], its views and staging, and the backend's `Storage`.
//! - `kernels`: the kernel table, every handle resolved once at load.
//! - `workspace`: the step scratch, reserved at load.
//! - `ops`: the `Ops`, `FusedOps` and `Sampling` of the backend, delegating to the launchers of
//!   `attention`, `matmul`, `moe`, `quant`, `quant_mma`, `quant_mma_w8a8` and `sampling`; `launch` and `graph` under them.
//! - `error`: the driver's errors, and which of them lose the device.
//! - [`cublaslt`]: NVIDIA's cuBLASLt as an opt-in GEMM (`TANDEM_CUDA_GEMM=cublaslt`) and the
//!   peer the kernel lab times against; not batch-invariant.
//! - `switches`: the `TANDEM_CUDA_*` variant switches, read once at load ([`SWITCHES`]).
//!
//! Architecture invariant: this crate builds and links without any CUDA installed (cudarc
//! loads libcuda and libnvrtc at run time); without a driver, [`CudaBackend::new`] returns an
//! error that says so, never a panic.

mod attention;
mod buf;
pub mod check;
pub mod compile;
pub mod cublaslt;
mod device;
mod error;
mod gemm;
mod graph;
mod kernels;
mod launch;
mod lora;
mod matmul;
mod moe;
mod ops;
mod quant;
mod quant_mma;
mod quant_mma_w8a8;
mod sampling;
pub mod sources;
mod switches;
pub mod toolchain;
mod workspace;

pub use buf::{CudaBuf, Elem};
pub use check::{check_kernels, KernelReport};
pub use device::CudaBackend;
pub use error::NO_DRIVER;
pub use kernels::kernel_names;
pub use switches::{Switch, SWITCHES};
