//! `cargo xtask convert-gguf --gguf FILE --out DIR`: a local GGUF (llama, qwen2, qwen3, qwen3moe, gemma3) to a Hugging Face
//! directory (what fetch-model does after downloading, without the catalog).

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    gguf: PathBuf,
    /// Output directory (created if needed; files in it are overwritten).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let s = tandem_models::convert_gguf(&args.gguf, &args.out, &mut |done, total, name| {
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
