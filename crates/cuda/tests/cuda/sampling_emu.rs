//! kernels/sampling.cu against the host sampler, bit for bit: the kernel runs under the host
//! emulation (kernels/emu/sample_io.cpp, built here with g++) on random rows and specs, and each
//! id must equal `tandem_core::sampling::sample_row` of the same row and spec. Rows cover
//! greedy and tiny temperatures, top-k (ties at the k-th value, k past the vocabulary), top-p,
//! min-p, their mixes, NaN and -inf logits, +inf and all-NaN rows, vocabularies from 1 to 5000
//! (lanes left empty, lanes of unequal length); and `sample_masked` (structured output: rows
//! with one to three allowed tokens, about half, or none masked) against the host's masked
//! sampler; and `logit_edits` (penalties, logit_bias, bans) before `sample_masked`: the edited
//! logits bitwise `LogitEdit::apply`'s and the ids the host's. Needs g++ (or $CXX): SKIPPED without one,
//! a failure under TANDEM_REQUIRE_EMU=1.

use std::path::Path;
use std::process::Command;

use tandem_core::sampling::{
    logprobs_row, sample_row, sample_rows_masked, LogitEdit, RowMasks, SampleSpec, MAX_TOP_LOGPROBS,
};

struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// One row of logits and its spec.
fn case(r: &mut SplitMix, vocab: usize) -> (Vec<f32>, SampleSpec) {
    let scale = r.pick(&[0.5f32, 3.0, 12.0]);
    // Coarse values (multiples of 1/8) make ties, at the top and at top-k's k-th value.
    let coarse = r.next().is_multiple_of(3);
    let mut l: Vec<f32> = (0..vocab)
        .map(|_| {
            let x = (r.unit() * 2.0 - 1.0) * scale;
            if coarse {
                (x * 8.0).round() / 8.0
            } else {
                x
            }
        })
        .collect();
    match r.next() % 10 {
        0 => (0..vocab / 7 + 1).for_each(|_| l[(r.next() % vocab as u64) as usize] = f32::NAN),
        1 => (0..vocab / 5 + 1).for_each(|_| l[(r.next() % vocab as u64) as usize] = f32::NEG_INFINITY),
        2 if r.next().is_multiple_of(4) => l[(r.next() % vocab as u64) as usize] = f32::INFINITY,
        3 if r.next().is_multiple_of(4) => l.iter_mut().for_each(|x| *x = f32::NAN),
        _ => {}
    }
    let spec = SampleSpec {
        temperature: r.pick(&[0.0f32, 1e-38, 9e-6, 1e-5, 0.05, 0.3, 0.7, 1.0, 1.0, 1.5, 4.0]),
        top_k: r.pick(&[0u32, 0, 1, 2, 5, 40, 10_000]),
        top_p: r.pick(&[1.0f32, 1.0, 0.95, 0.8, 0.5, 0.01]),
        min_p: r.pick(&[0.0f32, 0.0, 0.02, 0.3, 1.0]),
        seed: r.next(),
        completion: (r.next() % 4) as u32,
        token_index: (r.next() % 5000) as u32,
    };
    (l, spec)
}

/// sample_io's input up to its masks: rows, vocab, the logits, the specs, then the masks.
fn masked_input(cases: &[(Vec<f32>, SampleSpec)], vocab: usize, masks: &RowMasks) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend((cases.len() as u32).to_le_bytes());
    bytes.extend((vocab as u32).to_le_bytes());
    cases.iter().flat_map(|c| &c.0).for_each(|x| bytes.extend(x.to_le_bytes()));
    cases.iter().flat_map(|c| c.1.to_words()).for_each(|w| bytes.extend(w.to_le_bytes()));
    bytes.extend((masks.words as u32).to_le_bytes());
    bytes.extend(((masks.bits.len() / masks.words) as u32).to_le_bytes());
    masks.index.iter().for_each(|i| bytes.extend(i.to_le_bytes()));
    masks.bits.iter().for_each(|w| bytes.extend(w.to_le_bytes()));
    bytes
}

