//! Whole-model checks against golden data from HF transformers (tests/golden/*.json, written
//! by tests/hf_golden.py).
//!
//! The rule is vLLM's `check_logprobs_close`: greedy ids must be equal up to the first position
//! where they differ; there, each side's token must be in the other's top-5. On top of that,
//! while the ids agree, our log-probability of each of HF's top-5 tokens must be within
//! `logprob_tol` of HF's: a slightly wrong model (a norm off by a little) fails here even when
//! its argmax survives.

use serde::Deserialize;
use tandem_core::model::ModelRunner;

#[derive(Debug, Clone, Deserialize)]
pub struct GoldenFile {
    pub model: String,
    pub cases: Vec<GoldenCase>,
    #[serde(default)]
    pub tokenize: Vec<TokenizeCase>,
    #[serde(default)]
    pub chat_render: Vec<ChatRenderCase>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GoldenCase {
    pub kind: String,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<serde_json::Value>>,
    pub prompt_ids: Vec<u32>,
    pub greedy: Vec<u32>,
    /// Per step: HF's five best `[id, logprob]`.
    pub top5: Vec<Vec<(u32, f64)>>,
    /// Per step: HF's best logit minus its second best.
    pub gap: Vec<f64>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeCase {
    pub text: String,
    pub ids: Vec<u32>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRenderCase {
    pub messages: Vec<serde_json::Value>,
    /// The template variables HF was given (`chat_template_kwargs`, e.g. `enable_thinking`).
    #[serde(default)]
    pub kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    pub text: String,
}

impl GoldenFile {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// How one case went.
#[derive(Debug)]
pub struct CaseOutcome {
    pub ours: Vec<u32>,
    /// First position where the greedy ids differ, if any.
    pub diverged_at: Option<usize>,
    /// Largest |our logprob − HF logprob| over HF's top-5 while the ids agreed.
    pub max_logprob_err: f64,
}

fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = logits.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln() + max;
    logits.iter().map(|&x| x as f64 - lse).collect()
}

fn top5(lp: &[f64]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..lp.len() as u32).collect();
    idx.sort_by(|&a, &b| lp[b as usize].total_cmp(&lp[a as usize]).then(a.cmp(&b)));
    idx.truncate(5);
    idx
}

/// Runs one golden case on `runner` and applies the rule. Err says what failed and where.
pub fn check_case(runner: &mut dyn ModelRunner, case: &GoldenCase, logprob_tol: f64) -> Result<CaseOutcome, String> {
    check_case_with(runner, None, case, logprob_tol)
}

/// As [`check_case`], the sequence using LoRA slot `adapter` where given.
pub fn check_case_with(
    runner: &mut dyn ModelRunner,
    adapter: Option<u32>,
    case: &GoldenCase,
    logprob_tol: f64,
) -> Result<CaseOutcome, String> {
    let steps =
        tandem_core::greedy::generate_with(runner, adapter, &case.prompt_ids, case.greedy.len(), &[], true, |_| {})
            .map_err(|e| e.to_string())?;
    let ours: Vec<u32> = steps.iter().map(|s| s.id).collect();
    let mut max_err: f64 = 0.0;
    let mut diverged_at = None;
    for (i, step) in steps.iter().enumerate() {
        let lp = log_softmax(&step.logits);
        let theirs_top: Vec<u32> = case.top5[i].iter().map(|p| p.0).collect();
        if ours[i] != case.greedy[i] {
            let our_top = top5(&lp);
            if !theirs_top.contains(&ours[i]) || !our_top.contains(&case.greedy[i]) {
                return Err(format!(
                    "step {i}: we chose {} (HF top-5 {theirs_top:?}), HF chose {} (our top-5 {our_top:?}); HF gap {:.2e}",
                    ours[i], case.greedy[i], case.gap[i]
                ));
            }
            diverged_at = Some(i);
            break;
        }
        for &(id, hf_lp) in &case.top5[i] {
            let err = (lp[id as usize] - hf_lp).abs();
            max_err = max_err.max(err);
            if err > logprob_tol {
                return Err(format!(
                    "step {i}: token {id}: our logprob {:.6}, HF {hf_lp:.6} (|diff| {err:.2e} > {logprob_tol:.0e})",
                    lp[id as usize]
                ));
            }
        }
    }
    Ok(CaseOutcome { ours, diverged_at, max_logprob_err: max_err })
}

/// The golden files shipped in the repository (`tests/golden`): `$TANDEM_GOLDEN_DIR` where set
/// (a test binary run from a copy of the tree at another path, as gpu/check.sh runs the CUDA
/// tests on the GPU machine), else those of the tree this crate was built in.
pub fn golden_dir() -> std::path::PathBuf {
    match std::env::var_os("TANDEM_GOLDEN_DIR").filter(|d| !d.is_empty()) {
        Some(d) => std::path::PathBuf::from(d),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden"),
    }
}

/// A seeded random model written by our own tool (the same call `cargo xtask gen-model`
/// makes, so it matches what `tests/make_golden.sh` gave HF transformers). One per process.
pub fn random_model(shape: &str, seed: u64, dtype: tandem_core::DType) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("tandem-golden-{}-{shape}-{seed}-{}", std::process::id(), dtype.name()));
    if !dir.join("config.json").exists() {
        // `<shape>-fp8`: the shape with its projections in FP8, as `gen-model --dtype fp8-f32`.
        let (base, fp8) = shape.strip_suffix("-fp8").map_or((shape, false), |b| (b, true));
        let s = tandem_model_files::random_model::Shape::parse(base).unwrap_or_else(|| panic!("unknown shape {shape}"));
        tandem_model_files::random_model::write_random_model(&dir, s, seed, dtype).expect("writing the random model");
        if fp8 {
            tandem_model_files::fp8::quantize_dir(&dir, [32, 32]).expect("writing the projections in FP8");
        }
    }
    dir
}

