//! `cargo xtask kernels --predict`: the performance model's table. Calibration first: every
//! committed H200 timing (docs/results/*h200*/) beside its leave-one-variant-out prediction,
//! per kernel; then predictions for the variants no GPU has timed; the last line is the
//! calibration summary. `--write` also puts the predictions in docs/gpu/predictions.md and
//! docs/gpu/predictions.tsv: predictions for the next GPU run to score, never measurements
//! (docs/gpu/latest.json is never written here).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Result};

use crate::perf_calibration::{
    calibration_line, fit, launch_of, leave_one_variant_out, rank_agreement, ranked_cases, Scored, RANK_TIE,
};
use crate::perf_cases::{
    attention_decode, attention_decode_fp8, attention_prefill, gemm, moe, quant_gemv, quant_mma, quant_weight_bytes,
    sampler, tile_named, AttnShape, AttnVariant, FP8, GEMMA3_1B, INT4_G128, LLAMA_1B, LLAMA_8B, Q4_K, Q8_0,
};
use crate::perf_model::{predict, Launch, Params, Prediction, H200};
use crate::perf_timings::load;

/// The Llama-3.2-1B GEMMs of the kernel lab: (op, n, k).
const LAB_GEMMS: [(&str, usize, usize); 5] =
    [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate_up", 16384, 2048), ("down", 2048, 8192), ("lm_head", 128256, 2048)];

/// The Llama-3.1-8B layer GEMMs (hidden 4096, intermediate 14336, 8 KV heads of 128): (op, n, k).
const LAB_GEMMS_8B: [(&str, usize, usize); 4] =
    [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)];

/// A prediction for an untimed variant, with what it is compared to.
pub struct Row {
    pub kind: &'static str,
    pub variant: String,
    pub case: String,
    pub p: Prediction,
    /// The current default's prediction for the same case, when there is one.
    pub default_us: Option<f64>,
    pub ipm_source: &'static str,
}

fn row(kind: &'static str, variant: &str, case: String, l: &Launch, params: &Params, default: Option<&Launch>) -> Row {
    Row {
        kind,
        variant: variant.to_string(),
        case,
        p: predict(l, &H200, params),
        default_us: default.map(|d| predict(d, &H200, params).us),
        ipm_source: l.kernel.ipm_source,
    }
}

