//! A deterministic stand-in for a model, for tests and benchmarks.
//!
//! It keeps a fake KV cache: each slot remembers the (token, position) written to it. For a
//! logit row at position `p` it reads positions `0..=p` back through the sequence's block table,
//! fails if any slot holds the wrong position, and makes the greedy next token a hash of the
//! whole history read back. So a wrong position, a wrong token, a stale or shared-by-mistake
//! block changes the output (or fails the forward), and [`FakeModel::greedy`] is an oracle for
//! what the engine must produce.

use tandem_core::backend::KvGeometry;
use tandem_core::{Error, ForwardBatch, ModelConfig, ModelRunner, Result};

pub struct FakeModel {
    cfg: ModelConfig,
    geometry: KvGeometry,
    max_batch_tokens: usize,
    max_seqs: usize,
    /// `[slots]` (token, position) last written; u32::MAX marks an empty slot.
    kv: Vec<(u32, u32)>,
    /// Skip the KV cache and hashing; logits are all zero (benchmarks of the engine alone).
    pub null: bool,
    /// Forward calls made so far.
    pub calls: usize,
    /// Forward calls (0-based) that fail with an error.
    pub fail_calls: Vec<usize>,
    /// Forward calls (0-based) that fail as a lost device would ([`Error::is_fatal`]).
    pub fatal_calls: Vec<usize>,
    /// Tokens per forward, for tests of the token budget.
    pub batch_sizes: Vec<usize>,
    /// How long each forward sleeps (a device's step time, for tests of the overlap).
    pub delay: std::time::Duration,
    /// And how long more for each token it carries (a CPU backend's pace).
    pub per_token: std::time::Duration,
    /// When set, each forward's start and end instants and its token count are pushed here.
    pub forward_times: Option<ForwardTimes>,
    /// Logit rows a forward may return beyond one per sequence (prompt logprobs, drafts).
    pub spare_logit_rows: usize,
}

/// Where a fake model logs each forward's (start, end, tokens).
pub type ForwardTimes = std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, std::time::Instant, usize)>>>;

/// A small Llama config: `vocab` tokens, the given EOS ids, context `max_len`.
pub fn fake_config(vocab: usize, eos: &[u32], max_len: usize) -> ModelConfig {
    let json = format!(
        r#"{{"architectures":["LlamaForCausalLM"],"vocab_size":{vocab},"hidden_size":8,"intermediate_size":16,
        "num_hidden_layers":1,"num_attention_heads":2,"num_key_value_heads":1,"max_position_embeddings":{max_len},
        "eos_token_id":{eos:?}}}"#
    );
    ModelConfig::from_json(&json).expect("the fake config is valid")
}

