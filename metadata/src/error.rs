//! Start-up failures of the metadata service. Errors of requests travel as
//! [`sluice_common::MetaError`] instead.

use std::path::PathBuf;

/// Why the metadata service could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] sluice_common::config::ConfigError),
    /// A listener could not be bound.
    #[error("cannot bind {what} listener on {addr}: {source}")]
    Bind {
        /// `rpc` or `http`.
        what: &'static str,
        /// The address asked for.
        addr: String,
        /// The socket error.
        source: std::io::Error,
    },
    /// The namespace store could not be opened or read.
    #[error("cannot open the metadata store in {path}: {message}")]
    Store {
        /// The data directory.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The HTTP server could not start.
    #[error("cannot start the HTTP server on {addr}: {source}")]
    Http {
        /// The bound address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
}
