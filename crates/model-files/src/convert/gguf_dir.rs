//! A GGUF file served as it is: its weights kept in their stored layout and its metadata made
//! into what a model directory holds, without converting the weights.
//!
//! [`gguf_weights`] lists the file's tensors under their HF names, as [`super::convert_gguf`]
//! would write them, with their bytes left in the file's mapping: a tensor in a layout some
//! backend runs kept quantized (`tandem_core::quant_layout`: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
//! Q5_K, Q6_K) stays so, F32, F16 and BF16 tensors are views, and the rest (Q2_K, Q3_K, Q8_K,
//! Gemma's norms less one) are dequantized to f32 at open. Q and K of a Llama have their rows put
//! back in HF's order, which moves whole rows of blocks, so they stay quantized too.
//!
//! [`gguf_model_dir`] writes the small files (config.json, tokenizer.json, tokenizer_config.json,
//! generation_config.json) into a directory beside a link named [`GGUF_WEIGHTS`] to the file,
//! so everything that reads a model directory (tokenizer, chat template, generation defaults,
//! structured output) reads this one, and the loader takes the weights from the link.

use tandem_core::{DType, Error, Result};

use super::params::LlamaParams;
use super::tensors::{rope_unpermute, Take};
use super::{plan, write_metadata};
use crate::gguf::GgufFile;
use crate::gguf_tokenizer::GgufTokenizer;

use std::path::{Path, PathBuf};

use sha2::Digest;

use tandem_core::quant_layout::QuantLayout;
use tandem_core::weights::Weights;

use crate::quant::GgmlType;

/// The name of the link to the GGUF file in a directory [`gguf_model_dir`] made: a model
/// directory holding it loads its weights from it.
pub const GGUF_WEIGHTS: &str = "model.gguf";

