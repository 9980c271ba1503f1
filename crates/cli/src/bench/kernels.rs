//! `tandem bench kernels --backend B --shape S`: the kernel lab. Times each GEMM of a layer
//! (q/k/v, o, gate/up, down, lm_head) at decode and prefill widths m, and paged attention at
//! decode (batch x context) and prefill (one sequence of T tokens over itself), straight
//! through the backend's ops: no model, no engine. Each figure is the mean of back-to-back
//! launches over at least `--min-ms` after one warm-up, the device synchronised before and
//! after (so a sync's cost is spread over many launches, not hidden).
//!
//! With `--bandwidth-gbs` and `--peak-tflops` (the GPU check measures both, gpu/ceilings.py)
//! each row also shows its floor — the larger of bytes moved over the bandwidth and flops over
//! the peak — and our time as a fraction of it. gpu/kernel_lab.py times the same shapes
//! through torch (cuBLAS GEMMs, SDPA) on the same GPU and prints the ratios.
//!
//! Sampling: the step's last kernels at the shape's vocabulary and `--sample-batch` rows:
//! argmax (greedy), top-p 0.9 at temperature 1 (the figure held against 3% of a batch-1
//! step), and top-k 50 with top-p 0.9. Each call includes the ids' trip to the host, as a
//! step's does. The variant is the process's (`TANDEM_CUDA_SAMPLER`, `TANDEM_CUDA_ARGMAX`;
//! gpu/tune.sh times each).
//!
//! cuBLASLt: on CUDA, with bf16 or f16 weights, each GEMM case is timed again through cuBLASLt
//! in the same process (`CudaBackend::set_gemm_cublaslt`; no torch), and the table shows its
//! time over ours ("vs cuBLASLt": above 1, ours is faster); `--no-cublaslt` skips it, and a
//! missing libcublasLt.so.13 is a note on stderr, not a failure.
//!
//! LoRA: the segmented update (`Ops::lora`) over the q and down shapes at `--lora-m` rows
//! (a decode's k + 1 verification rows, and up to 64) spread over `--lora-slots` adapters;
//! torch's figure is a gathered batched matmul (gpu/kernel_lab.py).
//!
//! Quantized decode GEMVs: each layer GEMM (q/k/v, o, gate/up, down; checkpoints keep the
//! lm_head in 16 bits) on weights kept in each `--quant-gemv` layout (default int4 in groups of
//! 128, AWQ's and GPTQ's usual group; random blocks, x as the model stores it) at m = 1 and at
//! each verification width `k + 1` of `--verify-k`, the floor counting the blocks' bytes;
//! torch times the bf16 GEMM of the same shape beside it. A GEMM whose k is not whole blocks
//! of the layout is left out with a note.
//!
//! Shapes: `llama-3.2-1b`, `llama-3.1-8b` (the GPU's), `tiny` (for the CPU test of this harness).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tandem_conformance::ops::random_blocks;
use tandem_conformance::rng::Rng;
use tandem_core::backend::{AttnArgs, Backend, KvDtype, KvGeometry};
use tandem_core::quant_layout::QuantLayout;
use tandem_core::sampling::SampleSpec;
use tandem_core::weights::Weights;
use tandem_core::DType;

