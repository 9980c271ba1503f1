//! `tandem generate`: load, encode, decode greedily, print only the completion.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Result};
use tandem_core::detokenizer::IncrementalDetokenizer;
use tandem_core::model::LoadOptions;
use tandem_core::tokenizer::Tokenizer;

use crate::backends::{self, BackendKind};

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face model directory (default: the default model, fetched when absent).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt text, sent as is.
    #[arg(long, conflicts_with = "chat")]
    prompt: Option<String>,
    /// One user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, value_enum, default_value_t = BackendKind::Reference)]
    backend: BackendKind,
}

pub fn run(a: Args) -> Result<()> {
    let dir = backends::resolve_model(a.model.as_deref())?;
    let mut tok = Tokenizer::from_dir(&dir)?;
    let ids = match (&a.prompt, &a.chat) {
        (Some(p), None) => tok.encode(p, true)?,
        (None, Some(c)) => {
            let text = tok.apply_chat_template(&[serde_json::json!({"role": "user", "content": c})], true)?;
            tok.encode(&text, false)?
        }
        _ => bail!("give exactly one of --prompt or --chat"),
    };
    if a.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let total = ids.len() + a.max_tokens;
    let block_size = 16;
    let opts = LoadOptions { max_batch_tokens: 512, max_seqs: 1, num_kv_blocks: total.div_ceil(block_size), block_size, ..Default::default() };
    let t0 = std::time::Instant::now();
    let mut runner = backends::load(a.backend, &dir, opts)?;
    tok.add_eos_ids(&runner.config().eos_token_ids.clone());
    tracing::info!(backend = runner.backend_name(), prompt_tokens = ids.len(), load_ms = t0.elapsed().as_millis() as u64, "loaded {}", dir.display());
    let mut detok = IncrementalDetokenizer::new(true);
    let mut out = std::io::stdout().lock();
    let eos = tok.eos_ids.clone();
    let mut err = None;
    let t1 = std::time::Instant::now();
    let steps = tandem_core::greedy::generate(runner.as_mut(), &ids, a.max_tokens, &eos, false, |id| {
        if eos.contains(&id) {
            return;
        }
        match detok.push(&tok, &[id]) {
            Ok(s) => {
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
            }
            Err(e) => err = Some(e),
        }
    })?;
    if let Some(e) = err {
        return Err(e.into());
    }
    write!(out, "{}", detok.flush(&tok)?)?;
    writeln!(out)?;
    let secs = t1.elapsed().as_secs_f64();
    tracing::info!(tokens = steps.len(), seconds = format!("{secs:.2}"), tok_per_s = format!("{:.1}", steps.len() as f64 / secs), "done");
    Ok(())
}
