//! Benchmark workloads: random token ids from a seed, fixed or uniformly drawn lengths.
//!
//! - `random`: every prompt `input_len` tokens, every output `output_len` tokens (vLLM's
//!   `benchmark_throughput` with its random dataset: 1000 prompts of 128 in, 128 out).
//! - `mixed`: input lengths uniform in `[min_len, max_len]`, output lengths uniform in
//!   `[min_output_len, max_output_len]` (by default the same range: nano-vllm's bench, 256
//!   prompts, 100..=1024 each), which is where continuous batching earns its keep. The GPU
//!   check's peer workload is 16..=1024 in, 16..=512 out.
//!
//! Outputs are forced to their length with `ignore_eos`, so every engine does the same work.

use anyhow::{bail, Result};
use clap::ValueEnum;
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    Random,
    Mixed,
}

/// Workload flags shared by the benchmarks.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkloadArgs {
    #[arg(long, value_enum, default_value_t = WorkloadKind::Random)]
    pub workload: WorkloadKind,
    /// Prompts in the run (default: 1000 for `random`, 256 for `mixed`).
    #[arg(long)]
    pub num_prompts: Option<usize>,
    /// `random`: prompt tokens.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// `random`: output tokens.
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// `mixed`: shortest prompt and output.
    #[arg(long, default_value_t = 100)]
    pub min_len: usize,
    /// `mixed`: longest prompt and output.
    #[arg(long, default_value_t = 1024)]
    pub max_len: usize,
    /// `mixed`: shortest output (default: --min-len).
    #[arg(long)]
    pub min_output_len: Option<usize>,
    /// `mixed`: longest output (default: --max-len).
    #[arg(long)]
    pub max_output_len: Option<usize>,
    /// Seed of the token ids and lengths.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl WorkloadArgs {
    pub fn num_prompts(&self) -> usize {
        self.num_prompts.unwrap_or(match self.workload {
            WorkloadKind::Random => 1000,
            WorkloadKind::Mixed => 256,
        })
    }

    /// `mixed`: the output length range.
    pub fn output_range(&self) -> (usize, usize) {
        (self.min_output_len.unwrap_or(self.min_len), self.max_output_len.unwrap_or(self.max_len))
    }

    pub fn to_json(&self) -> Value {
        let (lo, hi) = self.output_range();
        match self.workload {
            WorkloadKind::Random => {
                json!({"workload": "random", "num_prompts": self.num_prompts(), "input_len": self.input_len, "output_len": self.output_len, "seed": self.seed})
            }
            WorkloadKind::Mixed => {
                json!({"workload": "mixed", "num_prompts": self.num_prompts(), "min_len": self.min_len, "max_len": self.max_len, "min_output_len": lo, "max_output_len": hi, "seed": self.seed})
            }
        }
    }

    /// A short description for table headers.
    pub fn describe(&self) -> String {
        let (lo, hi) = self.output_range();
        match self.workload {
            WorkloadKind::Random => {
                format!("random, {} prompts, {} in / {} out", self.num_prompts(), self.input_len, self.output_len)
            }
            WorkloadKind::Mixed if (lo, hi) == (self.min_len, self.max_len) => {
                format!("mixed, {} prompts, lengths uniform in {}..={}", self.num_prompts(), self.min_len, self.max_len)
            }
            WorkloadKind::Mixed => format!(
                "mixed, {} prompts, {}..={} in / {lo}..={hi} out",
                self.num_prompts(),
                self.min_len,
                self.max_len
            ),
        }
    }

    /// The prompts, for a model with `vocab` tokens and a context of `max_len` tokens.
    pub fn prompts(&self, vocab: usize, max_model_len: usize) -> Result<Vec<Prompt>> {
        let n = self.num_prompts();
        if n == 0 {
            bail!("--num-prompts must be at least 1");
        }
        if vocab == 0 {
            bail!("the model's vocabulary is empty");
        }
        let (lo_in, hi_in, lo_out, hi_out) = match self.workload {
            WorkloadKind::Random => (self.input_len, self.input_len, self.output_len, self.output_len),
            WorkloadKind::Mixed => {
                let (lo, hi) = self.output_range();
                (self.min_len, self.max_len, lo, hi)
            }
        };
        if lo_in == 0 || lo_out == 0 {
            bail!("prompt and output lengths must be at least 1 (got input {lo_in}, output {lo_out})");
        }
        if lo_in > hi_in {
            bail!("--min-len {lo_in} exceeds --max-len {hi_in}");
        }
        if lo_out > hi_out {
            bail!("the shortest output {lo_out} exceeds the longest {hi_out} (--min-output-len / --max-output-len)");
        }
        if hi_in + hi_out > max_model_len {
            bail!("prompts of up to {hi_in} tokens plus outputs of up to {hi_out} exceed the model's context of {max_model_len} tokens");
        }
        let mut rng = SplitMix64(self.seed ^ 0x05EE_D0FB_30C4);
        Ok((0..n)
            .map(|_| {
                let input = rng.range(lo_in, hi_in);
                let output_len = rng.range(lo_out, hi_out);
                let ids = (0..input).map(|_| (rng.next() % vocab as u64) as u32).collect();
                Prompt { ids, output_len }
            })
            .collect())
    }
}