use super::report::{self, markdown_table};
use super::OutputArgs;
use crate::backends::BackendKind;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value_t = BackendKind::Cuda)]
    backend: BackendKind,
    /// Model shape: llama-3.2-1b, llama-3.1-8b, gemma-3-1b (head_dim 256) or tiny.
    #[arg(long, default_value = "llama-3.2-1b")]
    shape: String,
    /// GEMM widths (tokens in the step). 3, 5, 24, 40, 96 and 160 are speculative decoding's
    /// verification steps: `b * (k + 1)` rows for `b` of 1, 8 and 32 decodes with `k` of 2 and 4
    /// drafts each.
    #[arg(long, value_delimiter = ',', default_value = "1,3,5,8,24,40,64,96,160,256,512,2048")]
    m: Vec<usize>,
    /// Decode attention: sequences in the batch.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    attn_batch: Vec<usize>,
    /// Decode attention: each sequence's context.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    attn_context: Vec<usize>,
    /// Verification attention (speculative decoding): sequences in the batch, each scoring its
    /// last token and its `k` drafts (`k + 1` query rows) over the first `--attn-context`.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    verify_batch: Vec<usize>,
    /// Verification attention: drafts per sequence (`k`); empty for none.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    verify_k: Vec<usize>,
    /// Skip decode attention over an fp8 KV cache (`--kv-cache-dtype fp8`: e4m3, scale 1), which
    /// otherwise times each `--attn-batch` x `--attn-context` case again as `attention decode
    /// fp8` where the backend stores one.
    #[arg(long)]
    no_attn_fp8: bool,
    /// Prefill attention: prompt lengths (one sequence, causal over itself).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    attn_prefill: Vec<usize>,
    /// Sampling and argmax: logit rows (the step's batch) at the shape's vocabulary.
    #[arg(long, value_delimiter = ',', default_value = "1,64")]
    sample_batch: Vec<usize>,
    /// The segmented LoRA update (`Ops::lora`): rows in the step, spread over the slots in
    /// turn. 2..5 are a decode's `k + 1` verification rows; empty for none.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5,8,16,32,64")]
    lora_m: Vec<usize>,
    /// LoRA: adapters loaded (`--max-loras`) and their rank (`--max-lora-rank`).
    #[arg(long, default_value_t = 4)]
    lora_slots: usize,
    #[arg(long, default_value_t = 16)]
    lora_rank: usize,
    /// Only the argmax and sampling cases (gpu/tune.sh's sampler variants).
    #[arg(long)]
    only_sampling: bool,
    /// Only the attention cases (gpu/tune.sh's attention variants: decode and prefill).
    #[arg(long, conflicts_with = "only_sampling")]
    only_attention: bool,
    /// Weight dtype of the GEMMs: bf16, f16, f32, or a layout the weights are kept in (q8_0,
    /// q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, int4_g32, int4_g64, int4_g128: random blocks;
    /// x in f32).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Quantized decode GEMVs: the layouts (as `--dtype` names them) whose layer GEMMs are
    /// timed at m = 1 and each `--verify-k` + 1; empty for none.
    #[arg(long, value_delimiter = ',', default_value = "int4_g128")]
    quant_gemv: Vec<String>,
    /// Time each case for at least this long.
    #[arg(long, default_value_t = 200.0)]
    min_ms: f64,
    /// Measured copy bandwidth, GB/s: adds each row's floor and our fraction of it.
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    /// Measured tensor-core peak, TFLOP/s.
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Do not time the GEMMs again through cuBLASLt (CUDA only).
    #[arg(long)]
    no_cublaslt: bool,
    #[command(flatten)]
    out: OutputArgs,
}

/// The dimensions a layer's kernels see.
#[derive(Debug, Clone, Copy)]
struct Shape {
    hidden: usize,
    inter: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
}

fn shape(name: &str) -> Result<Shape> {
    Ok(match name {
        "llama-3.2-1b" => Shape { hidden: 2048, inter: 8192, heads: 32, kv_heads: 8, head_dim: 64, vocab: 128256 },
        "llama-3.1-8b" => Shape { hidden: 4096, inter: 14336, heads: 32, kv_heads: 8, head_dim: 128, vocab: 128256 },
        // Gemma 3 1B: 4 heads over 1 KV head of 256 (the head_dim-256 attention).
        "gemma-3-1b" => Shape { hidden: 1152, inter: 6912, heads: 4, kv_heads: 1, head_dim: 256, vocab: 262144 },
        "tiny" => Shape { hidden: 64, inter: 160, heads: 4, kv_heads: 2, head_dim: 16, vocab: 384 },
        _ => bail!("--shape {name}: known shapes are llama-3.2-1b, llama-3.1-8b, gemma-3-1b, tiny"),
    })
}