/// Every never-timed variant the lab can name, at the lab's shapes.
pub fn untimed(params: &Params) -> Vec<Row> {
    let mut rows = Vec::new();
    let tile = |n: &str| tile_named(n).expect("a tile of the table");
    // GEMM tiles: the small ones at decode m, the large ones at prefill m; the default of the
    // same m beside each (m16 / m128_occ2).
    for (variants, default, ms) in [
        (&["m16_x1", "m16_gemv4", "m16_gemv8"][..], "m16", &[1usize, 8][..]),
        (&["m128_w64", "wgmma", "wgmma_ws"][..], "m128_occ2", &[256, 512, 2048][..]),
    ] {
        for v in variants {
            for &(op, n, k) in &LAB_GEMMS {
                for &m in ms {
                    let l = gemm(&tile(v), m, n, k, op == "o");
                    let d = gemm(&tile(default), m, n, k, op == "o");
                    rows.push(row("gemm", v, format!("{op} m={m} n={n} k={k}"), &l, params, Some(&d)));
                }
            }
        }
    }
    // GGUF weights kept quantized (kernels/quant_matmul.cu), Q4_K and Q8_0, beside the bf16
    // GEMM's default tile at the same m; the case names the quantized floor (the weight's bytes
    // over the H200's measured copy bandwidth).
    for q in [Q4_K, Q8_0] {
        for &(op, n, k) in &LAB_GEMMS {
            for m in [1, 8, 64, 512] {
                let l = quant_gemv(q, m, n, k);
                let d = gemm(&tile(default_tile(m)), m, n, k, op == "o");
                let floor = quant_weight_bytes(q, n, k) / (H200.copy_gbs * 1e3);
                let case = format!("{op} m={m} n={n} k={k} floor={floor:.1}us");
                rows.push(row("quant", &format!("quant_matmul_{}", q.0), case, &l, params, Some(&d)));
            }
        }
    }
    // Int4 groups of 128 (AWQ, GPTQ) at decode: m = 1 and the verification widths k + 1 of 2
    // and 4 drafts (the kernel lab's `--quant-gemv` rows), beside the bf16 GEMM at the same m.
    for &(op, n, k) in LAB_GEMMS.iter().filter(|g| g.0 != "lm_head") {
        for m in [1, 3, 5] {
            let l = quant_gemv(INT4_G128, m, n, k);
            let d = gemm(&tile(default_tile(m)), m, n, k, op == "o");
            let floor = quant_weight_bytes(INT4_G128, n, k) / (H200.copy_gbs * 1e3);
            let case = format!("{op} m={m} n={n} k={k} floor={floor:.1}us");
            rows.push(row("quant", "quant_matmul_int4_g128", case, &l, params, Some(&d)));
        }
    }
    // FP8 and int4 (groups of 128) on the tensor cores (kernels/quant_mma.cu,
    // TANDEM_CUDA_QUANT_TC=1) beside the GEMV the layout takes by default, at the Llama-3.1-8B
    // layer shapes: decode (m = 1, the m16 tile) and prefill (m = 512, 2048, the m64 tile).
    for q in [INT4_G128, FP8, Q4_K] {
        for &(op, n, k) in &LAB_GEMMS_8B {
            for m in [1, 512, 2048] {
                let l = quant_mma(q, m, n, k);
                let d = quant_gemv(q, m, n, k);
                let floor = quant_weight_bytes(q, n, k) / (H200.copy_gbs * 1e3);
                let case = format!("8b {op} m={m} n={n} k={k} floor={floor:.1}us");
                rows.push(row("quant", &format!("quant_mma_{}", q.0), case, &l, params, Some(&d)));
            }
        }
    }
    // Attention: tc_deep's decodes and tc_shared's and wgmma's prefills beside tc; tc at head_dim 128
    // (the 8B shape, never timed); tc_d256 beside partial (the gemma-3-1b shape).
    let shapes: [(&str, AttnShape); 2] = [("d64", LLAMA_1B), ("d128", LLAMA_8B)];
    for (sname, s) in shapes {
        let batches: &[usize] = if s.head_dim == 64 { &[1, 8, 64] } else { &[1, 8] };
        for &b in batches {
            for ctx in [1024, 4096, 16384] {
                let case = format!("decode {sname} b={b} ctx={ctx}");
                let tc = attention_decode(AttnVariant::Tc, s, b, ctx);
                let deep = attention_decode(AttnVariant::TcDeep, s, b, ctx);
                rows.push(row("attention", "tc_deep", case.clone(), &deep, params, Some(&tc)));
                if s.head_dim == 128 {
                    rows.push(row("attention", "tc", case, &tc, params, None));
                }
            }
        }
        for tokens in [512, 2048] {
            let case = format!("prefill {sname} tokens={tokens}");
            let tc = attention_prefill(AttnVariant::Tc, s, tokens);
            let sh = attention_prefill(AttnVariant::TcShared, s, tokens);
            rows.push(row("attention", "tc_shared", case.clone(), &sh, params, Some(&tc)));
            let wg = attention_prefill(AttnVariant::Wgmma, s, tokens);
            rows.push(row("attention", "attn_wgmma", case.clone(), &wg, params, Some(&tc)));
            if s.head_dim == 128 {
                rows.push(row("attention", "tc", case, &tc, params, None));
            }
        }
    }
    // Decode over an fp8 KV cache (tc's fp8 form, the default, and the partial kernel under
    // TANDEM_CUDA_ATTENTION=f32, both decoding bytes) beside tc over bf16, at the lab's
    // `attention decode fp8` cases (llama-3.2-1b).
    for b in [1, 8, 64] {
        for ctx in [1024, 4096] {
            let case = format!("decode d64 b={b} ctx={ctx}");
            let tc = attention_decode(AttnVariant::Tc, LLAMA_1B, b, ctx);
            let fp8 = attention_decode_fp8(AttnVariant::Tc, LLAMA_1B, b, ctx);
            rows.push(row("attention", "tc fp8_e4m3", case.clone(), &fp8, params, Some(&tc)));
            let partial = attention_decode_fp8(AttnVariant::Partial, LLAMA_1B, b, ctx);
            rows.push(row("attention", "partial fp8_e4m3", case, &partial, params, Some(&tc)));
        }
    }
    for b in [1, 8, 64] {
        for ctx in [1024, 4096] {
            let case = format!("decode d256 b={b} ctx={ctx}");
            let partial = attention_decode(AttnVariant::Partial, GEMMA3_1B, b, ctx);
            let tc = attention_decode(AttnVariant::Tc, GEMMA3_1B, b, ctx);
            rows.push(row("attention", "tc_d256", case.clone(), &tc, params, Some(&partial)));
            rows.push(row("attention", "partial d256", case, &partial, params, None));
        }
    }
    // The wgmma attention's prefills at head_dim 256 (whole rows a block) beside tc_d256's.
    for tokens in [512, 2048] {
        let case = format!("prefill d256 tokens={tokens}");
        let tc = attention_prefill(AttnVariant::Tc, GEMMA3_1B, tokens);
        let wg = attention_prefill(AttnVariant::Wgmma, GEMMA3_1B, tokens);
        rows.push(row("attention", "attn_wgmma", case, &wg, params, Some(&tc)));
    }
    // The routed MoE GEMMs (Qwen3-30B-A3B's layer: hidden 2048, 128 experts of 768, top 8).
    for tokens in [1, 64, 2048] {
        let (gu, down) = moe(tokens, 128, 8, 2048, 768);
        rows.push(row("moe", "moe_gemm gate_up", format!("qwen3-30b-a3b tokens={tokens}"), &gu, params, None));
        rows.push(row("moe", "moe_gemm down", format!("qwen3-30b-a3b tokens={tokens}"), &down, params, None));
    }
    // Samplers and argmax at Llama 3's vocabulary.
    for b in [1, 64] {
        for (v, default) in [
            ("argmax", None),
            ("argmax_multi", Some("argmax")),
            ("sample_bisect", None),
            ("sample_radix", Some("sample_bisect")),
            ("sample_multi", Some("sample_bisect")),
        ] {
            let l = sampler(v, b, 128256);
            let d = default.map(|d| sampler(d, b, 128256));
            rows.push(row("sampler", v, format!("vocab=128256 batch={b}"), &l, params, d.as_ref()));
        }
    }
    rows
}

