//! `tandem gen-model --shape NAME --seed N --out DIR [--dtype bf16|f32]`: a seeded random
//! model, the same bytes `cargo xtask gen-model` writes. It is in the binary so that a GPU
//! machine without a Rust toolchain makes its own weights (none have to travel there).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use tandem_core::DType;
use tandem_models::Shape;

#[derive(clap::Args)]
pub struct Args {
    /// tiny, tiny-tied, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b or llama-3-8b.
    #[arg(long)]
    shape: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// bf16 or f32.
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

pub fn run(a: Args) -> Result<()> {
    let shape = Shape::parse(&a.shape).ok_or_else(|| {
        let known: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        anyhow!("unknown shape `{}` (known: {})", a.shape, known.join(", "))
    })?;
    let dtype = match a.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => return Err(anyhow!("unknown dtype `{other}` (bf16 or f32)")),
    };
    let start = Instant::now();
    let s = tandem_models::write_random_model(&a.out, shape, a.seed, dtype)
        .with_context(|| format!("writing a random {} model to {}", shape.name(), a.out.display()))?;
    eprintln!(
        "{} seed {} {}: {} parameters, {:.1} MB, {:.1} s",
        shape.name(),
        a.seed,
        a.dtype,
        s.parameters,
        s.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    println!("{}", a.out.display());
    Ok(())
}