/// The layout `--dtype` and `--quant-gemv` call `name`: a GGUF layout's lower-case name, or
/// `int4_g<group>` for the int4 groups CUDA runs.
fn layout_named(name: &str) -> Option<QuantLayout> {
    let int4 = QuantLayout::INT4_GROUPS_CUDA.map(|group| QuantLayout::Int4Group { group });
    QuantLayout::GGUF.into_iter().chain(int4).find(|&l| lab_name(l) == name)
}

/// What [`layout_named`] reads.
fn lab_name(l: QuantLayout) -> String {
    match l {
        QuantLayout::Int4Group { group } => format!("int4_g{group}"),
        l => l.name().to_lowercase(),
    }
}

/// One timed case.
struct Row {
    op: String,
    case: String,
    us: f64,
    bytes: f64,
    flops: f64,
    /// What torch is asked to time (gpu/kernel_lab.py).
    spec: Value,
    /// The same GEMM through cuBLASLt, microseconds (CUDA, 16-bit weights).
    cublaslt_us: Option<f64>,
}

/// Mean microseconds per call of `f`: one warm-up, then calls until `min_ms` have passed.
fn time<B: Backend>(b: &B, min_ms: f64, mut f: impl FnMut() -> tandem_core::Result<()>) -> Result<f64> {
    f()?;
    b.sync()?;
    let t0 = Instant::now();
    let mut n = 0u32;
    loop {
        f()?;
        n += 1;
        if n.is_multiple_of(8) || n == 1 {
            b.sync()?;
            if t0.elapsed().as_secs_f64() * 1e3 >= min_ms {
                break;
            }
        }
    }
    b.sync()?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// splitmix64 values in [-scale, scale).
fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 * scale - scale
        })
        .collect()
}

/// A weight of `n` rows of `k` values kept in `layout`: random blocks (the op suite's), uploaded
/// as a model's GGUF tensor is.
fn quant_weight<B: Backend>(b: &B, layout: QuantLayout, n: usize, k: usize) -> Result<B::Buf> {
    let blocks = n * k / layout.block_elems();
    let bytes = random_blocks(layout, blocks, k, &mut Rng::new(n as u64));
    let mut ws = Weights::empty();
    ws.insert_quantized("w", layout, &[n, k], &bytes, "<kernel lab>".into())?;
    Ok(b.upload_weight(&ws.get("w", &[n, k])?)?)
}

fn gemms<B: Backend>(
    b: &B,
    s: Shape,
    a: &Args,
    dtype: DType,
    quant: Option<QuantLayout>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let kv = s.kv_heads * s.head_dim;
    let list = [
        ("qkv", s.hidden + 2 * kv, s.hidden),
        ("o", s.hidden, s.hidden),
        ("gate_up", 2 * s.inter, s.hidden),
        ("down", s.hidden, s.inter),
        ("lm_head", s.vocab, s.hidden),
    ];
    let wbytes = match dtype {
        DType::F32 => 4.0,
        _ => 2.0,
    };
    for (name, n, k) in list {
        let (w, wbytes) = match quant {
            // The quantized floor: the blocks' bytes, scales included.
            Some(l) => (quant_weight(b, l, n, k)?, l.row_bytes(k).map_err(anyhow::Error::msg)? as f64 / k as f64),
            None => (b.weight_from_f32(dtype, &values(n as u64, n * k, 0.05))?, wbytes),
        };
        // x as the model stores it (Model's ActDtypes): in the backend's activation type,
        // except o's input, the attention output, which stays f32. A 16-bit x is written the
        // way the model writes it, by rms_norm (gamma 1) from f32 values.
        let x_dtype = if name == "o" { DType::F32 } else { b.activation_dtype(dtype) };
        let ones = b.weight_from_f32(dtype, &vec![1.0; k])?;
        for &m in &a.m {
            let x = model_x(b, x_dtype, &ones, m, k)?;
            let mut out = b.alloc_f32(m * n)?;
            let us = time(b, a.min_ms, || b.matmul(&x, &w, None, &mut out, m, n, k))
                .with_context(|| format!("{name} m={m}"))?;
            let bytes = n as f64 * k as f64 * wbytes + (m * k * x_dtype.size()) as f64 + (m * n) as f64 * 4.0;
            rows.push(Row {
                op: format!("gemm {name}"),
                case: format!("m={m} n={n} k={k}"),
                us,
                bytes,
                flops: 2.0 * (m * n * k) as f64,
                spec: json!({"kind": "gemm", "m": m, "n": n, "k": k, "x_dtype": x_dtype.name()}),
                cublaslt_us: None,
            });
        }
    }
    Ok(())
}

