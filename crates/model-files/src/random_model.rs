//! Seeded random models of real shapes: `config.json`, `model.safetensors`, `tokenizer.json`,
//! `tokenizer_config.json`, `generation_config.json`.
//!
//! Same (shape, seed, dtype) gives the same bytes on every machine: the generator is splitmix64,
//! and "normal" values are an Irwin-Hall sum of four uniforms (adds and multiplies only, no libm
//! calls whose last bit could differ between platforms). Each tensor draws from its own stream,
//! seeded from the model seed and the tensor name, so its values do not depend on which other
//! tensors exist. Golden data computed once from a tiny model stays valid wherever it is rebuilt.

use std::io::BufWriter;
use std::path::Path;

use serde_json::json;
use tandem_core::{DType, Error, Result};

use crate::convert::write_json;
use crate::family::{named, CheckpointNames, Family, GEMMA3, LLAMA, MISTRAL, MIXTRAL, PHI3, QWEN2, QWEN3, QWEN3_MOE};
use crate::safetensors_writer::{SafetensorsWriter, TensorSpec};
use crate::tokenizer_json::{bpe_tokenizer_json, byte_level_alphabet, check_bpe, AddedToken, PreTokenizer};

/// The model shapes `gen-model` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// 2 layers, hidden 64, 4 heads / 2 KV heads of 16, untied lm_head: fast enough for every test.
    Tiny,
    /// As tiny, with tied embeddings and one KV head (GQA ratio 4).
    TinyTied,
    /// 4 layers, hidden 256, 2 heads / 1 KV head of 128 (Llama-3.1-8B's head_dim), untied:
    /// the head_dim-128 paths (CUDA's 128-column rope epilogue) in a model small enough for a test.
    TinyHd128,
    /// SmolLM2-135M's layer (hidden 576, 9 heads / 3 KV heads of 64, tied) in 2 layers with a
    /// 384-token vocabulary: head_dim 64's tensor-core attention, split K and the fused paths
    /// at a size the fake CUDA driver (the host emulator) runs in seconds.
    SmallHd64,
    Smollm2_135m,
    /// Qwen2 architecture: Q/K/V projections carry biases.
    Qwen25_05b,
    /// Llama 3.2 1B: tied, llama3 rope scaling.
    Llama32_1b,
    Llama3_8b,
    /// Qwen3: per-head q/k norms, head_dim 32 apart from hidden / heads (64 / 4), tied, eps 1e-6.
    TinyQwen3,
    /// Qwen3-MoE: tiny-qwen3's attention, 8 experts of width 48, top 2, `norm_topk_prob`.
    TinyQwen3Moe,
    /// Mixtral: Llama's attention, 4 experts (`block_sparse_moe`, w1/w2/w3) of width 96, top 2.
    TinyMixtral,
    /// Qwen3-30B-A3B's layer (hidden 2048, 32 heads / 4 KV heads of 128, 128 experts of width
    /// 768, top 8) in 2 layers: the GPU check times the routed experts against every expert
    /// (gpu/tune.sh, TANDEM_CUDA_MOE) on it (2.7 GB in bf16).
    Qwen3_30bA3b2l,
    /// Mistral: tiny's layer with a sliding window of 16 keys on every layer (shorter than the
    /// golden prompts, so the window matters).
    TinyMistral,
    /// Mistral over tiny-hd128's layer (2 heads / 1 KV head of 128) with a window of 16 keys:
    /// a sliding window on CUDA's tensor-core attention (head_dim 128), for the fake driver.
    TinyMistralHd128,
    /// Qwen2: q/k/v biases, tied, `use_sliding_window` with a window of 16 from layer 1 on
    /// (`max_window_layers` 1): one full and one windowed layer.
    TinyQwen2,
    /// Gemma 3: a sliding layer (window 16, local rope base 10000) then a global one (base 1e6,
    /// linear scaling 8), heads of 32 apart from hidden / heads, `query_pre_attn_scalar` 24 (not
    /// head_dim), GeGLU, sandwich norms stored as `w - 1`, tied, eps 1e-6.
    TinyGemma3,
    /// tiny-gemma3 with Gemma 3's head size: 4 heads / 1 KV head of 256 (hidden 64), so the
    /// head_dim-256 attention kernels run in a model small enough for the fake CUDA driver.
    TinyGemma3Hd256,
    /// Gemma 3 1B: 26 layers of hidden 1152, 4 heads / 1 KV head of 256, GeGLU of 6912, a
    /// 262,144-token vocabulary (tied), windows of 512 on five layers of every six, rope 1e4 /
    /// 1e6 unscaled (2.0 GB in bf16).
    Gemma3_1b,
    /// Phi-3: tiny's layer with q/k/v in one weight (`qkv_proj`) and gate/up in one
    /// (`gate_up_proj`), untied.
    TinyPhi3,
}