/// The bf16 GEMM's default tile at m rows (crates/cuda/src/gemm.rs: m16 up to 16, m64_occ4 to
/// 128, m128_occ2 above).
fn default_tile(m: usize) -> &'static str {
    match m {
        0..=16 => "m16",
        17..=128 => "m64_occ4",
        _ => "m128_occ2",
    }
}

fn fmt_params(p: &Params) -> String {
    format!(
        "launch {:.2} us, memory round trip {:.2} us, {:.2} cycles between a warp's issues, {:.0}% of copy bandwidth, L2 {:.0} GB/s, fold round {:.3} us, an mma.sync holds its warp {:.1} cycles, code fetched at {:.0} GB/s",
        p.launch_us,
        p.mem_latency_us,
        p.issue_cycles,
        p.dram_eff * 100.0,
        p.l2_gbs,
        p.fold_round_us,
        p.mma_cycles,
        p.fetch_gbs
    )
}

fn calibration_table(scored: &[Scored]) -> String {
    let mut s = String::from(
        "| variant | case | measured us | predicted us | error | bound | source |\n|---|---|---|---|---|---|---|\n",
    );
    for x in scored {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.1} | {:+.0}% | {} | {} |",
            x.timing.variant,
            x.timing.case.label(),
            x.timing.us,
            x.prediction.us,
            x.error() * 100.0,
            x.prediction.bound.name(),
            x.timing.source
        );
    }
    s
}

