//! The kernel sources: compiled into the binary from `kernels/*.cu`, or read from a directory
//! at run time (`TANDEM_KERNEL_DIR`) so a researcher can edit a `.cu` and rerun without
//! rebuilding Rust.
//!
//! `#include "common.cuh"` is pasted in by [`preprocess`] rather than resolved by NVRTC, so
//! a compiled binary needs no kernels directory and NVRTC needs no include path; `#line`
//! markers keep compiler messages pointing at the right file and line. So is an
//! `#include "other.cu"` of another kernel file (moe.cu includes matmul.cu's tile code), that
//! file's own header line dropped (the includer has pasted the header already).

use std::path::{Path, PathBuf};

use tandem_core::{Error, Result};

/// The shared header every kernel file includes.
pub const HEADER_NAME: &str = "common.cuh";
const INCLUDE_LINE: &str = "#include \"common.cuh\"";

/// One `.cu` file: its stem (`matmul`) and text.
#[derive(Debug, Clone)]
pub struct KernelSource {
    pub name: String,
    pub text: String,
}

macro_rules! embed {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../kernels/", $name, ".cu")))),*]
    };
}

/// Every kernel file, as built into this binary. Keep in step with `kernels/*.cu`
/// (the test `embedded_list_matches_kernels_dir` fails otherwise).
pub const EMBEDDED: &[(&str, &str)] = embed!(
    "add",
    "argmax",
    "embedding",
    "gather_rows",
    "kv_write",
    "lora",
    "matmul",
    "matmul_sm90",
    "moe",
    "paged_attention",
    "paged_attention_fp8",
    "paged_attention_sm90",
    "quant_matmul",
    "quant_mma",
    "quant_mma_w8a8",
    "rms_norm",
    "rope",
    "sampling",
    "silu_mul",
);
pub const EMBEDDED_HEADER: &str = include_str!("../../../kernels/common.cuh");

/// The embedded sources with the header pasted in.
pub fn embedded() -> Vec<KernelSource> {
    EMBEDDED
        .iter()
        .map(|(name, text)| {
            let text = paste_kernel_includes(&format!("{name}.cu"), text, |f| {
                EMBEDDED.iter().find(|(n, _)| format!("{n}.cu") == f).map(|(_, t)| t.to_string())
            });
            KernelSource { name: name.to_string(), text: preprocess(&format!("{name}.cu"), &text, EMBEDDED_HEADER) }
        })
        .collect()
}

/// Every `*.cu` in `dir` (sorted by name) with `dir/common.cuh` pasted in.
pub fn from_dir(dir: &Path) -> Result<Vec<KernelSource>> {
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| Error::io(p, e));
    let header_path = dir.join(HEADER_NAME);
    let header = read(&header_path)?;
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    let mut files: Vec<PathBuf> =
        entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "cu")).collect();
    files.sort();
    if files.is_empty() {
        return Err(Error::backend("cuda", format!("no .cu files in {}", dir.display())));
    }
    let mut out = Vec::with_capacity(files.len());
    for p in &files {
        let text = read(p)?;
        if text.contains('\0') {
            return Err(Error::backend("cuda", format!("{}: contains a NUL byte", p.display())));
        }
        let file = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let name = p.file_stem().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let text = paste_kernel_includes(&file, &text, |f| std::fs::read_to_string(dir.join(f)).ok());
        out.push(KernelSource { name, text: preprocess(&file, &text, &header) });
    }
    Ok(out)
}

/// Replaces each `#include "X.cu"` line of `src` (file `file`) with X.cu's text as `read`
/// gives it, X.cu's own `#include "common.cuh"` line dropped; one level deep (an included file's
/// own `.cu` includes stay, and fail to compile: none has any). A file `read` does not find
/// stays as it is (NVRTC then reports it).
pub fn paste_kernel_includes(file: &str, src: &str, read: impl Fn(&str) -> Option<String>) -> String {
    if !src.lines().any(|l| included_cu(l).is_some()) {
        return src.to_string();
    }
    let mut out = String::with_capacity(src.len() * 2);
    for (i, line) in src.lines().enumerate() {
        match included_cu(line).and_then(|f| read(f).map(|t| (f, t))) {
            Some((f, text)) => {
                out.push_str(&format!("#line 1 \"{f}\"\n"));
                for l in text.lines() {
                    out.push_str(if l.trim() == INCLUDE_LINE { "" } else { l });
                    out.push('\n');
                }
                out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// `X.cu` of a line `#include "X.cu"`.
fn included_cu(line: &str) -> Option<&str> {
    let f = line.trim().strip_prefix("#include \"")?.strip_suffix('"')?;
    (f.ends_with(".cu") && !f.contains('/')).then_some(f)
}

/// Replaces the `#include "common.cuh"` line of `src` (file `file`) with `header`.
pub fn preprocess(file: &str, src: &str, header: &str) -> String {
    let mut out = String::with_capacity(src.len() + header.len() + 64);
    for (i, line) in src.lines().enumerate() {
        if line.trim() == INCLUDE_LINE {
            out.push_str(&format!("#line 1 \"{HEADER_NAME}\"\n"));
            out.push_str(header);
            if !header.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(&format!("#line {} \"{file}\"\n", i + 2));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preprocess_inlines_header_and_keeps_line_numbers() {
        let src = "// a\n#include \"common.cuh\"\nint x;\n";
        let out = preprocess("a.cu", src, "typedef int i32;\n");
        assert_eq!(out, "// a\n#line 1 \"common.cuh\"\ntypedef int i32;\n#line 3 \"a.cu\"\nint x;\n");
    }

    #[test]
    fn kernel_includes_are_pasted_without_their_header() {
        let src = "#include \"common.cuh\"\n#include \"b.cu\"\nint y;\n";
        let out = paste_kernel_includes("a.cu", src, |f| {
            (f == "b.cu").then(|| "#include \"common.cuh\"\nint x;\n".to_string())
        });
        assert_eq!(out, "#include \"common.cuh\"\n#line 1 \"b.cu\"\n\nint x;\n#line 3 \"a.cu\"\nint y;\n");
        let moe = embedded().into_iter().find(|k| k.name == "moe").unwrap();
        assert!(
            moe.text.contains("matmul_tc_impl") && !moe.text.contains("#include \"matmul.cu\""),
            "moe.cu: matmul.cu not pasted in"
        );
        assert_eq!(
            moe.text.matches("__device__ __forceinline__ float warp_sum").count(),
            1,
            "moe.cu: the header pasted twice"
        );
    }

    #[test]
    fn embedded_list_matches_kernels_dir() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let from_disk = from_dir(&dir).unwrap();
        let names: Vec<&str> = from_disk.iter().map(|k| k.name.as_str()).collect();
        let built_in: Vec<&str> = EMBEDDED.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, built_in, "kernels/*.cu and sources::EMBEDDED differ");
        for k in embedded() {
            assert!(!k.text.lines().any(|l| l.trim() == INCLUDE_LINE), "{}: header not inlined", k.name);
            assert!(k.text.contains("warp_sum"), "{}: header text missing", k.name);
        }
    }
}
