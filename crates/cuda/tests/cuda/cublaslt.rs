//! GPU-only: cuBLASLt (`CudaBackend::set_gemm_cublaslt`, TANDEM_CUDA_GEMM=cublaslt) computes
//! the plain projections within f32 summation-order error of our tile kernels, for bf16 and f16
//! weights, x in f32 and in the weights' type, decode and prefill widths, k not a multiple of 8.
//! On the fake driver the library is crates/fake-cuda's CPU GEMM behind libcublasLt.so.13;
//! on a GPU without the library the test notes a skip (with the fake it must be there).

use tandem_core::backend::prelude::*;
use tandem_core::DType;

/// splitmix64 values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn cublaslt_matches_our_gemm() {
    let Some(mut b) = crate::gpu_or_skip("cuda cuBLASLt GEMM") else { return };
    if let Err(e) = b.set_gemm_cublaslt(true) {
        assert!(std::env::var("TANDEM_FAKE_CUDA").is_err(), "the fake driver ships libcublasLt.so.13: {e}");
        tandem_core::skip::note(format!("cuda cuBLASLt GEMM: {e}"));
        return;
    }
    assert!(b.gemm_cublaslt());
    for dtype in [DType::BF16, DType::F16] {
        for (m, n, k) in [(1, 70, 40), (5, 64, 33), (130, 96, 72)] {
            let wv = values(n as u64, n * k);
            let w = b.weight_from_f32(dtype, &wv).unwrap();
            let xv = values(m as u64 + 1000, m * k);
            let mut xf = b.alloc_f32(m * k).unwrap();
            b.write_f32(&mut xf, &xv).unwrap();
            // x in the weights' type, as the model stores it, written by rms_norm (gamma 1).
            let ones = b.weight_from_f32(dtype, &vec![1.0; k]).unwrap();
            let x16_dtype = b.activation_dtype(dtype);
            let mut x16 = b.alloc_activation(x16_dtype, m * k).unwrap();
            b.rms_norm(&xf, &ones, &mut x16, m, k, 1e-5).unwrap();
            for (what, x) in [("f32 x", &xf), ("16-bit x", &x16)] {
                let mut lt = b.alloc_f32(m * n).unwrap();
                b.set_gemm_cublaslt(true).unwrap();
                b.matmul(x, &w, None, &mut lt, m, n, k).unwrap();
                let lt = b.read_f32(&lt, m * n).unwrap();
                let mut ours = b.alloc_f32(m * n).unwrap();
                b.set_gemm_cublaslt(false).unwrap();
                b.matmul(x, &w, None, &mut ours, m, n, k).unwrap();
                let ours = b.read_f32(&ours, m * n).unwrap();
                // |x| <= 1 before the norm, a few after it, |w| < 1: the sum of |x w| is at most
                // a few k; summation order moves an f32 sum by about k ulps of it.
                let tol = 4.0 * k as f32 * 8.0 * f32::EPSILON;
                for (i, (a, o)) in lt.iter().zip(&ours).enumerate() {
                    assert!(
                        a.is_finite() && (a - o).abs() <= tol,
                        "{dtype:?} {what} m {m} n {n} k {k}: out[{i}] cuBLASLt {a}, ours {o}"
                    );
                }
            }
        }
    }
}
