//! `cargo xtask convert-gguf --gguf FILE --out DIR`: a local GGUF (llama, qwen2, qwen3, qwen3moe, gemma3) to a Hugging Face
//! directory (what fetch-model does after downloading, without the catalog). Tensor types: see
//! `tandem_model_files::quant::SUPPORTED` (the K-quants and the older 32-value types included).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, Q8_K).
    #[arg(long)]
    gguf: PathBuf,
    /// Output directory (created if needed; files in it are overwritten).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let s = tandem_model_files::convert_gguf(&args.gguf, &args.out, &mut |done, total, name| {
        eprint!("\r  [{:3}%] {done}/{total} {name:<60}", done * 100 / total);
        if done == total {
            eprintln!();
        }
    })
    .with_context(|| format!("converting {}", args.gguf.display()))?;
    eprintln!("{} tensors, {} parameters, tied embeddings: {}, {:.2} s", s.tensors, s.parameters, s.tied, s.seconds);
    println!("{}", args.out.display());
    Ok(())
}
