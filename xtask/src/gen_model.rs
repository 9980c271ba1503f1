//! `cargo xtask gen-model --shape tiny --seed 1 --out DIR [--dtype bf16|f32|fp8|fp8-f32]`: a seeded random
//! model. The same arguments give the same bytes on every machine.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// tiny, tiny-tied, tiny-hd128, small-hd64, smollm2-135m, qwen2.5-0.5b, llama-3.2-1b or llama-3-8b.
    #[arg(long, default_value = "tiny")]
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

pub fn run(args: Args) -> anyhow::Result<()> {
    let line = tandem_model_files::random_model::gen_model(&args.shape, args.seed, &args.dtype, &args.out)
        .map_err(anyhow::Error::msg)?;
    eprintln!("{line}");
    println!("{}", args.out.display());
    Ok(())
}
