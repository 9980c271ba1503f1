//! A case is one op with one set of parameters; [`cases`] is the whole suite.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use tandem_core::backend::{Backend, KvDtype, KvGeometry};
use tandem_core::DType;

use crate::compare::compare;
use crate::ops::{
    Add, AddRmsNorm, Argmax, Embedding, GateUpGelu, GateUpSilu, GatherRows, GeluTanhMul, KvWrite, Launch, Lora, Matmul,
    MoeAccumulate, MoeRoute, MoeRouted, Op, PagedAttention, QkvRopeKvWrite, QuantMatmul, ResidualNormGateUp, RmsNorm,
    Rope, RopeKvWrite, Scale, SeqChunk, SiluMul,
};
use crate::rng::{hash_str, mix, Rng};
use tandem_core::quant_layout::{Fp8Scales, QuantLayout};

enum Spec {
    Embedding(Embedding),
    GatherRows(GatherRows),
    RmsNorm(RmsNorm),
    Add(Add),
    AddRmsNorm(AddRmsNorm),
    Matmul(Matmul),
    GateUpSilu(GateUpSilu),
    GateUpGelu(GateUpGelu),
    ResidualNormGateUp(ResidualNormGateUp),
    Rope(Rope),
    SiluMul(SiluMul),
    GeluTanhMul(GeluTanhMul),
    Scale(Scale),
    KvWrite(KvWrite),
    RopeKvWrite(RopeKvWrite),
    QkvRopeKvWrite(QkvRopeKvWrite),
    PagedAttention(PagedAttention),
    Argmax(Argmax),
    MoeRoute(MoeRoute),
    MoeAccumulate(MoeAccumulate),
    MoeRouted(MoeRouted),
    Lora(Lora),
    QuantMatmul(QuantMatmul),
}

/// Calls `$body` with `$o` bound to the op inside whichever variant `$spec` is.
macro_rules! dispatch {
    ($spec:expr, $o:ident => $body:expr) => {
        match $spec {
            Spec::Embedding($o) => $body,
            Spec::GatherRows($o) => $body,
            Spec::RmsNorm($o) => $body,
            Spec::Add($o) => $body,
            Spec::AddRmsNorm($o) => $body,
            Spec::Matmul($o) => $body,
            Spec::GateUpSilu($o) => $body,
            Spec::GateUpGelu($o) => $body,
            Spec::ResidualNormGateUp($o) => $body,
            Spec::Rope($o) => $body,
            Spec::SiluMul($o) => $body,
            Spec::GeluTanhMul($o) => $body,
            Spec::Scale($o) => $body,
            Spec::KvWrite($o) => $body,
            Spec::RopeKvWrite($o) => $body,
            Spec::QkvRopeKvWrite($o) => $body,
            Spec::PagedAttention($o) => $body,
            Spec::Argmax($o) => $body,
            Spec::MoeRoute($o) => $body,
            Spec::MoeAccumulate($o) => $body,
            Spec::MoeRouted($o) => $body,
            Spec::Lora($o) => $body,
            Spec::QuantMatmul($o) => $body,
        }
    };
}

/// One op case: its name, its printed parameters, its NMSE limit, and (inside) the op that
/// generates inputs and runs on any backend.
pub struct Case {
    pub op: &'static str,
    pub params: String,
    pub limit: f64,
    spec: Spec,
}

/// What one case gave on the tested backend.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub op: &'static str,
    pub params: String,
    /// Seed of this case's inputs (derived from the run's seed and the case's label).
    pub seed: u64,
    pub limit: f64,
    /// Largest NMSE over the case's outputs, where it could be computed.
    pub nmse: Option<f64>,
    /// Why the case failed: a mismatch, a backend error or a panic.
    pub failure: Option<String>,
    /// Why the backend has no path for the op (the case did not run on it; not a failure).
    pub skipped: Option<String>,
}

impl CaseResult {
    /// No failure: the case passed, or was skipped (see [`CaseResult::skipped`]).
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
}

/// Timings of one case on one backend (perf mode).
#[derive(Debug, Clone)]
pub struct PerfResult {
    pub op: &'static str,
    pub params: String,
    pub times: Vec<Duration>,
    /// Estimated bytes moved and floating-point operations per launch.
    pub bytes: f64,
    pub flops: f64,
    pub failure: Option<String>,
    /// Why the backend has no path for the op (nothing was timed).
    pub skipped: Option<String>,
}