impl Shape {
    pub const ALL: [Shape; 19] = [
        Shape::Tiny,
        Shape::TinyTied,
        Shape::TinyHd128,
        Shape::SmallHd64,
        Shape::Smollm2_135m,
        Shape::Qwen25_05b,
        Shape::Llama32_1b,
        Shape::Llama3_8b,
        Shape::TinyQwen3,
        Shape::TinyQwen3Moe,
        Shape::TinyMixtral,
        Shape::Qwen3_30bA3b2l,
        Shape::TinyMistral,
        Shape::TinyMistralHd128,
        Shape::TinyQwen2,
        Shape::TinyGemma3,
        Shape::TinyGemma3Hd256,
        Shape::Gemma3_1b,
        Shape::TinyPhi3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Shape::Tiny => "tiny",
            Shape::TinyTied => "tiny-tied",
            Shape::TinyHd128 => "tiny-hd128",
            Shape::SmallHd64 => "small-hd64",
            Shape::Smollm2_135m => "smollm2-135m",
            Shape::Qwen25_05b => "qwen2.5-0.5b",
            Shape::Llama32_1b => "llama-3.2-1b",
            Shape::Llama3_8b => "llama-3-8b",
            Shape::TinyQwen3 => "tiny-qwen3",
            Shape::TinyQwen3Moe => "tiny-qwen3-moe",
            Shape::TinyMixtral => "tiny-mixtral",
            Shape::Qwen3_30bA3b2l => "qwen3-30b-a3b-2l",
            Shape::TinyMistral => "tiny-mistral",
            Shape::TinyMistralHd128 => "tiny-mistral-hd128",
            Shape::TinyQwen2 => "tiny-qwen2",
            Shape::TinyGemma3 => "tiny-gemma3",
            Shape::TinyGemma3Hd256 => "tiny-gemma3-hd256",
            Shape::Gemma3_1b => "gemma-3-1b",
            Shape::TinyPhi3 => "tiny-phi3",
        }
    }

    pub fn parse(s: &str) -> Option<Shape> {
        Shape::ALL.into_iter().find(|sh| sh.name() == s)
    }

    fn dims(self) -> Dims {
        let base = Dims {
            arch: named(LLAMA),
            experts: 0,
            top_k: 0,
            vocab: 384,
            hidden: 64,
            intermediate: 160,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            tied: false,
            rope_theta: 10000.0,
            llama3_scaling: false,
            rms_eps: 1e-5,
            max_pos: 2048,
            window: 0,
            window_from: 0,
        };
        match self {
            Shape::Tiny => base,
            Shape::TinyTied => Dims { tied: true, kv_heads: 1, ..base },
            Shape::TinyHd128 => Dims {
                hidden: 256,
                intermediate: 512,
                layers: 4,
                heads: 2,
                kv_heads: 1,
                head_dim: 128,
                rope_theta: 500000.0,
                ..base
            },
            Shape::SmallHd64 => Dims {
                hidden: 576,
                intermediate: 1536,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                tied: true,
                rope_theta: 100000.0,
                ..base
            },
            Shape::Smollm2_135m => Dims {
                vocab: 49152,
                hidden: 576,
                intermediate: 1536,
                layers: 30,
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
                tied: true,
                rope_theta: 100000.0,
                max_pos: 8192,
                ..base
            },
            Shape::Qwen25_05b => Dims {
                arch: named(QWEN2),
                vocab: 151936,
                hidden: 896,
                intermediate: 4864,
                layers: 24,
                heads: 14,
                kv_heads: 2,
                head_dim: 64,
                tied: true,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                max_pos: 32768,
                ..base
            },
            Shape::Llama32_1b => Dims {
                vocab: 128256,
                hidden: 2048,
                intermediate: 8192,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                head_dim: 64,
                tied: true,
                rope_theta: 500000.0,
                llama3_scaling: true,
                max_pos: 131072,
                ..base
            },
            Shape::Llama3_8b => Dims {
                vocab: 128256,
                hidden: 4096,
                intermediate: 14336,
                layers: 32,
                heads: 32,
                kv_heads: 8,
                head_dim: 128,
                rope_theta: 500000.0,
                max_pos: 8192,
                ..base
            },
            Shape::TinyQwen3 => {
                Dims { arch: named(QWEN3), head_dim: 32, tied: true, rope_theta: 1000000.0, rms_eps: 1e-6, ..base }
            }
            Shape::TinyQwen3Moe => Dims {
                arch: named(QWEN3_MOE),
                head_dim: 32,
                intermediate: 48,
                experts: 8,
                top_k: 2,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                ..base
            },
            Shape::TinyMixtral => {
                Dims { arch: named(MIXTRAL), intermediate: 96, experts: 4, top_k: 2, rope_theta: 1000000.0, ..base }
            }
            Shape::Qwen3_30bA3b2l => Dims {
                arch: named(QWEN3_MOE),
                vocab: 151936,
                hidden: 2048,
                intermediate: 768,
                experts: 128,
                top_k: 8,
                layers: 2,
                heads: 32,
                kv_heads: 4,
                head_dim: 128,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                max_pos: 40960,
                ..base
            },
            Shape::TinyMistral => Dims { arch: named(MISTRAL), window: 16, ..base },
            Shape::TinyMistralHd128 => Dims { arch: named(MISTRAL), window: 16, ..Shape::TinyHd128.dims() },
            Shape::TinyQwen2 => Dims {
                arch: named(QWEN2),
                tied: true,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                window: 16,
                window_from: 1,
                ..base
            },
            Shape::TinyGemma3 => Dims {
                arch: named(GEMMA3),
                head_dim: 32,
                tied: true,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                window: 16,
                ..base
            },
            Shape::TinyGemma3Hd256 => Dims {
                arch: named(GEMMA3),
                heads: 4,
                kv_heads: 1,
                head_dim: 256,
                tied: true,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                window: 16,
                ..base
            },
            Shape::Gemma3_1b => Dims {
                arch: named(GEMMA3),
                vocab: 262144,
                hidden: 1152,
                intermediate: 6912,
                layers: 26,
                heads: 4,
                kv_heads: 1,
                head_dim: 256,
                tied: true,
                rope_theta: 1000000.0,
                rms_eps: 1e-6,
                max_pos: 32768,
                window: 512,
                ..base
            },
            Shape::TinyPhi3 => Dims { arch: named(PHI3), max_pos: 4096, ..base },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Dims {
    /// Which family's config and tensor names the shape is written with.
    arch: &'static Family,
    /// Experts per MoE layer (0: a dense MLP); `intermediate` is then each expert's width.
    experts: usize,
    /// Experts per token.
    top_k: usize,
    vocab: usize,
    hidden: usize,
    intermediate: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    tied: bool,
    rope_theta: f32,
    llama3_scaling: bool,
    rms_eps: f32,
    max_pos: usize,
    /// Sliding window in keys (0: none): Mistral's on every layer, Qwen2's from `window_from`.
    window: usize,
    window_from: usize,
}

/// splitmix64: tiny, fast, and good enough for weights.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1), exact in f32 (24 bits).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / 16_777_216.0)
    }
    /// Mean 0, standard deviation 1, within +-2*sqrt(3): no outliers to blow up a tiny model.
    pub(crate) fn normalish(&mut self) -> f32 {
        let s = self.uniform() + self.uniform() + self.uniform() + self.uniform();
        (s - 2.0) * 1.732_050_8
    }
}

