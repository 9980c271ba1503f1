//! Construction: shaders from a run-time directory, and clear errors for a missing directory,
//! a broken shader and a bad backend name. One test (it sets environment variables).

mod common;

use tandem_core::backend::prelude::*;
use tandem_wgpu::{WgpuBackend, WgpuOptions};

#[test]
fn shader_dir_and_errors() {
    let Some(b) = common::open(WgpuOptions::default()) else { return };
    drop(b);
    let shaders = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shaders");
    let dir = std::env::temp_dir().join(format!("tandem-wgpu-shaders-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&shaders).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }

    // An edited shader is picked up without rebuilding: `add` made to add twice.
    let add = std::fs::read_to_string(dir.join("add.wgsl")).unwrap();
    let edited = add.replace("acc[i] = acc[i] + x[i];", "acc[i] = acc[i] + 2.0 * x[i];");
    assert_ne!(add, edited, "add.wgsl no longer has the line this test edits");
    std::fs::write(dir.join("add.wgsl"), edited).unwrap();
    let b = WgpuBackend::with_shader_dir(&dir).unwrap();
    assert_eq!(b.shader_dir(), Some(&dir));
    let mut acc = b.alloc_f32(2).unwrap();
    b.write_f32(&mut acc, &[1.0, 2.0]).unwrap();
    let mut x = b.alloc_f32(2).unwrap();
    b.write_f32(&mut x, &[10.0, 20.0]).unwrap();
    b.add(&mut acc, &x, 2).unwrap();
    assert_eq!(b.read_f32(&acc, 2).unwrap(), vec![21.0, 42.0]);

    // A shader that does not compile is an error naming the file, not a panic.
    std::fs::write(dir.join("silu_mul.wgsl"), "this is not wgsl").unwrap();
    let mut out = b.alloc_f32(2).unwrap();
    let e = b.silu_mul(&acc, &x, &mut out, 2).unwrap_err().to_string();
    assert!(e.contains("silu_mul.wgsl"), "{e}");

    // A missing directory is an error naming it.
    let missing = dir.join("nope");
    let e = WgpuBackend::with_shader_dir(&missing).err().expect("missing dir accepted").to_string();
    assert!(e.contains("nope"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);

    // A backend name wgpu does not know is an error that names the variable.
    std::env::set_var(tandem_wgpu::BACKENDS_ENV, "bogus");
    let e = WgpuBackend::new().err().expect("bogus backend accepted").to_string();
    assert!(e.contains("TANDEM_WGPU_BACKENDS"), "{e}");
    std::env::remove_var(tandem_wgpu::BACKENDS_ENV);
}
