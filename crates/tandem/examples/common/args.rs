//! The command line every example takes, `--model DIR [--backend NAME]`, and how its `main`
//! turns the outcome into an exit code: one copy, included by each example (`#[path]`).

use std::path::PathBuf;

use tandem::Backend;

/// `--model DIR --backend NAME`.
pub fn parse_args(args: impl Iterator<Item = String>) -> Result<(PathBuf, Backend), String> {
    let (mut model, mut backend) = (None, Backend::Auto);
    let mut args = args.skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => model = args.next().map(PathBuf::from),
            "--backend" => {
                backend =
                    args.next().ok_or("--backend needs a value")?.parse().map_err(|e: tandem::Error| e.to_string())?
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: --model DIR [--backend auto|reference|wgpu|cuda]"
                ))
            }
        }
    }
    Ok((model.ok_or("--model DIR is required")?, backend))
}

/// 2 for a bad command line, 1 for a failed run (the error on stderr), else 0.
#[allow(dead_code)] // the tests include the examples for `run` and `parse_args` only
pub fn exit_code<T>(outcome: Result<Result<T, Box<dyn std::error::Error>>, String>) -> std::process::ExitCode {
    match outcome {
        Ok(Ok(_)) => std::process::ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
