//! One module per op family. Each op case is parameters plus two functions: `generate` makes
//! the host inputs from a seeded PRNG, and `exec` uploads them to a backend, poisons the
//! outputs, runs the op (once, or timed in perf mode) and reads the outputs back. The suite
//! calls `exec` on the tested backend and on the reference with the same inputs.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tandem_core::backend::Backend;
use tandem_core::weights::Weights;
use tandem_core::{DType, Error, Result};

use crate::compare::Output;
use crate::rng::Rng;

mod attention;
mod basic;
mod fused;
mod kv;
mod lora;
mod matmul;
mod moe;
mod quant_fp8;
mod quant_matmul;
mod rope;

pub use attention::{PagedAttention, SeqChunk};
pub use basic::{Add, AddRmsNorm, Argmax, Embedding, GatherRows, GeluTanhMul, RmsNorm, Scale, SiluMul};
pub use fused::{QkvRopeKvWrite, RopeKvWrite};
pub use kv::KvWrite;
pub use lora::{lora_rows_alone, Lora};
pub use matmul::{GateUp, GateUpGelu, GateUpSilu, Matmul, ResidualNormGateUp};
pub use moe::{MoeAccumulate, MoeRoute, MoeRouted};
pub use quant_matmul::{random_blocks, w8a8_asked, QuantMatmul};
pub use rope::Rope;

/// Extra elements after every output: poisoned like the output, and required to stay poisoned,
/// so that a kernel writing past the length it was given fails instead of passing silently.
pub const GUARD: usize = 37;

/// Limits on NMSE. Ops that only move or add f32 values must agree to rounding; where a backend
/// may legitimately keep less precision (bf16 weights, a bf16/f16 KV cache, GPU sin/cos at large
/// angles) the limit says how much.
pub mod limits {
    use tandem_core::DType;

    /// Data movement and single adds: both sides should be bit-identical.
    pub const EXACT: f64 = 1e-10;
    /// f32 arithmetic with reductions or transcendental functions.
    pub const F32: f64 = 1e-7;
    /// gelu_tanh_mul: transcendental, but the erf GELU (a real mistake) is only 3.9e-8 away.
    pub const GELU: f64 = 1e-9;
    /// Rope angles reach thousands of radians; an f32 angle is off by ~1e-4 rad there.
    pub const ROPE: f64 = 1e-6;
    /// The KV cache dtype is the backend's choice; a bf16 cache rounds each value once
    /// ([`rounding`]: NMSE 2.75e-6, measured 2.8e-6 in tests/conformance/tolerance.rs).
    pub const KV: f64 = 1e-5;

    /// The NMSE one rounding to `dtype` adds (round to nearest). A value with mantissa t in
    /// [1, 2) is off by at most half an ulp, 2^-8 relative for bf16 (8 significant bits) and
    /// 2^-11 for f16; uniform within the ulp, the squared relative error averages ulp^2 / 12 *
    /// E[1/t^2], and E[1/t^2] = 3 / (8 ln 2) = 0.541 for t spread evenly in log scale, as normal
    /// draws are. bf16: 2^-14 * 0.541 / 12 = 2.75e-6; f16: 2^-20 * 0.541 / 12 = 4.3e-8. A
    /// single GEMM's limit ([`weight`]) is 3.6 of these for bf16 and 23 for f16.
    pub fn rounding(dtype: DType) -> f64 {
        let log_uniform_inv_sq = 3.0 / (8.0 * std::f64::consts::LN_2);
        match dtype {
            DType::F32 => 0.0,
            DType::F16 => (-20f64).exp2() * log_uniform_inv_sq / 12.0,
            DType::BF16 => (-14f64).exp2() * log_uniform_inv_sq / 12.0,
        }
    }

    /// silu's gain on an error in its input, sigma^2 E[silu'(g)^2] / E[silu(g)^2] for g ~ N(0,
    /// sigma^2), sigma^2 = 1.09 (the suite's gate: a normed row times gamma = 1 +- 0.3, through
    /// weights of variance 1 / hidden); 1.067 at sigma^2 = 1 too (checked by quadrature in
    /// tests/conformance/tolerance.rs).
    pub const SILU_GAIN: f64 = 1.067;

