//! The CUDA backend's variant switches: the `TANDEM_CUDA_*` environment variables that pick a
//! kernel variant or a check mode, read once when a [`CudaBackend`](crate::CudaBackend) loads
//! ([`Switches::from_env`]), logged once, and passed to where they are used. [`SWITCHES`] lists
//! each variable, its values and its default. A value a switch does not know fails the load
//! where its table entry says so (the variant switches); the on/off ones take anything else as
//! their default. Every variant gives the same tokens, bit for bit (the kernels' contract); the
//! switches choose speed, or a check mode. One exception: `TANDEM_CUDA_QUANT_TC` multiplies
//! FP8, int4 and GGUF weights in another order (kernels/quant_mma.cu), so a model
//! kept in those layouts has other bits with it on; it stays off until a GPU has timed it. Its
//! value `w8a8` also quantizes the activations of FP8 weights to e4m3 per token on sm_89+
//! (kernels/quant_mma_w8a8.cu, as vLLM runs FP8 there): other bits again, and a coarser x.
//! Another: `TANDEM_CUDA_ATTENTION_FP8=tc` runs an fp8 KV cache on the tensor-core attention
//! (kernels/paged_attention_fp8.cu, bitwise tc over the bf16-rounded decoded cache), whose bits
//! differ from the default f32 kernel's, which keeps each decoded product in f32.

use tandem_core::Result;

use crate::attention::{self, AttnVariant, D256Variant};
use crate::error::err;
use crate::gemm::{self, GemmVariants, GEMM_DEFAULT_VARIANTS};
use crate::launch;
use crate::moe::{self, MoePath, MOE_DEFAULT};

/// One variable of the table: its name, the values it takes and its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub name: &'static str,
    pub values: &'static str,
    pub default: &'static str,
    pub what: &'static str,
}

/// Every switch, in the order [`Switches::from_env`] reads them.
pub const SWITCHES: &[Switch] = &[
    Switch {
        name: "TANDEM_CUDA_GEMM",
        values: "ours, cublaslt (NVIDIA's library; not batch-invariant)",
        default: "ours",
        what: "who computes the 16-bit projections without bias (`--gemm`)",
    },
    Switch {
        name: "TANDEM_CUDA_GEMM_LARGE",
        values: "m128_occ2, m128, m128_n128, m128_w64, wgmma, wgmma_ws (sm_90 only)",
        default: "m128_occ2",
        what: "the tile kernel of GEMMs over more than 128 rows",
    },
    Switch {
        name: "TANDEM_CUDA_GEMM_MID",
        values: "m64_occ4, m64",
        default: "m64_occ4",
        what: "the tile kernel of GEMMs over 17 to 128 rows",
    },
    Switch {
        name: "TANDEM_CUDA_GEMM_SMALL",
        values: "m16, m16_s8, m16_gemv4, m16_gemv8, m16_x1",
        default: "m16",
        what: "the tile kernel of GEMMs over at most 16 rows",
    },
    Switch {
        name: "TANDEM_CUDA_ATTENTION",
        values: "tc, tc_deep, tc_shared, wgmma, f32",
        default: "tc",
        what: "the attention kernel of a bf16 cache",
    },
    Switch {
        name: "TANDEM_CUDA_ATTENTION_D256",
        values: "partial, tc",
        default: "partial",
        what: "the attention kernel at head_dim 256",
    },
    Switch {
        name: "TANDEM_CUDA_ATTENTION_FP8",
        values: "partial, tc",
        default: "partial",
        what: "the attention kernel of an fp8 cache (tc: paged_attention_fp8.cu, bitwise tc over the decoded cache)",
    },
    Switch {
        name: "TANDEM_CUDA_PDL",
        values: "0, 1",
        default: "0",
        what: "programmatic dependent launch (sm_90+; ignored, with a warning, below)",
    },
    Switch {
        name: "TANDEM_CUDA_MOE",
        values: "routed, dense",
        default: "routed",
        what: "each expert over its own tokens, or every expert over every token",
    },
    Switch {
        name: "TANDEM_CUDA_SAMPLER",
        values: "radix, multi; anything else: the bisecting `sample`",
        default: "bisect",
        what: "the kernel of sampled (not greedy) rows",
    },
    Switch {
        name: "TANDEM_CUDA_ARGMAX",
        values: "multi; anything else: one CTA a row",
        default: "one CTA a row",
        what: "the kernel of greedy rows",
    },
    Switch {
        name: "TANDEM_CUDA_SYNC",
        values: "1; anything else: off",
        default: "off",
        what: "a synchronize after every launch, so a fault names its kernel",
    },
    Switch {
        name: "TANDEM_CUDA_ACTIVATIONS",
        values: "f32; anything else: the weights' 16-bit type where matmuls read them",
        default: "16-bit",
        what: "how activations are stored (the same bits either way)",
    },
    Switch {
        name: "TANDEM_CUDA_CUBIN",
        values: "0: PTX the driver compiles; anything else: a cubin",
        default: "cubin",
        what: "what NVRTC makes of each kernel file",
    },
    Switch {
        name: "TANDEM_CUDA_QUANT_TC",
        values: "1; w8a8 (1, and FP8 weights as W8A8: per-token e4m3 activations, sm_89+); anything else: off",
        default: "off",
        what: "FP8, int4 and GGUF weights on the tensor cores (kernels/quant_mma.cu, \
               quant_mma_w8a8.cu; other bits than the GEMV's)",
    },
];