/// Whether `path` names a GGUF file (by its extension).
pub fn is_gguf(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The layout a ggml type is kept in, where some backend runs it quantized.
fn kept_layout(ty: GgmlType) -> Option<QuantLayout> {
    Some(match ty {
        GgmlType::Q8_0 => QuantLayout::Q8_0,
        GgmlType::Q4_0 => QuantLayout::Q4_0,
        GgmlType::Q4_1 => QuantLayout::Q4_1,
        GgmlType::Q5_0 => QuantLayout::Q5_0,
        GgmlType::Q5_1 => QuantLayout::Q5_1,
        GgmlType::Q4K => QuantLayout::Q4K,
        GgmlType::Q5K => QuantLayout::Q5K,
        GgmlType::Q6K => QuantLayout::Q6K,
        _ => None?,
    })
}

/// The dtype of a ggml type a backend reads as it is.
fn plain_dtype(ty: GgmlType) -> Option<DType> {
    Some(match ty {
        GgmlType::F32 => DType::F32,
        GgmlType::F16 => DType::F16,
        GgmlType::BF16 => DType::BF16,
        _ => None?,
    })
}

/// Rows of `bytes` (`rows` of `row_bytes` each) from llama.cpp's Q/K order back to HF's
/// ([`super::rope_unpermute`] on whole rows).
fn unpermute_rows(bytes: &[u8], n_head: usize, rows: usize, row_bytes: usize) -> Vec<u8> {
    let hd = rows / n_head.max(1);
    let mut out = vec![0u8; bytes.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for j in 0..2 {
                let dst = h * hd + j * hd / 2 + i;
                let src = h * hd + 2 * i + j;
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// The weights of GGUF file `path` under their HF names, kept as stored where a backend can run
/// them so (see the module doc).
pub fn gguf_weights(path: &Path) -> Result<Weights> {
    let g = GgufFile::open(path)?;
    let p = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let plan = plan(&g, &p, tok.vocab.len())?;
    let mut w = Weights::empty();
    let file = w.add_mapping(path)?;
    let mut names: Vec<&String> = plan.tensors.keys().collect();
    names.sort();
    for name in names {
        let (t, take) = plan.tensors[name];
        let fail = |m: String| Error::tensor(&g.path, &t.name, m);
        t.ggml_type.check_dequantizable().map_err(fail)?;
        let shape = match take {
            Take::Expert(_) => t.torch_shape()[1..].to_vec(),
            _ => t.torch_shape(),
        };
        let bytes = g.tensor_bytes(t)?;
        let start = (g.data_offset + t.offset) as usize;
        let layout = kept_layout(t.ggml_type);
        let dtype = plain_dtype(t.ggml_type);
        let numel: usize = shape.iter().product();
        match (take, layout, dtype) {
            (Take::Whole, Some(_), _) | (Take::Whole, None, Some(_)) => {
                let d = dtype.unwrap_or(DType::F32);
                w.insert_mapped(name, file, d, layout, &shape, start..start + bytes.len())?;
            }
            (Take::Expert(e), Some(_), _) | (Take::Expert(e), None, Some(_)) => {
                let size = t.ggml_type.byte_size(numel as u64).map_err(fail)? as usize;
                let at = start + e * size;
                w.insert_mapped(name, file, dtype.unwrap_or(DType::F32), layout, &shape, at..at + size)?;
            }
            (Take::Unpermute(n), Some(q), _) => {
                let moved = unpermute_rows(bytes, n, shape[0], bytes.len() / shape[0].max(1));
                w.insert_quantized(name, q, &shape, &moved, g.path.clone())?;
            }
            (Take::Unpermute(n), None, Some(d)) => {
                let moved = unpermute_rows(bytes, n, shape[0], bytes.len() / shape[0].max(1));
                w.replace(name, d, &shape, &d.to_f32(&moved))?;
            }
            // Dequantized at open: types no backend runs kept, and Gemma's norms less one.
            (take, _, _) => {
                let values = match take {
                    Take::Expert(e) => {
                        let size = t.ggml_type.byte_size(numel as u64).map_err(fail)? as usize;
                        crate::quant::dequantize(t.ggml_type, &bytes[e * size..(e + 1) * size], numel).map_err(fail)?
                    }
                    _ => g.tensor_f32(t)?,
                };
                let values = match take {
                    Take::MinusOne => values.into_iter().map(|x| x - 1.0).collect(),
                    Take::Unpermute(n) => rope_unpermute(&values, n, *shape.last().unwrap_or(&1)),
                    _ => values,
                };
                w.replace(name, DType::F32, &shape, &values)?;
            }
        }
    }
    Ok(w)
}

/// A model directory for GGUF file `gguf`: its metadata files written under `cache` (a
/// directory named after the file's path, size and modification time, reused when they match)
/// and a link [`GGUF_WEIGHTS`] to the file. Returns the directory.
pub fn gguf_model_dir(gguf: &Path, cache: &Path) -> Result<PathBuf> {
    let gguf = std::fs::canonicalize(gguf).map_err(|e| Error::io(gguf, e))?;
    let meta = std::fs::metadata(&gguf).map_err(|e| Error::io(&gguf, e))?;
    let modified = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    let key = format!("{}:{}:{:?}", gguf.display(), meta.len(), modified);
    let hex: String = sha2::Sha256::digest(key.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    let stem = gguf.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let dir = cache.join(format!("{stem}-{hex}"));
    if dir.join("config.json").exists() && dir.join(GGUF_WEIGHTS).exists() {
        return Ok(dir);
    }
    let g = GgufFile::open(&gguf)?;
    let p = LlamaParams::from_gguf(&g)?;
    let tok = GgufTokenizer::from_gguf(&g)?;
    let plan = plan(&g, &p, tok.vocab.len())?;
    // Written beside, then renamed: a directory that exists is whole.
    let tmp = cache.join(format!(".{stem}-{hex}.{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    write_metadata(&g, &p, &tok, &plan, &tmp)?;
    link(&gguf, &tmp.join(GGUF_WEIGHTS))?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another process made it first: theirs is as good.
        Err(_) if dir.join(GGUF_WEIGHTS).exists() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(Error::io(&dir, e)),
    }
}

#[cfg(unix)]
fn link(target: &Path, at: &Path) -> Result<()> {
    std::os::unix::fs::symlink(target, at).map_err(|e| Error::io(at, e))
}

#[cfg(not(unix))]
fn link(target: &Path, at: &Path) -> Result<()> {
    std::fs::hard_link(target, at).map_err(|e| Error::io(at, e))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{convert, scratch, tiny_q4_k_m_gguf};
    use super::*;
    use tandem_core::greedy::{generate, Step};
    use tandem_core::model::LoadOptions;
    use tandem_core::{Model, ModelConfig};
    use tandem_reference::RefBackend;

    const PROMPT: [u32; 5] = [1, 40, 77, 200, 5];

    /// Greedy steps (ids and logits) of `w` on the reference: the prompt, then 6 tokens.
    fn greedy(cfg: ModelConfig, w: &Weights) -> Vec<Step> {
        let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
        let mut m = Model::from_weights(RefBackend::new(), cfg, w, opts).unwrap();
        generate(&mut m, &PROMPT, 6, &[], true, |_| {}).unwrap()
    }

    fn bits(steps: &[Step]) -> Vec<(u32, Vec<u32>)> {
        steps.iter().map(|s| (s.id, s.logits.iter().map(|x| x.to_bits()).collect())).collect()
    }

    /// Every tensor of `w` dequantized into an f32 tensor of its own.
    fn dequantized(w: &Weights) -> Weights {
        let mut d = Weights::empty();
        for name in w.names() {
            let shape = w.shape(name).unwrap().to_vec();
            d.replace(name, DType::F32, &shape, &w.get(name, &shape).unwrap().to_f32()).unwrap();
        }
        d
    }

    /// A Q4_K_M-style file (Q4_K and Q6_K) serves kept quantized: the weights stay in the
    /// file's layouts (Q and K rows put back in HF's order), take the file's bytes, and the
    /// model's logits are bit for bit those of the same model with every weight dequantized.
    #[test]
    fn a_q4_k_m_file_serves_kept_quantized_as_dequantize_then_multiply() {
        let root = scratch("kept-q4km");
        let gguf = root.join("tiny-q4_k_m.gguf");
        let v = tiny_q4_k_m_gguf(&gguf, None);
        let w = gguf_weights(&gguf).unwrap();
        let layouts: std::collections::BTreeMap<&str, QuantLayout> = w.quantized().collect();
        assert_eq!(layouts.len(), 9, "{layouts:?}");
        assert_eq!(layouts["model.layers.0.self_attn.q_proj.weight"], QuantLayout::Q4K);
        assert_eq!(layouts["model.layers.0.mlp.down_proj.weight"], QuantLayout::Q6K);
        assert_eq!(layouts["model.embed_tokens.weight"], QuantLayout::Q6K);
        let q = w.get("model.layers.0.self_attn.q_proj.weight", &[256, 256]).unwrap();
        assert_eq!(q.to_f32(), rope_unpermute(&v["blk.0.attn_q.weight"], 2, 256));
        let k = w.get("model.layers.0.self_attn.k_proj.weight", &[128, 256]).unwrap();
        assert_eq!(k.to_f32(), rope_unpermute(&v["blk.0.attn_k.weight"], 1, 256));
        let file = std::fs::metadata(&gguf).unwrap().len();
        let bytes = w.stored_bytes();
        assert!(bytes <= file && bytes as f64 > 0.9 * file as f64, "weights {bytes} bytes, file {file}");

        let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
        assert_eq!(gguf_model_dir(&gguf, &root.join("cache")).unwrap(), dir, "made once, then reused");
        assert!(dir.join(GGUF_WEIGHTS).exists() && !dir.join("model.safetensors").exists());
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let kept = greedy(cfg.clone(), &w);
        let wide = greedy(cfg.clone(), &dequantized(&w));
        assert_eq!(bits(&kept), bits(&wide));

        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A Q8_0 file whose every value is exact in bf16 (`crate::tiny_gguf`) serves kept quantized with the greedy ids and logits of its converted bf16
    /// directory, bit for bit.
    #[test]
    fn a_q8_0_file_serves_as_its_converted_directory() {
        let root = scratch("kept-q8");
        let gguf = root.join("tiny-q8_0.gguf");
        crate::tiny_gguf::write_tiny_gguf(&gguf, 0).unwrap();

        let w = gguf_weights(&gguf).unwrap();
        assert_eq!(w.quantized().count(), 9);
        let dir = gguf_model_dir(&gguf, &root.join("cache")).unwrap();
        let kept = greedy(ModelConfig::from_file(&dir.join("config.json")).unwrap(), &w);
        let out = root.join("converted");
        convert(&gguf, &out).unwrap();
        let opts = LoadOptions { max_batch_tokens: 16, max_seqs: 2, num_kv_blocks: 8, ..Default::default() };
        let mut m = Model::load(RefBackend::new(), &out, opts).unwrap();
        let converted = generate(&mut m, &PROMPT, 6, &[], true, |_| {}).unwrap();
        let ids = |s: &[Step]| s.iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(ids(&kept), ids(&converted));
        assert_eq!(bits(&kept), bits(&converted));
        // Not trivial: the greedy ids vary.
        assert!(ids(&kept).iter().any(|&i| i != kept[0].id), "{:?}", ids(&kept));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