/// The seeded random models the golden files were made from (tests/make_golden.sh): shape,
/// seed, dtype.
pub const GOLDEN_MODELS: &[(&str, u64, tandem_core::DType)] = {
    use tandem_core::DType::{BF16, F32};
    &[
        ("tiny", 1, F32),
        ("tiny-tied", 2, BF16),
        ("tiny-qwen3", 3, F32),
        ("tiny-qwen3-moe", 4, F32),
        ("tiny-mixtral", 5, F32),
        ("tiny-mistral", 6, F32),
        ("tiny-qwen2", 7, F32),
        ("tiny-gemma3", 8, F32),
        ("tiny-fp8", 9, F32),
        ("tiny-phi3", 10, F32),
    ]
};

/// The random model golden file `name` was made from ([`GOLDEN_MODELS`]), written once.
pub fn golden_model(name: &str) -> std::path::PathBuf {
    let &(_, seed, dtype) =
        GOLDEN_MODELS.iter().find(|m| m.0 == name).unwrap_or_else(|| panic!("no golden model {name}"));
    random_model(name, seed, dtype)
}

/// One `#[test]` per golden model of [`GOLDEN_MODELS`], each calling `$check(name)` (a backend's
/// golden test file says how it checks one model).
#[macro_export]
macro_rules! golden_tests {
    ($check:ident) => {
        /// Llama, untied, GQA 2.
        #[test]
        fn tiny_untied_gqa2_f32() {
            $check("tiny");
        }
        /// Tied embeddings, one KV head, bf16 weights.
        #[test]
        fn tiny_tied_bf16() {
            $check("tiny-tied");
        }
        /// Qwen3: per-head q/k norms, head_dim 32 with hidden 64 and 4 heads, tied, eps 1e-6.
        #[test]
        fn tiny_qwen3_f32() {
            $check("tiny-qwen3");
        }
        /// Qwen3-MoE: 8 experts of width 48, top 2, norm_topk_prob; Qwen3's attention.
        #[test]
        fn tiny_qwen3_moe_f32() {
            $check("tiny-qwen3-moe");
        }
        /// Mixtral: 4 experts (block_sparse_moe, w1/w3/w2) of width 96, top 2, renormalised.
        #[test]
        fn tiny_mixtral_f32() {
            $check("tiny-mixtral");
        }
        /// Mistral with a sliding window of 16 keys on every layer, shorter than the golden
        /// prompts (up to 40 tokens and 12 more generated): HF's sliding-window mask.
        #[test]
        fn tiny_mistral_window_f32() {
            $check("tiny-mistral");
        }
        /// Qwen2: q/k/v biases, tied; `use_sliding_window` with `max_window_layers` 1: layer 0
        /// full, layer 1 windowed (16 keys).
        #[test]
        fn tiny_qwen2_window_f32() {
            $check("tiny-qwen2");
        }
        /// Gemma 3: a sliding layer (16 keys, rope base 1e4) and a global one (1e6, linear 8),
        /// GeGLU, sandwich norms of 1 + w, the scaled embedding, `query_pre_attn_scalar` 24, tied.
        #[test]
        fn tiny_gemma3_f32() {
            $check("tiny-gemma3");
        }
        /// FP8 projections (e4m3, 32 x 32 block scales: `weight_scale_inv`, Qwen3-*-FP8's
        /// layout) dequantized at load; HF transformers dequantizes them the same way on a CPU.
        #[test]
        fn tiny_fp8_blocks() {
            $check("tiny-fp8");
        }
        /// Phi-3: q/k/v and gate/up each one weight in the checkpoint, split at load.
        #[test]
        fn tiny_phi3_f32() {
            $check("tiny-phi3");
        }
    };
}