/// Per variant: timings, median and worst |error|, median signed error.
fn variant_summary(scored: &[Scored]) -> String {
    let mut variants: Vec<&str> = scored.iter().map(|s| s.timing.variant.as_str()).collect();
    variants.sort();
    variants.dedup();
    let mut s = String::from(
        "| variant | timings | median abs error | worst abs error | median signed error |\n|---|---|---|---|---|\n",
    );
    for v in variants {
        let mine: Vec<&Scored> = scored.iter().filter(|x| x.timing.variant == v).collect();
        let mut abs: Vec<f64> = mine.iter().map(|x| x.error().abs()).collect();
        let mut signed: Vec<f64> = mine.iter().map(|x| x.error()).collect();
        abs.sort_by(|a, b| a.total_cmp(b));
        signed.sort_by(|a, b| a.total_cmp(b));
        let _ = writeln!(
            s,
            "| {v} | {} | {:.0}% | {:.0}% | {:+.0}% |",
            mine.len(),
            abs[abs.len() / 2] * 100.0,
            abs[abs.len() - 1] * 100.0,
            signed[signed.len() / 2] * 100.0
        );
    }
    s
}

/// Each case timed on two or more variants: the variants in the H200's order, measured and
/// predicted, and whether the model keeps that order (ties within [`RANK_TIE`] go either way).
fn rank_table(scored: &[Scored]) -> String {
    let mut s = String::from(
        "| case | variants, fastest measured first: measured / predicted us | order kept |\n|---|---|---|\n",
    );
    for mut c in ranked_cases(scored, RANK_TIE) {
        c.variants.sort_by(|a, b| a.1.total_cmp(&b.1));
        let v: Vec<String> = c.variants.iter().map(|(n, m, p)| format!("{n} {m:.1} / {p:.1}")).collect();
        let _ = writeln!(s, "| {} | {} | {} |", c.case, v.join(", "), if c.agrees { "yes" } else { "**no**" });
    }
    s
}

fn prediction_table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| kind | variant | case | predicted us | bound | waves | blocks/SM | default's predicted us |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let d = r.default_us.map_or("-".to_string(), |d| format!("{d:.1}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            r.kind,
            r.variant,
            r.case,
            r.p.us,
            r.p.bound.name(),
            r.p.waves,
            r.p.blocks_per_sm,
            d
        );
    }
    s
}

fn prediction_tsv(rows: &[Row]) -> String {
    let mut s = String::from(
        "# PREDICTIONS of the CPU performance model (cargo xtask kernels --predict --write), not measurements\n\
         kind\tvariant\tcase\tpredicted_us\tbound\tlaunch_us\tfetch_us\tdram_us\tl2_us\ttensor_us\tissue_us\tlatency_us\twaves\tblocks_per_sm\tdefault_predicted_us\tipm_source\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{}\t{}\t{}\t{:.2}\t{}\t{:.2}\t{:.2}\t{:.2}\t{:.2}\t{:.2}\t{:.2}\t{:.2}\t{}\t{}\t{}\t{}",
            r.kind,
            r.variant,
            r.case,
            r.p.us,
            r.p.bound.name(),
            r.p.launch_us,
            r.p.fetch_us,
            r.p.dram_us,
            r.p.l2_us,
            r.p.tensor_us,
            r.p.issue_us,
            r.p.latency_us,
            r.p.waves,
            r.p.blocks_per_sm,
            r.default_us.map_or("-".to_string(), |d| format!("{d:.2}")),
            r.ipm_source
        );
    }
    s
}

