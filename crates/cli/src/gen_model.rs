//! `tandem gen-model --shape NAME --seed N --out DIR [--dtype bf16|f32|fp8|fp8-f32]`: a seeded random
//! model, the same bytes `cargo xtask gen-model` writes. It is in the binary so that a GPU
//! machine without a Rust toolchain makes its own weights (none have to travel there).

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// tiny, tiny-tied, tiny-hd128, small-hd64, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b or llama-3-8b.
    #[arg(long)]
    shape: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// bf16, f32, fp8 (the projections in FP8 e4m3 with 128 x 128 block scales, the rest bf16:
    /// the layout of Qwen3-*-FP8) or fp8-f32 (32 x 32 blocks, the rest f32).
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let line =
        tandem_model_files::random_model::gen_model(&a.shape, a.seed, &a.dtype, &a.out).map_err(anyhow::Error::msg)?;
    eprintln!("{line}");
    println!("{}", a.out.display());
    Ok(())
}
