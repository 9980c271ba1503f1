//! `cargo xtask gen-model --shape tiny --seed 1 --out DIR [--dtype bf16|f32]`: a seeded random
//! model. The same arguments give the same bytes on every machine.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context};
use tandem_core::DType;
use tandem_models::Shape;

#[derive(clap::Args)]
pub struct Args {
    /// tiny, tiny-tied, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b or llama-3-8b.
    #[arg(long, default_value = "tiny")]
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

pub fn run(args: Args) -> anyhow::Result<()> {
    let shape = Shape::parse(&args.shape).ok_or_else(|| {
        let known: Vec<&str> = Shape::ALL.iter().map(|s| s.name()).collect();
        anyhow!("unknown shape `{}` (known: {})", args.shape, known.join(", "))
    })?;
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        other => return Err(anyhow!("unknown dtype `{other}` (bf16 or f32)")),
    };
    let start = Instant::now();
    let s = tandem_models::write_random_model(&args.out, shape, args.seed, dtype)
        .with_context(|| format!("writing a random {} model to {}", shape.name(), args.out.display()))?;
    eprintln!(
        "{} seed {} {}: {} parameters, {:.1} MB, {:.1} s",
        shape.name(),
        args.seed,
        args.dtype,
        s.parameters,
        s.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    println!("{}", args.out.display());
    Ok(())
}