/// `m` rows of `k` x as the model writes them: rms_norm (gamma `ones`) of seeded f32 values,
/// into `x_dtype` (the GEMMs', GEMVs' and LoRA's input alike).
fn model_x<B: Backend>(b: &B, x_dtype: DType, ones: &B::Buf, m: usize, k: usize) -> Result<B::Buf> {
    let mut xf = b.alloc_f32(m * k)?;
    b.write_f32(&mut xf, &values(m as u64, m * k, 1.0))?;
    let mut x = b.alloc_activation(x_dtype, m * k)?;
    b.rms_norm(&xf, ones, &mut x, m, k, 1e-5)?;
    Ok(x)
}

/// The segmented LoRA update over the q projection's and down's shapes (x as the model stores
/// it for `dtype` weights), `m` rows spread over `--lora-slots` slots of rank `--lora-rank`.
fn lora<B: Backend>(b: &B, s: Shape, a: &Args, dtype: DType, rows: &mut Vec<Row>) -> Result<()> {
    let (slots, rank) = (a.lora_slots, a.lora_rank);
    if a.lora_m.is_empty() || slots == 0 || rank == 0 {
        return Ok(());
    }
    let f32_buf = |v: &[f32]| -> Result<B::Buf> {
        let mut buf = b.alloc_f32(v.len())?;
        b.write_f32(&mut buf, v)?;
        Ok(buf)
    };
    let scales = f32_buf(&vec![2.0; slots])?;
    for (name, out, inp) in [("q", s.heads * s.head_dim, s.hidden), ("down", s.hidden, s.inter)] {
        let a_stack = f32_buf(&values(inp as u64, slots * rank * inp, 0.05))?;
        let b_stack = f32_buf(&values(out as u64, slots * out * rank, 0.05))?;
        let x_dtype = b.activation_dtype(dtype);
        let operand = b.matmul_operand(dtype);
        let ones = b.weight_from_f32(dtype, &vec![1.0; inp])?;
        for &m in &a.lora_m {
            let x = model_x(b, x_dtype, &ones, m, inp)?;
            let ids: Vec<u32> = (0..m).map(|t| (t % slots) as u32).collect();
            let mut idx = b.alloc_u32(m)?;
            b.write_u32(&mut idx, &ids)?;
            let mut shrink = b.alloc_f32(m * rank)?;
            let mut y = b.alloc_f32(m * out)?;
            b.write_f32(&mut y, &vec![0.0; m * out])?;
            let args = tandem_core::lora::LoraArgs {
                x: &x,
                operand,
                a: &a_stack,
                b: &b_stack,
                slots: &idx,
                scales: &scales,
                rows: m,
                inp,
                out,
                max_loras: slots,
                max_rank: rank,
            };
            let us = time(b, a.min_ms, || b.lora(&args, &mut shrink, &mut y))
                .with_context(|| format!("lora {name} m={m}"))?;
            // Each row reads its slot's factors (the slots in use read once each at best).
            let used = m.min(slots) as f64;
            let bytes =
                used * (rank * (inp + out)) as f64 * 4.0 + (m * inp * x_dtype.size()) as f64 + (m * out) as f64 * 8.0;
            rows.push(Row {
                op: format!("lora {name}"),
                case: format!("m={m} in={inp} out={out} slots={slots} rank={rank}"),
                us,
                bytes,
                flops: 2.0 * (m * rank * (inp + out)) as f64,
                spec: json!({"kind": "lora", "m": m, "in": inp, "out": out, "slots": slots, "rank": rank}),
                cublaslt_us: None,
            });
        }
    }
    Ok(())
}

