//! The H200 timings committed under docs/results/*/ that the performance model is calibrated
//! against: the kernel lab tables of a check (check.log) and of a tuning round (tune/tune.log,
//! one table per GEMM variant set), and ncu's Duration of the profiled launches
//! (tune/ncu-*.txt). Tables printed under ncu (every launch serialised and replayed) are not
//! timings and are skipped; so are the torch tables and the end-to-end figures.

use std::path::Path;

use anyhow::{Context, Result};

/// A kernel lab case (attention at the head_dim of the lab's shape).
#[derive(Clone, Debug, PartialEq)]
pub enum Case {
    Gemm {
        op: String,
        m: usize,
        n: usize,
        k: usize,
    },
    AttnDecode {
        batch: usize,
        ctx: usize,
        d: usize,
    },
    AttnPrefill {
        tokens: usize,
        d: usize,
    },
    /// `argmax` or `sample top-p 0.9` etc. over `batch` rows of `vocab` logits.
    Sample {
        op: String,
        batch: usize,
        vocab: usize,
    },
}

impl Case {
    pub fn label(&self) -> String {
        match self {
            Case::Gemm { op, m, n, k } => format!("gemm {op} m={m} n={n} k={k}"),
            Case::AttnDecode { batch, ctx, d } => format!("attention decode d{d} b={batch} ctx={ctx}"),
            Case::AttnPrefill { tokens, d } => format!("attention prefill d{d} tokens={tokens}"),
            Case::Sample { op, batch, vocab } => format!("{op} batch={batch} vocab={vocab}"),
        }
    }
}

/// head_dim of the lab's shapes (crates/cli/src/bench/kernels.rs `shape`).
pub fn head_dim_of(shape: &str) -> Option<usize> {
    match shape {
        "llama-3.2-1b" => Some(64),
        "llama-3.1-8b" => Some(128),
        "gemma-3-1b" => Some(256),
        _ => None,
    }
}

/// One measured time: the variant that ran (a GEMM tile's name or `attn tc`), the case, and
/// where it was read.
#[derive(Clone, Debug)]
pub struct Timing {
    pub variant: String,
    pub case: Case,
    pub us: f64,
    pub source: String,
}

/// The GEMM tiles serving an m under a LARGE:MID:SMALL set (crates/cuda/src/gemm.rs
/// `gemm_kernel_of`, 64-wide tiles).
pub fn tile_for(set: &str, m: usize) -> Option<String> {
    let parts: Vec<&str> = set.split(':').collect();
    if parts.len() != 3 {
        return None;
    }
    Some(
        match m {
            0..=16 => parts[2],
            17..=128 => parts[1],
            _ => parts[0],
        }
        .to_string(),
    )
}

/// The defaults the check ran with before the 2026-12-04 tuning round changed them
/// (crates/cuda/src/gemm.rs names the later ones): a check.log's lab names no variant.
pub const CHECK_DEFAULT_SET: &str = "m128:m64:m16";

/// Parses one kernel lab row (`| gemm qkv | m=1 n=3072 k=2048 | 15.1 | ...`) of a lab run at
/// head_dim `d`.
pub fn parse_row(line: &str, d: usize) -> Option<(Case, f64)> {
    let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
    if cells.len() < 3 {
        return None;
    }
    let us: f64 = cells[2].parse().ok()?;
    let field = |name: &str| -> Option<usize> {
        cells[1]
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')).and_then(|v| v.parse().ok()))
    };
    let case = if let Some(op) = cells[0].strip_prefix("gemm ") {
        Case::Gemm { op: op.to_string(), m: field("m")?, n: field("n")?, k: field("k")? }
    } else if cells[0] == "attention decode" {
        Case::AttnDecode { batch: field("batch")?, ctx: field("ctx")?, d }
    } else if cells[0] == "attention prefill" {
        Case::AttnPrefill { tokens: field("tokens")?, d }
    } else if cells[0] == "argmax" || cells[0].starts_with("sample ") {
        Case::Sample { op: cells[0].to_string(), batch: field("batch")?, vocab: field("vocab")? }
    } else {
        return None;
    };
    Some((case, us))
}

