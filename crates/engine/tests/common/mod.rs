//! Shared helpers of the engine tests: a fake model and a one-letter-per-token detokenizer.
#![allow(dead_code)]

use std::sync::Arc;

use tandem_core::ModelConfig;
use tandem_engine::fake_model::{fake_config, FakeModel};
use tandem_engine::{DecodeFn, Engine, EngineConfig, RequestOutput, RequestStream};

pub const VOCAB: usize = 64;
pub const EOS: u32 = 63;

/// id -> one letter ('a' + id % 26); ids 60 and 61 are the two bytes of 'é'.
pub fn letters() -> DecodeFn {
    Arc::new(|ids: &[u32]| {
        let mut bytes = Vec::new();
        for &i in ids {
            match i {
                60 => bytes.push(0xC3),
                61 => bytes.push(0xA9),
                _ => bytes.push(b'a' + (i % 26) as u8),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

pub fn model_config() -> ModelConfig {
    fake_config(VOCAB, &[EOS], 4096)
}

pub fn fake(num_blocks: usize, max_batch_tokens: usize, max_seqs: usize) -> FakeModel {
    FakeModel::new(model_config(), num_blocks, 16, max_batch_tokens, max_seqs)
}

pub fn engine(model: FakeModel, cfg: EngineConfig) -> Engine {
    Engine::new(Box::new(model), letters(), cfg).expect("valid engine config")
}

/// Steps until idle (bounded, so a stuck engine fails instead of hanging).
pub fn run_to_idle(e: &mut Engine) -> usize {
    let mut steps = 0;
    while e.has_work() {
        e.step();
        e.scheduler().check_invariants().unwrap();
        steps += 1;
        assert!(steps < 100_000, "engine does not finish");
    }
    steps
}

pub fn drain(s: &mut RequestStream) -> Vec<RequestOutput> {
    std::iter::from_fn(|| s.try_recv()).collect()
}

/// Per completion index: all token ids and the concatenated text, plus the final message.
pub struct Collected {
    pub tokens: Vec<Vec<u32>>,
    pub text: Vec<String>,
    pub finals: Vec<RequestOutput>,
    pub finish: Vec<Option<tandem_engine::FinishReason>>,
}

pub fn collect(outs: &[RequestOutput], n: usize) -> Collected {
    let mut c =
        Collected { tokens: vec![vec![]; n], text: vec![String::new(); n], finals: vec![], finish: vec![None; n] };
    for o in outs {
        assert!(c.finals.is_empty(), "output after the final one: {o:?}");
        c.tokens[o.index].extend(&o.token_ids);
        c.text[o.index] += &o.text;
        if let Some(r) = &o.finish_reason {
            assert!(c.finish[o.index].is_none(), "completion {} finished twice", o.index);
            c.finish[o.index] = Some(r.clone());
        }
        if o.finished {
            c.finals.push(o.clone());
        }
    }
    c
}

/// splitmix64: the randomized tests' own stream (sampling keys its draws with Philox instead).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