/// TANDEM_CUDA_ATTENTION (and TANDEM_CUDA_ATTENTION_D256 as `d256=VALUE`) when the lab runs
/// on CUDA and they are set.
fn attention_variant(a: &Args) -> Option<String> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let v = match (get("TANDEM_CUDA_ATTENTION"), get("TANDEM_CUDA_ATTENTION_D256")) {
        (None, None) => return None,
        (Some(v), None) => v,
        (None, Some(d)) => format!("d256={d}"),
        (Some(v), Some(d)) => format!("{v},d256={d}"),
    };
    matches!(a.backend, BackendKind::Cuda | BackendKind::Auto).then_some(v)
}

/// Attention over `seqs` sequences of `ctx` tokens each, the last `q_len` of each in the step,
/// over a cache of `kv` (None: the backend's default).
#[allow(clippy::too_many_arguments)] // one case's dimensions, each a plain number
fn attention<B: Backend>(
    b: &B,
    s: Shape,
    a: &Args,
    seqs: usize,
    ctx: usize,
    q_len: usize,
    kv: Option<KvDtype>,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let block = 16;
    let max_blocks = ctx.div_ceil(block);
    let g =
        KvGeometry { num_blocks: seqs * max_blocks, block_size: block, num_kv_heads: s.kv_heads, head_dim: s.head_dim };
    let kv_vals = values(7, g.layer_elems(), 1.0);
    // The backend's default KV element type (bf16 on CUDA), as serving uses it, unless asked.
    let kv_dtype = kv.unwrap_or(b.kv_dtypes()[0]);
    let mut k_cache = b.alloc_kv_as(g, kv_dtype)?;
    let mut v_cache = b.alloc_kv_as(g, kv_dtype)?;
    // Fill the caches through the backend's own write (its layout and element type).
    let slots: Vec<u32> = (0..g.slots() as u32).collect();
    let per = s.kv_heads * s.head_dim;
    let chunk = 4096usize.min(g.slots());
    for start in (0..g.slots()).step_by(chunk) {
        let len = chunk.min(g.slots() - start);
        let mut kb = b.alloc_f32(len * per)?;
        b.write_f32(&mut kb, &kv_vals[start * per..(start + len) * per])?;
        let mut sb = b.alloc_u32(len)?;
        b.write_u32(&mut sb, &slots[start..start + len])?;
        b.kv_write(&kb, &kb, &mut k_cache, &mut v_cache, &sb, len, g)?;
    }
    let t = seqs * q_len;
    let mut q = b.alloc_f32(t * s.heads * s.head_dim)?;
    b.write_f32(&mut q, &values(3, t * s.heads * s.head_dim, 1.0))?;
    let pos: Vec<u32> = (0..seqs).flat_map(|_| (ctx - q_len..ctx).map(|p| p as u32)).collect();
    let seq_of: Vec<u32> = (0..seqs).flat_map(|i| std::iter::repeat_n(i as u32, q_len)).collect();
    let table: Vec<u32> = (0..(seqs * max_blocks) as u32).collect();
    let (mut pb, mut tb, mut bt) = (b.alloc_u32(t)?, b.alloc_u32(t)?, b.alloc_u32(table.len())?);
    b.write_u32(&mut pb, &pos)?;
    b.write_u32(&mut tb, &seq_of)?;
    b.write_u32(&mut bt, &table)?;
    let mut out = b.alloc_f32(t * s.heads * s.head_dim)?;
    let args = AttnArgs {
        q: &q,
        k_cache: &k_cache,
        v_cache: &v_cache,
        positions: &pb,
        token_seq: &tb,
        block_tables: &bt,
        num_tokens: t,
        num_seqs: seqs,
        max_blocks,
        max_context: ctx,
        decode_tokens: if q_len == 1 { t } else { 0 },
        num_heads: s.heads,
        geometry: g,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        window: 0,
    };
    let us = time(b, a.min_ms, || b.paged_attention(&args, &mut out))?;
    let kv_bytes = 2.0 * (seqs * ctx * per) as f64 * kv_dtype.size() as f64;
    let io = 2.0 * (t * s.heads * s.head_dim) as f64 * 4.0;
    // Causal prefill does half the square; decode one query row per sequence; verification
    // `q_len` rows each over the context before it and the rows up to itself.
    let pairs = if q_len == 1 {
        (seqs * ctx) as f64
    } else if q_len == ctx {
        seqs as f64 * (q_len * (q_len + 1) / 2) as f64
    } else {
        seqs as f64 * (q_len * (ctx - q_len) + q_len * (q_len + 1) / 2) as f64
    };
    let flops = 4.0 * pairs * (s.heads * s.head_dim) as f64;
    let (op, mut case) = if q_len == 1 && kv_dtype.fp8().is_some() {
        ("attention decode fp8", format!("batch={seqs} ctx={ctx} kv={}", kv_dtype.name()))
    } else if q_len == 1 {
        ("attention decode", format!("batch={seqs} ctx={ctx} kv={}", kv_dtype.name()))
    } else if q_len < ctx {
        ("attention verify", format!("batch={seqs} ctx={ctx} rows={q_len} kv={}", kv_dtype.name()))
    } else {
        ("attention prefill", format!("tokens={q_len} kv={}", kv_dtype.name()))
    };
    // The CUDA attention variant (TANDEM_CUDA_ATTENTION), named when one is picked, so that
    // gpu/tune.sh's tables of tc and tc_deep side by side say which row is which.
    if let Some(v) = attention_variant(a) {
        case.push_str(&format!(" attn={v}"));
    }
    rows.push(Row { op: op.into(), case, us, bytes: kv_bytes + io, flops, spec: json!({"kind": "attention", "batch": seqs, "ctx": ctx, "q_len": q_len, "heads": s.heads, "kv_heads": s.kv_heads, "head_dim": s.head_dim, "kv": kv_dtype.name()}), cublaslt_us: None });
    Ok(())
}

