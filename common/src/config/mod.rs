//! Configuration: one TOML file with `[metadata]`, `[datanode]` and `[client]` sections, plus
//! environment overrides, loaded with the `config` crate.
//!
//! Keys are dotted names inside their section, as in Hadoop (`write.buffer.size.bytes` under
//! `[datanode]`). In TOML they may be written as dotted keys or as nested tables. Environment
//! variables override the file: `SLUICE_<SECTION>__<KEY>` with `__` between key parts, and `_`
//! standing for `-` (environment names cannot hold dashes), e.g.
//! `SLUICE_DATANODE__WRITE__MEMORY__BUFFER__LAST_REPLICA_ONLY=false`. Variables without `__`
//! (such as `SLUICE_METADATA`, the CLI's address) are not configuration keys.
//!
//! An unknown section or key is an error naming it; so is a value of the wrong type or out of
//! range (`validate()`). Sizes and durations are written with units (see [`units`]).

mod client;
mod datanode;
mod log;
mod metadata;
pub mod units;

pub use client::{ClientConfig, ReadMode, ReplacePolicy};
pub use datanode::{DatanodeConfig, PrefetchAdvice, SendfileMode};
pub use log::{ColorMode, LogConfig, LogFormat};
pub use metadata::MetadataConfig;
pub use units::{ByteSize, HumanDuration, Millis, PathList};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Prefix of configuration environment variables.
pub const ENV_PREFIX: &str = "SLUICE";

/// A configuration that could not be loaded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The file could not be read or parsed.
    #[error("cannot load config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// A section other than `metadata`, `datanode`, `client`.
    #[error(
        "unknown config section [{section}] (the sections are [metadata], [datanode] and [client])"
    )]
    UnknownSection {
        /// The section.
        section: String,
    },
    /// A key the section does not have.
    #[error("unknown config key {key}")]
    UnknownKey {
        /// `section.key`.
        key: String,
    },
    /// A value of the wrong type or form.
    #[error("config key {key}: {message}")]
    BadValue {
        /// `section.key`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// A value out of range, or inconsistent with another.
    #[error("invalid config {key} = {value}: {reason}")]
    Invalid {
        /// `section.key`.
        key: String,
        /// The value as configured.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

impl ConfigError {
    /// A [`ConfigError::Invalid`].
    pub fn invalid(key: &str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// The whole configuration; each service reads its own section.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SluiceConfig {
    /// `[metadata]`.
    pub metadata: MetadataConfig,
    /// `[datanode]`.
    pub datanode: DatanodeConfig,
    /// `[client]`.
    pub client: ClientConfig,
    /// `[log]`: every binary's log output.
    pub log: LogConfig,
}

impl SluiceConfig {
    /// Loads `file` (if given) and the process environment, then validates.
    pub fn load(file: Option<&Path>) -> Result<SluiceConfig, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// Loads `file` (if given) and the given environment variables, then validates.
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<SluiceConfig, ConfigError> {
        let prefix = format!("{ENV_PREFIX}_");
        let env: HashMap<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix) && k[prefix.len()..].contains("__"))
            .collect();
        let mut builder = config::Config::builder();
        if let Some(path) = file {
            builder = builder.add_source(
                config::File::from(path)
                    .format(config::FileFormat::Toml)
                    .required(true),
            );
        }
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("_")
                .separator("__")
                .try_parsing(true)
                .source(Some(env.into_iter().collect())),
        );
        let file_err = |message: String| ConfigError::File {
            path: file.map(Path::to_path_buf).unwrap_or_default(),
            message,
        };
        let tree: Value = builder
            .build()
            .map_err(|e| file_err(e.to_string()))?
            .try_deserialize()
            .map_err(|e| file_err(e.to_string()))?;
        Self::from_tree(tree)
    }

    /// Parses a TOML document (no environment), then validates. For tests and examples.
    pub fn from_toml_str(toml: &str) -> Result<SluiceConfig, ConfigError> {
        let tree: Value = config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(|e| ConfigError::File {
                path: PathBuf::from("<string>"),
                message: e.to_string(),
            })?;
        Self::from_tree(tree)
    }

    fn from_tree(tree: Value) -> Result<SluiceConfig, ConfigError> {
        let mut out = SluiceConfig::default();
        let Value::Object(sections) = tree else {
            return Ok(out);
        };
        for (name, body) in sections {
            match name.as_str() {
                "metadata" => out.metadata = section("metadata", body)?,
                "datanode" => out.datanode = section("datanode", body)?,
                "client" => out.client = section("client", body)?,
                "log" => out.log = section("log", body)?,
                _ => return Err(ConfigError::UnknownSection { section: name }),
            }
        }
        out.metadata.validate()?;
        out.datanode.validate()?;
        out.client.validate()?;
        Ok(out)
    }
}

/// Deserializes one section from its (possibly nested) tree, keys flattened to dotted names.
fn section<T: DeserializeOwned>(name: &str, body: Value) -> Result<T, ConfigError> {
    let mut flat = Map::new();
    match body {
        Value::Object(map) => flatten("", map, &mut flat),
        other => {
            return Err(ConfigError::BadValue {
                key: name.to_string(),
                message: format!("expected a section (table), found {other}"),
            })
        }
    }
    serde_path_to_error::deserialize(Value::Object(flat)).map_err(|e| {
        let message = e.inner().to_string();
        if let Some(rest) = message.strip_prefix("unknown field `") {
            let key = rest.split('`').next().unwrap_or(rest);
            return ConfigError::UnknownKey {
                key: format!("{name}.{key}"),
            };
        }
        let path = e.path().to_string();
        let key = if path == "." || path.is_empty() {
            name.to_string()
        } else {
            format!("{name}.{path}")
        };
        ConfigError::BadValue { key, message }
    })
}

fn flatten(prefix: &str, map: Map<String, Value>, out: &mut Map<String, Value>) {
    for (k, v) in map {
        let k = k.replace('_', "-");
        let key = if prefix.is_empty() {
            k
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Object(inner) => flatten(&key, inner, out),
            leaf => {
                out.insert(key, leaf);
            }
        }
    }
}

#[cfg(test)]
mod tests;