fn mix(h: u64, x: u64) -> u64 {
    let mut z = h ^ x.wrapping_add(0x9E37_79B9_7F4A_7C15).wrapping_add(h << 6).wrapping_add(h >> 2);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl FakeModel {
    pub fn new(
        cfg: ModelConfig,
        num_blocks: usize,
        block_size: usize,
        max_batch_tokens: usize,
        max_seqs: usize,
    ) -> Self {
        let geometry = KvGeometry { num_blocks, block_size, num_kv_heads: 1, head_dim: 4 };
        FakeModel {
            cfg,
            geometry,
            max_batch_tokens,
            max_seqs,
            kv: vec![(u32::MAX, u32::MAX); num_blocks * block_size],
            null: false,
            calls: 0,
            fail_calls: vec![],
            fatal_calls: vec![],
            batch_sizes: vec![],
            delay: std::time::Duration::ZERO,
            per_token: std::time::Duration::ZERO,
            forward_times: None,
            spare_logit_rows: 0,
        }
    }

    fn history_hash(tokens: impl Iterator<Item = (u32, u32)>) -> u64 {
        tokens.fold(0x1234_5678, |h, (t, p)| mix(h, ((t as u64) << 32) | p as u64))
    }

    /// The token after a history (may be an EOS id: tests see stops too).
    pub fn next_token(history_hash: u64, cfg: &ModelConfig) -> u32 {
        (history_hash % cfg.vocab_size as u64) as u32
    }

    /// Logits of a row: a clear winner (the next token) over small deterministic noise, so
    /// temperature sampling has a real distribution.
    fn fill_logits(history_hash: u64, cfg: &ModelConfig, row: &mut [f32]) {
        let next = Self::next_token(history_hash, cfg);
        for (i, x) in row.iter_mut().enumerate() {
            *x = (mix(history_hash, i as u64 + 7) % 1000) as f32 / 1000.0 * 3.0;
        }
        row[next as usize] = 4.0;
    }

    /// What greedy decoding of `prompt` must produce: up to `n` tokens, ending early after an
    /// EOS id unless `ignore_eos`.
    pub fn greedy(cfg: &ModelConfig, prompt: &[u32], n: usize, ignore_eos: bool) -> Vec<u32> {
        let mut toks = prompt.to_vec();
        for _ in 0..n {
            let h = Self::history_hash(toks.iter().enumerate().map(|(p, &t)| (t, p as u32)));
            let t = Self::next_token(h, cfg);
            toks.push(t);
            if !ignore_eos && cfg.eos_token_ids.contains(&t) {
                break;
            }
        }
        toks.split_off(prompt.len())
    }
}

impl ModelRunner for FakeModel {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }
    fn backend_name(&self) -> &'static str {
        "fake"
    }
    fn kv_geometry(&self) -> KvGeometry {
        self.geometry
    }
    fn max_batch_tokens(&self) -> usize {
        self.max_batch_tokens
    }
    fn max_seqs(&self) -> usize {
        self.max_seqs
    }
    fn max_logit_rows(&self) -> usize {
        self.max_seqs + self.spare_logit_rows
    }

    fn forward(&mut self, b: &ForwardBatch) -> Result<Vec<f32>> {
        let start = std::time::Instant::now();
        let r = self.forward_inner(b);
        std::thread::sleep(self.delay + self.per_token * b.num_tokens() as u32);
        if let Some(t) = &self.forward_times {
            t.lock().expect("forward_times poisoned").push((start, std::time::Instant::now(), b.num_tokens()));
        }
        r
    }
}

impl FakeModel {
    fn forward_inner(&mut self, b: &ForwardBatch) -> Result<Vec<f32>> {
        let call = self.calls;
        self.calls += 1;
        self.batch_sizes.push(b.num_tokens());
        let vocab = self.cfg.vocab_size;
        if self.fatal_calls.contains(&call) {
            return Err(Error::device_lost("fake", format!("injected illegal address on call {call}")));
        }
        if self.fail_calls.contains(&call) {
            return Err(Error::backend("fake", format!("injected failure on call {call}")));
        }
        if b.num_tokens() > self.max_batch_tokens || b.num_seqs() > self.max_seqs {
            return Err(Error::Batch(format!(
                "{} tokens / {} seqs over the fake's limits",
                b.num_tokens(),
                b.num_seqs()
            )));
        }
        let mut logits = vec![0.0f32; b.logit_rows.len() * vocab];
        if self.null {
            return Ok(logits);
        }
        let bs = self.geometry.block_size;
        b.validate(vocab, self.kv.len(), bs)?;
        for i in 0..b.num_tokens() {
            self.kv[b.slots[i] as usize] = (b.tokens[i], b.positions[i]);
        }
        for (row, &r) in logits.chunks_exact_mut(vocab).zip(&b.logit_rows) {
            let (s, p) = (b.token_seq[r as usize] as usize, b.positions[r as usize]);
            let table = &b.block_tables[s * b.max_blocks..(s + 1) * b.max_blocks];
            let mut hist = Vec::with_capacity(p as usize + 1);
            for q in 0..=p {
                let slot = table[q as usize / bs] as usize * bs + q as usize % bs;
                let (t, at) = self.kv[slot];
                if at != q {
                    return Err(Error::Batch(format!("fake KV: slot {slot} holds position {at}, expected {q}")));
                }
                hist.push((t, q));
            }
            Self::fill_logits(Self::history_hash(hist.into_iter()), &self.cfg, row);
        }
        Ok(logits)
    }
}
