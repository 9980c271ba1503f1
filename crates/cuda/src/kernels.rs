//! The kernel table: every kernel file compiled (a cubin, or PTX the driver compiles), loaded,
//! and each kernel the ops launch resolved once to a handle ([`Kernels`]), so a launch costs no
//! lookup and a kernel missing from the modules fails start-up by name.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use tandem_core::Result;

use crate::buf::Elem;
use crate::compile::{compile_cubin_cached, compile_ptx_cached, ptx_entries};
use crate::error::{drv, err};
use crate::gemm;
use crate::quant_mma::QUANT_MMA_KINDS;
use crate::sources::KernelSource;

/// A kernel resolved once at load, with its name for launch errors.
pub(crate) struct Kernel<F> {
    pub(crate) name: &'static str,
    pub(crate) f: F,
}

/// Every kernel the ops launch, looked up once when the modules load (a kernel missing from
/// them fails start-up, naming it), so a launch costs no string formatting or map lookup.
/// Arrays are indexed by weight kind (f32, bf16, f16: [`weight_index`]), 16-bit weight kind
/// (bf16, f16), tile kernel ([`GemmKernel::index`]) or KV cache kind (f32, bf16).
pub(crate) struct Kernels<F> {
    pub(crate) embedding: [Kernel<F>; 3],
    pub(crate) rms_norm: [Kernel<F>; 3],
    pub(crate) add_rms_norm: [Kernel<F>; 3],
    pub(crate) gather_rows: Kernel<F>,
    pub(crate) add: Kernel<F>,
    pub(crate) silu_mul: Kernel<F>,
    pub(crate) gelu_tanh_mul: Kernel<F>,
    pub(crate) scale: Kernel<F>,
    pub(crate) rope: Kernel<F>,
    pub(crate) matmul_tiled_f32: Kernel<F>,
    pub(crate) matmul_x: [Kernel<F>; 2],
    pub(crate) matmul_tc: [[Kernel<F>; 13]; 2],
    /// Per cache kind, in buf.rs `need_kv`'s order: f32, bf16, fp8 e4m3, fp8 e5m2 (the fp8
    /// ones take the layer's k_scale and v_scale as two more arguments).
    pub(crate) kv_write: [Kernel<F>; 4],
    pub(crate) rope_kv_write: [Kernel<F>; 4],
    pub(crate) attn_partial: [Kernel<F>; 4],
    pub(crate) attn_tc: [Kernel<F>; 3],
    /// paged_attention_tc's fp8 form (kernels/paged_attention_fp8.cu): [e4m3, e5m2][d64, d128,
    /// d256], taking the layer's k_scale and v_scale as two more arguments.
    pub(crate) attn_tc_fp8: [[Kernel<F>; 3]; 2],
    pub(crate) attn_tc_deep: [Kernel<F>; 2],
    pub(crate) attn_tc_shared: [Kernel<F>; 2],
    pub(crate) argmax: Kernel<F>,
    /// `TANDEM_CUDA_ARGMAX=multi`: per-chunk partials, then a fold a row.
    pub(crate) argmax_partial: Kernel<F>,
    pub(crate) argmax_fold: Kernel<F>,
    pub(crate) moe_route: Kernel<F>,
    pub(crate) moe_accumulate: Kernel<F>,
    /// By x's type: f32, bf16, f16.
    pub(crate) lora_shrink: [Kernel<F>; 3],
    pub(crate) lora_expand: Kernel<F>,
    pub(crate) moe: MoeKernels<F>,
    pub(crate) sample: Kernel<F>,
    pub(crate) sample_masked: Kernel<F>,
    /// `TANDEM_CUDA_SAMPLER=radix`: the same ids in fewer passes.
    pub(crate) sample_radix: Kernel<F>,
    pub(crate) sample_masked_radix: Kernel<F>,
    /// `TANDEM_CUDA_SAMPLER=multi`: the same ids with 64 CTAs a row.
    pub(crate) sample_mc_max: Kernel<F>,
    pub(crate) sample_mc_topk: Kernel<F>,
    pub(crate) sample_mc_topp: Kernel<F>,
    pub(crate) sample_mc_draw: Kernel<F>,
    pub(crate) logit_edits: Kernel<F>,
    pub(crate) logit_restore: Kernel<F>,
    pub(crate) logprobs: Kernel<F>,
    /// kernels/quant_matmul.cu, by [`crate::quant::quant_index`] (QuantLayout::GGUF's order,
    /// then FP8, then int4 groups of 32, 64 and 128).
    pub(crate) quant_matmul: [Kernel<F>; QUANT_KINDS],
    pub(crate) quant_embedding: [Kernel<F>; QUANT_KINDS],
    /// kernels/quant_mma.cu, by [`crate::quant_mma::mma_index`] (FP8, int4 groups of 32, 64
    /// and 128, Q8_0, Q4_0, Q6_K, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K) and row tile (m16, m64).
    pub(crate) quant_mma: [[Kernel<F>; 2]; QUANT_MMA_KINDS],
    /// kernels/quant_mma_w8a8.cu, by row tile (m16, m64): FP8 weights with e4m3 activations.
    pub(crate) quant_mma_w8a8: [Kernel<F>; 2],
}