/// FNV-1a, to give each tensor name its own stream.
pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// How a tensor is filled: `mean + std * normalish`.
#[derive(Debug, Clone, Copy)]
struct Fill {
    mean: f32,
    std: f32,
}

fn tensor_plan(d: &Dims, dtype: DType) -> Vec<(TensorSpec, Fill)> {
    let (h, q, kv, inter) = (d.hidden, d.heads * d.head_dim, d.kv_heads * d.head_dim, d.intermediate);
    // Projections get std 1/sqrt(fan_in) (0.02-ish at real widths) rather than a flat 0.02: at
    // hidden 64 a flat 0.02 would make every attention score ~0 and attention a plain average,
    // which hides masking and position bugs. Norms sit around 1 with noise, so they matter too.
    let proj = |fan_in: usize| Fill { mean: 0.0, std: 1.0 / (fan_in as f32).sqrt() };
    // Gemma stores its norms as w - 1 (HF multiplies by 1 + w).
    let norm = Fill { mean: if d.arch.is(GEMMA3) { 0.0 } else { 1.0 }, std: 0.1 };
    let bias = Fill { mean: 0.0, std: 0.1 };
    let t = |name: String, shape: &[usize], fill: Fill| (TensorSpec::new(name, dtype, shape), fill);
    // Logits of std ~2 after the final norm: a clear argmax most of the time, not always. The
    // embedding gets the same scale because tied models use it as the lm_head; at std 1 their
    // logits reach std sqrt(hidden) and greedy decoding repeats one token for ever.
    let head = Fill { mean: 0.0, std: 2.0 / (h as f32).sqrt() };
    // Gemma scales the embedding by sqrt(hidden) into a residual stream whose blocks add
    // unit-RMS (normed) outputs: at the head's scale the token itself would win every step. Its
    // table gets 1/8 of it (rows of RMS 0.25 once scaled) and its final norm 1 + w = 8, so the
    // tied head's logits keep std ~2.
    let (embed, final_norm) = match d.arch.architecture {
        GEMMA3 => (Fill { mean: 0.0, std: head.std / 8.0 }, Fill { mean: 7.0, std: 0.1 }),
        _ => (head, norm),
    };
    let mut plan = vec![
        t("model.embed_tokens.weight".into(), &[d.vocab, h], embed),
        t("model.norm.weight".into(), &[h], final_norm),
    ];
    if !d.tied {
        plan.push(t("lm_head.weight".into(), &[d.vocab, h], head));
    }
    for i in 0..d.layers {
        let p = format!("model.layers.{i}");
        plan.push(t(format!("{p}.input_layernorm.weight"), &[h], norm));
        plan.push(t(format!("{p}.post_attention_layernorm.weight"), &[h], norm));
        if d.arch.is(GEMMA3) {
            plan.push(t(format!("{p}.pre_feedforward_layernorm.weight"), &[h], norm));
            plan.push(t(format!("{p}.post_feedforward_layernorm.weight"), &[h], norm));
        }
        if d.arch.is(PHI3) {
            plan.push(t(format!("{p}.self_attn.qkv_proj.weight"), &[q + 2 * kv, h], proj(h)));
        } else {
            plan.push(t(format!("{p}.self_attn.q_proj.weight"), &[q, h], proj(h)));
            plan.push(t(format!("{p}.self_attn.k_proj.weight"), &[kv, h], proj(h)));
            plan.push(t(format!("{p}.self_attn.v_proj.weight"), &[kv, h], proj(h)));
        }
        plan.push(t(format!("{p}.self_attn.o_proj.weight"), &[h, q], proj(q)));
        match d.arch {
            f if f.moe() => {
                // Router logits of std ~1.5: clear winners, not one expert for every token.
                let (block, [gate, up, down]) = f.moe_names();
                plan.push(t(
                    format!("{p}.{block}.gate.weight"),
                    &[d.experts, h],
                    Fill { mean: 0.0, std: 1.5 / (h as f32).sqrt() },
                ));
                for e in 0..d.experts {
                    plan.push(t(format!("{p}.{block}.experts.{e}.{gate}.weight"), &[inter, h], proj(h)));
                    plan.push(t(format!("{p}.{block}.experts.{e}.{up}.weight"), &[inter, h], proj(h)));
                    plan.push(t(format!("{p}.{block}.experts.{e}.{down}.weight"), &[h, inter], proj(inter)));
                }
            }
            f if f.is(PHI3) => {
                plan.push(t(format!("{p}.mlp.gate_up_proj.weight"), &[2 * inter, h], proj(h)));
                plan.push(t(format!("{p}.mlp.down_proj.weight"), &[h, inter], proj(inter)));
            }
            _ => {
                plan.push(t(format!("{p}.mlp.gate_proj.weight"), &[inter, h], proj(h)));
                plan.push(t(format!("{p}.mlp.up_proj.weight"), &[inter, h], proj(h)));
                plan.push(t(format!("{p}.mlp.down_proj.weight"), &[h, inter], proj(inter)));
            }
        }
        if d.arch.qk_norm() {
            plan.push(t(format!("{p}.self_attn.q_norm.weight"), &[d.head_dim], norm));
            plan.push(t(format!("{p}.self_attn.k_norm.weight"), &[d.head_dim], norm));
        }
        if d.arch.is(QWEN2) {
            plan.push(t(format!("{p}.self_attn.q_proj.bias"), &[q], bias));
            plan.push(t(format!("{p}.self_attn.k_proj.bias"), &[kv], bias));
            plan.push(t(format!("{p}.self_attn.v_proj.bias"), &[kv], bias));
        }
    }
    plan
}

