//! The wgpu backend: every `tandem_core::Backend` op as a WGSL kernel (in `shaders/` at the
//! repository root), on Vulkan by default (Mesa's lavapipe in CI; any Vulkan GPU), or on the
//! wgpu backends `TANDEM_WGPU_BACKENDS` names.
//!
//! Code map:
//! - [`adapter`]: which wgpu backends, the adapter, the device with the adapter's own limits.
//! - [`shaders`]: WGSL sources (compiled in, or from `TANDEM_SHADER_DIR`), the per-dtype
//!   prelude, the pipeline cache.
//! - [`recorder`]: one pending command encoder, the per-submit parameter arena, reads and writes.
//! - [`buffer`]: [`WgpuBuf`], the backend's buffer type.
//! - [`backend`]: [`WgpuBackend`]: its state, its construction and the `Backend` impl, whose
//!   methods live one file per group of the trait (`device`, `storage`, `ops`, `fused_ops`,
//!   `sampling`); `matmul`, the kernel every projection runs through; `operand`, the host-side
//!   checks each op starts with.
//! - [`quant_split`]: quantized weights repacked at upload so that the kernels' loads are
//!   aligned texels.
//! - [`fp8_codec`]: WGSL fp8 encode/decode, bit-exact with the reference, for fp8 KV caches.
//! - `affinity`: lavapipe's compute workers pinned one per CPU (CPU adapters on Linux).
//!
//! Architecture invariant: ops only record; the device runs them when something is read
//! (`read_*`, `argmax`), or when a write must not be seen by work recorded before it.

pub mod adapter;
mod affinity;
pub mod backend;
pub mod buffer;
pub mod fp8_codec;
pub mod quant_split;
pub mod recorder;
pub mod shaders;

pub use adapter::{AdapterSummary, BACKENDS_ENV};
pub use backend::{WgpuBackend, WgpuOptions};
pub use buffer::{BufKind, WgpuBuf};
pub use recorder::Stats;
pub use shaders::SHADER_DIR_ENV;
