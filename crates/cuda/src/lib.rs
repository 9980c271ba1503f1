//! The CUDA backend: kernels/*.cu compiled with NVRTC, launched through cudarc.
