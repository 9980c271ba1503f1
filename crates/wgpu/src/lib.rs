//! The wgpu backend: every op in WGSL (shaders/), paged KV cache and attention.