/// Argmax and sampling over `batch` rows of logits spread like a model's (uniform in [-8, 8]).
fn sampling<B: Backend>(b: &B, s: Shape, a: &Args, batch: usize, rows: &mut Vec<Row>) -> Result<()> {
    let n = batch * s.vocab;
    let mut logits = b.alloc_f32(n)?;
    b.write_f32(&mut logits, &values(11 + batch as u64, n, 8.0))?;
    let bytes = n as f64 * 4.0;
    let us = time(b, a.min_ms, || b.argmax(&logits, batch, s.vocab).map(drop))
        .with_context(|| format!("argmax batch={batch}"))?;
    rows.push(Row {
        op: "argmax".into(),
        case: format!("batch={batch} vocab={}", s.vocab),
        us,
        bytes,
        flops: 0.0,
        spec: json!({"kind": "argmax", "batch": batch, "vocab": s.vocab}),
        cublaslt_us: None,
    });
    for (name, top_k, top_p) in [("top-p 0.9", 0u32, 0.9f32), ("top-k 50 top-p 0.9", 50, 0.9)] {
        let mut step = 0u32;
        let us = time(b, a.min_ms, || {
            step += 1;
            let specs: Vec<SampleSpec> = (0..batch as u32)
                .map(|r| SampleSpec {
                    temperature: 1.0,
                    top_k,
                    top_p,
                    min_p: 0.0,
                    seed: 7 + r as u64,
                    completion: 0,
                    token_index: step,
                })
                .collect();
            b.sample(&logits, batch, s.vocab, &specs).map(drop)
        })
        .with_context(|| format!("sample {name} batch={batch}"))?;
        rows.push(Row {
            op: format!("sample {name}"),
            case: format!("batch={batch} vocab={}", s.vocab),
            us,
            bytes,
            flops: 0.0,
            spec: json!({"kind": "sample", "batch": batch, "vocab": s.vocab, "top_k": top_k, "top_p": top_p}),
            cublaslt_us: None,
        });
    }
    Ok(())
}

