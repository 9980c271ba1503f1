//! Sampled requests keep their distribution under speculation. On the reference backend's real
//! forward (a seeded random tiny model, top-k 4 so the processed distribution has few
//! outcomes), the tokens after a drafted position are counted over many seeds with n-gram
//! drafts and without, and a two-sample chi-square test compares the counts with a threshold
//! derived for a false alarm rate of 1e-6. The same test, on the same data, must reject a wrong
//! acceptance rule (always accept the draft). A seeded request also gives the very same tokens
//! with drafts as without.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use tandem_core::model::LoadOptions;
use tandem_core::{DType, Model, ModelRunner};
use tandem_engine::speculative::{DraftProposer, NgramProposer, SpeculativeConfig};
use tandem_engine::{Engine, EngineConfig, Request, SamplingParams};
use tandem_model_files::random_model::{write_random_model, Shape};
use tandem_reference::RefBackend;

fn model_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-engine-spec-sampled-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    write_random_model(&d, Shape::Tiny, 11, DType::F32).unwrap();
    d
}

fn runner(dir: &Path) -> Box<dyn ModelRunner> {
    let opts =
        LoadOptions { max_batch_tokens: 512, max_seqs: 64, num_kv_blocks: 256, block_size: 16, ..Default::default() };
    Box::new(Model::load(RefBackend::new(), dir, opts).unwrap())
}

/// A prompt followed by the model's own greedy continuation of it: the tokens the model tends
/// to sample recur in it, each followed by what the model tends to give next, so n-gram lookup
/// finds drafts that are sometimes accepted and sometimes not.
fn prompt(dir: &Path) -> Vec<u32> {
    let mut e = Engine::new(runner(dir), letters(), EngineConfig::default()).unwrap();
    let start = vec![1, 2, 3];
    let params = SamplingParams { ignore_eos: true, ..SamplingParams::greedy(160) };
    let mut s = e.add_request(Request { prompt: start.clone(), params, priority: 0 }).unwrap();
    run_to_idle(&mut e);
    let mut p = start;
    p.extend(collect(&drain(&mut s), 1).tokens.remove(0));
    p
}

fn sampled(prompt: &[u32], seed: u64) -> Request {
    let params = SamplingParams {
        temperature: 1.0,
        top_k: 4,
        seed: Some(seed),
        max_tokens: Some(3),
        ignore_eos: true,
        ..Default::default()
    };
    Request { prompt: prompt.to_vec(), params, priority: 0 }
}

/// Each seed's three output tokens (the first from the prefill; the second from the first
/// decode, which has a draft when speculation is on; the third after it).
fn outputs(dir: &Path, cfg: EngineConfig, seeds: std::ops::Range<u64>, prompt: &[u32]) -> (Vec<Vec<u32>>, Engine) {
    let mut e = Engine::new(runner(dir), letters(), cfg).unwrap();
    let mut out = Vec::new();
    // In batches, so the pool is never short (no preemption is needed for this test).
    let seeds: Vec<u64> = seeds.collect();
    for chunk in seeds.chunks(48) {
        let mut streams: Vec<_> = chunk.iter().map(|&s| e.add_request(sampled(prompt, s)).unwrap()).collect();
        run_to_idle(&mut e);
        for s in &mut streams {
            let c = collect(&drain(s), 1);
            assert_eq!(c.tokens[0].len(), 3);
            out.push(c.tokens[0].clone());
        }
    }
    (out, e)
}