/// What was written.
#[derive(Debug, Clone)]
pub struct RandomModelSummary {
    pub parameters: usize,
    pub bytes: u64,
}

/// `gen-model` as both `cargo xtask gen-model` and `tandem gen-model` run it: names parsed
/// (errors list what is known), the model written, and a one-line summary returned.
pub fn gen_model(shape: &str, seed: u64, dtype: &str, out: &Path) -> std::result::Result<String, String> {
    let s = Shape::parse(shape).ok_or_else(|| {
        let known: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        format!("unknown shape `{shape}` (known: {})", known.join(", "))
    })?;
    // fp8: the projections in FP8 with 128 x 128 blocks, the rest bf16 (what Qwen3-*-FP8
    // ships); fp8-f32: 32 x 32 blocks (a tiny model gets several) and the rest f32 (the golden).
    let (dt, fp8) = match dtype {
        "bf16" => (DType::BF16, None),
        "f32" => (DType::F32, None),
        "fp8" => (DType::BF16, Some([128, 128])),
        "fp8-f32" => (DType::F32, Some([32, 32])),
        other => return Err(format!("unknown dtype `{other}` (bf16, f32, fp8 or fp8-f32)")),
    };
    let start = std::time::Instant::now();
    let sum = write_random_model(out, s, seed, dt)
        .map_err(|e| format!("writing a random {shape} model to {}: {e}", out.display()))?;
    if let Some(block) = fp8 {
        crate::fp8::quantize_dir(out, block)
            .map_err(|e| format!("writing {shape}'s projections in FP8 in {}: {e}", out.display()))?;
    }
    Ok(format!(
        "{shape} seed {seed} {dtype}: {} parameters, {:.1} MB, {:.1} s",
        sum.parameters,
        sum.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    ))
}

