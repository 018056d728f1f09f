//! Logging set-up for the binaries: `tracing` to stderr, filtered by `RUST_LOG`, as plain text
//! (coloured only on a terminal) or JSON lines, by the `[log]` section of the configuration.

use crate::config::{ColorMode, LogConfig, LogFormat};
use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

/// Installs the global subscriber with the default [`LogConfig`] (text, colour on a terminal);
/// later calls do nothing (tests call it freely).
pub fn init(default_filter: &str) {
    init_with(default_filter, &LogConfig::default());
}

/// Installs the global subscriber: `RUST_LOG` (else `default_filter`) filters, `log` shapes the
/// lines. Only the first call of the process has an effect.
pub fn init_with(default_filter: &str, log: &LogConfig) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true);
    let _ = match log.format {
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Text => builder.with_ansi(colour(log.color)).try_init(),
    };
}

/// Whether text lines are coloured.
fn colour(mode: ColorMode) -> bool {
    match mode {
        ColorMode::Always => true,
        ColorMode::Never => false,
        ColorMode::Auto => {
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    }
}
