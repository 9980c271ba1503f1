//! The int4 conversions against packers written as the formats' own tools write them (AutoAWQ's
//! `WQLinear_GEMM.from_linear`, AutoGPTQ's `QuantLinear.pack`, compressed-tensors'
//! `pack_to_int32`), and the config checks.

use super::*;
use crate::quant_layout::QuantLayout;

/// A small deterministic generator (no dependency for a test).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A weight's truth: values `q[o][i]`, zeros `z[o][g]` and scales `s[o][g]`.
struct Truth {
    rows: usize,
    cols: usize,
    group: usize,
    q: Vec<Vec<u8>>,
    z: Vec<Vec<u8>>,
    s: Vec<Vec<f32>>,
}

fn truth(rows: usize, cols: usize, group: usize, seed: u64) -> Truth {
    let mut r = Lcg(seed);
    let groups = cols / group;
    let q = (0..rows).map(|_| (0..cols).map(|_| (r.next() % 16) as u8).collect()).collect();
    let z = (0..rows).map(|_| (0..groups).map(|_| (r.next() % 16) as u8).collect()).collect();
    let s = (0..rows)
        .map(|_| (0..groups).map(|_| half::f16::from_f32((r.next() % 1000) as f32 * 1e-4 + 1e-3).to_f32()).collect())
        .collect();
    Truth { rows, cols, group, q, z, s }
}

impl Truth {
    fn expected(&self) -> Vec<f32> {
        let mut out = vec![];
        for o in 0..self.rows {
            for i in 0..self.cols {
                let g = i / self.group;
                out.push((self.q[o][i] as f32 - self.z[o][g] as f32) * self.s[o][g]);
            }
        }
        out
    }
    /// Scales `[groups, rows]` as AWQ and GPTQ store them.
    fn scales_in_out(&self) -> Vec<f32> {
        let groups = self.cols / self.group;
        (0..groups).flat_map(|g| (0..self.rows).map(move |o| (g, o))).map(|(g, o)| self.s[o][g]).collect()
    }
}

fn decode(shape: [usize; 2], group: usize, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; shape[0] * shape[1]];
    QuantLayout::Int4Group { group }.dequantize(bytes, &mut out).unwrap();
    out
}

fn run(
    format: Int4Format,
    ints: &[(&str, Vec<usize>, Vec<i64>)],
    vals: &[(&str, Vec<usize>, Vec<f32>)],
) -> std::result::Result<([usize; 2], usize, Vec<u8>), String> {
    let int = |n: &str| ints.iter().find(|t| t.0 == n).map(|t| (t.1.clone(), t.2.clone()));
    let val = |n: &str| vals.iter().find(|t| t.0 == n).map(|t| (t.1.clone(), t.2.clone()));
    convert(format, &Parts { int: &int, val: &val })
}

#[test]
fn a_block_decodes_as_q_minus_z_times_s() {
    let mut b = vec![0u8; HEADER_BYTES + 4];
    b[..4].copy_from_slice(&0.5f32.to_le_bytes());
    b[4] = 8;
    b[8] = 0x3f; // inputs 0 (15) and 1 (3)
    b[9] = 0x80; // inputs 2 (0) and 3 (8)
    let mut o = [0f32; 8];
    block_int4(&b, &mut o);
    assert_eq!(o[..4], [3.5, -2.5, -4.0, 0.0]);
    assert_eq!(QuantLayout::Int4Group { group: 128 }.block_bytes(), 72);
}

#[test]
fn awq_gemm_packing_reads_back() {
    let t = truth(16, 64, 32, 1);
    let order = [0usize, 2, 4, 6, 1, 3, 5, 7];
    // AutoAWQ: intweight is [in, out]; word col holds out 8col + order[i] at bits 4i.
    let pack = |get: &dyn Fn(usize, usize) -> u8, n_in: usize| -> Vec<i64> {
        let mut out = vec![];
        for i in 0..n_in {
            for col in 0..t.rows / 8 {
                let mut w = 0u32;
                for (k, &ord) in order.iter().enumerate() {
                    w |= (get(i, col * 8 + ord) as u32) << (4 * k);
                }
                out.push(w as i32 as i64);
            }
        }
        out
    };
    let qweight = pack(&|i, o| t.q[o][i], t.cols);
    let qzeros = pack(&|g, o| t.z[o][g], t.cols / t.group);
    let groups = t.cols / t.group;
    let (shape, group, bytes) = run(
        Int4Format::Awq,
        &[("qweight", vec![t.cols, t.rows / 8], qweight), ("qzeros", vec![groups, t.rows / 8], qzeros)],
        &[("scales", vec![groups, t.rows], t.scales_in_out())],
    )
    .unwrap();
    assert_eq!((shape, group), ([16, 64], 32));
    assert_eq!(bytes.len(), 16 * 2 * (8 + 16));
    assert_eq!(decode(shape, group, &bytes), t.expected());
}