/// Which kernel samples the rows that are not greedy (`TANDEM_CUDA_SAMPLER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampler {
    /// kernels/sampling.cu `sample` / `sample_masked` (the default).
    Bisect,
    /// `sample_radix` / `sample_masked_radix`: top-k by a radix select, top-p 4 key bits a
    /// pass; the same ids in about a quarter of the passes.
    Radix,
    /// `sample_mc_*`: 64 CTAs a row, twelve launches, the same ids, with workspace reserved at
    /// load (a step it does not cover takes `sample`).
    Multi,
}

/// The switches as one load read them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Switches {
    /// `TANDEM_CUDA_GEMM=cublaslt`: the plain 16-bit projections through cuBLASLt
    /// (cublaslt.rs), the fused ones declined so that every projection is plain.
    pub cublaslt: bool,
    /// `TANDEM_CUDA_GEMM_LARGE` / `_MID` / `_SMALL`.
    pub gemm: GemmVariants,
    /// `TANDEM_CUDA_ATTENTION`.
    pub attention: AttnVariant,
    /// `TANDEM_CUDA_ATTENTION_D256`.
    pub attention_d256: D256Variant,
    /// `TANDEM_CUDA_ATTENTION_FP8=tc`: an fp8 cache on tc's fp8 form where a bf16 cache takes tc.
    pub attention_fp8_tc: bool,
    /// `TANDEM_CUDA_PDL=1` (whether the GPU can is the backend's to decide).
    pub pdl: bool,
    /// `TANDEM_CUDA_MOE`.
    pub moe: MoePath,
    /// `TANDEM_CUDA_SAMPLER`.
    pub sampler: Sampler,
    /// `TANDEM_CUDA_ARGMAX=multi`: greedy rows take `argmax_partial` (a CTA per 4,096 logits)
    /// and `argmax_fold`, the same ids.
    pub argmax_multi: bool,
    /// `TANDEM_CUDA_SYNC=1`.
    pub sync: bool,
    /// `TANDEM_CUDA_ACTIVATIONS=f32`.
    pub f32_activations: bool,
    /// Not `TANDEM_CUDA_CUBIN=0`.
    pub cubin: bool,
    /// `TANDEM_CUDA_QUANT_TC=1`: FP8, int4-group and GGUF weights through kernels/quant_mma.cu's
    /// tensor-core kernels instead of quant_matmul.cu's GEMV (quant_mma.rs).
    pub quant_tc: bool,
    /// `TANDEM_CUDA_QUANT_TC=w8a8` (quant_tc is then on too): FP8 weights through
    /// kernels/quant_mma_w8a8.cu, activations quantized to e4m3 per token, where the GPU is
    /// sm_89 or newer (quant_mma_w8a8.rs; below, quant_mma.cu's W8A16 with a log line).
    pub quant_w8a8: bool,
}

impl Default for Switches {
    /// Every switch at its default (what an empty environment reads).
    fn default() -> Self {
        Switches {
            cublaslt: false,
            gemm: GEMM_DEFAULT_VARIANTS,
            attention: AttnVariant::Tc,
            attention_d256: D256Variant::Partial,
            attention_fp8_tc: false,
            pdl: false,
            moe: MOE_DEFAULT,
            sampler: Sampler::Bisect,
            argmax_multi: false,
            sync: false,
            f32_activations: false,
            cubin: true,
            quant_tc: false,
            quant_w8a8: false,
        }
    }
}

