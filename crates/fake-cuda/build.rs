//! Compiles every kernels/*.cu for the host with the emulator (kernels/emu/cuda_emu.h, strict
//! mode: shuffled blocks, poisoned `__shared__`), one translation unit a file, each followed by
//! a table of its kernels (name, signature, thunk: cpp/thunk.h). The kernel names come from the
//! file itself, preprocessed the same way (`extern "C" void NAME(` once the macros expand).
//! Needs g++ (C++20), as kernels/emu/run.sh does.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernels = manifest.join("../../kernels").canonicalize().expect("kernels/ beside crates/");
    let emu = kernels.join("emu");
    let cpp = manifest.join("cpp");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    println!("cargo:rerun-if-changed={}", kernels.display());
    println!("cargo:rerun-if-changed={}", emu.join("cuda_emu.h").display());
    println!("cargo:rerun-if-changed={}", cpp.join("thunk.h").display());
    println!("cargo:rerun-if-env-changed=CXX");

    let mut files: Vec<PathBuf> = std::fs::read_dir(&kernels)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let base = |extra: &[&str]| {
        let mut c = Command::new(&cxx);
        c.args([
            "-std=c++20",
            "-fPIC",
            "-fvisibility=hidden",
            "-pthread",
            "-DTANDEM_EMU_STRICT",
            "-Wno-unknown-pragmas",
        ]);
        c.arg(format!("-I{}", emu.display())).arg(format!("-I{}", cpp.display()));
        c.args(extra);
        c
    };

    // Preprocess, collect the names, write the unit, compile: all files side by side.
    let mut units = vec![];
    for f in &files {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        let head = format!("#include \"cuda_emu.h\"\n#include \"{}\"\n", f.display());
        let probe = out.join(format!("{stem}.probe.cpp"));
        std::fs::write(&probe, &head).unwrap();
        let pre = base(&["-E", "-P"]).arg(&probe).output().expect("running the C++ preprocessor (g++)");
        assert!(pre.status.success(), "preprocessing {}:\n{}", f.display(), String::from_utf8_lossy(&pre.stderr));
        let names = kernel_names(&String::from_utf8_lossy(&pre.stdout));
        assert!(!names.is_empty(), "{}: no extern \"C\" kernels found", f.display());
        let mut unit = head.clone();
        unit.push_str("#include \"thunk.h\"\n");
        let structs = cpp.join(format!("{stem}.structs.h"));
        println!("cargo:rerun-if-changed={}", structs.display());
        if structs.exists() {
            unit.push_str(&format!("#include \"{}\"\n", structs.display()));
        }
        unit.push_str("static const fake::Kernel table[] = {\n");
        for n in &names {
            unit.push_str(&format!("    fake::describe(\"{n}\", &{n}, &fake::run<&{n}>),\n"));
        }
        unit.push_str("};\n");
        unit.push_str(&format!(
            "extern \"C\" __attribute__((visibility(\"hidden\"))) const fake::Kernel* tandem_fake_kernels_{stem}(unsigned long* n) {{ *n = {}; return table; }}\n",
            names.len()
        ));
        let src = out.join(format!("{stem}.thunks.cpp"));
        std::fs::write(&src, unit).unwrap();
        units.push((stem, src));
    }
    let opt = std::env::var("TANDEM_FAKE_CUDA_OPT").unwrap_or_else(|_| "-O2".into());
    let mut children = vec![];
    let mut objs = vec![];
    for (stem, src) in &units {
        let obj = out.join(format!("{stem}.o"));
        let child = base(&[&opt, "-c", "-o"]).arg(&obj).arg(src).spawn().expect("running g++");
        children.push((stem.clone(), child));
        objs.push(obj);
    }
    for (stem, mut c) in children {
        assert!(c.wait().unwrap().success(), "compiling kernels/{stem}.cu for the host failed (see above)");
    }
    // GCC drops the section attribute of a static local in a template instantiation, so the
    // `__shared__` objects of template kernels land in plain .bss. In these units .bss holds
    // nothing else (checked: function-local statics only), so it joins the poisoned section.
    for obj in &objs {
        let t = Command::new("objdump").arg("-t").arg(obj).output().expect("running objdump");
        for line in String::from_utf8_lossy(&t.stdout).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.contains(&".bss") && f.contains(&"O") {
                let name = f.last().copied().unwrap_or("");
                assert!(name.starts_with("_ZZ"), "{}: `{name}` in .bss is not a function-local static (a `__shared__`): the fake driver would poison it before each block", obj.display());
            }
        }
        let st = Command::new("objcopy")
            .arg("--rename-section")
            .arg(".bss=tandem_emu_shared")
            .arg(obj)
            .status()
            .expect("running objcopy");
        assert!(st.success(), "objcopy failed on {}", obj.display());
    }
    let lib = out.join("libtandem_fake_kernels.a");
    let _ = std::fs::remove_file(&lib);
    let st = Command::new("ar").arg("crs").arg(&lib).args(&objs).status().expect("running ar");
    assert!(st.success(), "ar failed");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=tandem_fake_kernels");
    println!("cargo:rustc-link-lib=dylib=stdc++");

    // The Rust side's list of tables.
    let mut rs = String::from("unsafe extern \"C\" {\n");
    for (stem, _) in &units {
        rs.push_str(&format!("    fn tandem_fake_kernels_{stem}(n: *mut std::ffi::c_ulong) -> *const KernelEntry;\n"));
    }
    rs.push_str("}\n/// Every kernel file's table: (file stem, table function).\npub(crate) const TABLES: &[(&str, unsafe extern \"C\" fn(*mut std::ffi::c_ulong) -> *const KernelEntry)] = &[\n");
    for (stem, _) in &units {
        rs.push_str(&format!("    (\"{stem}\", tandem_fake_kernels_{stem}),\n"));
    }
    rs.push_str("];\n");
    std::fs::write(out.join("tables.rs"), rs).unwrap();
}

/// `extern "C" void NAME(` in preprocessed text (the emulator defines `__global__` and
/// `__launch_bounds__` away).
fn kernel_names(text: &str) -> Vec<String> {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut names = vec![];
    let mut rest = flat.as_str();
    while let Some(i) = rest.find("extern \"C\" void ") {
        rest = &rest[i + "extern \"C\" void ".len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        // The emulator's own context switch is extern "C" too; it is no kernel.
        if !name.is_empty()
            && !name.starts_with("tandem_emu")
            && rest[name.len()..].trim_start().starts_with('(')
            && !names.contains(&name)
        {
            names.push(name);
        }
    }
    names
}