/// The routed mixture of experts' kernels (kernels/moe.cu, moe.rs); gemm_tc by 16-bit weight
/// kind (bf16, f16) and row tile (m16, m64).
pub(crate) struct MoeKernels<F> {
    pub(crate) select: Kernel<F>,
    pub(crate) count: Kernel<F>,
    pub(crate) offsets: Kernel<F>,
    pub(crate) scatter: Kernel<F>,
    pub(crate) gather: Kernel<F>,
    pub(crate) gemm_tc: [[Kernel<F>; 2]; 2],
    pub(crate) gemm_f32: Kernel<F>,
    pub(crate) combine: Kernel<F>,
}

impl<F> Kernels<F> {
    /// The one list of kernel names: `take` finds each (the loaded modules, or a test that
    /// only collects the names).
    pub(crate) fn resolve(mut take: impl FnMut(&'static str) -> Result<F>) -> Result<Self> {
        let mut k = |name: &'static str| -> Result<Kernel<F>> { Ok(Kernel { name, f: take(name)? }) };
        Ok(Kernels {
            embedding: [k("embedding_f32")?, k("embedding_bf16")?, k("embedding_f16")?],
            rms_norm: [k("rms_norm_f32")?, k("rms_norm_bf16")?, k("rms_norm_f16")?],
            add_rms_norm: [k("add_rms_norm_f32")?, k("add_rms_norm_bf16")?, k("add_rms_norm_f16")?],
            gather_rows: k("gather_rows")?,
            add: k("add")?,
            silu_mul: k("silu_mul")?,
            gelu_tanh_mul: k("gelu_tanh_mul")?,
            scale: k("scale")?,
            rope: k("rope")?,
            matmul_tiled_f32: k("matmul_tiled_f32")?,
            matmul_x: [k("matmul_x_bf16")?, k("matmul_x_f16")?],
            matmul_tc: [
                [
                    k("matmul_tc_bf16_m16")?,
                    k("matmul_tc_bf16_m64")?,
                    k("matmul_tc_bf16_m128")?,
                    k("matmul_tc_bf16_m16_n128")?,
                    k("matmul_tc_bf16_m64_n128")?,
                    k("matmul_tc_bf16_m128_n128")?,
                    k("matmul_tc_bf16_m128_occ2")?,
                    k("matmul_tc_bf16_m64_occ4")?,
                    k("matmul_tc_bf16_m16_s8")?,
                    k("matmul_tc_bf16_m16_gemv4")?,
                    k("matmul_tc_bf16_m16_gemv8")?,
                    k("matmul_tc_bf16_m16_x1")?,
                    k("matmul_tc_bf16_m128_w64")?,
                ],
                [
                    k("matmul_tc_f16_m16")?,
                    k("matmul_tc_f16_m64")?,
                    k("matmul_tc_f16_m128")?,
                    k("matmul_tc_f16_m16_n128")?,
                    k("matmul_tc_f16_m64_n128")?,
                    k("matmul_tc_f16_m128_n128")?,
                    k("matmul_tc_f16_m128_occ2")?,
                    k("matmul_tc_f16_m64_occ4")?,
                    k("matmul_tc_f16_m16_s8")?,
                    k("matmul_tc_f16_m16_gemv4")?,
                    k("matmul_tc_f16_m16_gemv8")?,
                    k("matmul_tc_f16_m16_x1")?,
                    k("matmul_tc_f16_m128_w64")?,
                ],
            ],
            kv_write: [k("kv_write_f32")?, k("kv_write_bf16")?, k("kv_write_fp8e4m3")?, k("kv_write_fp8e5m2")?],
            rope_kv_write: [
                k("rope_kv_write_f32")?,
                k("rope_kv_write_bf16")?,
                k("rope_kv_write_fp8e4m3")?,
                k("rope_kv_write_fp8e5m2")?,
            ],
            attn_partial: [
                k("paged_attention_partial_f32")?,
                k("paged_attention_partial_bf16")?,
                k("paged_attention_partial_fp8e4m3")?,
                k("paged_attention_partial_fp8e5m2")?,
            ],
            attn_tc: [k("paged_attention_tc_d64")?, k("paged_attention_tc_d128")?, k("paged_attention_tc_d256")?],
            attn_tc_fp8: [
                [
                    k("paged_attention_tc_fp8e4m3_d64")?,
                    k("paged_attention_tc_fp8e4m3_d128")?,
                    k("paged_attention_tc_fp8e4m3_d256")?,
                ],
                [
                    k("paged_attention_tc_fp8e5m2_d64")?,
                    k("paged_attention_tc_fp8e5m2_d128")?,
                    k("paged_attention_tc_fp8e5m2_d256")?,
                ],
            ],
            attn_tc_deep: [k("paged_attention_tc_deep_d64")?, k("paged_attention_tc_deep_d128")?],
            attn_tc_shared: [k("paged_attention_tc_shared_d64")?, k("paged_attention_tc_shared_d128")?],
            argmax: k("argmax")?,
            argmax_partial: k("argmax_partial")?,
            argmax_fold: k("argmax_fold")?,
            moe_route: k("moe_route")?,
            moe_accumulate: k("moe_accumulate")?,
            lora_shrink: [k("lora_shrink_f32")?, k("lora_shrink_bf16")?, k("lora_shrink_f16")?],
            lora_expand: k("lora_expand")?,
            moe: MoeKernels {
                select: k("moe_select")?,
                count: k("moe_count")?,
                offsets: k("moe_offsets")?,
                scatter: k("moe_scatter")?,
                gather: k("moe_gather")?,
                gemm_tc: [
                    [k("moe_gemm_bf16_m16")?, k("moe_gemm_bf16_m64")?],
                    [k("moe_gemm_f16_m16")?, k("moe_gemm_f16_m64")?],
                ],
                gemm_f32: k("moe_gemm_f32")?,
                combine: k("moe_combine")?,
            },
            sample: k("sample")?,
            sample_masked: k("sample_masked")?,
            sample_radix: k("sample_radix")?,
            sample_masked_radix: k("sample_masked_radix")?,
            sample_mc_max: k("sample_mc_max")?,
            sample_mc_topk: k("sample_mc_topk")?,
            sample_mc_topp: k("sample_mc_topp")?,
            sample_mc_draw: k("sample_mc_draw")?,
            logit_edits: k("logit_edits")?,
            logit_restore: k("logit_restore")?,
            logprobs: k("logprobs")?,
            quant_matmul: quant_kernels(&mut k, QUANT_MATMUL)?,
            quant_embedding: quant_kernels(&mut k, QUANT_EMBEDDING)?,
            quant_mma: [
                [k("quant_mma_fp8_m16")?, k("quant_mma_fp8_m64")?],
                [k("quant_mma_int4_g32_m16")?, k("quant_mma_int4_g32_m64")?],
                [k("quant_mma_int4_g64_m16")?, k("quant_mma_int4_g64_m64")?],
                [k("quant_mma_int4_g128_m16")?, k("quant_mma_int4_g128_m64")?],
                [k("quant_mma_q8_0_m16")?, k("quant_mma_q8_0_m64")?],
                [k("quant_mma_q4_0_m16")?, k("quant_mma_q4_0_m64")?],
                [k("quant_mma_q6_k_m16")?, k("quant_mma_q6_k_m64")?],
                [k("quant_mma_q4_1_m16")?, k("quant_mma_q4_1_m64")?],
                [k("quant_mma_q5_0_m16")?, k("quant_mma_q5_0_m64")?],
                [k("quant_mma_q5_1_m16")?, k("quant_mma_q5_1_m64")?],
                [k("quant_mma_q4_k_m16")?, k("quant_mma_q4_k_m64")?],
                [k("quant_mma_q5_k_m16")?, k("quant_mma_q5_k_m64")?],
            ],
            quant_mma_w8a8: [k("quant_mma_w8a8_fp8_m16")?, k("quant_mma_w8a8_fp8_m64")?],
        })
    }
}

/// How many layouts kernels/quant_matmul.cu runs: the GGUF blocks, FP8 e4m3 and int4 groups of
/// 32, 64 and 128.
pub(crate) const QUANT_KINDS: usize = 12;

/// kernels/quant_matmul.cu's kernels, in QuantLayout::GGUF's order, then FP8, then int4 by
/// group (quant.rs `QUANT_SUFFIXES`).
const QUANT_MATMUL: [&str; QUANT_KINDS] = [
    "quant_matmul_q8_0",
    "quant_matmul_q4_0",
    "quant_matmul_q4_1",
    "quant_matmul_q5_0",
    "quant_matmul_q5_1",
    "quant_matmul_q4_k",
    "quant_matmul_q5_k",
    "quant_matmul_q6_k",
    "quant_matmul_fp8",
    "quant_matmul_int4_g32",
    "quant_matmul_int4_g64",
    "quant_matmul_int4_g128",
];
const QUANT_EMBEDDING: [&str; QUANT_KINDS] = [
    "quant_embedding_q8_0",
    "quant_embedding_q4_0",
    "quant_embedding_q4_1",
    "quant_embedding_q5_0",
    "quant_embedding_q5_1",
    "quant_embedding_q4_k",
    "quant_embedding_q5_k",
    "quant_embedding_q6_k",
    "quant_embedding_fp8",
    "quant_embedding_int4_g32",
    "quant_embedding_int4_g64",
    "quant_embedding_int4_g128",
];

/// The kernels of `names`, each found by `k`.
fn quant_kernels<F>(
    k: &mut impl FnMut(&'static str) -> Result<Kernel<F>>,
    names: [&'static str; QUANT_KINDS],
) -> Result<[Kernel<F>; QUANT_KINDS]> {
    let mut out = Vec::with_capacity(QUANT_KINDS);
    for n in names {
        out.push(k(n)?);
    }
    out.try_into().map_err(|_| err("quant kernels: one a layout expected"))
}

/// Every kernel name the backend launches (what start-up resolves); tests/cuda/kernels_check.rs
/// holds them against what NVRTC compiled, so a renamed kernel fails without a GPU.
pub fn kernel_names() -> Vec<&'static str> {
    let mut names = vec![];
    let _ = Kernels::<()>::resolve(|n| {
        names.push(n);
        Ok(())
    });
    names
}

/// The index of a weight kind in [`Kernels`]' per-weight arrays (f32, bf16, f16).
pub(crate) fn weight_index(e: Elem) -> usize {
    match e {
        Elem::F32 | Elem::U32 => 0,
        Elem::BF16 => 1,
        Elem::F16 => 2,
        Elem::Quant(_) | Elem::Fp8Kv(..) => 0,
    }
}

/// A compiled kernel file: a cubin for the device's own architecture (the default), or PTX the
/// driver compiles at load (`TANDEM_CUDA_CUBIN=0`, or where NVRTC could not make a cubin).
pub(crate) enum Image {
    Cubin(Vec<u8>),
    Ptx(String),
}

/// Every kernel file compiled (or read from the cache, compile.rs) on its own thread: NVRTC
/// programs are independent, and a cold start's time is then the slowest file's, not the sum.
pub(crate) fn compile_modules(
    srcs: &[KernelSource],
    arch: &str,
    include: Option<&std::path::PathBuf>,
    cubin: bool,
) -> Result<Vec<Image>> {
    std::thread::scope(|s| {
        let jobs: Vec<_> = srcs
            .iter()
            .map(|src| {
                s.spawn(move || -> Result<Image> {
                    if cubin {
                        match compile_cubin_cached(src, arch, include) {
                            Ok(c) => return Ok(Image::Cubin(c)),
                            Err(e) => {
                                tracing::warn!("{}.cu: no cubin for sm_{arch}, loading PTX instead: {e}", src.name)
                            }
                        }
                    }
                    compile_ptx_cached(src, arch, include).map(Image::Ptx)
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(err("a kernel compile thread panicked (see stderr)"))))
            .collect()
    })
}

pub(crate) fn load_module(
    ctx: &Arc<CudaContext>,
    src: &KernelSource,
    image: Image,
    funcs: &mut HashMap<String, CudaFunction>,
) -> Result<()> {
    // A cubin names no entries we can read cheaply: look up every kernel the backend launches
    // (those of other files are absent and skipped). PTX lists its own.
    let (module, names, cubin) = match image {
        Image::Cubin(c) => (
            ctx.load_module(cudarc::nvrtc::Ptx::from_binary(c))
                .map_err(drv(&format!("loading the cubin of {}.cu", src.name)))?,
            kernel_names()
                .into_iter()
                .chain(gemm::WGMMA_KERNELS)
                .chain(gemm::WGMMA_WS_KERNELS.into_iter().flatten())
                .filter(|n| !funcs.contains_key(*n))
                .map(str::to_string)
                .collect::<Vec<_>>(),
            true,
        ),
        Image::Ptx(ptx) => {
            let names = ptx_entries(&ptx);
            let m = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(drv(&format!(
                "loading the PTX of {}.cu (driver older than the NVRTC that made it?)",
                src.name
            )))?;
            (m, names, false)
        }
    };
    for name in names {
        match module.load_function(&name) {
            Ok(f) => {
                funcs.insert(name, f);
            }
            // A cubin's lookup misses the kernels of other files; one missing everywhere fails
            // Kernels::resolve, by name.
            Err(_) if cubin => {}
            Err(e) => return Err(drv(&format!("{}.cu: kernel {name}", src.name))(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::gemm_kernel;

    /// One name per kernel, each once; the per-kind arrays line up with their index functions.
    #[test]
    fn every_kernel_is_named_once() {
        let names = kernel_names();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        assert_eq!(names.len(), 150); // 6 tc attention over an fp8 cache (e4m3 / e5m2 by head_dim 64, 128, 256) + 2 quant_mma_w8a8 (FP8 W8A8 by row tile m16, m64) + 6 fp8 KV cache (kv_write, rope_kv_write, paged_attention_partial by e4m3 / e5m2) + 24 quant_mma (FP8, int4 groups of 32, 64, 128, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K by row tile m16, m64) + 4 segmented LoRA (shrink by x's type, expand) + 24 quant (matmul and embedding, 8 GGUF layouts, FP8 and int4 groups of 32, 64, 128) + 50 + 11 routed-MoE + 6 decode GEMM + 2 m128_w64 + 8 sampler/argmax + 2 tc_deep and 2 tc_shared attention variants + gelu_tanh_mul and scale (Gemma 3) + tc attention at head_dim 256
        let k = Kernels::<&'static str>::resolve(Ok).unwrap();
        assert_eq!(k.embedding.map(|x| x.f), ["embedding_f32", "embedding_bf16", "embedding_f16"]);
        assert_eq!(
            [Elem::F32, Elem::BF16, Elem::F16].map(|e| k.rms_norm[weight_index(e)].f),
            ["rms_norm_f32", "rms_norm_bf16", "rms_norm_f16"]
        );
        for (m, want) in [(1, "matmul_tc_f16_m16"), (17, "matmul_tc_f16_m64_occ4"), (129, "matmul_tc_f16_m128_occ2")] {
            assert_eq!(k.matmul_tc[weight_index(Elem::F16) - 1][gemm_kernel(m, gemm::GEMM_BN).index].f, want);
        }
        for (m, want) in
            [(1, "matmul_tc_bf16_m16_n128"), (17, "matmul_tc_bf16_m64_n128"), (129, "matmul_tc_bf16_m64_n128")]
        {
            assert_eq!(k.matmul_tc[weight_index(Elem::BF16) - 1][gemm_kernel(m, gemm::GEMM_BN_WIDE).index].f, want);
        }
        assert_eq!(k.matmul_x[weight_index(Elem::BF16) - 1].f, "matmul_x_bf16");
        for (i, s) in crate::quant::QUANT_SUFFIXES.into_iter().enumerate() {
            assert_eq!(k.quant_matmul[i].f, format!("quant_matmul_{s}"));
            assert_eq!(k.quant_embedding[i].f, format!("quant_embedding_{s}"));
            use tandem_core::quant_layout::{Fp8Scales, QuantLayout};
            let layout = match s {
                "fp8" => Some(QuantLayout::Fp8E4m3(Fp8Scales::Block)),
                _ => match s.strip_prefix("int4_g") {
                    Some(g) => Some(QuantLayout::Int4Group { group: g.parse().unwrap() }),
                    None => QuantLayout::GGUF.into_iter().find(|l| l.name().to_lowercase() == s),
                },
            };
            if let Some(mi) = layout.and_then(crate::quant_mma::mma_index) {
                for (ti, bm) in crate::quant_mma::QT_TILES.into_iter().enumerate() {
                    assert_eq!(k.quant_mma[mi][ti].f, format!("quant_mma_{s}_m{bm}"));
                }
            }
            if s == "fp8" {
                for (ti, bm) in crate::quant_mma::QT_TILES.into_iter().enumerate() {
                    assert_eq!(k.quant_mma_w8a8[ti].f, format!("quant_mma_w8a8_fp8_m{bm}"));
                }
            }
        }
        use crate::buf::{KV_BF16, KV_F32, KV_FP8_E4M3, KV_FP8_E5M2};
        let kinds = [(KV_F32, "f32"), (KV_BF16, "bf16"), (KV_FP8_E4M3, "fp8e4m3"), (KV_FP8_E5M2, "fp8e5m2")];
        for (i, s) in kinds {
            assert_eq!(k.kv_write[i].f, format!("kv_write_{s}"));
            assert_eq!(k.rope_kv_write[i].f, format!("rope_kv_write_{s}"));
            assert_eq!(k.attn_partial[i].f, format!("paged_attention_partial_{s}"));
        }
        assert_eq!(
            k.attn_tc.map(|x| x.f),
            ["paged_attention_tc_d64", "paged_attention_tc_d128", "paged_attention_tc_d256"]
        );
        for (i, s) in [(KV_FP8_E4M3, "fp8e4m3"), (KV_FP8_E5M2, "fp8e5m2")] {
            assert_eq!(
                k.attn_tc_fp8[i - KV_FP8_E4M3].each_ref().map(|x| x.f),
                [64, 128, 256].map(|d| format!("paged_attention_tc_{s}_d{d}"))
            );
        }
        // lora.rs indexes the shrink kernels by x's type: f32, bf16, f16.
        assert_eq!(k.lora_shrink.map(|x| x.f), ["lora_shrink_f32", "lora_shrink_bf16", "lora_shrink_f16"]);
        // moe.rs indexes gemm_tc by [bf16, f16][m16, m64].
        assert_eq!(
            k.moe.gemm_tc.map(|r| r.map(|x| x.f)),
            [["moe_gemm_bf16_m16", "moe_gemm_bf16_m64"], ["moe_gemm_f16_m16", "moe_gemm_f16_m64"]]
        );
    }
}