/// Writes a random model of `shape` into `dir` (created if needed).
pub fn write_random_model(dir: &Path, shape: Shape, seed: u64, dtype: DType) -> Result<RandomModelSummary> {
    let d = shape.dims();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let plan = tensor_plan(&d, dtype);
    let st_path = dir.join("model.safetensors");
    let file = std::fs::File::create(&st_path).map_err(|e| Error::io(&st_path, e))?;
    let mut w = SafetensorsWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        &st_path,
        plan.iter().map(|(s, _)| s.clone()).collect(),
    )?;
    let order: Vec<TensorSpec> = w.specs().to_vec();
    let mut parameters = 0;
    let mut chunk = Vec::with_capacity(1 << 16);
    for spec in &order {
        let fill = plan.iter().find(|(s, _)| s.name == spec.name).expect("spec from the plan").1;
        let mut rng = SplitMix64(seed ^ fnv1a(&spec.name));
        let mut left = spec.numel();
        while left > 0 {
            let n = left.min(1 << 16);
            chunk.clear();
            chunk.extend((0..n).map(|_| fill.mean + fill.std * rng.normalish()));
            w.push(&chunk)?;
            left -= n;
        }
        parameters += spec.numel();
    }
    w.finish()?;
    write_json(&dir.join("config.json"), &config_json(shape, &d, dtype))?;
    let tok = RandomTokenizer::build(d.vocab).map_err(|m| Error::config(dir.join("tokenizer.json"), m))?;
    write_json(
        &dir.join("tokenizer.json"),
        &bpe_tokenizer_json(&tok.vocab, &tok.merges, &tok.added, PreTokenizer::ByteLevel),
    )?;
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config_json(&d))?;
    write_json(
        &dir.join("generation_config.json"),
        &json!({ "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": EOS }),
    )?;
    let bytes = std::fs::metadata(&st_path).map_err(|e| Error::io(&st_path, e))?.len();
    Ok(RandomModelSummary { parameters, bytes })
}

const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
const BOS: u32 = 1;
const EOS: u32 = 2;
const CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
/// The Qwen3 shapes' template: ChatML with Qwen3's `enable_thinking` switch (false writes an
/// empty think block after the generation prompt, as Qwen3's own template does).
const QWEN3_CHAT_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}{% endif %}";

/// The Gemma 3 shape's template, written in the manner of Gemma 3's own (the constructs its
/// real one uses, for our template engine to get right): the BOS token first, a system message
/// folded into the first user turn, roles that must alternate (`raise_exception` otherwise),
/// `assistant` written `model`, content trimmed, a string or a list of text parts.
const GEMMA3_CHAT_TEMPLATE: &str = "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}{%- else -%}{%- set first_prefix = '' -%}{%- set turns = messages -%}{%- endif -%}{%- for message in turns -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}{{ '<start_of_turn>' + role + '\n' + (first_prefix if loop.first else '') }}{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}{%- for part in message['content'] -%}{%- if part['type'] == 'text' -%}{{ part['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

