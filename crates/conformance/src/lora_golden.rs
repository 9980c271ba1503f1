//! LoRA adapters against HF transformers + peft (tests/golden/lora, made by
//! tests/lora_golden.py): each adapter, made by peft itself with B drawn nonzero, over the
//! seeded random model it was made for, must give peft's greedy ids by the golden rule
//! ([`crate::golden::check_case_with`]), and the base model's rows on the same model must stay
//! the base model's.

use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::LoadOptions;
use tandem_core::{Backend, Model};

use crate::golden::{check_case_with, golden_dir, golden_model, GoldenCase};

/// The adapters of tests/golden/lora: adapter name, the golden model it was made over.
pub const LORA_GOLDEN: &[(&str, &str)] = &[
    // Every projection, r 8, alpha 16, target_modules as a list.
    ("tiny-all", "tiny"),
    // rsLoRA, r 4, target_modules as a regular expression (q, v, down).
    ("tiny-rs", "tiny"),
    // Phi-3's fused qkv_proj and gate_up_proj: one A, B split by rows.
    ("tiny-phi3-fused", "tiny-phi3"),
    // Qwen3: the updates land before the per-head q/k norm.
    ("tiny-qwen3-attn", "tiny-qwen3"),
    // Gemma 3: o and down updated before the sandwich norms.
    ("tiny-gemma3-all", "tiny-gemma3"),
];

/// One golden file of tests/golden/lora.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct LoraGolden {
    pub cases: Vec<LoraCase>,
}

/// A golden case with the base model's own greedy ids beside the adapter's.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct LoraCase {
    #[serde(flatten)]
    pub case: GoldenCase,
    pub base_greedy: Vec<u32>,
}

/// The directory of adapter `name`.
pub fn adapter_dir(name: &str) -> std::path::PathBuf {
    golden_dir().join("lora").join(name)
}

/// Load options that fit every golden case: 16-token chunks, a few sequences.
pub fn lora_load_options(longest: usize, seqs: usize) -> LoadOptions {
    LoadOptions {
        max_batch_tokens: 16,
        max_seqs: seqs,
        num_kv_blocks: seqs * (longest.div_ceil(16) + 1),
        block_size: 16,
        ..Default::default()
    }
}

/// Checks adapter `name` on `backend` (in slot 1 of 2, slot 0 empty): its cases by the golden
/// rule, the base model's rows equal to HF's base ids, and the adapter changing some answer.
/// Returns a line a case.
pub fn check_lora<B: Backend>(backend: B, name: &str, logprob_tol: f64) -> Result<Vec<String>, String> {
    let &(_, model_name) = LORA_GOLDEN.iter().find(|g| g.0 == name).ok_or_else(|| format!("no LoRA golden {name}"))?;
    let path = golden_dir().join("lora").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let golden: LoraGolden = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = golden_model(model_name);
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).map_err(|e| e.to_string())?;
    let w = tandem_core::weights::Weights::open(&dir).map_err(|e| e.to_string())?;
    let longest = golden.cases.iter().map(|c| c.case.prompt_ids.len() + c.case.greedy.len()).max().unwrap_or(1);
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let adapter = LoraAdapter::load(&adapter_dir(name), &cfg).map_err(|e| e.to_string())?;
    let mut model = Model::from_weights_lora(backend, cfg, &w, lora_load_options(longest, 1), Some(limits))
        .map_err(|e| e.to_string())?;
    model.load_lora(1, &adapter).map_err(|e| e.to_string())?;
    let mut lines = vec![];
    let mut changed = 0;
    for (i, c) in golden.cases.iter().enumerate() {
        let o = check_case_with(&mut model, Some(1), &c.case, logprob_tol)
            .map_err(|e| format!("{name} case {i} ({} prompt tokens): {e}", c.case.prompt_ids.len()))?;
        let base =
            tandem_core::greedy::generate(&mut model, &c.case.prompt_ids, c.base_greedy.len(), &[], false, |_| {})
                .map_err(|e| e.to_string())?;
        let base: Vec<u32> = base.iter().map(|s| s.id).collect();
        if base != c.base_greedy {
            return Err(format!("{name} case {i}: the base rows gave {base:?}, HF's base model {:?}", c.base_greedy));
        }
        changed += usize::from(o.ours != base);
        lines.push(format!(
            "{name} case {i}: {} prompt tokens, diverged at {:?}, max |Δlogprob| {:.2e}, base ids {}",
            c.case.prompt_ids.len(),
            o.diverged_at,
            o.max_logprob_err,
            if o.ours == base { "the same" } else { "differ" }
        ));
    }
    if changed == 0 {
        return Err(format!("{name}: the adapter changed no answer: the check cannot tell it was applied"));
    }
    Ok(lines)
}