const LAB_HEADER: &str = "| op | case | us | GB/s | TFLOP/s | of floor |";

/// What one `===== ` step of a log timed: the GEMM variant set (LARGE:MID:SMALL), the
/// attention variant (`attn tc`, `attn d256 partial`, ...), the sampler pair, and the head_dim
/// of its shape. None: not a lab step (ncu, torch, end-to-end benches).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub gemm_set: String,
    pub attn: String,
    pub sampler: Option<(String, String)>,
    pub d: usize,
}

pub fn parse_step(title: &str) -> Option<Step> {
    let shape = title.split("--shape ").nth(1)?.split_whitespace().next()?;
    let d = head_dim_of(shape)?;
    let bracket = match (title.find('['), title.find(']')) {
        (Some(a), Some(b)) if a < b => Some(&title[a + 1..b]),
        _ => None,
    };
    let default_attn = if d == 256 { "attn d256 partial" } else { "attn tc" }.to_string();
    let mut step = Step { gemm_set: CHECK_DEFAULT_SET.to_string(), attn: default_attn, sampler: None, d };
    let words: Vec<&str> = bracket.map(|b| b.split_whitespace().collect()).unwrap_or_default();
    if title.starts_with("kernel lab torch") {
        return None;
    } else if title.starts_with("kernel lab ") {
        if let Some(set) = bracket {
            step.gemm_set = set.to_string();
        }
    } else if title.starts_with("attention lab ") || title.starts_with("prefill attention [") {
        step.attn = match words.as_slice() {
            ["d256", v, ..] => format!("attn d256 {v}"),
            [v, ..] => format!("attn {v}"),
            [] => return None,
        };
    } else if title.starts_with("sampling lab ") {
        let (sv, av) = bracket?.split_once(':')?;
        step.sampler = Some((sv.to_string(), av.to_string()));
    } else {
        return None;
    }
    Some(step)
}

/// The variant a row of `step` timed.
fn variant_of(step: &Step, case: &Case) -> Option<String> {
    match case {
        Case::Gemm { m, .. } => tile_for(&step.gemm_set, *m),
        Case::AttnDecode { .. } | Case::AttnPrefill { .. } => Some(step.attn.clone()),
        Case::Sample { op, .. } => {
            let (sv, av) = step.sampler.clone().unwrap_or(("bisect".into(), "one".into()));
            Some(if op == "argmax" {
                if av == "multi" { "argmax_multi" } else { "argmax" }.to_string()
            } else {
                format!("sample_{sv}")
            })
        }
    }
}

/// The lab tables of a check.log or tune.log: each lab step (`===== kernel lab`, `attention
/// lab`, `prefill attention`, `sampling lab`), its variants from its title (tune.sh names them
/// in brackets) or the defaults.
pub fn parse_log(text: &str, source: &str) -> Vec<Timing> {
    let mut out = Vec::new();
    let mut step: Option<Step> = None;
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        if let Some(title) = line.strip_prefix("===== ") {
            in_table = false;
            step = parse_step(title);
            continue;
        }
        if line.starts_with("----- ") {
            step = None;
            continue;
        }
        let Some(st) = &step else { continue };
        if line.trim() == LAB_HEADER {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        let Some((case, us)) = parse_row(line, st.d) else { continue };
        let Some(variant) = variant_of(st, &case) else { continue };
        out.push(Timing { variant, case, us, source: format!("{source}:{}", i + 1) });
    }
    out
}