pub fn run(write: bool) -> Result<()> {
    let root = crate::workspace_root();
    let timings = load(&root.join("docs/results"), &root)?;
    if timings.is_empty() {
        bail!("no H200 timings found under {}", root.join("docs/results").display());
    }
    let scored = leave_one_variant_out(&timings);
    let all: Vec<(Launch, f64)> = timings.iter().filter_map(|t| launch_of(t).map(|l| (l, t.us))).collect();
    let params = fit(&all);
    println!(
        "### performance model: calibration (leave-one-variant-out) against {} committed H200 timings\n",
        timings.len()
    );
    print!("{}", calibration_table(&scored));
    println!();
    print!("{}", variant_summary(&scored));
    println!();
    print!("{}", rank_table(&scored));
    println!("\nfitted on every timing: {}\n", fmt_params(&params));
    let rows = untimed(&params);
    println!("### predictions for the variants no GPU has timed (PREDICTIONS, not measurements)\n");
    print!("{}", prediction_table(&rows));
    let line = calibration_line(&scored);
    let (strict, cases) = rank_agreement(&scored, 0.0);
    let strict_line = format!(
        "rank agreement in strict order (the last line lets measured times within {:.0}% go either way): {strict}/{cases}",
        RANK_TIE * 100.0
    );
    if write {
        write_predictions(&root, &rows, &params, &line)?;
        let cal = root.join("docs/gpu/perf-model-calibration.md");
        let mut c = String::from(
            "# The performance model's calibration (generated)\n\n\
             `cargo xtask kernels --predict --write`: every committed H200 timing beside the model's\n\
             leave-one-variant-out prediction (the variant's own timings never fitted). What the model\n\
             is: docs/perf-model.md.\n\n",
        );
        let _ = writeln!(c, "`{line}`\n\n{strict_line}.\n");
        c.push_str(&variant_summary(&scored));
        c.push_str("\nThe variants' order per case (leave-one-variant-out predictions):\n\n");
        c.push_str(&rank_table(&scored));
        let _ = writeln!(c, "\nParameters fitted on every timing: {}.\n", fmt_params(&params));
        c.push_str(&calibration_table(&scored));
        std::fs::write(&cal, c)?;
        println!("wrote {}", cal.display());
    }
    println!("\n{strict_line}");
    println!("{line}");
    Ok(())
}

fn write_predictions(root: &Path, rows: &[Row], params: &Params, line: &str) -> Result<()> {
    let dir = root.join("docs/gpu");
    let (md, tsv) = (dir.join("predictions.md"), dir.join("predictions.tsv"));
    for p in [&md, &tsv] {
        if p.file_name().is_some_and(|n| n == "latest.json") {
            bail!("the performance model never writes {}", p.display());
        }
    }
    let mut s = String::from(
        "# Predictions for the next GPU run (CPU performance model)\n\n\
         PREDICTIONS of `cargo xtask kernels --predict --write` for every kernel variant no GPU has\n\
         timed, on the H200 (132 SMs, the copy bandwidth gpu/ceilings.py measured), for the next\n\
         GPU run to score. Not measurements: nothing here goes into docs/gpu/latest.json. The\n\
         model and its terms: docs/perf-model.md. Machine-readable: predictions.tsv beside this.\n\n",
    );
    let _ = writeln!(s, "Parameters (fitted on every committed timing): {}.\n", fmt_params(params));
    let _ = writeln!(s, "The model's own score on the committed timings: `{line}`.\n");
    s.push_str(&prediction_table(rows));
    std::fs::write(&md, s)?;
    std::fs::write(&tsv, prediction_tsv(rows))?;
    println!("\nwrote {} and {}", md.display(), tsv.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf_model::PRIOR;

    /// Every untimed variant the lab names has rows, each a finite positive time.
    #[test]
    fn every_untimed_variant_is_predicted() {
        let rows = untimed(&PRIOR);
        for v in [
            "m16_x1",
            "m16_gemv4",
            "m16_gemv8",
            "m128_w64",
            "wgmma",
            "wgmma_ws",
            "tc_deep",
            "tc_shared",
            "attn_wgmma",
            "tc_d256",
            "moe_gemm gate_up",
            "moe_gemm down",
            "argmax_multi",
            "sample_radix",
            "sample_multi",
            "quant_matmul_q4_k",
            "quant_matmul_q8_0",
            "quant_matmul_int4_g128",
            "quant_mma_int4_g128",
            "quant_mma_fp8",
            "quant_mma_q4_k",
        ] {
            assert!(rows.iter().any(|r| r.variant == v), "{v} has no prediction");
        }
        assert!(rows.iter().all(|r| r.p.us.is_finite() && r.p.us > 0.0));
        assert!(prediction_tsv(&rows).starts_with("# PREDICTIONS"));
    }
}
