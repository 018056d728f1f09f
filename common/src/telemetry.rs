//! Logging set-up for the binaries: `tracing` to stderr, filtered by `RUST_LOG` (default
//! `info`), plain text or JSON.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber once; later calls do nothing (tests call it freely).
pub fn init(default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .try_init();
}