/// AutoGPTQ's layout: qweight `[in/8, out]` (input 8r + j at bits 4j), qzeros `[groups, out/8]`
/// (output 8c + j at bits 4j) holding `z - zero_offset`.
fn gptq_parts(t: &Truth, zero_offset: u8) -> Vec<(&'static str, Vec<usize>, Vec<i64>)> {
    let groups = t.cols / t.group;
    let mut qweight = vec![];
    for r in 0..t.cols / 8 {
        for o in 0..t.rows {
            let w = (0..8).fold(0u32, |w, j| w | (t.q[o][8 * r + j] as u32) << (4 * j));
            qweight.push(w as i32 as i64);
        }
    }
    let mut qzeros = vec![];
    for g in 0..groups {
        for c in 0..t.rows / 8 {
            let w = (0..8).fold(0u32, |w, j| w | (((t.z[8 * c + j][g] - zero_offset) & 0x0f) as u32) << (4 * j));
            qzeros.push(w as i32 as i64);
        }
    }
    let g_idx = (0..t.cols).map(|i| (i / t.group) as i64).collect();
    vec![
        ("qweight", vec![t.cols / 8, t.rows], qweight),
        ("qzeros", vec![groups, t.rows / 8], qzeros),
        ("g_idx", vec![t.cols], g_idx),
    ]
}

#[test]
fn gptq_packing_reads_back_with_zeros_stored_minus_one() {
    let mut t = truth(8, 256, 128, 2);
    for z in t.z.iter_mut().flatten() {
        *z = (*z).max(1); // stored minus one, so a zero of 0 cannot be written
    }
    let scales = [("scales", vec![2, 8], t.scales_in_out())];
    let (shape, group, bytes) = run(Int4Format::Gptq { zeros_minus_one: true }, &gptq_parts(&t, 1), &scales).unwrap();
    assert_eq!((shape, group), ([8, 256], 128));
    assert_eq!(decode(shape, group, &bytes), t.expected());
    let (shape, group, bytes) = run(Int4Format::Gptq { zeros_minus_one: false }, &gptq_parts(&t, 0), &scales).unwrap();
    assert_eq!(decode(shape, group, &bytes), t.expected());

    // Act order: a g_idx that is not i / group is refused, naming it.
    let mut parts = gptq_parts(&t, 1);
    parts[2].2.swap(0, 200);
    let e = run(Int4Format::Gptq { zeros_minus_one: true }, &parts, &scales).unwrap_err();
    assert!(e.contains("`g_idx`") && e.contains("act order"), "{e}");
    // A scale grid that does not fit is named.
    let bad = [("scales", vec![3, 8], vec![0.0; 24])];
    let e = run(Int4Format::Gptq { zeros_minus_one: true }, &gptq_parts(&t, 1), &bad).unwrap_err();
    assert!(e.contains("`scales`"), "{e}");
}

/// compressed-tensors' `pack_to_int32`: signed values plus 8, eight a word along `packed_dim`.
fn ct_pack(values: &[Vec<i8>], along_rows: bool) -> (Vec<usize>, Vec<i64>) {
    let (rows, cols) = (values.len(), values[0].len());
    let get = |r: usize, c: usize| (values[r][c] as i32 + 8) as u32;
    if along_rows {
        let mut out = vec![];
        for r in 0..rows.div_ceil(8) {
            for c in 0..cols {
                let w = (0..8).filter(|j| 8 * r + j < rows).fold(0u32, |w, j| w | get(8 * r + j, c) << (4 * j));
                out.push(w as i32 as i64);
            }
        }
        return (vec![rows.div_ceil(8), cols], out);
    }
    let mut out = vec![];
    for r in 0..rows {
        for k in 0..cols.div_ceil(8) {
            let w = (0..8).filter(|j| 8 * k + j < cols).fold(0u32, |w, j| w | get(r, 8 * k + j) << (4 * j));
            out.push(w as i32 as i64);
        }
    }
    (vec![rows, cols.div_ceil(8)], out)
}

#[test]
fn compressed_tensors_pack_quantized_reads_back() {
    for symmetric in [true, false] {
        let mut t = truth(12, 64, 16, 3);
        // Signed values in [-8, 7]; a symmetric scheme's zero is 0 (8 unsigned).
        let signed: Vec<Vec<i8>> = t.q.iter().map(|r| r.iter().map(|&q| q as i8 - 8).collect()).collect();
        let zp: Vec<Vec<i8>> =
            t.z.iter().map(|r| r.iter().map(|&z| if symmetric { 0 } else { z as i8 - 8 }).collect()).collect();
        if symmetric {
            t.z.iter_mut().flatten().for_each(|z| *z = 8);
        }
        let (ps, packed) = ct_pack(&signed, false);
        let scale: Vec<f32> = t.s.iter().flatten().copied().collect();
        let mut ints = vec![("weight_packed", ps, packed), ("weight_shape", vec![2], vec![12, 64])];
        if !symmetric {
            let (zs, z) = ct_pack(&zp, true);
            ints.push(("weight_zero_point", zs, z));
        }
        let (shape, group, bytes) =
            run(Int4Format::CompressedTensors, &ints, &[("weight_scale", vec![12, 4], scale)]).unwrap();
        assert_eq!((shape, group), ([12, 64], 16));
        assert_eq!(decode(shape, group, &bytes), t.expected(), "symmetric {symmetric}");
    }
}

