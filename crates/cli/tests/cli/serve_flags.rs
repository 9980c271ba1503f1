//! `tandem serve` with vLLM's command line: flags tandem lacks are refused by name, values it
//! does not implement are refused with what to use instead; nothing starts serving then.

use std::process::Command;

fn serve(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tandem")).arg("serve").args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn vllm_flags_tandem_lacks_are_errors_that_name_them() {
    for flag in ["--pipeline-parallel-size", "--swap-space", "--tokenizer=/x", "--trust-remote-code"] {
        let (code, err) = serve(&["some/dir", flag]);
        let name = flag.split('=').next().unwrap();
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(err.contains(&format!("`{name}` is a vLLM flag that tandem does not support")), "{flag}: {err}");
    }
}

#[test]
fn values_tandem_does_not_implement_are_refused_before_loading() {
    let dir = std::env::temp_dir().join(format!("tandem-serve-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tandem_model_files::random_model::write_random_model(
        &dir,
        tandem_model_files::random_model::Shape::Tiny,
        3,
        tandem_core::DType::F32,
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    let cases: [(&[&str], &str); 20] = [
        (&["--dtype", "bfloat16"], "stores its weights as float32"),
        (&["--dtype", "int8"], "expected auto, bfloat16, float16 or float32"),
        (&["--tensor-parallel-size", "2"], "only 1 is supported"),
        (&["--kv-cache-dtype", "fp8_inc"], "fp8_inc: this fp8 KV cache is not supported"),
        (&["--kv-cache-dtype", "fp8_ds_mla"], "fp8_ds_mla: this fp8 KV cache is not supported"),
        (&["--kv-cache-dtype", "int4"], "expected auto, bf16 (bfloat16), f32 (float32), fp8 (fp8_e4m3) or fp8_e5m2"),
        // A bf16 cache is CUDA's: the reference refuses it at load, naming what it stores.
        (&["--kv-cache-dtype", "bfloat16"], "a bf16 KV cache is not supported on reference (it stores f32"),
        (&["--generation-config", "/nonexistent"], "no generation_config.json there"),
        (
            &["--enable-auto-tool-choice", "--tool-call-parser", "deepseek_v3"],
            "--tool-call-parser deepseek_v3: tandem parses hermes, llama3_json, mistral, qwen3_xml",
        ),
        (&["--reasoning-parser", "granite"], "--reasoning-parser granite: tandem parses qwen3, deepseek_r1"),
        // The parsers tandem has are taken: the start goes on to the next check (which fails
        // here on purpose, before anything is served).
        (
            &[
                "--tool-call-parser",
                "llama3_json",
                "--reasoning-parser",
                "qwen3",
                "--generation-config",
                "/nonexistent",
            ],
            "no generation_config.json there",
        ),
        (
            &[
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "mistral",
                "--reasoning-parser",
                "deepseek_r1",
                "--generation-config",
                "/nonexistent",
            ],
            "no generation_config.json there",
        ),
        // vLLM's partial-prefill flags are taken, with vLLM's rule between them.
        (
            &["--max-num-partial-prefills", "1", "--max-long-partial-prefills", "2"],
            "max_long_partial_prefills (2) must be <= max_num_partial_prefills (1)",
        ),
        (&["--max-num-partial-prefills", "0"], "--max-num-partial-prefills"),
        // vLLM's --quantization: gguf is taken for a GGUF file only; other methods are named.
        (&["--quantization", "gguf"], "is not a GGUF file"),
        (&["-q", "awq"], "--quantization awq: "),
        (&["-q", "gptq_marlin"], "does not describe an int4 gptq checkpoint"),
        (&["-q", "bitsandbytes"], "--quantization bitsandbytes: not supported"),
        (&["--quantization", "fp8"], "is not a fp8 checkpoint"),
        (&["--quantization", "compressed-tensors"], "is not a compressed-tensors checkpoint"),
    ];
    for (extra, want) in cases {
        let mut args = vec![d, "--backend", "reference", "--port", "0"];
        args.extend_from_slice(extra);
        let (code, err) = serve(&args);
        assert_ne!(code, 0, "{extra:?}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // An FP8 checkpoint: `--quantization` must name what its config.json says.
    tandem_model_files::fp8::quantize_dir(&dir, [32, 32]).unwrap();
    let (code, err) = serve(&[d, "--backend", "reference", "--port", "0", "--quantization", "compressed-tensors"]);
    assert_ne!(code, 0);
    assert!(err.contains("says `quant_method` `fp8`; the two must match"), "{err}");
    // The positional directory and --model together are ambiguous.
    let (code, err) = serve(&[d, "--model", d]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot be used with"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// vLLM's LoRA flags: an adapter that does not fit stops the start with an error naming the
/// adapter, its file and what does not fit; flags that need `--enable-lora` say so.
#[test]
fn lora_flags_refuse_what_does_not_fit_naming_the_adapter() {
    let dir = std::env::temp_dir().join(format!("tandem-serve-lora-flags-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    tandem_model_files::random_model::write_random_model(
        &dir,
        tandem_model_files::random_model::Shape::Tiny,
        3,
        tandem_core::DType::F32,
    )
    .unwrap();
    let d = dir.to_str().unwrap();
    let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/lora");
    let all = format!("all={}", golden.join("tiny-all").display());
    let rs = format!("rs={}", golden.join("tiny-rs").display());
    let json = format!(r#"{{"name": "rs", "path": "{}", "base_model_name": "m"}}"#, golden.join("tiny-rs").display());
    let cases: [(&[&str], &str); 7] = [
        (&["--lora-modules", &rs], "--lora-modules and --max-cpu-loras need --enable-lora"),
        (&["--enable-lora", "--max-lora-rank", "4", "--lora-modules", &all], "LoRA module \"all\""),
        (&["--enable-lora", "--max-lora-rank", "4", "--lora-modules", &all], "adapter_config.json"),
        (&["--enable-lora", "--max-lora-rank", "4", "--lora-modules", &all], "--max-lora-rank"),
        (&["--enable-lora", "--lora-modules", "x=/nonexistent/adapter"], "LoRA module \"x\""),
        (&["--enable-lora", "--lora-modules", &rs, &json], "LoRA module name \"rs\" given twice"),
        (
            &["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1"],
            "--max-cpu-loras (1) must be >= --max-loras (2)",
        ),
    ];
    for (extra, want) in cases {
        let mut args = vec![d, "--backend", "reference", "--port", "0"];
        args.extend_from_slice(extra);
        let (code, err) = serve(&args);
        assert_ne!(code, 0, "{extra:?}");
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