/// An ncu report: the profiled kernel (`  NAME (gx, gy, gz)x(...)`), its Duration, and the
/// case: the lab's first row of that kind in the report (ncu profiled the first launch).
pub fn parse_ncu(text: &str, source: &str) -> Option<Timing> {
    let kernel_line = text.lines().find(|l| l.starts_with("  ") && l.contains(")x(") && l.contains("CC "))?;
    let name = kernel_line.split_whitespace().next()?;
    let us: f64 = text
        .lines()
        .find(|l| l.trim_start().starts_with("Duration") && l.contains(" us "))?
        .split_whitespace()
        .last()?
        .replace(',', "")
        .parse()
        .ok()?;
    let d = if name.contains("_d128") { 128 } else { 64 };
    let rows: Vec<Case> = text.lines().filter_map(|l| parse_row(l, d)).map(|(c, _)| c).collect();
    if let Some(suffix) = name.strip_prefix("matmul_tc_bf16_") {
        let case = rows.into_iter().find(|c| matches!(c, Case::Gemm { .. }))?;
        return Some(Timing { variant: suffix.to_string(), case, us, source: source.to_string() });
    }
    let attn = if name.starts_with("paged_attention_tc_deep_") {
        "attn tc_deep"
    } else if name.starts_with("paged_attention_tc_shared_") {
        "attn tc_shared"
    } else if name.starts_with("paged_attention_wgmma_") {
        "attn wgmma"
    } else if name.starts_with("paged_attention_tc_d64") || name.starts_with("paged_attention_tc_d128") {
        "attn tc"
    } else {
        return None;
    };
    if name.starts_with("paged_attention_") {
        let case = rows.into_iter().find(|c| matches!(c, Case::AttnDecode { .. }))?;
        return Some(Timing { variant: attn.to_string(), case, us, source: source.to_string() });
    }
    None
}