fn config_json(shape: Shape, d: &Dims, dtype: DType) -> serde_json::Value {
    let (arch, model_type) = d.arch.hf_names();
    let rope_scaling = if d.llama3_scaling {
        json!({ "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3" })
    } else {
        serde_json::Value::Null
    };
    let mut c = json!({
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": d.vocab,
        "hidden_size": d.hidden,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": d.layers,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": d.rms_eps.to_string().parse::<f64>().unwrap_or(d.rms_eps as f64),
        "rope_theta": d.rope_theta as f64,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": d.max_pos,
        "tie_word_embeddings": d.tied,
        "attention_bias": d.arch.is(QWEN2),
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": EOS,
        "torch_dtype": match dtype { DType::F32 => "float32", DType::BF16 => "bfloat16", DType::F16 => "float16" },
        "tandem_random_shape": shape.name(),
    });
    match d.arch.architecture {
        QWEN2 | QWEN3 | QWEN3_MOE if d.window > 0 => {
            c["use_sliding_window"] = json!(true);
            c["sliding_window"] = json!(d.window);
            c["max_window_layers"] = json!(d.window_from);
        }
        QWEN2 | QWEN3 | QWEN3_MOE => {
            c["use_sliding_window"] = json!(false);
            c["sliding_window"] = serde_json::Value::Null;
        }
        MISTRAL => c["sliding_window"] = if d.window > 0 { json!(d.window) } else { serde_json::Value::Null },
        LLAMA => c["mlp_bias"] = json!(false),
        GEMMA3 => {
            // The format of Gemma 3's released config.json files (transformers 5 reads it too).
            c["hidden_activation"] = json!("gelu_pytorch_tanh");
            c.as_object_mut().map(|o| o.remove("hidden_act"));
            c["sliding_window"] = json!(d.window);
            c["rope_local_base_freq"] = json!(10000.0);
            if matches!(shape, Shape::TinyGemma3 | Shape::TinyGemma3Hd256) {
                // Each setting apart from its default, so the golden tells it missing.
                c["query_pre_attn_scalar"] = json!(24);
                c["layer_types"] = json!(["sliding_attention", "full_attention"]);
                c["rope_scaling"] = json!({ "rope_type": "linear", "factor": 8.0 });
            } else {
                c["query_pre_attn_scalar"] = json!(d.head_dim);
                c["sliding_window_pattern"] = json!(6);
            }
            c["final_logit_softcapping"] = serde_json::Value::Null;
            c["attn_logit_softcapping"] = serde_json::Value::Null;
        }
        MIXTRAL => {
            c["sliding_window"] = serde_json::Value::Null;
            c["num_local_experts"] = json!(d.experts);
            c["num_experts_per_tok"] = json!(d.top_k);
            c["router_aux_loss_coef"] = json!(0.0);
        }
        PHI3 => {
            c["sliding_window"] = if d.window > 0 { json!(d.window) } else { serde_json::Value::Null };
            c["original_max_position_embeddings"] = json!(d.max_pos);
        }
        _ => {}
    }
    if d.arch.is(QWEN3_MOE) {
        c["num_experts"] = json!(d.experts);
        c["num_experts_per_tok"] = json!(d.top_k);
        c["moe_intermediate_size"] = json!(d.intermediate);
        c["norm_topk_prob"] = json!(true);
        c["decoder_sparse_step"] = json!(1);
        c["mlp_only_layers"] = json!([]);
        c["router_aux_loss_coef"] = json!(0.0);
    }
    c
}

fn tokenizer_config_json(d: &Dims) -> serde_json::Value {
    let mut decoder = serde_json::Map::new();
    for (id, s) in SPECIALS.iter().enumerate() {
        decoder.insert(
            id.to_string(),
            json!({ "content": s, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true }),
        );
    }
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "bos_token": SPECIALS[BOS as usize],
        "chat_template": match d.arch.architecture {
            QWEN3 | QWEN3_MOE => QWEN3_CHAT_TEMPLATE,
            GEMMA3 => GEMMA3_CHAT_TEMPLATE,
            _ => CHAT_TEMPLATE,
        },
        "clean_up_tokenization_spaces": false,
        "eos_token": SPECIALS[EOS as usize],
        "model_max_length": d.max_pos,
        "pad_token": SPECIALS[EOS as usize],
        "tokenizer_class": "GPT2Tokenizer",
        "unk_token": SPECIALS[0],
        "vocab_size": d.vocab,
    })
}

/// Text the small BPE is trained on: enough English, digits and code for a few hundred merges.
const CORPUS: &str = "The quick brown fox jumps over the lazy dog. The capital of France is Paris, and the capital \
of Germany is Berlin. What is the capital of Italy? It is Rome. Hello, world! How are you today? I am fine, \
thank you. The weather is nice and the sun is shining. We are going to the park in the morning and to the \
market in the evening. There are 12 apples and 345 oranges on the table. Please answer the question in one \
sentence. The model reads the text and writes the answer. fn main() { println!(\"hello\"); } def add(a, b): \
return a + b. Once upon a time there was a little girl who lived in a village near the forest. Whenever she \
went out, the little girl wore a red riding cloak, so everyone in the village called her Little Red Riding Hood. \
The engine schedules requests, runs the model, and returns the tokens to the user. Thank you for reading this \
text, and have a good day.";

struct RandomTokenizer {
    vocab: Vec<String>,
    merges: Vec<(String, String)>,
    added: Vec<AddedToken>,
}