impl Switches {
    /// The switches of this process's environment; a value a variant switch does not know is
    /// an error that names the variable and its values.
    pub fn from_env() -> Result<Self> {
        Self::read(|name| std::env::var(name).ok())
    }

    /// The switches `var` gives (a variable's value, None where unset).
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let cublaslt = parse_gemm(var("TANDEM_CUDA_GEMM").as_deref()).map_err(err)?;
        let gemm = gemm::parse_gemm_variants(
            var("TANDEM_CUDA_GEMM_LARGE").as_deref(),
            var("TANDEM_CUDA_GEMM_MID").as_deref(),
            var("TANDEM_CUDA_GEMM_SMALL").as_deref(),
        )
        .map_err(err)?;
        let attention = attention::parse_variant(var("TANDEM_CUDA_ATTENTION").as_deref()).map_err(err)?;
        let attention_d256 = attention::parse_d256(var("TANDEM_CUDA_ATTENTION_D256").as_deref()).map_err(err)?;
        let attention_fp8_tc = attention::parse_fp8(var("TANDEM_CUDA_ATTENTION_FP8").as_deref()).map_err(err)?;
        let pdl = launch::parse_pdl(var("TANDEM_CUDA_PDL").as_deref()).map_err(err)?;
        let moe = moe::moe_path(var("TANDEM_CUDA_MOE").as_deref())?;
        let quant_tc = var("TANDEM_CUDA_QUANT_TC");
        let sampler = match var("TANDEM_CUDA_SAMPLER").as_deref() {
            Some("radix") => Sampler::Radix,
            Some("multi") => Sampler::Multi,
            _ => Sampler::Bisect,
        };
        Ok(Switches {
            cublaslt,
            gemm,
            attention,
            attention_d256,
            attention_fp8_tc,
            pdl,
            moe,
            sampler,
            argmax_multi: var("TANDEM_CUDA_ARGMAX").as_deref() == Some("multi"),
            sync: var("TANDEM_CUDA_SYNC").as_deref() == Some("1"),
            f32_activations: var("TANDEM_CUDA_ACTIVATIONS").as_deref() == Some("f32"),
            cubin: var("TANDEM_CUDA_CUBIN").as_deref() != Some("0"),
            quant_tc: matches!(quant_tc.as_deref(), Some("1" | "w8a8")),
            quant_w8a8: quant_tc.as_deref() == Some("w8a8"),
        })
    }

    /// The switches away from their defaults, one `NAME: value` each (empty: all defaults).
    pub fn changed(&self) -> Vec<String> {
        let d = Switches::default();
        let mut out = vec![];
        if self.cublaslt != d.cublaslt {
            out.push("TANDEM_CUDA_GEMM: cublaslt".into());
        }
        if self.gemm != d.gemm {
            out.push(format!("TANDEM_CUDA_GEMM_LARGE / _MID / _SMALL: {:?}", self.gemm));
        }
        if self.attention != d.attention {
            out.push(format!("TANDEM_CUDA_ATTENTION: {:?}", self.attention));
        }
        if self.attention_d256 != d.attention_d256 {
            out.push(format!("TANDEM_CUDA_ATTENTION_D256: {:?}", self.attention_d256));
        }
        if self.attention_fp8_tc != d.attention_fp8_tc {
            out.push("TANDEM_CUDA_ATTENTION_FP8: tc".into());
        }
        if self.pdl != d.pdl {
            out.push("TANDEM_CUDA_PDL: 1".into());
        }
        if self.moe != d.moe {
            out.push(format!("TANDEM_CUDA_MOE: {:?}", self.moe));
        }
        if self.sampler != d.sampler {
            out.push(format!("TANDEM_CUDA_SAMPLER: {:?}", self.sampler));
        }
        if self.argmax_multi != d.argmax_multi {
            out.push("TANDEM_CUDA_ARGMAX: multi".into());
        }
        if self.sync != d.sync {
            out.push("TANDEM_CUDA_SYNC: 1".into());
        }
        if self.f32_activations != d.f32_activations {
            out.push("TANDEM_CUDA_ACTIVATIONS: f32".into());
        }
        if self.cubin != d.cubin {
            out.push("TANDEM_CUDA_CUBIN: 0".into());
        }
        if self.quant_w8a8 != d.quant_w8a8 {
            out.push("TANDEM_CUDA_QUANT_TC: w8a8".into());
        } else if self.quant_tc != d.quant_tc {
            out.push("TANDEM_CUDA_QUANT_TC: 1".into());
        }
        out
    }

    /// One line at load: the switches set away from their defaults.
    pub fn log(&self) {
        let changed = self.changed();
        if changed.is_empty() {
            tracing::info!("cuda: every TANDEM_CUDA_* switch at its default");
        } else {
            tracing::info!("cuda: switches {}", changed.join(", "));
        }
    }
}