#[test]
fn sampling_kernel_matches_the_host_sampler_bitwise() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    if !Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success()) {
        assert!(
            !std::env::var("TANDEM_REQUIRE_EMU").is_ok_and(|v| v == "1"),
            "TANDEM_REQUIRE_EMU=1 but no C++ compiler `{cxx}`"
        );
        tandem_core::skip::note(format!("sampling kernel emulation: no C++ compiler `{cxx}`"));
        return;
    }
    let dir = std::env::temp_dir().join(format!("tandem-sampling-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/emu/sample_io.cpp");
    let build = |name: &str, defs: &[&str]| {
        let exe = dir.join(name);
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-O1", "-pthread", "-Wall", "-Wno-unused-function"])
            .args(defs)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
            .unwrap();
        assert!(out.status.success(), "building {}:\n{}", src.display(), String::from_utf8_lossy(&out.stderr));
        exe
    };
    let exe = build("sample_io", &[]);
    // The radix variant's walk in chunks of 4 weights, not 1024: vocabularies past 1024 walk
    // their lane in several chunks, as a 262,144-token vocabulary would.
    // The multi-CTA variant's top-p passes stage 3 columns at a time, not 256 (a 262,144-token
    // vocabulary stages 1,024 in four chunks).
    let exe_small_walk = build("sample_io_walk4", &["-DSMP_WALK=4", "-DSMC_COLS=3"]);
    check_variant(&exe, &dir, "bisect", &[], 1);
    check_variant(&exe, &dir, "radix", &[40_000], 1);
    check_variant(&exe_small_walk, &dir, "radix", &[], 1);
    // The many-CTA variant (walk in chunks of 4, top-p staging 3 columns at a time; a quarter
    // of the plain rows: its 768 CTAs a row cost the emulator ~50 ms a row), then its deliberately broken builds
    // (SMC_BREAK=1: the top-k histograms not zeroed; 2: a top-p pass folds the wrong pass's
    // partials), which must give some id the host does not.
    check_variant(&exe_small_walk, &dir, "multi", &[], 4);
    for b in 1..=2 {
        let broken = build(&format!("sample_io_smc_break{b}"), &[&format!("-DSMC_BREAK={b}")]);
        let wrong = mismatches(&broken, &dir, "multi");
        assert!(
            wrong > 0,
            "SMC_BREAK={b}: the broken multi-CTA sampler gave the host's ids on every row: the check cannot see it"
        );
        println!("SMC_BREAK={b}: {wrong} ids differ from the host's (as they must)");
    }

    let _ = std::fs::remove_dir_all(&dir);
}

/// How many of 24 random rows of 1000 logits `exe` samples differently from the host.
fn mismatches(exe: &Path, dir: &Path, variant: &str) -> usize {
    let mut r = SplitMix(20261205);
    let mut wrong = 0;
    {
        let (vocab, rows) = (1000usize, 24);
        let cases: Vec<_> = (0..rows).map(|_| case(&mut r, vocab)).collect();
        let mut bytes = Vec::new();
        bytes.extend((rows as u32).to_le_bytes());
        bytes.extend((vocab as u32).to_le_bytes());
        cases.iter().flat_map(|c| &c.0).for_each(|x| bytes.extend(x.to_le_bytes()));
        cases.iter().flat_map(|c| c.1.to_words()).for_each(|w| bytes.extend(w.to_le_bytes()));
        let (inp, outp) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&inp, &bytes).unwrap();
        let run = Command::new(exe).env("TANDEM_CUDA_SAMPLER", variant).arg(&inp).arg(&outp).output().unwrap();
        assert!(run.status.success(), "sample_io failed: {}", String::from_utf8_lossy(&run.stderr));
        let got: Vec<u32> =
            std::fs::read(&outp).unwrap().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        wrong += cases.iter().zip(&got).filter(|((l, s), g)| sample_row(l, s) != **g).count();
    }
    wrong
}

