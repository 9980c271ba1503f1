//! A step's output, echoed as it comes and kept for its count.
//!
//! stdout and stderr share one pipe, so their lines keep their order: cargo prints which test
//! binary runs (`Running ...`) on stderr and the binary's results on stdout, and the counter
//! (count.rs) needs the one before the other.

use std::io::{BufRead, BufReader};
use std::process::Command;

use anyhow::{Context, Result};

/// Runs `cmd`, printing each line of its stdout and stderr, and returns the lines and whether
/// it exited successfully.
pub fn run_echoed(mut cmd: Command, what: &str) -> Result<(Vec<String>, bool)> {
    let (reader, writer) = std::io::pipe().context("a pipe")?;
    cmd.stdout(writer.try_clone()?).stderr(writer);
    let mut child = cmd.spawn().with_context(|| format!("running {what}"))?;
    // `cmd` holds the parent's copies of the writer: dropped, the reader sees the end.
    drop(cmd);
    let mut lines = vec![];
    for line in BufReader::new(reader).split(b'\n') {
        let line = String::from_utf8_lossy(&line?).trim_end_matches('\r').to_string();
        println!("{line}");
        lines.push(line);
    }
    let ok = child.wait()?.success();
    Ok((lines, ok))
}