/// The layer GEMMs on weights kept in `layout` at m = 1 and each verification width, x in the
/// backend's activation type for a 16-bit model (f32 for o's input, as [`gemms`] has it).
fn quant_gemvs<B: Backend>(b: &B, s: Shape, a: &Args, layout: QuantLayout, rows: &mut Vec<Row>) -> Result<()> {
    let kv = s.kv_heads * s.head_dim;
    let list = [
        ("qkv", s.hidden + 2 * kv, s.hidden),
        ("o", s.hidden, s.hidden),
        ("gate_up", 2 * s.inter, s.hidden),
        ("down", s.hidden, s.inter),
    ];
    let mut ms = vec![1];
    ms.extend(a.verify_k.iter().map(|k| k + 1));
    let name = lab_name(layout);
    for (op, n, k) in list {
        let Ok(row_bytes) = layout.row_bytes(k) else {
            eprintln!("kernel lab: {op} (k = {k}) is not whole {name} blocks: its quantized GEMV is left out");
            continue;
        };
        let w = quant_weight(b, layout, n, k)?;
        let x_dtype = if op == "o" { DType::F32 } else { b.activation_dtype(DType::BF16) };
        let ones = b.weight_from_f32(DType::BF16, &vec![1.0; k])?;
        for &m in &ms {
            let x = model_x(b, x_dtype, &ones, m, k)?;
            let mut out = b.alloc_f32(m * n)?;
            let us = time(b, a.min_ms, || b.matmul(&x, &w, None, &mut out, m, n, k))
                .with_context(|| format!("{op} {name} m={m}"))?;
            rows.push(Row {
                op: format!("gemv {op} {name}"),
                case: format!("m={m} n={n} k={k}"),
                us,
                bytes: (n * row_bytes) as f64 + (m * k * x_dtype.size()) as f64 + (m * n) as f64 * 4.0,
                flops: 2.0 * (m * n * k) as f64,
                spec: json!({"kind": "gemm", "m": m, "n": n, "k": k, "x_dtype": x_dtype.name(), "weights": name}),
                cublaslt_us: None,
            });
        }
    }
    Ok(())
}

/// The GEMMs' weight type and kept layout (`--dtype`).
fn gemm_dtype(a: &Args) -> Result<(DType, Option<QuantLayout>)> {
    let quant = layout_named(&a.dtype);
    let dtype = match a.dtype.as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        _ if quant.is_some() => DType::F32,
        d => bail!(
            "--dtype {d}: bf16, f16, f32 or a kept layout (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, \
             int4_g32, int4_g64, int4_g128)"
        ),
    };
    Ok((dtype, quant))
}

/// Each GEMM row of `rows` timed again through cuBLASLt on `b` (its `cublaslt_us`), unless
/// `--no-cublaslt`, the weights are not 16-bit, or cuBLASLt already served them; a missing
/// library is a note, not a failure.
fn cublaslt_peer(b: &mut tandem_cuda::CudaBackend, a: &Args, rows: &mut [Row]) -> Result<()> {
    let (dtype, quant) = gemm_dtype(a)?;
    if a.no_cublaslt || a.only_sampling || a.only_attention || quant.is_some() || dtype == DType::F32 {
        return Ok(());
    }
    if b.gemm_cublaslt() {
        eprintln!("kernel lab: TANDEM_CUDA_GEMM=cublaslt: the GEMM rows are cuBLASLt's already");
        return Ok(());
    }
    if let Err(e) = b.set_gemm_cublaslt(true) {
        eprintln!("kernel lab: cuBLASLt not timed: {e}");
        return Ok(());
    }
    let mut peer = vec![];
    gemms(&*b, shape(&a.shape)?, a, dtype, None, &mut peer)?;
    b.set_gemm_cublaslt(false)?;
    for p in peer {
        if let Some(r) = rows.iter_mut().find(|r| r.op == p.op && r.case == p.case) {
            r.cublaslt_us = Some(p.us);
        }
    }
    Ok(())
}