impl PerfResult {
    pub fn median(&self) -> Option<Duration> {
        let mut t = self.times.clone();
        t.sort();
        t.get(t.len() / 2).copied()
    }
    pub fn min(&self) -> Option<Duration> {
        self.times.iter().min().copied()
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".into()
    }
}

/// What one case gave: the worst NMSE, why it failed, why it was skipped.
type Checked = (Option<f64>, Option<String>, Option<String>);

fn check_op<O: Op, B: Backend, R: Backend>(o: &O, b: &B, r: &R, seed: u64) -> Checked {
    // A panicking backend fails its case; the rest of the suite still runs.
    let res = catch_unwind(AssertUnwindSafe(|| {
        let inputs = o.generate(&mut Rng::new(seed));
        let want = o.exec(r, &inputs, &mut Launch::once()).map_err(|e| format!("reference failed: {e}"))?;
        let mut launch = Launch::once();
        let got = o.exec(b, &inputs, &mut launch).map_err(|e| e.to_string())?;
        Ok::<_, String>((got, want, launch.skipped))
    }));
    let (got, want) = match res {
        Ok(Ok((_, _, Some(why)))) => return (None, None, Some(why)),
        Ok(Ok((got, want, None))) => (got, want),
        Ok(Err(e)) => return (None, Some(e), None),
        Err(p) => return (None, Some(panic_message(p)), None),
    };
    if got.len() != want.len() {
        return (None, Some(format!("{} outputs, want {}", got.len(), want.len())), None);
    }
    let mut worst: Option<f64> = Some(0.0);
    for (g, w) in got.iter().zip(&want) {
        match compare(g, w, o.limit()) {
            Ok(e) => worst = worst.map(|x| x.max(e)),
            Err(m) => {
                let nmse = match m {
                    crate::compare::Mismatch::Error { nmse, .. } => Some(nmse),
                    _ => None,
                };
                return (nmse, Some(format!("{}: {m}", w.name)), None);
            }
        }
    }
    (worst, None, None)
}

/// The op's times on `b`, and why it was skipped there (no times then).
fn time_op<O: Op, B: Backend>(
    o: &O,
    b: &B,
    seed: u64,
    warmup: usize,
    reps: usize,
) -> Result<(Vec<Duration>, Option<String>), String> {
    let res = catch_unwind(AssertUnwindSafe(|| {
        let inputs = o.generate(&mut Rng::new(seed));
        let mut launch = Launch::timed(warmup, reps);
        o.exec(b, &inputs, &mut launch).map_err(|e| e.to_string())?;
        Ok((launch.times, launch.skipped))
    }));
    res.unwrap_or_else(|p| Err(panic_message(p)))
}

impl Case {
    fn new<O: Op>(o: O, wrap: fn(O) -> Spec) -> Case {
        Case { op: O::NAME, params: o.params(), limit: o.limit(), spec: wrap(o) }
    }

    /// `op params`, as printed.
    pub fn label(&self) -> String {
        format!("{} {}", self.op, self.params)
    }

    /// This case's input seed in a run seeded with `run_seed`.
    pub fn seed(&self, run_seed: u64) -> u64 {
        mix(run_seed ^ hash_str(&self.label()))
    }

    /// A filter selects a case by its op name, or by any part of its label
    /// (`"matmul"`, `"w=bf16 m=1 "`).
    pub fn matches(&self, filter: &str) -> bool {
        self.op == filter || self.label().contains(filter)
    }

    /// Runs the case on `backend` and on `reference` with the same inputs and compares.
    pub fn check<B: Backend, R: Backend>(&self, backend: &B, reference: &R, run_seed: u64) -> CaseResult {
        let seed = self.seed(run_seed);
        let (nmse, failure, skipped) = dispatch!(&self.spec, o => check_op(o, backend, reference, seed));
        CaseResult { op: self.op, params: self.params.clone(), seed, limit: self.limit, nmse, failure, skipped }
    }