/// Every timing under `results` (docs/results): each `*h200*` directory's check.log,
/// tune/tune.log and tune/ncu-*.txt, in name order.
pub fn load(results: &Path, root: &Path) -> Result<Vec<Timing>> {
    let mut dirs: Vec<_> = std::fs::read_dir(results)
        .with_context(|| format!("reading {}", results.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().contains("h200")))
        .collect();
    dirs.sort();
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut out = Vec::new();
    for d in dirs {
        for log in [d.join("check.log"), d.join("tune/tune.log")] {
            if log.exists() {
                let text = std::fs::read_to_string(&log).with_context(|| format!("reading {}", log.display()))?;
                out.extend(parse_log(&text, &rel(&log)));
            }
        }
        let tune = d.join("tune");
        if tune.is_dir() {
            let mut ncu: Vec<_> = std::fs::read_dir(&tune)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("ncu-")))
                .collect();
            ncu.sort();
            for f in ncu {
                let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
                out.extend(parse_ncu(&text, &rel(&f)));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_and_other_tables_do_not() {
        let (c, us) = parse_row("| gemm qkv | m=1 n=3072 k=2048 | 15.1 | 836.8 | 0.84 | - |", 64).unwrap();
        assert_eq!((c, us), (Case::Gemm { op: "qkv".into(), m: 1, n: 3072, k: 2048 }, 15.1));
        let (c, _) =
            parse_row("| attention decode | batch=8 ctx=4096 kv=bf16 | 43.4 | 1547.7 | 6.18 | 37% |", 64).unwrap();
        assert_eq!(c, Case::AttnDecode { batch: 8, ctx: 4096, d: 64 });
        let (c, _) = parse_row("| sample top-p 0.9 | batch=64 vocab=128256 | 80.5 | - | - | - |", 64).unwrap();
        assert_eq!(c, Case::Sample { op: "sample top-p 0.9".into(), batch: 64, vocab: 128256 });
        assert!(parse_row("| op | case | us | GB/s | TFLOP/s | of floor |", 64).is_none());
        assert!(parse_row("| prefill tok/s | 30934.3 | 30947.7 | - | - |", 64).is_none());
    }

    #[test]
    fn tiles_follow_m() {
        assert_eq!(tile_for("m128_occ2:m64:m16_s8", 1).as_deref(), Some("m16_s8"));
        assert_eq!(tile_for("m128_occ2:m64:m16_s8", 17).as_deref(), Some("m64"));
        assert_eq!(tile_for("m128_occ2:m64:m16_s8", 129).as_deref(), Some("m128_occ2"));
        assert_eq!(tile_for("bad", 1), None);
    }

    /// The committed 2026-12-04 run: the check's lab (30 GEMMs + 8 attention rows), three
    /// tuning tables of 22, four ncu launches; nothing from the tables printed under ncu or
    /// the torch table.
    #[test]
    fn the_committed_h200_run_parses_whole() {
        let root = crate::workspace_root();
        let t = load(&root.join("docs/results"), &root).unwrap();
        let from = |s: &str| t.iter().filter(|x| x.source.contains(s)).count();
        assert_eq!(from("2026-12-04-h200/check.log"), 38);
        assert_eq!(from("2026-12-04-h200/tune/tune.log"), 66);
        assert_eq!(from("2026-12-04-h200/tune/ncu-"), 4);
        let find = |v: &str, label: &str| t.iter().find(|x| x.variant == v && x.case.label() == label).map(|x| x.us);
        assert_eq!(find("m128_occ2", "gemm down m=2048 n=2048 k=8192"), Some(523.4));
        assert_eq!(find("m16_s8", "gemm qkv m=1 n=3072 k=2048"), Some(22.2));
        let ncu = t.iter().find(|x| x.source.ends_with("ncu-m2048-m128_n128.txt")).unwrap();
        assert_eq!((ncu.variant.as_str(), ncu.us), ("m128_n128", 247.01));
        assert_eq!(ncu.case.label(), "gemm qkv m=2048 n=3072 k=2048");
        let attn = t.iter().find(|x| x.source.ends_with("ncu-attn-decode.txt")).unwrap();
        assert_eq!((attn.case.label(), attn.us), ("attention decode d64 b=1 ctx=1024".to_string(), 25.7));
    }

    /// The steps gpu/tune.sh runs since: attention variants at their shapes, d256, samplers.
    #[test]
    fn tuning_steps_name_their_variants() {
        let log = "===== attention lab [tc_deep llama-3.1-8b] (timeout 90s): env X=1 bin bench kernels --backend cuda --shape llama-3.1-8b --m 1\n\
                   | op | case | us | GB/s | TFLOP/s | of floor |\n|---|---|---|---|---|---|\n\
                   | attention decode | batch=8 ctx=16384 kv=bf16 attn=tc_deep | 300.0 | - | - | 50% |\n\
                   ----- attention lab [tc_deep llama-3.1-8b]: rc=0 in 2s\n\
                   ===== attention lab [d256 tc gemma-3-1b] (timeout 90s): env bin bench kernels --shape gemma-3-1b --m 1\n\
                   | op | case | us | GB/s | TFLOP/s | of floor |\n\
                   | attention decode | batch=1 ctx=1024 kv=bf16 attn=d256=tc | 20.0 | - | - | - |\n\
                   ===== sampling lab [radix:multi] (timeout 60s): env bin bench kernels --shape llama-3.2-1b --only-sampling\n\
                   | op | case | us | GB/s | TFLOP/s | of floor |\n\
                   | argmax | batch=1 vocab=128256 | 9.0 | - | - | - |\n\
                   | sample top-p 0.9 | batch=1 vocab=128256 | 40.0 | - | - | - |\n\
                   ===== ncu m64-m64 (timeout 60s): ncu bin bench kernels --shape llama-3.2-1b\n\
                   | op | case | us | GB/s | TFLOP/s | of floor |\n\
                   | gemm qkv | m=64 n=3072 k=2048 | 74.0 | - | - | - |\n";
        let t = parse_log(log, "x");
        let got: Vec<(String, String, f64)> = t.iter().map(|x| (x.variant.clone(), x.case.label(), x.us)).collect();
        assert_eq!(
            got,
            vec![
                ("attn tc_deep".into(), "attention decode d128 b=8 ctx=16384".into(), 300.0),
                ("attn d256 tc".into(), "attention decode d256 b=1 ctx=1024".into(), 20.0),
                ("argmax_multi".into(), "argmax batch=1 vocab=128256".into(), 9.0),
                ("sample_radix".into(), "sample top-p 0.9 batch=1 vocab=128256".into(), 40.0),
            ]
        );
    }
}