impl RandomTokenizer {
    /// Special tokens at ids 0..3 (as SmolLM), the 256 byte tokens, merges learnt from
    /// [`CORPUS`], then `<|reserved_N|>` fillers so every id of a large vocabulary decodes.
    fn build(vocab_size: usize) -> std::result::Result<Self, String> {
        let base = SPECIALS.len() + 256;
        if vocab_size < base {
            return Err(format!("vocab size {vocab_size} is below the {base} special and byte tokens"));
        }
        let mut vocab: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
        vocab.extend(byte_level_alphabet().iter().map(|c| c.to_string()));
        let mut known: std::collections::HashSet<String> = vocab.iter().cloned().collect();
        let mut words: std::collections::BTreeMap<Vec<String>, usize> = std::collections::BTreeMap::new();
        for w in split_words(CORPUS) {
            let symbols = crate::tokenizer_json::to_byte_level(&w).chars().map(|c| c.to_string()).collect();
            *words.entry(symbols).or_default() += 1;
        }
        let mut merges = vec![];
        while vocab.len() < vocab_size {
            let mut pairs: std::collections::BTreeMap<(&str, &str), usize> = std::collections::BTreeMap::new();
            for (w, n) in &words {
                for p in w.windows(2) {
                    *pairs.entry((p[0].as_str(), p[1].as_str())).or_default() += n;
                }
            }
            // Most frequent pair; ties go to the first in sorted order, so training is deterministic.
            let Some(((a, b), count)) =
                pairs.into_iter().fold(None, |best: Option<((&str, &str), usize)>, (p, n)| match best {
                    Some((_, bn)) if bn >= n => best,
                    _ => Some((p, n)),
                })
            else {
                break;
            };
            if count < 2 {
                break;
            }
            let (a, b) = (a.to_string(), b.to_string());
            let joined = format!("{a}{b}");
            words = words.into_iter().fold(std::collections::BTreeMap::new(), |mut acc, (w, n)| {
                let mut out = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                        out.push(joined.clone());
                        i += 2;
                    } else {
                        out.push(w[i].clone());
                        i += 1;
                    }
                }
                *acc.entry(out).or_default() += n;
                acc
            });
            if known.insert(joined.clone()) {
                vocab.push(joined);
            }
            merges.push((a, b));
        }
        let mut n = 0;
        while vocab.len() < vocab_size {
            vocab.push(format!("<|reserved_{n}|>"));
            n += 1;
        }
        let added = SPECIALS
            .iter()
            .enumerate()
            .map(|(id, s)| AddedToken { id: id as u32, content: s.to_string(), special: true })
            .collect();
        let t = RandomTokenizer { vocab, merges, added };
        check_bpe(&t.vocab, &t.merges, &t.added)?;
        Ok(t)
    }
}