/// Pearson's two-sample chi-square statistic of two count tables over the same categories,
/// categories seen fewer than 10 times in both together pooled into one; and its degrees of
/// freedom.
fn chi_square<K: Ord + Clone>(a: &BTreeMap<K, u64>, b: &BTreeMap<K, u64>) -> (f64, usize) {
    let (na, nb) = (a.values().sum::<u64>() as f64, b.values().sum::<u64>() as f64);
    let (ka, kb) = ((nb / na).sqrt(), (na / nb).sqrt());
    let keys: Vec<K> =
        a.keys().chain(b.keys()).cloned().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for k in keys {
        let (x, y) = (*a.get(&k).unwrap_or(&0) as f64, *b.get(&k).unwrap_or(&0) as f64);
        if x + y < 10.0 {
            pooled = (pooled.0 + x, pooled.1 + y);
        } else {
            cells.push((x, y));
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cells.push(pooled);
    }
    let stat = cells.iter().map(|&(x, y)| (ka * x - kb * y).powi(2) / (x + y)).sum();
    (stat, cells.len().saturating_sub(1))
}

/// The chi-square quantile with `dof` degrees of freedom that a true null exceeds with
/// probability 1e-6 (Wilson-Hilferty: (X/dof)^(1/3) is about normal with mean 1 - 2/(9 dof)
/// and variance 2/(9 dof); z = 4.753 is the normal's 1e-6 upper quantile).
fn threshold(dof: usize) -> f64 {
    let (d, z) = (dof as f64, 4.753);
    let v = 2.0 / (9.0 * d);
    d * (1.0 - v + z * v.sqrt()).powi(3)
}

fn counts<K: Ord>(keys: impl Iterator<Item = K>) -> BTreeMap<K, u64> {
    let mut m = BTreeMap::new();
    for k in keys {
        *m.entry(k).or_insert(0) += 1;
    }
    m
}

#[test]
fn sampled_tokens_after_a_draft_keep_their_distribution() {
    let dir = model_dir();
    let p = prompt(&dir);
    let n = 1200u64;
    let on = EngineConfig { speculative: Some(SpeculativeConfig::ngram(2)), ..Default::default() };
    // Independent seeds for the two arms: with the same seed the tokens are the same (below).
    let (off, _) = outputs(&dir, EngineConfig::default(), 0..n, &p);
    let (spec, e) = outputs(&dir, on.clone(), n..2 * n, &p);
    let st = e.stats();
    assert!(st.spec_decode_num_drafts_total >= n / 2, "most first decodes carry a draft: {st:?}");
    let (acc, drafted) = (st.spec_decode_num_accepted_tokens_total, st.spec_decode_num_draft_tokens_total);
    assert!(acc > n / 20 && acc + n / 20 < drafted, "drafts both accepted and rejected: {acc} of {drafted}");

    // The token at the drafted position, and the pair of it and the token after it (the bonus
    // token where the draft was accepted).
    for (what, key) in [("second token", 1usize), ("second and third", 2)] {
        let pick = |o: &Vec<u32>| o[1..=key].to_vec();
        let (stat, dof) = chi_square(&counts(off.iter().map(pick)), &counts(spec.iter().map(pick)));
        assert!(dof >= 2, "{what}: too few outcomes to tell distributions apart ({dof} dof)");
        assert!(stat < threshold(dof), "{what}: chi-square {stat:.1} over {dof} dof >= {:.1}", threshold(dof));
    }

    // A wrong rule, always accepting the draft, makes the second token the draft whenever
    // there is one; the same test on the same data rejects it.
    let ngram = NgramProposer { min: 1, max: 4 }; // SpeculativeConfig::ngram's
    let always_accept: Vec<u32> = spec
        .iter()
        .map(|o| {
            let mut t = p.clone();
            t.push(o[0]);
            ngram.propose(&t, 1).first().copied().unwrap_or(o[1])
        })
        .collect();
    let (stat, dof) = chi_square(&counts(off.iter().map(|o| o[1])), &counts(always_accept.into_iter()));
    assert!(stat > threshold(dof), "always-accept passed: chi-square {stat:.1} over {dof} dof");

    // Seeded: the same tokens with drafts as without.
    let (plain, _) = outputs(&dir, EngineConfig::default(), 0..96, &p);
    let (drafted, _) = outputs(&dir, on, 0..96, &p);
    assert_eq!(plain, drafted);
    let _ = std::fs::remove_dir_all(&dir);
}
