//! A one-line progress bar on stderr. On a terminal it redraws in place with `\r`; into a file
//! or pipe it prints a plain line every few seconds, so logs stay readable.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    label: String,
    total: usize,
    start: Instant,
    last: Option<Instant>,
    tty: bool,
}

impl Progress {
    pub fn new(label: impl Into<String>, total: usize) -> Self {
        Progress { label: label.into(), total, start: Instant::now(), last: None, tty: std::io::stderr().is_terminal() }
    }

    /// Redraws if enough time has passed; `extra` is appended (e.g. "812 tok/s").
    pub fn update(&mut self, done: usize, extra: &str) {
        let every = if self.tty { Duration::from_millis(200) } else { Duration::from_secs(5) };
        if self.last.is_some_and(|l| l.elapsed() < every) {
            return;
        }
        self.last = Some(Instant::now());
        self.draw(done, extra);
    }

    fn draw(&self, done: usize, extra: &str) {
        const WIDTH: usize = 30;
        let filled = (done * WIDTH).checked_div(self.total).unwrap_or(WIDTH).min(WIDTH);
        let bar: String = "#".repeat(filled) + &".".repeat(WIDTH - filled);
        let line =
            format!("{} [{bar}] {done}/{} {:.1}s {extra}", self.label, self.total, self.start.elapsed().as_secs_f64());
        let mut err = std::io::stderr().lock();
        let _ = if self.tty { write!(err, "\r{line}\x1b[K") } else { writeln!(err, "{line}") };
        let _ = err.flush();
    }

    /// Draws the final state and ends the line.
    pub fn finish(&mut self, done: usize, extra: &str) {
        self.draw(done, extra);
        if self.tty {
            eprintln!();
        }
    }
}
