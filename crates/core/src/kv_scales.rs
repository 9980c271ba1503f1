//! A checkpoint's fp8 KV-cache scales: one K and one V scale a layer, read where vLLM reads
//! them, used by an fp8 KV cache instead of 1.0 ([`crate::fp8_round`]: stored `x / scale`,
//! read back times it).
//!
//! vLLM (`maybe_remap_kv_scale_name`) takes, under a layer's `self_attn.`: `k_scale` and
//! `v_scale` (ModelOpt, llm-compressor's `kv_cache_scheme`, and vLLM's own `attn.k_scale` /
//! `attn.v_scale`), `kv_scale` (older checkpoints: one scale for both), and
//! `k_proj.output_scale` / `v_proj.output_scale` (older compressed-tensors). Each must be one
//! positive, finite value (a per-tensor scale); a per-head or per-channel scale, a layer with
//! some but not all of its scales, and `q_scale` / `prob_scale` (which quantize the query and
//! the softmax for FP8 attention, which tandem does not do) are refused by tensor name.

use crate::error::{Error, Result};
use crate::weights::Weights;

/// Names a scale may have under `model.layers.{i}.self_attn.`: (name, sets K, sets V).
const NAMES: &[(&str, bool, bool)] = &[
    ("k_scale", true, false),
    ("v_scale", false, true),
    ("attn.k_scale", true, false),
    ("attn.v_scale", false, true),
    ("kv_scale", true, true),
    ("k_proj.output_scale", true, false),
    ("v_proj.output_scale", false, true),
];

/// Tensors that ask for FP8 attention, which tandem does not run.
const REFUSED: &[&str] = &["q_scale", "attn.q_scale", "prob_scale", "attn.prob_scale"];

/// The `[k, v]` scale of each of `layers` layers, or None where the checkpoint has none.
pub fn read(w: &Weights, layers: usize) -> Result<Option<Vec<[f32; 2]>>> {
    let mut out = Vec::with_capacity(layers);
    let mut any = false;
    let mut missing = None;
    for i in 0..layers {
        let p = format!("model.layers.{i}.self_attn.");
        if let Some(name) = REFUSED.iter().map(|n| format!("{p}{n}")).find(|n| w.contains(n)) {
            return Err(refuse(&name, "quantizes attention's query or probabilities to FP8, which tandem does not"));
        }
        let [mut k, mut v] = [None, None];
        for &(n, sets_k, sets_v) in NAMES {
            let name = format!("{p}{n}");
            if !w.contains(&name) {
                continue;
            }
            let s = scalar(w, &name)?;
            for (slot, sets) in [(&mut k, sets_k), (&mut v, sets_v)] {
                if sets {
                    if slot.is_some() {
                        return Err(refuse(&name, "a second scale for one cache of the layer"));
                    }
                    *slot = Some(s);
                }
            }
        }
        match (k, v) {
            (Some(k), Some(v)) => {
                any = true;
                out.push([k, v]);
            }
            (None, None) => {
                missing.get_or_insert(i);
                out.push([1.0, 1.0]);
            }
            _ => return Err(refuse(&format!("{p}{{k,v}}_scale"), "the layer has a K or a V scale but not both")),
        }
    }
    match (any, missing) {
        (false, _) => Ok(None),
        (true, None) => Ok(Some(out)),
        (true, Some(i)) => {
            Err(refuse(&format!("model.layers.{i}.self_attn.k_scale"), "missing, while other layers have KV scales"))
        }
    }
}

/// One scale's value: a tensor of one element, positive, finite and normal.
fn scalar(w: &Weights, name: &str) -> Result<f32> {
    let shape = w.shape(name).unwrap_or(&[]).to_vec();
    if shape.iter().product::<usize>() != 1 {
        return Err(refuse(name, &format!("shape {shape:?}: only a per-tensor (one-value) KV scale is supported")));
    }
    let t = w.get(name, &shape)?;
    if t.quant.is_some() {
        return Err(refuse(name, "a KV scale must be a plain f32, bf16 or f16 value"));
    }
    let v = t.dtype.to_f32(t.bytes())[0];
    if !(v.is_normal() && v > 0.0) {
        return Err(refuse(name, &format!("KV scale {v} is not a positive, finite, normal number")));
    }
    Ok(v)
}

fn refuse(name: &str, why: &str) -> Error {
    Error::tensor("the checkpoint", name, format!("fp8 KV cache scale: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn weights(scales: &[(&str, Vec<usize>, f32)]) -> Weights {
        let mut w = Weights::empty();
        for (name, shape, v) in scales {
            let n: usize = shape.iter().product();
            w.replace(name, DType::F32, shape, &vec![*v; n]).unwrap();
        }
        w
    }

    #[test]
    fn each_spelling_gives_the_layers_scales() {
        let l = |i: usize, n: &str| format!("model.layers.{i}.self_attn.{n}");
        let w = weights(&[
            (&l(0, "k_scale"), vec![], 0.5),
            (&l(0, "v_scale"), vec![], 2.0),
            (&l(1, "kv_scale"), vec![1], 0.25),
            (&l(2, "k_proj.output_scale"), vec![], 3.0),
            (&l(2, "attn.v_scale"), vec![1], 0.125),
        ]);
        assert_eq!(read(&w, 3).unwrap(), Some(vec![[0.5, 2.0], [0.25, 0.25], [3.0, 0.125]]));
        assert_eq!(read(&Weights::empty(), 3).unwrap(), None);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let l = |i: usize, n: &str| format!("model.layers.{i}.self_attn.{n}");
        type Scales = Vec<(String, Vec<usize>, f32)>;
        let cases: Vec<(Scales, &str)> = vec![
            (
                vec![(l(0, "k_scale"), vec![4], 1.0), (l(0, "v_scale"), vec![], 1.0)],
                "k_scale`: fp8 KV cache scale: shape [4]",
            ),
            (vec![(l(0, "k_scale"), vec![], 1.0)], "not both"),
            (vec![(l(0, "k_scale"), vec![], 0.0), (l(0, "v_scale"), vec![], 1.0)], "not a positive"),
            (vec![(l(0, "kv_scale"), vec![], 1.0), (l(0, "k_scale"), vec![], 1.0)], "a second scale"),
            (
                vec![(l(0, "kv_scale"), vec![], 1.0), (l(0, "q_scale"), vec![], 1.0)],
                "q_scale`: fp8 KV cache scale: quantizes",
            ),
            (vec![(l(1, "kv_scale"), vec![], 1.0)], "layers.0.self_attn.k_scale`: fp8 KV cache scale: missing"),
        ];
        for (scales, want) in cases {
            let refs: Vec<(&str, Vec<usize>, f32)> =
                scales.iter().map(|(n, s, v)| (n.as_str(), s.clone(), *v)).collect();
            let e = read(&weights(&refs), 2).unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