/// One request of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub output_len: usize,
}

/// splitmix64: seeded, portable, enough for token ids and lengths.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(workload: WorkloadKind, n: usize) -> WorkloadArgs {
        WorkloadArgs {
            workload,
            num_prompts: Some(n),
            input_len: 16,
            output_len: 8,
            min_len: 100,
            max_len: 1024,
            min_output_len: None,
            max_output_len: None,
            seed: 3,
        }
    }

    #[test]
    fn random_workload_has_fixed_lengths_ids_in_vocab_and_repeats_from_its_seed() {
        let a = args(WorkloadKind::Random, 20);
        let p = a.prompts(384, 2048).unwrap();
        assert_eq!(p.len(), 20);
        assert!(p.iter().all(|p| p.ids.len() == 16 && p.output_len == 8 && p.ids.iter().all(|&t| t < 384)));
        assert_eq!(p, a.prompts(384, 2048).unwrap());
        assert_ne!(p, WorkloadArgs { seed: 4, ..a }.prompts(384, 2048).unwrap());
        // Not all the same id: the generator moves.
        assert!(p[0].ids.iter().any(|&t| t != p[0].ids[0]));
    }

    #[test]
    fn mixed_workload_spans_its_range() {
        let p = args(WorkloadKind::Mixed, 256).prompts(49152, 4096).unwrap();
        let lens: Vec<usize> = p.iter().map(|p| p.ids.len()).collect();
        assert!(lens.iter().all(|&l| (100..=1024).contains(&l)));
        assert!(p.iter().all(|p| (100..=1024).contains(&p.output_len)));
        // 256 uniform draws over 925 values: both ends of the range are reached.
        assert!(*lens.iter().min().unwrap() < 200 && *lens.iter().max().unwrap() > 900);
    }

    #[test]
    fn mixed_outputs_can_have_their_own_range() {
        let a = WorkloadArgs {
            min_len: 16,
            max_len: 1024,
            min_output_len: Some(16),
            max_output_len: Some(512),
            ..args(WorkloadKind::Mixed, 256)
        };
        let p = a.prompts(49152, 4096).unwrap();
        assert!(p.iter().all(|p| (16..=1024).contains(&p.ids.len()) && (16..=512).contains(&p.output_len)));
        assert!(p.iter().map(|p| p.output_len).max().unwrap() > 450, "outputs reach the top of their range");
        assert!(p.iter().map(|p| p.ids.len()).max().unwrap() > 900, "prompts keep theirs");
        assert_eq!(a.to_json()["max_output_len"], 512);
        // An empty output range is refused, not clamped.
        assert!(WorkloadArgs { min_output_len: Some(600), ..a.clone() }.prompts(49152, 4096).is_err());
    }

    #[test]
    fn workloads_that_cannot_fit_are_refused() {
        assert!(args(WorkloadKind::Mixed, 4).prompts(384, 2000).is_err());
        assert!(WorkloadArgs { input_len: 0, ..args(WorkloadKind::Random, 4) }.prompts(384, 2048).is_err());
        assert!(args(WorkloadKind::Random, 0).prompts(384, 2048).is_err());
    }
}
