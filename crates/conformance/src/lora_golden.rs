//! LoRA adapters against HF transformers + peft (tests/golden/lora, made by
//! tests/lora_golden.py): each adapter, made by peft itself with B drawn nonzero, over the
//! seeded random model it was made for, must give peft's greedy ids by the golden rule
//! ([`crate::golden::check_case_with`]), and the base model's rows on the same model must stay
//! the base model's.

use tandem_core::backend::KvDtype;
use tandem_core::lora::{LoraAdapter, LoraLimits};
use tandem_core::model::LoadOptions;
use tandem_core::{Backend, ForwardBatch, Model, ModelRunner};

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
    check_lora_kv(backend, name, logprob_tol, None)
}

/// [`check_lora`] with the KV cache held in `kv` (`None`: the backend's default).
pub fn check_lora_kv<B: Backend>(
    backend: B,
    name: &str,
    logprob_tol: f64,
    kv: Option<KvDtype>,
) -> Result<Vec<String>, String> {
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
    let opts = LoadOptions { kv_dtype: kv, ..lora_load_options(longest, 1) };
    let mut model = Model::from_weights_lora(backend, cfg, &w, opts, Some(limits)).map_err(|e| e.to_string())?;
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

/// Adapter `name`'s golden cases in one batch on `backend`: each case's prompt under the
/// adapter (slot 1), under the base model, and under `other` (slot 0, an adapter made for the
/// same model) where given, all prefilled in one forward and decoded together. Each row must
/// give the ids it gives run alone on the same backend (batch invariance), the adapter's rows
/// pass the golden rule ([`check_case_with`]) and the base rows give HF's base ids. Returns a
/// line.
pub fn check_lora_mixed<B: Backend>(
    backend: B,
    name: &str,
    other: Option<&str>,
    logprob_tol: f64,
) -> Result<String, String> {
    check_lora_mixed_kv(backend, name, other, logprob_tol, None)
}

/// [`check_lora_mixed`] with the KV cache held in `kv` (`None`: the backend's default).
pub fn check_lora_mixed_kv<B: Backend>(
    backend: B,
    name: &str,
    other: Option<&str>,
    logprob_tol: f64,
    kv: Option<KvDtype>,
) -> Result<String, String> {
    let &(_, model_name) = LORA_GOLDEN.iter().find(|g| g.0 == name).ok_or_else(|| format!("no LoRA golden {name}"))?;
    let path = golden_dir().join("lora").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let golden: LoraGolden = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let dir = golden_model(model_name);
    let cfg = tandem_core::ModelConfig::from_file(&dir.join("config.json")).map_err(|e| e.to_string())?;
    let w = tandem_core::weights::Weights::open(&dir).map_err(|e| e.to_string())?;
    // (case, adapter slot) a row; slot 1 is `name`, slot 0 `other`.
    let mut rows: Vec<(usize, Option<u32>)> = vec![];
    for i in 0..golden.cases.len() {
        rows.extend([(i, Some(1)), (i, None)]);
        if other.is_some() {
            rows.push((i, Some(0)));
        }
    }
    let block = 16;
    let longest = golden.cases.iter().map(|c| c.case.prompt_ids.len() + c.case.greedy.len()).max().unwrap_or(1);
    let per_seq = longest.div_ceil(block);
    let prompt_tokens: usize = rows.iter().map(|&(i, _)| golden.cases[i].case.prompt_ids.len()).sum();
    let opts = LoadOptions {
        max_batch_tokens: prompt_tokens.max(rows.len()),
        max_seqs: rows.len(),
        num_kv_blocks: rows.len() * per_seq,
        block_size: block,
        kv_dtype: kv,
        ..Default::default()
    };
    let limits = LoraLimits { max_loras: 2, max_rank: 8 };
    let mut model =
        Model::from_weights_lora(backend, cfg.clone(), &w, opts, Some(limits)).map_err(|e| e.to_string())?;
    model
        .load_lora(1, &LoraAdapter::load(&adapter_dir(name), &cfg).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    if let Some(o) = other {
        let a = LoraAdapter::load(&adapter_dir(o), &cfg).map_err(|e| format!("{o}: {e}"))?;
        model.load_lora(0, &a).map_err(|e| e.to_string())?;
    }
    // Each row alone first, on the same model: the adapter's rows by the golden rule.
    let mut alone = vec![];
    for &(i, slot) in &rows {
        let c = &golden.cases[i];
        let ids = match slot {
            Some(1) => {
                check_case_with(&mut model, slot, &c.case, logprob_tol)
                    .map_err(|e| format!("{name} case {i} alone: {e}"))?
                    .ours
            }
            _ => tandem_core::greedy::generate_with(
                &mut model,
                slot,
                &c.case.prompt_ids,
                c.case.greedy.len(),
                &[],
                false,
                |_| {},
            )
            .map_err(|e| e.to_string())?
            .iter()
            .map(|s| s.id)
            .collect(),
        };
        if slot.is_none() && ids != c.base_greedy {
            return Err(format!("{name} case {i}: the base rows gave {ids:?}, HF's base model {:?}", c.base_greedy));
        }
        alone.push(ids);
    }
    // Then all together: sequence r owns blocks r*per_seq.. .
    let tables: Vec<Vec<u32>> =
        (0..rows.len()).map(|r| ((r * per_seq) as u32..((r + 1) * per_seq) as u32).collect()).collect();
    let vocab = cfg.vocab_size;
    let mut batch = ForwardBatch { max_blocks: per_seq, ..Default::default() };
    let mut lens = vec![];
    for (r, &(i, _)) in rows.iter().enumerate() {
        let p = &golden.cases[i].case.prompt_ids;
        batch.push_seq(p, 0, &tables[r], block, true);
        lens.push(p.len());
    }
    let mut got: Vec<Vec<u32>> = vec![vec![]; rows.len()];
    let steps = golden.cases.iter().map(|c| c.case.greedy.len()).max().unwrap_or(0);
    for step in 0..steps {
        batch.adapters = rows.iter().map(|r| r.1).collect();
        let logits = model.forward(&batch).map_err(|e| format!("{name} mixed step {step}: {e}"))?;
        let mut next = ForwardBatch { max_blocks: per_seq, ..Default::default() };
        for (r, row) in logits.chunks_exact(vocab).enumerate() {
            let id = tandem_core::backend::argmax_row(row);
            got[r].push(id);
            next.push_seq(&[id], lens[r], &tables[r], block, true);
            lens[r] += 1;
        }
        batch = next;
    }
    for (r, &(i, slot)) in rows.iter().enumerate() {
        let want = &alone[r];
        if got[r][..want.len()] != want[..] {
            return Err(format!(
                "{name} case {i} under slot {slot:?}: {:?} in the mixed batch, {want:?} alone",
                &got[r][..want.len()]
            ));
        }
    }
    Ok(format!(
        "{name}: {} rows in one batch ({} cases under it, the base model{}), each as alone",
        rows.len(),
        golden.cases.len(),
        other.map_or(String::new(), |o| format!(" and {o}"))
    ))
}
