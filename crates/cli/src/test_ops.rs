//! `tandem test-ops`: the op conformance suite on one backend, against the reference (like
//! llama.cpp's test-backend-ops). Runs where there is no Rust toolchain; exits non-zero on any
//! failure, and when the backend asked for cannot be opened (never "0 cases, OK").

use anyhow::{bail, Result};

use crate::backends::BackendKind;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// Only cases whose name or parameters contain this text (e.g. `matmul`, `paged_attention`).
    #[arg(long)]
    op: Option<String>,
    /// Seed of the random inputs (printed when not given, so a failure can be rerun).
    #[arg(long)]
    seed: Option<u64>,
    /// Time each case on the backend instead of checking it.
    #[arg(long)]
    perf: bool,
}

pub fn run(a: Args) -> Result<()> {
    let seed = a.seed.unwrap_or_else(tandem_conformance::fresh_seed);
    let filter = a.op.as_deref();
    let mut out = std::io::stdout();
    let failed = match a.backend {
        BackendKind::Reference => suite(&tandem_reference::RefBackend::new(), filter, seed, a.perf, &mut out),
        BackendKind::Wgpu => suite(&tandem_wgpu::WgpuBackend::new()?, filter, seed, a.perf, &mut out),
        BackendKind::Cuda => suite(&tandem_cuda::CudaBackend::new(0)?, filter, seed, a.perf, &mut out),
        // The suite checks the backend it was told to; guessing one would hide an absent one.
        BackendKind::Auto => bail!("test-ops needs a named backend (reference, wgpu or cuda), not auto"),
    }?;
    if failed > 0 {
        bail!("{failed} case(s) failed on {}", a.backend.name());
    }
    Ok(())
}

fn suite<B: tandem_core::Backend>(
    b: &B,
    filter: Option<&str>,
    seed: u64,
    perf: bool,
    out: &mut std::io::Stdout,
) -> Result<usize> {
    if perf {
        let rep = tandem_conformance::run_perf(b, filter, seed, 10, out);
        if rep.results.is_empty() {
            bail!("no case matches {filter:?}");
        }
        return Ok(0);
    }
    let rep = tandem_conformance::run(b, filter, seed, out);
    if rep.passed + rep.failed == 0 && rep.skipped_cases > 0 {
        bail!(
            "{} has no path for the {} case(s) matching {filter:?} (skipped): nothing was checked",
            b.name(),
            rep.skipped_cases
        );
    }
    if rep.passed + rep.failed == 0 {
        bail!("no case matches {filter:?}: nothing was checked");
    }
    Ok(rep.failed)
}
