//! The smallest possible driver of a [`ModelRunner`]: one sequence, contiguous blocks, greedy.
//! Used by the golden tests, `tandem generate`, `tandem compare`, and as the oracle in
//! `tandem bench decode`'s test; the engine crate is the real driver.

use crate::backend::argmax_row;
use crate::batch::ForwardBatch;
use crate::error::{Error, Result};
use crate::model::ModelRunner;

/// What one greedy step saw: the chosen id and the logits row it came from.
pub struct Step {
    pub id: u32,
    pub logits: Vec<f32>,
}

/// Runs `prompt` through `runner` (in chunks of at most `max_batch_tokens`), then decodes
/// greedily until `max_tokens` tokens or one of `stop_ids`. KV blocks 0.. are used in order.
/// `keep_logits` keeps each step's logits row (golden tests need them; serving does not).
pub fn generate(
    runner: &mut dyn ModelRunner,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    keep_logits: bool,
    on_token: impl FnMut(u32),
) -> Result<Vec<Step>> {
    generate_with(runner, None, prompt, max_tokens, stop_ids, keep_logits, on_token)
}

/// As [`generate`], the sequence using LoRA slot `adapter` where given.
pub fn generate_with(
    runner: &mut dyn ModelRunner,
    adapter: Option<u32>,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    keep_logits: bool,
    mut on_token: impl FnMut(u32),
) -> Result<Vec<Step>> {
    let adapters = if adapter.is_some() { vec![adapter] } else { vec![] };
    let g = runner.kv_geometry();
    let total = prompt.len() + max_tokens;
    if prompt.is_empty() {
        return Err(Error::Batch("empty prompt".into()));
    }
    if total.div_ceil(g.block_size) > g.num_blocks {
        return Err(Error::Batch(format!(
            "{total} tokens need more than the {} KV blocks of {} tokens",
            g.num_blocks, g.block_size
        )));
    }
    let table: Vec<u32> = (0..total.div_ceil(g.block_size) as u32).collect();
    let vocab = runner.config().vocab_size;
    let chunk = runner.max_batch_tokens();
    let mut steps = Vec::new();
    let mut done = 0;
    let mut logits = Vec::new();
    while done < prompt.len() {
        let end = (done + chunk).min(prompt.len());
        let mut b = ForwardBatch { max_blocks: table.len(), ..Default::default() };
        b.push_seq(&prompt[done..end], done, &table, g.block_size, end == prompt.len());
        b.adapters.clone_from(&adapters);
        logits = runner.forward(&b)?;
        done = end;
    }
    for (i, pos) in (0..max_tokens).zip(prompt.len()..) {
        let id = argmax_row(&logits[..vocab]);
        on_token(id);
        steps.push(Step { id, logits: if keep_logits { logits[..vocab].to_vec() } else { vec![] } });
        if stop_ids.contains(&id) || i + 1 == max_tokens {
            break;
        }
        let mut b = ForwardBatch { max_blocks: table.len(), ..Default::default() };
        b.push_seq(&[id], pos, &table, g.block_size, true);
        b.adapters.clone_from(&adapters);
        logits = runner.forward(&b)?;
    }
    Ok(steps)
}
