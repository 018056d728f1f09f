//! The progress bar of put, get and cp (indicatif: bytes, rate, ETA), drawn on stderr only
//! when stderr is a terminal, so that scripts and pipes see nothing.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal as _;

/// Bar with a known total.
const TEMPLATE: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}";
/// Spinner for a source of unknown length (stdin).
const SPINNER: &str = "{spinner} {msg} {bytes} {binary_bytes_per_sec}";

/// A progress display, or nothing when stderr is not a terminal.
pub struct Progress(Option<ProgressBar>);

impl Progress {
    /// A bar for one copy named `what`, of `total` bytes (`None`: unknown).
    pub fn start(what: &str, total: Option<u64>) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let (bar, template) = match total {
            Some(n) => (ProgressBar::new(n), TEMPLATE),
            None => (ProgressBar::no_length(), SPINNER),
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_message(what.to_string());
        Progress(Some(bar))
    }

    /// No display (cat, tail).
    pub fn none() -> Progress {
        Progress(None)
    }

    /// `n` more bytes copied.
    pub fn advance(&self, n: u64) {
        if let Some(b) = &self.0 {
            b.inc(n);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