/// Rough GPT-2-like words: an optional leading space, then a run of letters/digits or a run of
/// other non-space characters.
fn split_words(text: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let class = |c: char| {
        if c.is_whitespace() {
            0
        } else if c.is_alphanumeric() {
            1
        } else {
            2
        }
    };
    for c in text.chars() {
        let joins = match cur.chars().last() {
            None => true,
            // A single space joins the word after it, as in GPT-2.
            Some(l) if class(l) == 0 => cur.chars().count() == 1 && class(c) != 0,
            Some(l) => class(l) == class(c),
        };
        if !joins {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::weights::Weights;
    use tandem_core::ModelConfig;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("tandem-random-{}-{name}", std::process::id()))
    }

    #[test]
    fn tiny_loads_in_core_and_is_reproducible() {
        let a = tmp("a");
        let s = write_random_model(&a, Shape::Tiny, 1, DType::BF16).unwrap();
        let cfg = ModelConfig::from_file(&a.join("config.json")).unwrap();
        assert_eq!(
            (
                cfg.vocab_size,
                cfg.hidden_size,
                cfg.num_hidden_layers,
                cfg.num_attention_heads,
                cfg.num_key_value_heads,
                cfg.head_dim
            ),
            (384, 64, 2, 4, 2, 16)
        );
        assert!(!cfg.tie_word_embeddings);
        let w = Weights::open(&a).unwrap();
        let q = w.get("model.layers.1.self_attn.q_proj.weight", &[64, 64]).unwrap().to_f32();
        let mean = q.iter().sum::<f32>() / q.len() as f32;
        let std = (q.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / q.len() as f32).sqrt();
        assert!(mean.abs() < 0.01 && (std - 0.125).abs() < 0.01, "q_proj mean {mean} std {std}");
        let norm = w.get("model.norm.weight", &[64]).unwrap().to_f32();
        assert!(norm.iter().all(|x| (0.6..1.4).contains(x)), "{norm:?}");
        assert!(w.get("lm_head.weight", &[384, 64]).is_ok());
        assert_eq!(s.parameters, 384 * 64 * 2 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 32 * 64 * 2 + 3 * 160 * 64));

        // Same seed: same bytes. Another seed: other weights.
        let b = tmp("b");
        write_random_model(&b, Shape::Tiny, 1, DType::BF16).unwrap();
        for f in
            ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"]
        {
            assert_eq!(std::fs::read(a.join(f)).unwrap(), std::fs::read(b.join(f)).unwrap(), "{f}");
        }
        let c = tmp("c");
        write_random_model(&c, Shape::Tiny, 2, DType::BF16).unwrap();
        assert_ne!(
            std::fs::read(a.join("model.safetensors")).unwrap(),
            std::fs::read(c.join("model.safetensors")).unwrap()
        );
    }

    /// Golden data (HF logits for the tiny model) is computed once and committed; it stays valid
    /// only while these bytes do. Changing the generator on purpose means regenerating that data
    /// and updating these digests.
    #[test]
    fn tiny_seed_1_bytes_are_pinned() {
        let d = tmp("pinned");
        write_random_model(&d, Shape::Tiny, 1, DType::BF16).unwrap();
        let digest = |f: &str| crate::fetch::sha256_file(&d.join(f)).unwrap();
        assert_eq!(digest("model.safetensors"), "4c11d44245368865ec5fe095425e043dbb9c32526f403864745d8bb54940639b");
        assert_eq!(digest("config.json"), "b9afe4b523b927f24a46c3d83e611d9c72a0f1b9bfd0419e3dcc902b9b098155");
        assert_eq!(digest("tokenizer.json"), "4b7bf1d9ffdf1c709a6f97b6521a7354ba8feb4334de1bb9462e08dfa1b1ba12");
    }

    #[test]
    fn tiny_tied_f32_and_tokenizer() {
        let d = tmp("tied");
        write_random_model(&d, Shape::TinyTied, 7, DType::F32).unwrap();
        let cfg = ModelConfig::from_file(&d.join("config.json")).unwrap();
        assert!(cfg.tie_word_embeddings);
        assert_eq!(cfg.num_attention_heads / cfg.num_key_value_heads, 4);
        assert_eq!(cfg.dtype.as_deref(), Some("float32"));
        let w = Weights::open(&d).unwrap();
        assert!(!w.contains("lm_head.weight"));
        assert_eq!(w.get("model.embed_tokens.weight", &[384, 64]).unwrap().dtype, DType::F32);

        let tok = tokenizers::Tokenizer::from_file(d.join("tokenizer.json")).unwrap();
        assert_eq!(tok.get_vocab_size(true), 384);
        let text = "<|im_start|>user\nThe capital of France?<|im_end|>";
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(enc.get_ids()[0], 1);
        assert_eq!(*enc.get_ids().last().unwrap(), 2);
        // Merges were learnt: fewer tokens than bytes.
        assert!(enc.get_ids().len() < text.len() / 2, "{:?}", enc.get_ids());
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
        let tc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(d.join("tokenizer_config.json")).unwrap()).unwrap();
        assert!(tc["chat_template"].as_str().unwrap().contains("<|im_start|>"));
        let core_tok = tandem_core::tokenizer::Tokenizer::from_dir(&d).unwrap();
        let msgs = [json!({"role": "user", "content": "Hi"})];
        assert_eq!(
            core_tok.apply_chat_template(&msgs, true).unwrap(),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn big_shapes_have_the_right_config_and_tensors() {
        // Only the plan and config (writing 8B parameters has no place in a unit test).
        for shape in Shape::ALL {
            assert_eq!(Shape::parse(shape.name()), Some(shape));
            let d = shape.dims();
            let cfg = ModelConfig::from_json(&config_json(shape, &d, DType::BF16).to_string()).unwrap();
            assert_eq!(cfg.head_dim, d.head_dim, "{}", shape.name());
            let plan = tensor_plan(&d, DType::BF16);
            assert_eq!(
                plan.iter().any(|(s, _)| s.name.ends_with("q_proj.bias")),
                cfg.attention_bias,
                "{}",
                shape.name()
            );
            assert_eq!(plan.iter().any(|(s, _)| s.name == "lm_head.weight"), !cfg.tie_word_embeddings);
        }
        let d = Shape::Llama32_1b.dims();
        let cfg = ModelConfig::from_json(&config_json(Shape::Llama32_1b, &d, DType::BF16).to_string()).unwrap();
        assert!(matches!(cfg.rope_scaling, tandem_core::config::RopeScaling::Llama3 { .. }));
        let params: usize = tensor_plan(&Shape::Smollm2_135m.dims(), DType::BF16).iter().map(|(s, _)| s.numel()).sum();
        assert_eq!(params, 134_515_008, "SmolLM2-135M has 134,515,008 parameters");
        assert!(Shape::parse("gpt-5").is_none());
    }

    #[test]
    fn big_vocab_tokenizer_fills_with_reserved() {
        let t = RandomTokenizer::build(49152).unwrap();
        assert_eq!(t.vocab.len(), 49152);
        assert!(t.merges.len() > 100, "{} merges", t.merges.len());
        let first_reserved = t.vocab.iter().position(|v| v == "<|reserved_0|>").unwrap();
        assert_eq!(t.vocab[49151], format!("<|reserved_{}|>", 49151 - first_reserved));
        assert!(first_reserved > 259 + 100);
        assert!(RandomTokenizer::build(100).is_err());
    }

    #[test]
    fn normalish_has_unit_variance() {
        let mut r = SplitMix64(42);
        let xs: Vec<f32> = (0..100_000).map(|_| r.normalish()).collect();
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.02 && (var - 1.0).abs() < 0.02, "mean {mean} var {var}");
        // A fixed seed gives fixed values on every platform.
        assert_eq!(SplitMix64(0).next_u64(), 0xe220_a839_7b1d_cdaf);
    }
}
