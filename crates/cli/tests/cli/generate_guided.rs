//! `tandem generate` with structured output, through the built binary on a tiny random model:
//! `--regex` and `--json-schema @FILE` constrain every completion; a bad regex and a schema
//! file that is not JSON are errors naming the flag or the file.

use std::path::PathBuf;
use std::process::Command;

fn model() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("generate-guided-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    tandem_model_files::random_model::write_random_model(
        &d,
        tandem_model_files::random_model::Shape::Tiny,
        2,
        tandem_core::DType::F32,
    )
    .unwrap();
    d
}

fn generate(dir: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "generate",
            "--backend",
            "reference",
            "--num-kv-blocks",
            "128",
            "--model",
            dir.to_str().unwrap(),
            "--prompt",
            "Hi",
            "--max-tokens",
            "300",
            "--temperature",
            "1.0",
            "--seed",
            "3",
            "-n",
            "4",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn generate_constrains_every_completion_and_names_bad_specs() {
    let dir = model();
    let o = generate(&dir, &["--regex", "[xyz]{2,4}!"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&o.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let texts: Vec<&str> =
        lines[0]["completions"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap()).collect();
    assert_eq!(texts.len(), 4, "{lines:?}");
    let rx = regex::Regex::new("^[xyz]{2,4}!$").unwrap();
    assert!(texts.iter().all(|t| rx.is_match(t)), "{texts:?}");

    let schema = dir.join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type":"object","properties":{"a":{"enum":[1,2,3]}},"required":["a"],"additionalProperties":false}"#,
    )
    .unwrap();
    let o = generate(&dir, &["--json-schema", &format!("@{}", schema.display())]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    for c in line["completions"].as_array().unwrap() {
        let v: serde_json::Value = serde_json::from_str(c["text"].as_str().unwrap()).unwrap();
        assert!([1, 2, 3].contains(&v["a"].as_i64().unwrap()) && v.as_object().unwrap().len() == 1, "{v}");
    }

    let o = generate(&dir, &["--regex", "(unclosed"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--regex") && err.contains("unclosed"), "{err}");
    std::fs::write(&schema, "{not json").unwrap();
    let o = generate(&dir, &["--json-schema", &format!("@{}", schema.display())]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("schema.json") && err.contains("not valid JSON"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
