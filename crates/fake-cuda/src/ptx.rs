//! What the fake driver reads from the PTX NVRTC made: each `.entry` with its `.param` list,
//! its launch bounds (`.maxntid`, `.reqntid`) and the static `__shared__` bytes its body
//! references (module-scope `.shared` declarations), and whether it uses dynamic shared memory
//! (an `.extern .shared` array).

use std::collections::HashMap;

/// A kernel parameter's PTX type class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    B32,
    B64,
    F32,
    /// Anything else (a struct passed by value, f64, 16-bit): bytes.
    Other(usize),
}

impl Param {
    /// Whether a host parameter (crates/fake-cuda/cpp/thunk.h `code`, and its size) matches.
    pub fn matches(self, c: u8, size: u32) -> bool {
        match (self, c) {
            (Param::B64, b'p' | b'l') | (Param::B32, b'i') | (Param::F32, b'f') => true,
            (Param::Other(n), b's') => n == size as usize,
            _ => false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub params: Vec<Param>,
    /// Threads per block the kernel was compiled for (`__launch_bounds__`), if it says.
    pub max_threads: Option<u32>,
    /// `.reqntid`: the exact block shape required.
    pub req_threads: Option<u32>,
    pub static_smem: usize,
    pub dynamic_smem: bool,
}

fn type_bytes(t: &str) -> Option<usize> {
    Some(match t {
        ".b8" | ".u8" | ".s8" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        _ => return None,
    })
}

/// `.shared .align 4 .b8 name[2048];` -> (name, bytes, extern).
fn shared_decl(line: &str) -> Option<(String, usize, bool)> {
    let l = line.trim().trim_end_matches(';');
    let (ext, rest) = match l.strip_prefix(".extern ") {
        Some(r) => (true, r),
        None => (false, l),
    };
    let rest = rest.strip_prefix(".shared ")?;
    let toks: Vec<&str> = rest.split_whitespace().collect();
    let mut elem = None;
    let mut name = None;
    let mut i = 0;
    while i < toks.len() {
        match toks[i] {
            ".align" => i += 1,
            t if t.starts_with('.') => elem = type_bytes(t).or(elem),
            t => name = Some(t),
        }
        i += 1;
    }
    let name = name?;
    let mut bytes = elem?;
    let base = name.split('[').next()?.to_string();
    for dim in name.split('[').skip(1) {
        let d = dim.trim_end_matches(']');
        if d.is_empty() {
            bytes = 0; // extern: sized at launch
        } else {
            bytes *= d.parse::<usize>().ok()?;
        }
    }
    Some((base, bytes, ext))
}

fn param(line: &str) -> Option<Param> {
    let l = line.trim().trim_end_matches(',').trim_end_matches(')');
    let rest = l.strip_prefix(".param ")?;
    let toks: Vec<&str> = rest.split_whitespace().collect();
    let mut elem = None;
    let mut i = 0;
    while i < toks.len() {
        match toks[i] {
            ".align" => i += 1,
            ".ptr" | ".global" | ".const" | ".local" | ".shared" => {}
            t if t.starts_with('.') => elem = Some(t),
            name => {
                let t = elem?;
                let n = type_bytes(t)?;
                let count: usize =
                    name.split('[').skip(1).map(|d| d.trim_end_matches(']').parse::<usize>().unwrap_or(1)).product();
                return Some(match (t, name.contains('[')) {
                    (".u32" | ".s32" | ".b32", false) => Param::B32,
                    (".u64" | ".s64" | ".b64", false) => Param::B64,
                    (".f32", false) => Param::F32,
                    _ => Param::Other(n * count.max(1)),
                });
            }
        }
        i += 1;
    }
    None
}

fn first_number(s: &str) -> Option<u32> {
    let dims: Vec<u32> = s.split(',').filter_map(|d| d.trim().parse().ok()).collect();
    if dims.is_empty() {
        None
    } else {
        Some(dims.iter().product())
    }
}

/// Every `.entry` of `ptx`.
pub fn parse(ptx: &str) -> Result<Vec<Entry>, String> {
    let lines: Vec<&str> = ptx.lines().collect();
    let mut shared: HashMap<String, (usize, bool)> = HashMap::new();
    let mut depth = 0i32;
    for l in &lines {
        if depth == 0 {
            if let Some((name, bytes, ext)) = shared_decl(l) {
                shared.insert(name, (bytes, ext));
            }
        }
        depth += l.matches('{').count() as i32 - l.matches('}').count() as i32;
    }
    let mut out = vec![];
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        let Some(rest) = l.strip_prefix(".visible .entry ").or_else(|| l.strip_prefix(".entry ")) else {
            i += 1;
            continue;
        };
        let name = rest.split(['(', ' ']).next().unwrap_or("").to_string();
        if name.is_empty() {
            return Err(format!("line {}: an .entry without a name", i + 1));
        }
        let mut e =
            Entry { name, params: vec![], max_threads: None, req_threads: None, static_smem: 0, dynamic_smem: false };
        // Parameters up to the closing parenthesis (the `(` line may carry none).
        let mut j = i;
        if !rest.contains(')') {
            j += 1;
            while j < lines.len() {
                let pl = lines[j].trim();
                if pl.starts_with(".param") {
                    e.params.push(param(pl).ok_or_else(|| format!("{}: unreadable parameter `{pl}`", e.name))?);
                }
                if pl.ends_with(')') || pl == ")" {
                    break;
                }
                j += 1;
            }
        }
        // Directives, then the body up to its matching brace.
        j += 1;
        while j < lines.len() && !lines[j].trim_start().starts_with('{') {
            let d = lines[j].trim();
            if let Some(v) = d.strip_prefix(".maxntid") {
                e.max_threads = first_number(v);
            } else if let Some(v) = d.strip_prefix(".reqntid") {
                e.req_threads = first_number(v);
            }
            j += 1;
        }
        let start = j;
        let mut depth = 0i32;
        while j < lines.len() {
            depth += lines[j].matches('{').count() as i32 - lines[j].matches('}').count() as i32;
            j += 1;
            if depth == 0 {
                break;
            }
        }
        let body = lines[start..j].join("\n");
        for (v, (bytes, ext)) in &shared {
            if mentions(&body, v) {
                if *ext {
                    e.dynamic_smem = true;
                } else {
                    e.static_smem += bytes;
                }
            }
        }
        out.push(e);
        i = j;
    }
    Ok(out)
}

/// `name` as a whole identifier in `text`.
fn mentions(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$';
    let mut from = 0;
    while let Some(k) = text[from..].find(name) {
        let a = from + k;
        let b = a + name.len();
        let before = text[..a].chars().next_back().is_none_or(|c| !ident(c));
        let after = text[b..].chars().next().is_none_or(|c| !ident(c));
        if before && after {
            return true;
        }
        from = b;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_params_bounds_and_shared() {
        let ptx = "\
.version 9.0
.target sm_90
.address_size 64
.extern .shared .align 16 .b8 dyn[];
.shared .align 4 .b8 _ZZ6argmaxE2sv[2048];
.shared .align 4 .u32 _ZZ1fE6s_last;

.visible .entry argmax(
\t.param .u64 .ptr .align 1 argmax_param_0,
\t.param .u64 argmax_param_1,
\t.param .u32 argmax_param_2,
\t.param .f32 argmax_param_3
)
.maxntid 512, 1, 1
{
\tmov.u64 %rd1, _ZZ6argmaxE2sv;
\tret;
}
.visible .entry f()
.reqntid 128, 1, 1
{
\tmov.u64 %rd1, dyn;
\tld.shared.u32 %r1, [_ZZ1fE6s_last];
}
";
        let e = parse(ptx).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "argmax");
        assert_eq!(e[0].params, vec![Param::B64, Param::B64, Param::B32, Param::F32]);
        assert_eq!(e[0].max_threads, Some(512));
        assert_eq!((e[0].static_smem, e[0].dynamic_smem), (2048, false));
        assert_eq!(e[1].name, "f");
        assert!(e[1].params.is_empty());
        assert_eq!(e[1].req_threads, Some(128));
        assert_eq!((e[1].static_smem, e[1].dynamic_smem), (4, true));
    }
}