/// The converted default model: `$TANDEM_SMOLLM2_DIR`, else `models/SmolLM2-135M-Instruct`.
/// None (and a printed, counted `SKIPPED:` line) when absent, unless `TANDEM_REQUIRE_MODEL`
/// is set, in which case absence is a failure.
pub fn smollm2_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("TANDEM_SMOLLM2_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct"));
    if dir.join("config.json").exists() {
        return Some(dir);
    }
    if std::env::var_os("TANDEM_REQUIRE_MODEL").is_some() {
        panic!("TANDEM_REQUIRE_MODEL is set but {} holds no model (run `cargo xtask fetch-model`)", dir.display());
    }
    tandem_core::skip::note(format!(
        "SmolLM2 golden test: no model at {} (run `cargo xtask fetch-model`)",
        dir.display()
    ));
    None
}

/// Loads `model_dir` on a backend and checks every case of `golden` against it.
/// Returns one line per case for the test log.
pub fn check_model<B: tandem_core::Backend>(
    backend: B,
    model_dir: &std::path::Path,
    golden: &GoldenFile,
    logprob_tol: f64,
) -> Result<Vec<String>, String> {
    let cfg = tandem_core::ModelConfig::from_file(&model_dir.join("config.json")).map_err(|e| e.to_string())?;
    let weights = tandem_core::weights::Weights::open(model_dir).map_err(|e| e.to_string())?;
    check_weights(backend, cfg, &weights, golden, logprob_tol)
}

/// [`check_model`] for weights already opened (and perhaps altered by a test).
pub fn check_weights<B: tandem_core::Backend>(
    backend: B,
    cfg: tandem_core::ModelConfig,
    weights: &tandem_core::weights::Weights,
    golden: &GoldenFile,
    logprob_tol: f64,
) -> Result<Vec<String>, String> {
    let longest = golden.cases.iter().map(|c| c.prompt_ids.len() + c.greedy.len()).max().unwrap_or(1);
    // 16-token chunks: longer prompts are prefilled in pieces over their own cached prefix.
    let opts = tandem_core::model::LoadOptions {
        max_batch_tokens: 16,
        max_seqs: 4,
        num_kv_blocks: longest.div_ceil(16) + 1,
        block_size: 16,
        ..Default::default()
    };
    let mut model = tandem_core::Model::from_weights(backend, cfg, weights, opts).map_err(|e| e.to_string())?;
    let mut lines = vec![];
    for (i, case) in golden.cases.iter().enumerate() {
        let o = check_case(&mut model, case, logprob_tol)
            .map_err(|e| format!("{} case {i} ({} prompt tokens): {e}", golden.model, case.prompt_ids.len()))?;
        lines.push(format!(
            "{} case {i}: {} prompt tokens, {} steps, diverged at {:?}, max |Δlogprob| {:.2e}",
            golden.model,
            case.prompt_ids.len(),
            o.ours.len(),
            o.diverged_at,
            o.max_logprob_err
        ));
    }
    Ok(lines)
}

/// A test body: checks `tests/golden/<name>.json` against `dir` on `backend`, prints one line
/// per case, panics with the first failure.
pub fn assert_golden<B: tandem_core::Backend>(backend: B, name: &str, dir: &std::path::Path, logprob_tol: f64) {
    let g = GoldenFile::load(&golden_dir().join(format!("{name}.json"))).unwrap_or_else(|e| panic!("{e}"));
    match check_model(backend, dir, &g, logprob_tol) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => panic!("{e}"),
    }
}