fn lab<B: Backend>(b: &B, a: &Args) -> Result<Vec<Row>> {
    let s = shape(&a.shape)?;
    let (dtype, quant) = gemm_dtype(a)?;
    let mut rows = vec![];
    if !a.only_sampling {
        if !a.only_attention {
            gemms(b, s, a, dtype, quant, &mut rows)?;
            for name in a.quant_gemv.iter().filter(|n| !n.is_empty()) {
                let layout = layout_named(name).with_context(|| {
                    format!("--quant-gemv {name}: a kept layout (q8_0 ... q6_k, int4_g32, int4_g64, int4_g128)")
                })?;
                quant_gemvs(b, s, a, layout, &mut rows)?;
            }
        }
        for &bs in &a.attn_batch {
            for &ctx in &a.attn_context {
                attention(b, s, a, bs, ctx, 1, None, &mut rows)?;
                if !a.no_attn_fp8 && b.kv_dtypes().contains(&KvDtype::Fp8E4m3) {
                    attention(b, s, a, bs, ctx, 1, Some(KvDtype::Fp8E4m3), &mut rows)?;
                }
            }
        }
        if let Some(&ctx) = a.attn_context.first() {
            for &bs in &a.verify_batch {
                for &k in &a.verify_k {
                    attention(b, s, a, bs, ctx, k + 1, None, &mut rows)?;
                }
            }
        }
        for &t in &a.attn_prefill {
            attention(b, s, a, 1, t, t, None, &mut rows)?;
        }
    }
    if !a.only_attention {
        for &bs in &a.sample_batch {
            sampling(b, s, a, bs, &mut rows)?;
        }
        if !a.only_sampling && quant.is_none() {
            lora(b, s, a, dtype, &mut rows)?;
        }
    }
    Ok(rows)
}

pub fn run(a: Args) -> Result<()> {
    let (rows, device) = match a.backend {
        BackendKind::Reference => (lab(&tandem_reference::RefBackend::new(), &a)?, "CPU".to_string()),
        BackendKind::Wgpu => {
            let b = tandem_wgpu::WgpuBackend::new().context("opening the wgpu backend")?;
            let d = format!("{:?}", b.adapter());
            (lab(&b, &a)?, d)
        }
        BackendKind::Cuda | BackendKind::Auto => {
            let mut b = tandem_cuda::CudaBackend::new(0).context("opening the CUDA backend")?;
            let d = b.device_name().to_string();
            let mut rows = lab(&b, &a)?;
            cublaslt_peer(&mut b, &a, &mut rows)?;
            (rows, d)
        }
    };
    let floor = |r: &Row| {
        let bw = a.bandwidth_gbs.map(|g| r.bytes / (g * 1e9) * 1e6);
        let pk = a.peak_tflops.map(|p| r.flops / (p * 1e12) * 1e6);
        match (bw, pk) {
            (None, None) => None,
            (x, y) => Some(x.unwrap_or(0.0).max(y.unwrap_or(0.0))),
        }
    };
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let f = floor(r);
            vec![
                r.op.clone(),
                r.case.clone(),
                format!("{:.1}", r.us),
                format!("{:.1}", r.bytes / r.us / 1e3),
                format!("{:.2}", r.flops / r.us / 1e6),
                f.map_or("-".into(), |f| format!("{:.0}%", 100.0 * f / r.us)),
                r.cublaslt_us.map_or("-".into(), |p| format!("{:.2}x", p / r.us)),
            ]
        })
        .collect();
    let results: Vec<Value> = rows
        .iter()
        .map(|r| json!({"op": r.op, "case": r.case, "us": r.us, "bytes": r.bytes, "flops": r.flops, "floor_us": floor(r), "frac_of_floor": floor(r).map(|f| f / r.us), "cublaslt_us": r.cublaslt_us, "torch": r.spec}))
        .collect();
    let settings = json!({"shape": a.shape, "dtype": a.dtype, "min_ms": a.min_ms, "bandwidth_gbs": a.bandwidth_gbs, "peak_tflops": a.peak_tflops, "cuda_attention": attention_variant(&a)});
    let rep = report::build(
        "kernels",
        json!({"name": a.backend.name(), "device": device}),
        json!({"shape": a.shape}),
        settings,
        json!(results),
    );
    report::write_json(&a.out, &format!("kernels-{}-{}", a.backend.name(), a.shape), &rep)?;
    println!("### kernel lab: {} on {} ({device})\n", a.shape, a.backend.name());
    println!("{}", markdown_table(&["op", "case", "us", "GB/s", "TFLOP/s", "of floor", "vs cuBLASLt"], &table));
    Ok(())
}