    /// residual_norm_gate_up's chain in roundings' worth of NMSE in its `act` output, for a
    /// backend that rounds activations to the weight type (as tensor cores take them), which it
    /// does at two steps. x (variance 1) is rounded into o = x Wo^T: o's error has variance
    /// `rounding` (a random matrix carries the NMSE through), so h + o (variance 2) has NMSE
    /// 0.5 `rounding`, which the norm carries into n; n is rounded into gate and up: 1.5 in n.
    /// gate and up inherit 1.5 each, through independent weights, so independently; act =
    /// silu(gate) * up adds them, gate's times [`SILU_GAIN`]: 1.5 * (1 + 1.067) = 3.1. (h's
    /// NMSE is 0.5.) The f32 accumulations add ~1e-7 of `rounding`'s 2.75e-6: nothing here.
    pub const RESIDUAL_CHAIN_ROUNDINGS: f64 = 1.5 * (1.0 + SILU_GAIN);

    /// Paged attention in roundings' worth of NMSE, as the tensor-core kernel computes it: the
    /// cache (K and V), q and the softmax weights p rounded to bf16 (each by at most 2^-8
    /// relative). A rounded v_j errs o = sum_j p_j v_j / l by sum_j p_j d_j v_j: NMSE 1 (v
    /// independent across keys); a rounded p_j alike (l sums the unrounded p): 1. Rounded q and
    /// k move each score s_j by an error of variance 2 `rounding` * var(s), and p_j by that
    /// relative, so o by sum_j p_j (e_j - mean e)(v_j - o): NMSE at most 2 var(s) (all of it
    /// where the weight spreads over many keys, none where one key takes it all). The suite
    /// draws q at scale 2 and k at 1 with scale 1 / sqrt(head_dim): var(s) = 4, so 2 + 8 = 10.
    pub const ATTENTION_ROUNDINGS: f64 = 2.0 + 2.0 * 4.0;

    /// Attention: [`ATTENTION_ROUNDINGS`] times the bf16 single GEMM's limit (1e-4, which keeps
    /// the GEMM's 3.6x over the expected 2.75e-5), doubled for the few-key cases, where the NMSE
    /// is a ratio of sums over a handful of keys and one row whose keys nearly cancel weighs
    /// heavily: the rounding variant of tests/conformance/tolerance.rs measured over 400 seeds
    /// (2026-12-04) worst 7.3e-5 at 7 keys and head_dim 64 (2.6x the expectation), 1.7e-5 to
    /// 4.4e-5 on the other cases. Real bugs (a missed key, a wrong block) measure 1e-2 and more.
    pub const ATTENTION: f64 = 2.0 * ATTENTION_ROUNDINGS * 1e-5;

    /// The NMSE one rounding to e4m3 adds, as [`rounding`] derives it: 4 significant bits, so
    /// half an ulp is 2^-4 relative and the NMSE 2^-6 * 0.541 / 12 = 7.0e-4 on normal draws. A
    /// per-token scale (amax / 448) only moves the values along the exponent range; the ones
    /// it leaves below e4m3's smallest normal (|x| < 2^-6 * amax / 448: about 1e-4 of normal
    /// draws) add nothing measurable (tests/conformance/tolerance.rs measures 7e-4).
    pub fn e4m3_rounding() -> f64 {
        (-6f64).exp2() * 3.0 / (8.0 * std::f64::consts::LN_2) / 12.0
    }

