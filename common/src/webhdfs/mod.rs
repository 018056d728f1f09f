//! WebHDFS wire pieces shared by the metadata service's gateway (namespace, redirects) and the
//! DataNode's (data): request parameters and paths ([`params`]), the JSON documents
//! ([`json`]), and errors as `RemoteException` answers ([`RemoteError`]). Framework-free: each
//! side adapts them to its actix-web handlers. See `docs/webhdfs.md`.

pub mod json;
pub mod params;

use crate::MetaError;
use serde_json::{json, Value};

/// The URL prefix of every WebHDFS request.
pub const PREFIX: &str = "/webhdfs/v1";

/// The user a request without `user.name` runs as (HDFS's static web user).
pub const DEFAULT_USER: &str = "dr.who";

/// A failed request as a WebHDFS client sees it: an HTTP status and a `RemoteException` naming a
/// Java exception (clients map the name to their own errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{exception}: {message}")]
pub struct RemoteError {
    /// The HTTP status.
    pub status: u16,
    /// The Java exception's short name, e.g. `FileNotFoundException`.
    pub exception: &'static str,
    /// The message.
    pub message: String,
}

impl RemoteError {
    /// An error with the given status and exception.
    pub fn new(status: u16, exception: &'static str, message: impl Into<String>) -> Self {
        RemoteError {
            status,
            exception,
            message: message.into(),
        }
    }

    /// A bad parameter (400, `IllegalArgumentException`), worded as HDFS words it.
    pub fn bad_param(name: &str, value: &str, reason: &str) -> Self {
        RemoteError::new(
            400,
            "IllegalArgumentException",
            format!("Invalid value for webhdfs parameter \"{name}\": {reason} (got \"{value}\")"),
        )
    }

    /// An operation Sluice does not implement (400, `UnsupportedOperationException`).
    pub fn unsupported(message: impl Into<String>) -> Self {
        RemoteError::new(400, "UnsupportedOperationException", message)
    }

    /// An I/O failure (403, `IOException`, as HDFS's `ExceptionHandler` answers one).
    pub fn io(message: impl Into<String>) -> Self {
        RemoteError::new(403, "IOException", message)
    }

    /// The `RemoteException` document.
    pub fn to_json(&self) -> Value {
        json!({"RemoteException": {
            "exception": self.exception,
            "javaClassName": java_class(self.exception),
            "message": self.message,
        }})
    }
}

/// The fully qualified Java class of an exception name.
fn java_class(exception: &str) -> String {
    let package = match exception {
        "FileNotFoundException" | "IOException" => "java.io",
        "IllegalArgumentException" | "UnsupportedOperationException" => "java.lang",
        "FileAlreadyExistsException"
        | "ParentNotDirectoryException"
        | "PathIsNotEmptyDirectoryException" => "org.apache.hadoop.fs",
        "AlreadyBeingCreatedException" => "org.apache.hadoop.hdfs.protocol",
        "LeaseExpiredException" | "NotReplicatedYetException" => {
            "org.apache.hadoop.hdfs.server.namenode"
        }
        "AccessControlException" => "org.apache.hadoop.security",
        _ => "java.lang",
    };
    format!("{package}.{exception}")
}

impl From<&MetaError> for RemoteError {
    fn from(e: &MetaError) -> Self {
        let msg = e.to_string();
        match e {
            MetaError::NotFound { path } => RemoteError::new(
                404,
                "FileNotFoundException",
                format!("File {path} does not exist."),
            ),
            MetaError::IsADirectory { path } => RemoteError::new(
                404,
                "FileNotFoundException",
                format!("Path is not a file: {path}"),
            ),
            MetaError::AlreadyExists { .. } => {
                RemoteError::new(403, "FileAlreadyExistsException", msg)
            }
            MetaError::NotADirectory { .. } => {
                RemoteError::new(403, "ParentNotDirectoryException", msg)
            }
            MetaError::DirectoryNotEmpty { .. } => {
                RemoteError::new(403, "PathIsNotEmptyDirectoryException", msg)
            }
            MetaError::InvalidPath { .. } | MetaError::InvalidArgument { .. } => {
                RemoteError::new(400, "IllegalArgumentException", msg)
            }
            MetaError::LeaseConflict { .. } => {
                RemoteError::new(403, "AlreadyBeingCreatedException", msg)
            }
            MetaError::NotLeaseHolder { .. } => RemoteError::new(403, "LeaseExpiredException", msg),
            MetaError::NotReplicatedYet { .. } => {
                RemoteError::new(403, "NotReplicatedYetException", msg)
            }
            MetaError::NotUnderConstruction { .. }
            | MetaError::UnknownBlock { .. }
            | MetaError::GenerationStampMismatch { .. }
            | MetaError::NotEnoughDatanodes { .. }
            | MetaError::UnknownDatanode { .. }
            | MetaError::Storage { .. } => RemoteError::io(msg),
        }
    }
}

impl From<MetaError> for RemoteError {
    fn from(e: MetaError) -> Self {
        RemoteError::from(&e)
    }
}