    /// Times the op alone on `backend`: `warmup` untimed runs, then `reps` runs, each waited for.
    pub fn time<B: Backend>(&self, backend: &B, run_seed: u64, warmup: usize, reps: usize) -> PerfResult {
        let seed = self.seed(run_seed);
        let (res, cost) = dispatch!(&self.spec, o => (time_op(o, backend, seed, warmup, reps), o.cost()));
        let (times, failure, skipped) = match res {
            Ok((t, skipped)) => (t, None, skipped),
            Err(e) => (vec![], Some(e), None),
        };
        PerfResult {
            op: self.op,
            params: self.params.clone(),
            times,
            bytes: cost.bytes,
            flops: cost.flops,
            failure,
            skipped,
        }
    }
}

fn geometry(num_blocks: usize, block_size: usize, num_kv_heads: usize, head_dim: usize) -> KvGeometry {
    KvGeometry { num_blocks, block_size, num_kv_heads, head_dim }
}

/// Every case of the suite. Sizes are chosen to be awkward: not multiples of any tile or
/// workgroup (k = 100, 1000; n = 1, 77), contexts ending mid-block, scattered blocks.
pub fn cases() -> Vec<Case> {
    use DType::{BF16, F16, F32};
    let mut v = vec![];

    for dtype in [F32, BF16, F16] {
        v.push(Case::new(Embedding { dtype, vocab: 1000, hidden: 576, tokens: 7, from_file: false }, Spec::Embedding));
    }
    v.push(Case::new(Embedding { dtype: F32, vocab: 77, hidden: 100, tokens: 1, from_file: false }, Spec::Embedding));
    v.push(Case::new(
        Embedding { dtype: BF16, vocab: 49152, hidden: 64, tokens: 37, from_file: false },
        Spec::Embedding,
    ));
    // An odd row length: half-precision rows start in the middle of a 32-bit word.
    for dtype in [BF16, F16] {
        v.push(Case::new(Embedding { dtype, vocab: 300, hidden: 77, tokens: 5, from_file: false }, Spec::Embedding));
    }

    for (dtype, vocab, hidden) in [(BF16, 1000, 576), (F16, 300, 77)] {
        v.push(Case::new(Embedding { dtype, vocab, hidden, tokens: 7, from_file: true }, Spec::Embedding));
    }

    for (src_rows, dim, n) in [(40, 576, 5), (3, 77, 1), (130, 1000, 37)] {
        v.push(Case::new(GatherRows { src_rows, dim, n }, Spec::GatherRows));
    }

    for (dtype, rows, dim, eps, x_scale) in [
        (F32, 1, 576, 1e-5, 1.0),
        (BF16, 7, 576, 1e-5, 1.0),
        (F16, 37, 100, 1e-6, 1.0),
        (BF16, 3, 1000, 1e-6, 100.0),
        (F32, 2, 4096, 1e-5, 1e-3),
        (F32, 5, 1, 1e-6, 1.0),
        (BF16, 3, 77, 1e-5, 1.0),
    ] {
        v.push(Case::new(RmsNorm { dtype, rows, dim, eps, x_scale, from_file: false }, Spec::RmsNorm));
    }
    for dtype in [BF16, F32] {
        v.push(Case::new(
            RmsNorm { dtype, rows: 7, dim: 576, eps: 1e-5, x_scale: 1.0, from_file: true },
            Spec::RmsNorm,
        ));
    }

    for len in [1, 77, 576 * 37, 100_003] {
        v.push(Case::new(Add { len }, Spec::Add));
    }
    // Decode and prefill rows at SmolLM2's width, a width that is not a multiple of 8 (the
    // unfused path on wgpu), and each weight dtype.
    for (dtype, rows, dim) in [(BF16, 1, 576), (BF16, 37, 576), (F16, 5, 64), (F32, 3, 100), (F32, 70, 2048)] {
        v.push(Case::new(AddRmsNorm { dtype, rows, dim, eps: 1e-5 }, Spec::AddRmsNorm));
    }
    for (len, gate_scale) in [(1, 1.0), (3 * 1536, 1.0), (100_003, 12.0)] {
        v.push(Case::new(SiluMul { len, gate_scale }, Spec::SiluMul));
    }
    // GeGLU (Gemma): a vec4 length and an odd one; gate_scale 12 saturates tanh.
    for (len, gate_scale) in [(1, 1.0), (7 * 1152, 1.0), (3 * 6912, 3.0), (100_003, 12.0)] {
        v.push(Case::new(GeluTanhMul { len, gate_scale }, Spec::GeluTanhMul));
    }
    // Gemma's embedding scale √hidden (1152: Gemma 3 1B, not exact in f32; 2560: 4B, as bf16
    // rounds it), vec4 lengths and odd ones.
    for (len, factor) in [(1, 24.0), (77, 1152f32.sqrt()), (1152 * 37, 1152f32.sqrt()), (100_003, 50.5)] {
        v.push(Case::new(Scale { len, factor }, Spec::Scale));
    }
    // Mixtral's 8 experts top 2, Qwen3-MoE's 128 top 8 (renormalised or not), one row, a
    // prefill's rows, and ties the lower index must win.
    for (rows, experts, top_k, renormalize, ties) in [
        (1, 8, 2, true, false),
        (37, 8, 2, true, true),
        (5, 128, 8, false, false),
        (70, 128, 8, true, true),
        (3, 4, 4, true, false),
    ] {
        v.push(Case::new(MoeRoute { rows, experts, top_k, renormalize, ties }, Spec::MoeRoute));
    }
    for (rows, dim, expert, experts, first) in
        [(1, 64, 0, 8, true), (37, 576, 5, 8, false), (70, 2048, 127, 128, false), (3, 100, 0, 4, true)]
    {
        v.push(Case::new(MoeAccumulate { rows, dim, expert, experts, first }, Spec::MoeAccumulate));
    }
    // The routed experts (CUDA) against the every-expert path, bitwise: a decode token (the
    // 16-row tile), a prefill with more routed rows than 16 per expert (the 64-row tile), an
    // odd width (hidden 72, inter 40: not multiples of the tiles) with 16 experts top 4
    // unrenormalised, and f32 weights (the SIMT grouped GEMM).
    for (dtype, rows, experts, top_k, hidden, inter, renormalize) in [
        (BF16, 1, 8, 2, 64, 96, true),
        (BF16, 37, 4, 2, 128, 64, true),
        (F16, 5, 16, 4, 72, 40, false),
        (F32, 7, 8, 2, 64, 48, true),
    ] {
        v.push(Case::new(MoeRouted { dtype, rows, experts, top_k, hidden, inter, renormalize }, Spec::MoeRouted));
    }
    // The segmented LoRA update: a decode row, a few, a prefill's rows over SmolLM2's q (576)
    // and down (1536 in) shapes, 4 slots of rank up to 16 (the rest smaller, zero padded), x
    // rounded to bf16 as CUDA's tensor-core matmul rounds it, and odd widths.
    for (rows, inp, out, max_loras, max_rank, operand) in [
        (1, 576, 576, 4, 16, F32),
        (3, 576, 192, 4, 16, F32),
        (37, 1536, 576, 4, 16, F32),
        (37, 576, 1536, 2, 8, BF16),
        (3, 77, 45, 3, 5, F32),
        (1, 64, 100, 1, 1, BF16),
    ] {
        v.push(Case::new(Lora { rows, inp, out, max_loras, max_rank, operand }, Spec::Lora));
    }

    for (tokens, q_heads, kv_heads, head_dim, theta, max_pos) in [
        (1, 9, 3, 64, 10_000.0, 2048),
        (5, 8, 2, 128, 500_000.0, 8192),
        (37, 4, 4, 64, 10_000.0, 4096),
        (3, 12, 4, 128, 100_000.0, 16384),
        (16, 15, 5, 64, 10_000.0, 100),
    ] {
        v.push(Case::new(Rope { tokens, q_heads, kv_heads, head_dim, theta, max_pos }, Spec::Rope));
    }

    // Decode (m = 1, 3, 16) and prefill (m = 37, 128); (k, n) as a projection, an odd small
    // shape, and a single output column.
    for dtype in [F32, BF16, F16] {
        for m in [1, 3, 16, 37, 128] {
            v.push(Case::new(
                Matmul { dtype, m, n: 1536, k: 576, bias: m == 3 || m == 37, from_file: false },
                Spec::Matmul,
            ));
            v.push(Case::new(Matmul { dtype, m, n: 77, k: 100, bias: true, from_file: false }, Spec::Matmul));
            v.push(Case::new(Matmul { dtype, m, n: 1, k: 1000, bias: m == 16, from_file: false }, Spec::Matmul));
        }
    }
    // An odd k: half-precision weight rows start in the middle of a 32-bit word.
    v.push(Case::new(Matmul { dtype: BF16, m: 3, n: 77, k: 99, bias: true, from_file: false }, Spec::Matmul));
    v.push(Case::new(Matmul { dtype: F16, m: 16, n: 33, k: 99, bias: false, from_file: false }, Spec::Matmul));
    // SmolLM2-135M's own projections: k/v (n = 3·64), and down (k = 1536).
    for m in [1, 37] {
        v.push(Case::new(Matmul { dtype: BF16, m, n: 192, k: 576, bias: false, from_file: false }, Spec::Matmul));
        v.push(Case::new(Matmul { dtype: BF16, m, n: 576, k: 1536, bias: false, from_file: false }, Spec::Matmul));
    }
    // Through upload_weight from a real safetensors file, as the model loads them.
    for (dtype, m, n, k, bias) in [(BF16, 3, 77, 100, true), (F16, 1, 1536, 576, false), (F32, 37, 77, 100, true)] {
        v.push(Case::new(Matmul { dtype, m, n, k, bias, from_file: true }, Spec::Matmul));
    }
    // Past 128 rows (CUDA's prefill tile kernels, m128 and its variants: TANDEM_CUDA_GEMM_LARGE),
    // with K cut into slices folded in registers or shared memory (n = 200, k = 1000: 3).
    for dtype in [BF16, F16] {
        v.push(Case::new(
            Matmul { dtype, m: 300, n: 200, k: 1000, bias: dtype == BF16, from_file: false },
            Spec::Matmul,
        ));
        v.push(Case::new(Matmul { dtype, m: 129, n: 1536, k: 576, bias: false, from_file: false }, Spec::Matmul));
    }
    // Weights kept in a GGUF block layout: decode (m = 1, 3) and prefill (m = 37) rows, n odd,
    // k a few 256-value super-blocks (SmolLM2's 576 is not one, so 512 and 1536).
    for layout in QuantLayout::GGUF {
        for (m, n, k) in [(1, 77, 512), (3, 33, 1536), (37, 77, 512)] {
            v.push(Case::new(QuantMatmul { layout, m, n, k, w8a8: false }, Spec::QuantMatmul));
        }
    }
    // Int4 weights (AWQ, GPTQ, compressed-tensors, converted at load): groups of 32 and 128.
    for group in [32, 128] {
        for (m, n, k) in [(1, 77, 512), (3, 33, 1536), (37, 77, 512)] {
            v.push(Case::new(
                QuantMatmul { layout: QuantLayout::Int4Group { group }, m, n, k, w8a8: false },
                Spec::QuantMatmul,
            ));
        }
    }
    // FP8 e4m3 kept in 8 bits, with each scale layout checkpoints ship (SmolLM2's 576 is whole
    // runs of 32; 128 x 128 blocks leave a ragged last block column).
    // W8A8 (x quantized to e4m3 per token) is judged by its own, derived limit where asked for.
    let w8a8 = crate::ops::w8a8_asked();
    for scales in [Fp8Scales::Tensor, Fp8Scales::Channel, Fp8Scales::Block] {
        for (m, n, k) in [(1, 77, 576), (3, 33, 1536), (37, 77, 576)] {
            v.push(Case::new(QuantMatmul { layout: QuantLayout::Fp8E4m3(scales), m, n, k, w8a8 }, Spec::QuantMatmul));
        }
    }
    // The LM head: a wide n.
    for (dtype, m) in [(BF16, 1), (F32, 3)] {
        v.push(Case::new(Matmul { dtype, m, n: 49152, k: 576, bias: false, from_file: false }, Spec::Matmul));
    }

    for (g, tokens) in [
        (geometry(10, 16, 2, 64), 1),
        (geometry(12, 16, 3, 128), 37),
        (geometry(8, 32, 1, 64), 5),
        (geometry(6, 32, 4, 128), 100),
        (geometry(3, 16, 1, 64), 48), // every slot of the cache
    ] {
        v.push(Case::new(KvWrite { geometry: g, tokens, kv_dtype: None }, Spec::KvWrite));
    }
    // An fp8 cache (vLLM's --kv-cache-dtype fp8 / fp8_e5m2): the bytes equal the reference's,
    // ties, saturation and subnormals among the inputs.
    for (g, tokens, kv) in [
        (geometry(10, 16, 2, 64), 1, KvDtype::Fp8E4m3),
        (geometry(12, 16, 3, 128), 37, KvDtype::Fp8E4m3),
        (geometry(3, 16, 1, 64), 48, KvDtype::Fp8E4m3),
        (geometry(8, 32, 1, 64), 5, KvDtype::Fp8E5m2),
        (geometry(6, 32, 4, 128), 100, KvDtype::Fp8E5m2),
    ] {
        v.push(Case::new(KvWrite { geometry: g, tokens, kv_dtype: Some(kv) }, Spec::KvWrite));
    }

    // The fused attention-input ops (wgpu: one dispatch, or the q/k/v projection's epilogue,
    // which takes decode and head_dim-64 prefill shapes; head_dim 128 at T = 37 takes its
    // unfused path), against the plain ops on the reference.
    for (g, q_heads, tokens) in
        [(geometry(10, 16, 3, 64), 9, 1), (geometry(12, 16, 2, 128), 8, 37), (geometry(8, 32, 1, 64), 4, 5)]
    {
        v.push(Case::new(RopeKvWrite { geometry: g, q_heads, tokens, max_pos: 4096 }, Spec::RopeKvWrite));
    }
    // The fused gate/up projection with silu (CUDA: one GEMM, the split and register folds;
    // an intermediate size that is not a multiple of 32; f32 weights are not fused).
    for (dtype, m, inter, hidden) in [(BF16, 1, 1536, 576), (BF16, 37, 200, 256), (F16, 200, 70, 136), (F32, 3, 64, 96)]
    {
        v.push(Case::new(GateUpSilu { dtype, m, inter, hidden }, Spec::GateUpSilu));
    }
    // The same with GeGLU (Gemma's MLP; CUDA: the EPI_GEGLU epilogue): decode, a prefill
    // with inter not a multiple of 32, f16.
    for (dtype, m, inter, hidden) in [(BF16, 1, 1152, 640), (BF16, 37, 200, 256), (F16, 5, 70, 136)] {
        v.push(Case::new(GateUpGelu { dtype, m, inter, hidden }, Spec::GateUpGelu));
    }
    // The residual add and the next norm around the projections: fused where the backend fuses
    // norms at that many tokens (CUDA: 1-2 tokens, the epilogue and the prologue), else plain.
    for (dtype, m, hidden, k, inter) in [
        (BF16, 1, 576, 576, 1536),
        (BF16, 2, 256, 384, 200),
        (F16, 2, 136, 1000, 70),
        (BF16, 37, 256, 96, 130),
        (F32, 1, 64, 96, 64),
    ] {
        v.push(Case::new(ResidualNormGateUp { dtype, m, hidden, k, inter }, Spec::ResidualNormGateUp));
    }
    for (dtype, g, q_heads, hidden, tokens, bias) in [
        (BF16, geometry(10, 16, 3, 64), 9, 576, 1, false),
        (BF16, geometry(10, 16, 3, 64), 9, 576, 37, true),
        (BF16, geometry(16, 16, 2, 64), 4, 256, 200, false),
        (F16, geometry(8, 16, 1, 128), 4, 256, 2, true),
        (F32, geometry(8, 16, 1, 128), 4, 256, 37, false),
    ] {
        v.push(Case::new(QkvRopeKvWrite { dtype, geometry: g, q_heads, hidden, tokens, bias }, Spec::QkvRopeKvWrite));
    }

    let d = SeqChunk::decode;
    let p = |cached, query| SeqChunk { cached, query };
    // (block_size, kv_heads, gqa, head_dim, sequences)
    let attention: Vec<(usize, usize, usize, usize, Vec<SeqChunk>)> = vec![
        // Decode: several sequences, contexts ending mid-block and on a block's end.
        (16, 2, 1, 64, vec![d(1), d(15), d(17), d(33), d(100)]),
        (16, 1, 3, 64, vec![d(16), d(47), d(5)]),
        (32, 2, 4, 128, vec![d(31), d(33), d(65), d(200)]),
        (32, 4, 3, 128, vec![d(1), d(64), d(97)]),
        (16, 3, 4, 128, vec![d(129)]),
        (32, 1, 1, 64, vec![d(7)]),
        // SmolLM2-135M's heads (9 query, 3 KV, 64 wide) over a full decode batch of 32.
        (16, 3, 3, 64, (0..32).map(|i| d(1 + (i * 37) % 300)).collect()),
        // Prefill: a fresh prompt, chunks over a cached prefix, and chunks mixed with decodes.
        (16, 2, 1, 64, vec![p(0, 37)]),
        (16, 2, 3, 64, vec![p(20, 13), p(5, 40)]),
        (32, 1, 4, 128, vec![p(33, 31), p(64, 1), p(0, 5)]),
        (32, 2, 3, 128, vec![p(100, 28)]),
        (16, 4, 4, 128, vec![p(16, 16), p(3, 1), p(47, 50)]),
        // Long contexts: past one 512-token partition of a split-context decode kernel (the
        // CUDA backend's), and a prefill chunk at the end of a long cached prefix.
        (16, 2, 3, 64, vec![d(600), d(1100), d(3)]),
        // Each also holds a short sequence: over 1000 keys, dropping or adding one key moves
        // the output by ~1e-3, under the NMSE limit; a short context makes such a bug loud.
        (32, 1, 4, 128, vec![p(1000, 24), d(513), d(2)]),
        (32, 1, 4, 128, vec![d(1024), d(3)]),
        (16, 2, 3, 128, vec![d(512), d(5)]),
        // Head_dim 256 (Gemma 2 and 3; the CUDA backend's tc_d256 under
        // TANDEM_CUDA_ATTENTION_D256=tc): Gemma 3 1B's 4 heads over 1 KV head, decodes mid-block
        // and over several partitions; prefill chunks over a prefix beside a decode, GQA 2.
        (16, 1, 4, 256, vec![d(1), d(17), d(100), d(700)]),
        (32, 2, 2, 256, vec![p(20, 13), p(5, 40), d(33)]),
    ];
    for (block_size, kv_heads, gqa, head_dim, seqs) in attention {
        v.push(Case::new(
            PagedAttention { block_size, kv_heads, gqa, head_dim, seqs, spare_blocks: 3, window: 0, kv_dtype: None },
            Spec::PagedAttention,
        ));
    }
    // Over an fp8 cache: decodes (SmolLM2's heads), prefill chunks over a prefix beside a
    // decode, head_dim 128 in e5m2, a window.
    let fp8 = [
        (16, 3, 3, 64, vec![d(1), d(17), d(100)], 0, KvDtype::Fp8E4m3),
        (16, 2, 3, 64, vec![p(20, 13), p(5, 40), d(33)], 0, KvDtype::Fp8E4m3),
        (32, 2, 4, 128, vec![d(31), p(64, 9)], 0, KvDtype::Fp8E5m2),
        (16, 2, 3, 64, vec![d(5), d(100), p(60, 37)], 50, KvDtype::Fp8E4m3),
    ];
    for (block_size, kv_heads, gqa, head_dim, seqs, window, kv) in fp8 {
        v.push(Case::new(
            PagedAttention { block_size, kv_heads, gqa, head_dim, seqs, spare_blocks: 3, window, kv_dtype: Some(kv) },
            Spec::PagedAttention,
        ));
    }
    // Sliding windows (Mistral, Gemma 3's local layers): contexts shorter and longer than the
    // window, decodes beside a prefill chunk whose rows' windows start in different places, a
    // span of several partitions, and a window of one key (the output is that key's V).
    let windowed: Vec<(usize, usize, usize, usize, Vec<SeqChunk>, usize)> = vec![
        (16, 2, 3, 64, vec![d(5), d(100), p(60, 37), d(700)], 50),
        (32, 1, 4, 128, vec![d(1100), p(1000, 24), d(2)], 600),
        (16, 2, 1, 128, vec![p(20, 70), d(64), d(65)], 64),
        (16, 1, 2, 64, vec![p(3, 9), d(40)], 1),
        // Gemma 3's local layers (window 512) at head_dim 256.
        (16, 1, 2, 256, vec![d(5), p(500, 30), d(700)], 512),
    ];
    for (block_size, kv_heads, gqa, head_dim, seqs, window) in windowed {
        v.push(Case::new(
            PagedAttention { block_size, kv_heads, gqa, head_dim, seqs, spare_blocks: 3, window, kv_dtype: None },
            Spec::PagedAttention,
        ));
    }

    for (rows, vocab, ties) in [(1, 49152, false), (3, 77, true), (16, 1000, false), (5, 1, false), (4, 49152, true)] {
        v.push(Case::new(Argmax { rows, vocab, ties }, Spec::Argmax));
    }
    v
}