    /// A matmul on FP8 weights whose backend quantizes x per token to e4m3 (W8A8, as vLLM runs
    /// FP8 checkpoints on sm_89+; CUDA with `TANDEM_CUDA_QUANT_TC=w8a8`): each x rounded once to
    /// e4m3 ([`e4m3_rounding`], carried through by a random matrix), the weight's e4m3 value
    /// times its scale taken exactly where the reference rounds it to bf16 ([`rounding`] of
    /// bf16 at most), with the bf16 GEMM's 3.6x headroom over the expectation: 2.5e-3.
    pub fn w8a8() -> f64 {
        3.6 * (e4m3_rounding() + rounding(DType::BF16))
    }

    /// Ops whose error is set by the weight dtype (a backend may round activations to it, as
    /// tensor cores do: bf16 activations measure NMSE ≈ 2e-6 to 4e-6, f16 ≈ 3e-8 to 8e-8).
    pub fn weight(dtype: DType) -> f64 {
        match dtype {
            DType::F32 => F32,
            DType::F16 => 1e-6,
            DType::BF16 => 1e-5,
        }
    }
}

/// Estimated bytes moved and floating-point operations of one launch (perf mode's napkin math).
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    pub bytes: f64,
    pub flops: f64,
}

/// One op case: parameters, inputs and how to run it on any backend.
pub trait Op {
    type Inputs;
    const NAME: &'static str;
    /// Parameters as printed, `key=value` separated by spaces.
    fn params(&self) -> String;
    fn limit(&self) -> f64;
    fn cost(&self) -> Cost;
    fn generate(&self, rng: &mut Rng) -> Self::Inputs;
    fn exec<B: Backend>(&self, b: &B, x: &Self::Inputs, launch: &mut Launch) -> Result<Vec<Output>>;
}

/// Launches per timed sample in perf mode.
pub const LAUNCHES_PER_SAMPLE: usize = 8;

/// How `exec` runs the op: once (conformance), or repeatedly with a wait after each (perf).
pub struct Launch {
    warmup: usize,
    reps: usize,
    pub times: Vec<Duration>,
    /// Why the backend has no path for this op (set by `exec` through [`Launch::skip`]): the
    /// case is counted as skipped on it, not run. The reference's outputs are still returned.
    pub skipped: Option<String>,
}

impl Launch {
    pub fn once() -> Self {
        Launch { warmup: 0, reps: 0, times: vec![], skipped: None }
    }
    pub fn timed(warmup: usize, reps: usize) -> Self {
        Launch { warmup, reps: reps.max(1), times: vec![], skipped: None }
    }

    /// Marks the op as one this backend lacks (a backend-specific path, such as CUDA's routed
    /// experts): the suite reports the case as skipped, with `why`.
    pub fn skip(&mut self, why: String) {
        self.skipped = Some(why);
    }

    /// Runs `op` once; or, timed, `warmup` untimed samples then `reps` timed ones, a sample
    /// being [`LAUNCHES_PER_SAMPLE`] launches and one wait, its time divided by the launches
    /// (so a backend that queues work is timed by its throughput, not by one round trip).
    /// In-place ops (add, rope) change their data between launches; perf mode discards outputs.
    pub fn run<B: Backend>(&mut self, b: &B, mut op: impl FnMut() -> Result<()>) -> Result<()> {
        if self.reps == 0 {
            return op();
        }
        // Reading any buffer waits for all queued work, so a one-element read is the fence.
        let mut fence = b.alloc_f32(1)?;
        b.write_f32(&mut fence, &[0.0])?;
        b.read_f32(&fence, 1)?;
        for i in 0..self.warmup + self.reps {
            let t = Instant::now();
            for _ in 0..LAUNCHES_PER_SAMPLE {
                op()?;
            }
            b.read_f32(&fence, 1)?;
            if i >= self.warmup {
                self.times.push(t.elapsed() / LAUNCHES_PER_SAMPLE as u32);
            }
        }
        Ok(())
    }
}

pub(crate) fn upload_f32<B: Backend>(b: &B, data: &[f32]) -> Result<B::Buf> {
    let mut buf = b.alloc_f32(data.len().max(1))?;
    b.write_f32(&mut buf, data)?;
    Ok(buf)
}