#[test]
fn configs_are_read_and_unsupported_schemes_named() {
    let dir = std::env::temp_dir().join(format!("tandem-int4-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    let with = |q: &str| {
        std::fs::write(&path, format!(r#"{{"quantization_config": {q}}}"#)).unwrap();
        format_of(&path)
    };
    assert_eq!(
        with(r#"{"quant_method": "awq", "bits": 4, "group_size": 128, "version": "GEMM", "zero_point": true}"#)
            .unwrap(),
        Some(Int4Format::Awq)
    );
    assert_eq!(
        with(r#"{"quant_method": "gptq", "bits": 4, "desc_act": false, "sym": true}"#).unwrap(),
        Some(Int4Format::Gptq { zeros_minus_one: true })
    );
    let ct = r#"{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128, "actorder": null}, "input_activations": null, "targets": ["Linear"]}}}"#;
    assert_eq!(with(ct).unwrap(), Some(Int4Format::CompressedTensors));
    assert_eq!(with(r#"{"quant_method": "fp8"}"#).unwrap(), None);
    for (q, needle) in [
        (r#"{"quant_method": "gptq", "bits": 8}"#, "quantization_config.bits: 8-bit"),
        (r#"{"quant_method": "gptq", "bits": 4, "desc_act": true}"#, "quantization_config.desc_act"),
        (r#"{"quant_method": "awq", "bits": 4, "version": "gemv"}"#, "quantization_config.version"),
        (
            r#"{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int", "actorder": "group"}}}}"#,
            "config_groups.g.weights.actorder",
        ),
        (
            r#"{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "int"}}}}"#,
            "config_groups.g.weights.num_bits",
        ),
    ] {
        let e = with(q).unwrap_err().to_string();
        assert!(e.contains(needle) && e.contains("config.json"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A directory with one safetensors file holding `tensors` (name, dtype, shape, bytes) and a
/// config.json with `quant` as its quantization_config.
fn write_dir(
    tag: &str,
    quant: &str,
    tensors: &[(&str, safetensors::Dtype, Vec<usize>, Vec<u8>)],
) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-int4-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), format!(r#"{{"quantization_config": {quant}}}"#)).unwrap();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    dir
}

#[test]
fn weights_open_converts_an_awq_file_and_names_what_is_wrong() {
    use crate::weights::Weights;
    use safetensors::Dtype::{F16, I32};
    let t = truth(8, 32, 32, 4);
    let (mut qweight, mut qzeros) = (vec![], vec![]);
    let order = [0usize, 2, 4, 6, 1, 3, 5, 7];
    for i in 0..32 {
        qweight.extend_from_slice(&(0..8).fold(0u32, |w, k| w | (t.q[order[k]][i] as u32) << (4 * k)).to_le_bytes());
    }
    qzeros.extend_from_slice(&(0..8).fold(0u32, |w, k| w | (t.z[order[k]][0] as u32) << (4 * k)).to_le_bytes());
    let scales: Vec<u8> = t.scales_in_out().iter().flat_map(|&s| half::f16::from_f32(s).to_le_bytes()).collect();
    let awq = r#"{"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm"}"#;
    let parts = vec![
        ("m.up.qweight", I32, vec![32, 1], qweight),
        ("m.up.qzeros", I32, vec![1, 1], qzeros),
        ("m.up.scales", F16, vec![1, 8], scales),
    ];
    let dir = write_dir("awq", awq, &parts);
    let w = Weights::open(&dir).unwrap();
    let up = w.get("m.up.weight", &[8, 32]).unwrap();
    assert_eq!(up.quant, Some(QuantLayout::Int4Group { group: 32 }));
    assert_eq!(up.to_f32(), t.expected());
    assert!(!w.contains("m.up.qweight") && !w.contains("m.up.scales"));
    std::fs::remove_dir_all(&dir).unwrap();

    // Without its zero points: the weight and the missing tensor are named.
    let dir = write_dir("awq-missing", awq, &[parts[0].clone(), parts[2].clone()]);
    let e = Weights::open(&dir).err().expect("refused").to_string();
    assert!(e.contains("m.up.weight") && e.contains("`qzeros` is missing") && e.contains("awq"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();

    // An integer tensor outside an int4 checkpoint is still refused by dtype.
    let dir = write_dir("plain", "null", &[parts[0].clone()]);
    let e = Weights::open(&dir).err().expect("refused").to_string();
    assert!(e.contains("m.up.qweight") && e.contains("dtype I32 is not supported"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