/// Every case of the test through one variant of the kernel (`TANDEM_CUDA_SAMPLER`), plus the
/// vocabularies `big`; the plain rows a vocabulary divided by `fewer`.
fn check_variant(exe: &Path, dir: &Path, variant: &str, big: &[usize], fewer: usize) {
    let big = big.iter().copied();
    let mut r = SplitMix(std::env::var("TANDEM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261201));
    let mut total = 0;
    for vocab in [1usize, 7, 255, 256, 257, 1000, 5000].into_iter().chain(big) {
        let rows = (if vocab > 5000 {
            8
        } else if vocab >= 1000 {
            24
        } else {
            40
        }) / fewer;
        let cases: Vec<_> = (0..rows).map(|_| case(&mut r, vocab)).collect();
        let mut bytes = Vec::new();
        bytes.extend((rows as u32).to_le_bytes());
        bytes.extend((vocab as u32).to_le_bytes());
        cases.iter().flat_map(|c| &c.0).for_each(|x| bytes.extend(x.to_le_bytes()));
        cases.iter().flat_map(|c| c.1.to_words()).for_each(|w| bytes.extend(w.to_le_bytes()));
        let (inp, outp) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&inp, &bytes).unwrap();
        let run = Command::new(exe).env("TANDEM_CUDA_SAMPLER", variant).arg(&inp).arg(&outp).output().unwrap();
        assert!(run.status.success(), "sample_io failed: {}", String::from_utf8_lossy(&run.stderr));
        let got: Vec<u32> =
            std::fs::read(&outp).unwrap().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(got.len(), rows);
        for (i, ((l, s), g)) in cases.iter().zip(&got).enumerate() {
            let want = sample_row(l, s);
            assert_eq!(*g, want, "vocab {vocab} row {i}: kernel {g}, host {want}, spec {s:?}");
        }
        total += rows;
    }
    // Masked rows (structured output): `sample_masked` against `sample_rows_masked`; rows
    // unmasked, with one to three allowed tokens, or with about half of them allowed.
    let mut changed = 0;
    for vocab in [33usize, 300] {
        let rows = 12;
        let cases: Vec<_> = (0..rows).map(|_| case(&mut r, vocab)).collect();
        let mut masks = RowMasks::none(rows, vocab);
        for row in 0..rows {
            let mut m = vec![0u32; masks.words];
            match r.next() % 3 {
                0 => continue,
                1 => (0..1 + r.next() % 3).for_each(|_| {
                    let t = (r.next() % vocab as u64) as usize;
                    m[t / 32] |= 1 << (t % 32);
                }),
                _ => (0..vocab).filter(|_| r.next().is_multiple_of(2)).for_each(|t| m[t / 32] |= 1 << (t % 32)),
            }
            masks.set(row, &m);
        }
        let bytes = masked_input(&cases, vocab, &masks);
        let (inp, outp) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&inp, &bytes).unwrap();
        let run = Command::new(exe).env("TANDEM_CUDA_SAMPLER", variant).arg(&inp).arg(&outp).output().unwrap();
        assert!(run.status.success(), "sample_io (masked) failed: {}", String::from_utf8_lossy(&run.stderr));
        let got: Vec<u32> =
            std::fs::read(&outp).unwrap().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        let logits: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
        let specs: Vec<SampleSpec> = cases.iter().map(|c| c.1).collect();
        let want = sample_rows_masked(&logits, vocab, &specs, &masks);
        assert_eq!(got, want, "masked rows, vocab {vocab}: index {:?}", masks.index);
        changed += cases.iter().zip(&want).filter(|(c, w)| sample_row(&c.0, &c.1) != **w).count();
        total += rows;
    }
    assert!(changed > 0, "no mask changed any id: the masked cases prove nothing");
    // Edited rows (penalties, logit_bias, bans), some masked too: `logit_edits` then
    // `sample_masked` against `sample_rows_masked`, and the edited logits bit for bit.
    let mut edited = 0;
    let mut logprob_rows = 0;
    for vocab in [40usize, 1000] {
        let rows = 16;
        let cases: Vec<_> = (0..rows).map(|_| case(&mut r, vocab)).collect();
        let mut masks = RowMasks::none(rows, vocab);
        for (row, (row_logits, _)) in cases.iter().enumerate() {
            if r.next().is_multiple_of(4) {
                let mut m = vec![0u32; masks.words];
                (0..vocab).filter(|_| !r.next().is_multiple_of(3)).for_each(|t| m[t / 32] |= 1 << (t % 32));
                masks.set(row, &m);
            }
            if r.next().is_multiple_of(5) {
                continue;
            }
            // Distinct tokens, the row's best among them now and then (so edits move the argmax).
            let mut tokens: Vec<u32> = (0..vocab as u32).filter(|_| r.next().is_multiple_of(4)).collect();
            if let Some(best) = (0..vocab).max_by(|&a, &b| row_logits[a].total_cmp(&row_logits[b])) {
                if !tokens.contains(&(best as u32)) {
                    tokens.push(best as u32);
                }
            }
            let edits = tokens
                .into_iter()
                .map(|token| LogitEdit {
                    token,
                    repetition: r.next().is_multiple_of(2).then(|| r.pick(&[0.5f32, 1.1, 1.3, 2.0, 10.0])),
                    subtract: r.next().is_multiple_of(2).then(|| r.pick(&[0.1f32, 1.5, 3.7, -2.0])),
                    bias: r.next().is_multiple_of(3).then(|| r.pick(&[-100.0f32, -2.5, 0.3, 5.0, 100.0])),
                    ban: r.next().is_multiple_of(10),
                })
                .collect();
            masks.set_edits(row, edits);
        }
        masks.check(rows, vocab).unwrap();
        let mut bytes = masked_input(&cases, vocab, &masks);
        let (start, words) = masks.edit_words();
        bytes.extend((*start.last().unwrap()).to_le_bytes());
        start.iter().chain(&words).for_each(|w| bytes.extend(w.to_le_bytes()));
        // Logprobs of the raw logits for most rows (after the edits were undone).
        let top_n: Vec<u32> = (0..rows).map(|_| r.pick(&[u32::MAX, 0, 1, 5, 20])).collect();
        top_n.iter().for_each(|w| bytes.extend(w.to_le_bytes()));
        let (inp, outp) = (dir.join("in.bin"), dir.join("out.bin"));
        std::fs::write(&inp, &bytes).unwrap();
        let run = Command::new(exe).env("TANDEM_CUDA_SAMPLER", variant).arg(&inp).arg(&outp).output().unwrap();
        assert!(run.status.success(), "sample_io (edited) failed: {}", String::from_utf8_lossy(&run.stderr));
        let words_out: Vec<u32> =
            std::fs::read(&outp).unwrap().chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        let k = MAX_TOP_LOGPROBS;
        assert_eq!(words_out.len(), rows + rows * vocab + rows + 2 * rows * k);
        let logits: Vec<f32> = cases.iter().flat_map(|c| c.0.iter().copied()).collect();
        let mut want_logits = logits.clone();
        for row in 0..rows {
            for e in masks.row_edits(row) {
                let x = &mut want_logits[row * vocab + e.token as usize];
                *x = e.apply(*x);
            }
        }
        let got_logits = &words_out[rows..rows + rows * vocab];
        for (i, (g, w)) in got_logits.iter().zip(&want_logits).enumerate() {
            assert_eq!(
                *g,
                w.to_bits(),
                "edited logit {i} (row {}, token {}): kernel {}, host {w}",
                i / vocab,
                i % vocab,
                f32::from_bits(*g)
            );
        }
        let specs: Vec<SampleSpec> = cases.iter().map(|c| c.1).collect();
        let want = sample_rows_masked(&logits, vocab, &specs, &masks);
        assert_eq!(&words_out[..rows], &want[..], "edited rows, vocab {vocab}");
        // The logprobs: bitwise `logprobs_row` of the raw row at the sampled id.
        let lp = &words_out[rows + rows * vocab..];
        let (lp_tok, top_ids, top_lp) = (&lp[..rows], &lp[rows..rows + rows * k], &lp[rows + rows * k..]);
        for row in 0..rows {
            if top_n[row] == u32::MAX {
                continue;
            }
            let w = logprobs_row(&logits[row * vocab..(row + 1) * vocab], want[row], top_n[row] as usize);
            assert_eq!(
                lp_tok[row],
                w.logprob.to_bits(),
                "row {row} logprob: kernel {}, host {}",
                f32::from_bits(lp_tok[row]),
                w.logprob
            );
            let got: Vec<(u32, u32)> = (0..k)
                .map(|i| (top_ids[row * k + i], top_lp[row * k + i]))
                .take_while(|(t, _)| *t != u32::MAX)
                .collect();
            let host: Vec<(u32, u32)> = w.top.iter().map(|(t, l)| (*t, l.to_bits())).collect();
            assert_eq!(got, host, "row {row} top {}", top_n[row]);
            logprob_rows += 1;
        }
        let plain = RowMasks { edits: vec![], ..masks.clone() };
        edited +=
            want.iter().zip(sample_rows_masked(&logits, vocab, &specs, &plain)).filter(|(a, b)| **a != *b).count();
        total += rows;
    }
    assert!(edited > 0, "no edit changed any id: the edited cases prove nothing");
    assert!(logprob_rows >= 10, "only {logprob_rows} rows asked for logprobs");
    println!("sampling kernel ({variant}) == host sampler on {total} rows ({changed} ids changed by their masks, {edited} by their edits; {logprob_rows} rows' logprobs)");
}