pub(crate) fn upload_u32<B: Backend>(b: &B, data: &[u32]) -> Result<B::Buf> {
    let mut buf = b.alloc_u32(data.len().max(1))?;
    b.write_u32(&mut buf, data)?;
    Ok(buf)
}

/// `data` followed by [`GUARD`] NaNs (for in-place ops, whose input is their output).
pub(crate) fn upload_guarded<B: Backend>(b: &B, data: &[f32]) -> Result<B::Buf> {
    let mut v = data.to_vec();
    v.extend(std::iter::repeat_n(f32::NAN, GUARD));
    upload_f32(b, &v)
}

/// An output buffer of `len` elements plus the guard, all NaN: an element the op does not
/// write stays NaN and fails the non-finite check.
pub(crate) fn poisoned<B: Backend>(b: &B, len: usize) -> Result<B::Buf> {
    upload_f32(b, &vec![f32::NAN; len + GUARD])
}

/// Reads `len` elements and checks that the guard after them is still NaN.
pub(crate) fn read_guarded<B: Backend>(b: &B, buf: &B::Buf, len: usize, what: &str) -> Result<Vec<f32>> {
    let mut v = b.read_f32(buf, len + GUARD)?;
    short_read(b, v.len(), len + GUARD, what)?;
    if let Some(i) = v[len..].iter().position(|x| !x.is_nan()) {
        return Err(Error::backend(
            b.name(),
            format!("{what}: wrote past its {len} elements (element {} is {})", len + i, v[len + i]),
        ));
    }
    v.truncate(len);
    Ok(v)
}

/// A weight on `b`: through `upload_weight` from a real safetensors file (the path the model
/// takes) when `from_file`, else through `weight_from_f32`.
pub(crate) fn weight<B: Backend>(
    b: &B,
    dtype: DType,
    shape: &[usize],
    values: &[f32],
    from_file: bool,
) -> Result<B::Buf> {
    if from_file {
        upload_from_file(b, dtype, shape, values)
    } else {
        b.weight_from_f32(dtype, values)
    }
}

