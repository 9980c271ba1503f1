//! The op conformance suite (crates/conformance) on the wgpu backend, against the reference —
//! the same cases `tandem test-ops --backend wgpu` runs — and proof that it catches a broken
//! shader: a copy of `shaders/` with one line of rms_norm.wgsl changed, loaded at run time,
//! must fail the rms_norm cases and only those.

use tandem_wgpu::WgpuBackend;

fn require() -> bool {
    std::env::var_os("TANDEM_REQUIRE_WGPU").is_some()
}

#[test]
fn wgpu_passes_every_op_case() {
    let b = match WgpuBackend::new() {
        Ok(b) => b,
        Err(e) => {
            assert!(!require(), "TANDEM_REQUIRE_WGPU is set but wgpu cannot start: {e}");
            return tandem_core::skip::note(format!("wgpu op suite: {e}"));
        }
    };
    let seed = tandem_conformance::fresh_seed();
    let mut out = Vec::new();
    let rep = tandem_conformance::run(&b, None, seed, &mut out);
    let text = String::from_utf8_lossy(&out);
    println!("{text}");
    assert!(rep.passed >= 100, "only {} cases ran", rep.passed);
    assert!(rep.ok(), "{}", rep.summary());
}

#[test]
fn a_broken_shader_fails_the_suite() {
    if WgpuBackend::new().is_err() {
        assert!(!require(), "TANDEM_REQUIRE_WGPU is set but wgpu cannot start");
        return tandem_core::skip::note("wgpu broken-shader check: no adapter");
    }
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders");
    let dir = std::env::temp_dir().join(format!("tandem-broken-shaders-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    // eps a million times too large: rms_norm outputs shrink, except where x is so large that
    // even that eps does not matter (one case, x_scale=100).
    let f = dir.join("rms_norm.wgsl");
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.contains("+ p.eps"), "rms_norm.wgsl changed shape; update this test");
    std::fs::write(&f, text.replace("+ p.eps", "+ p.eps * 1e6")).unwrap();

    let b = WgpuBackend::with_shader_dir(&dir).unwrap();
    let mut out = Vec::new();
    let rep = tandem_conformance::run(&b, Some("rms_norm"), 1, &mut out);
    assert!(rep.failed >= 5 && !rep.ok(), "the broken shader was not caught:\n{}", String::from_utf8_lossy(&out));
    let rep = tandem_conformance::run(&b, Some("silu_mul"), 1, &mut out);
    assert!(rep.ok(), "an unbroken shader failed:\n{}", String::from_utf8_lossy(&out));
    let _ = std::fs::remove_dir_all(&dir);
}