/// `TANDEM_CUDA_GEMM`: whether cuBLASLt computes the plain projections (unset or empty: ours).
pub(crate) fn parse_gemm(v: Option<&str>) -> std::result::Result<bool, String> {
    match v.unwrap_or("") {
        "" | "ours" => Ok(false),
        "cublaslt" => Ok(true),
        o => Err(format!("TANDEM_CUDA_GEMM={o}: one of ours (the default), cublaslt")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Switches> {
        Switches::read(|n| vars.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
    }

    /// An empty environment reads the defaults, and the table names every switch read.
    #[test]
    fn defaults_and_the_table_agree() {
        assert_eq!(read(&[]).unwrap(), Switches::default());
        assert!(Switches::default().changed().is_empty());
        let names: Vec<_> = SWITCHES.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), 15);
        let src = include_str!("switches.rs");
        for n in &names {
            assert!(src.matches(&format!("var(\"{n}\")")).count() == 1, "{n} is read once");
        }
    }

    /// Each switch keeps its meaning: the values it knows, and what it does with others.
    #[test]
    fn values_read_as_before() {
        let s = read(&[
            ("TANDEM_CUDA_GEMM", "cublaslt"),
            ("TANDEM_CUDA_GEMM_SMALL", "m16_x1"),
            ("TANDEM_CUDA_ATTENTION", "tc_shared"),
            ("TANDEM_CUDA_ATTENTION_D256", "tc"),
            ("TANDEM_CUDA_PDL", "1"),
            ("TANDEM_CUDA_MOE", "dense"),
            ("TANDEM_CUDA_SAMPLER", "multi"),
            ("TANDEM_CUDA_ARGMAX", "multi"),
            ("TANDEM_CUDA_SYNC", "1"),
            ("TANDEM_CUDA_ACTIVATIONS", "f32"),
            ("TANDEM_CUDA_CUBIN", "0"),
            ("TANDEM_CUDA_QUANT_TC", "1"),
        ])
        .unwrap();
        assert_eq!(s.attention, AttnVariant::TcShared);
        assert_eq!(s.attention_d256, D256Variant::Tc);
        assert!(s.cublaslt && s.pdl && s.argmax_multi && s.sync && s.f32_activations && !s.cubin && s.quant_tc);
        assert!(!s.quant_w8a8);
        assert_eq!((s.moe, s.sampler), (MoePath::Dense, Sampler::Multi));
        assert_eq!(s.changed().len(), 12);
        // The on/off switches take anything else as off; the variant switches refuse it.
        let s = read(&[
            ("TANDEM_CUDA_SAMPLER", "fast"),
            ("TANDEM_CUDA_SYNC", "yes"),
            ("TANDEM_CUDA_CUBIN", ""),
            ("TANDEM_CUDA_QUANT_TC", "on"),
        ])
        .unwrap();
        assert_eq!(s, Switches::default());
        assert!(!read(&[("TANDEM_CUDA_GEMM", "ours")]).unwrap().cublaslt);
        // w8a8: the tensor-core kernels, FP8 as W8A8; logged as its own value.
        let s = read(&[("TANDEM_CUDA_QUANT_TC", "w8a8")]).unwrap();
        assert!(s.quant_tc && s.quant_w8a8);
        assert_eq!(s.changed(), vec!["TANDEM_CUDA_QUANT_TC: w8a8".to_string()]);
        assert!(!read(&[("TANDEM_CUDA_QUANT_TC", "W8A8")]).unwrap().quant_tc);
        for (k, v) in [
            ("TANDEM_CUDA_GEMM", "cublas"),
            ("TANDEM_CUDA_GEMM_LARGE", "m256"),
            ("TANDEM_CUDA_ATTENTION", "x"),
            ("TANDEM_CUDA_ATTENTION_D256", "x"),
            ("TANDEM_CUDA_PDL", "2"),
            ("TANDEM_CUDA_MOE", "sparse"),
        ] {
            let e = read(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k), "{e}");
        }
    }
}