/// Writes `values` as tensor `w` of a safetensors file, maps it with [`Weights`] and uploads
/// the view. For half precision an odd-length tensor comes first, so the weight's bytes start
/// at 2 mod 4 in the mapping, as they can in real checkpoints.
fn upload_from_file<B: Backend>(b: &B, dtype: DType, shape: &[usize], values: &[f32]) -> Result<B::Buf> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tandem-conformance-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let name = match dtype {
        DType::F32 => "F32",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
    };
    let pad = if dtype.size() == 2 { 3 } else { 0 };
    let data = dtype.from_f32(values);
    let (p, end) = (pad * dtype.size(), pad * dtype.size() + data.len());
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut header = format!(r#"{{"w":{{"dtype":"{name}","shape":[{}],"data_offsets":[{p},{end}]}}"#, dims.join(","));
    if pad > 0 {
        header += &format!(r#","pad":{{"dtype":"{name}","shape":[{pad}],"data_offsets":[0,{p}]}}"#);
    }
    header += "}";
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend(std::iter::repeat_n(0x3Fu8, p)); // any finite half values
    file.extend_from_slice(&data);
    let path = dir.join("model.safetensors");
    std::fs::write(&path, &file).map_err(|e| Error::io(&path, e))?;
    let res = Weights::open(&dir).and_then(|w| w.get("w", shape)).and_then(|t| b.upload_weight(&t));
    // The mapping outlives the file on Unix; elsewhere the directory may stay behind.
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// Values rounded to `dtype` and back, so the host copy is exactly what both backends hold.
pub(crate) fn round_to(dtype: DType, v: Vec<f32>) -> Vec<f32> {
    dtype.to_f32(&dtype.from_f32(&v))
}

/// A read that returned fewer values than asked for is the backend's error, not a panic here.
fn short_read<B: Backend>(b: &B, got: usize, want: usize, what: &str) -> Result<()> {
    if got < want {
        return Err(Error::backend(b.name(), format!("reading {what}: got {got} values, asked for {want}")));
    }
    Ok(())
}

/// Fails when the op changed an f32 input (a kernel using its input as scratch breaks the
/// model, which reads activations again after the op).
pub(crate) fn untouched_f32<B: Backend>(b: &B, buf: &B::Buf, host: &[f32], what: &str) -> Result<()> {
    let now = b.read_f32(buf, host.len())?;
    short_read(b, now.len(), host.len(), what)?;
    match (0..host.len()).find(|&i| now[i].to_bits() != host[i].to_bits()) {
        None => Ok(()),
        Some(i) => {
            Err(Error::backend(b.name(), format!("input {what} was modified at [{i}]: {} became {}", host[i], now[i])))
        }
    }
}

/// As [`untouched_f32`], for index inputs (ids, positions, slots, block tables).
pub(crate) fn untouched_u32<B: Backend>(b: &B, buf: &B::Buf, host: &[u32], what: &str) -> Result<()> {
    let now = b.read_u32(buf, host.len())?;
    short_read(b, now.len(), host.len(), what)?;
    match (0..host.len()).find(|&i| now[i] != host[i]) {
        None => Ok(()),
        Some(i) => {
            Err(Error::backend(b.name(), format!("input {what} was modified at [{i}]: {} became {}", host[i], now[i])))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::backend::prelude::*;
    use tandem_reference::RefBackend;

    #[test]
    fn a_changed_input_is_reported_with_its_index() {
        let b = RefBackend::new();
        let host = [1.0f32, 2.0, 3.0];
        let mut buf = upload_f32(&b, &host).unwrap();
        untouched_f32(&b, &buf, &host, "x").unwrap();
        b.write_f32(&mut buf, &[1.0, 2.5]).unwrap();
        let e = untouched_f32(&b, &buf, &host, "x").unwrap_err().to_string();
        assert!(e.contains("input x was modified at [1]"), "{e}");

        let ids = [4u32, 5];
        let mut ib = upload_u32(&b, &ids).unwrap();
        untouched_u32(&b, &ib, &ids, "slots").unwrap();
        b.write_u32(&mut ib, &[4, 6]).unwrap();
        assert!(untouched_u32(&b, &ib, &ids, "slots").is_err());
    }

    #[test]
    fn the_guard_catches_a_write_past_the_end() {
        let b = RefBackend::new();
        let mut out = poisoned(&b, 4).unwrap();
        b.write_f32(&mut out, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(read_guarded(&b, &out, 4, "out").unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
        b.write_f32(&mut out, &[1.0, 2.0, 3.0, 4.0, 0.0]).unwrap();
        let e = read_guarded(&b, &out, 4, "out").unwrap_err().to_string();
        assert!(e.contains("wrote past its 4 elements (element 4 is 0)"), "{e}");
    }

    #[test]
    fn a_weight_from_a_file_holds_the_same_values() {
        let b = RefBackend::new();
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let v = round_to(dtype, (0..15).map(|i| i as f32 * 0.37 - 2.0).collect());
            let w = weight(&b, dtype, &[3, 5], &v, true).unwrap();
            // rms_norm of ones by w reads w back: out = 1 * w (rms of ones is 1, eps 0).
            let (x, mut out) = (upload_f32(&b, &[1.0; 15]).unwrap(), b.alloc_f32(15).unwrap());
            b.rms_norm(&x, &w, &mut out, 1, 15, 0.0).unwrap();
            assert_eq!(b.read_f32(&out, 15).unwrap(), v, "{dtype:?}");
        }
    }

    #[test]
    fn timed_launch_runs_warmup_plus_reps() {
        let b = RefBackend::new();
        let mut calls = 0;
        let mut l = Launch::timed(2, 5);
        l.run(&b, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!((calls, l.times.len()), (7 * LAUNCHES_PER_SAMPLE, 5));
        let mut once = Launch::once();
        once.run(&b, || Ok(())).unwrap();
        assert!(once.times.is_empty());
    }
}
