//! Our dequantiser against an independent one: tests/fixtures/gguf-quants holds raw GGUF blocks
//! and the f32 values the `gguf` Python package's numpy dequantiser gives for them (written by
//! the committed make.py there; CI only reads the files). Every value must match bitwise.

use std::path::Path;
use tandem_model_files::quant::{dequantize, GgmlType};

fn read(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf-quants").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn check(ty: GgmlType) {
    let name = ty.name();
    let blocks = read(&format!("{name}.bin"));
    let want: Vec<f32> =
        read(&format!("{name}.f32")).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let (per, size) = ty.block_layout().unwrap();
    assert_eq!(blocks.len() as u64 / size * per, want.len() as u64, "{name}: fixture sizes disagree");
    let got = dequantize(ty, &blocks, want.len()).unwrap();
    let mut bad = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        if g.to_bits() != w.to_bits() {
            if bad < 8 {
                eprintln!(
                    "{name} element {i} (block {}, offset {}): got {g:e}, gguf {w:e}",
                    i as u64 / per,
                    i as u64 % per
                );
            }
            bad += 1;
        }
    }
    assert_eq!(bad, 0, "{name}: {bad} of {} values differ from the gguf package's", want.len());
    // The fixtures are not trivial: many distinct values, both signs.
    let mut distinct: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 100, "{name}: only {} distinct values", distinct.len());
    assert!(want.iter().any(|v| *v < 0.0) && want.iter().any(|v| *v > 0.0), "{name}");
}

#[test]
fn q4_0() {
    check(GgmlType::Q4_0);
}
#[test]
fn q4_1() {
    check(GgmlType::Q4_1);
}
#[test]
fn q5_0() {
    check(GgmlType::Q5_0);
}
#[test]
fn q5_1() {
    check(GgmlType::Q5_1);
}
#[test]
fn q8_0() {
    check(GgmlType::Q8_0);
}
#[test]
fn q2_k() {
    check(GgmlType::Q2K);
}
#[test]
fn q3_k() {
    check(GgmlType::Q3K);
}
#[test]
fn q4_k() {
    check(GgmlType::Q4K);
}
#[test]
fn q5_k() {
    check(GgmlType::Q5K);
}
#[test]
fn q6_k() {
    check(GgmlType::Q6K);
}

/// A truncated fixture (any length short of whole blocks) is an error, never a panic.
#[test]
fn truncated_k_quant_blocks_are_errors() {
    for ty in [GgmlType::Q2K, GgmlType::Q3K, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let blocks = read(&format!("{}.bin", ty.name()));
        for cut in [1, 2, 17, 100] {
            let e = dequantize(
                ty,
                &blocks[..blocks.len() - cut],
                blocks.len() / ty.block_layout().unwrap().1 as usize * 256,
            )
            .unwrap_err();
            assert!(e.contains(&ty.name()) && e.contains("bytes"), "{e}");
        }
    }
}
