//! Namespace paths: absolute, `/`-separated, validated before any lookup.

use sluice_common::MetaError;

/// Longest path accepted, in bytes (HDFS's `MAX_PATH_LENGTH`).
pub const MAX_PATH_BYTES: usize = 8000;
/// Longest path component, in bytes (HDFS's `max-component-length`).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A validated absolute path, split into components (`/` has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsPath {
    components: Vec<String>,
}

impl NsPath {
    /// The root directory.
    pub fn root() -> NsPath {
        NsPath { components: vec![] }
    }

    /// Parses and validates `path`. One trailing `/` is accepted (`/a/` is `/a`); empty, `.`
    /// and `..` components, NUL bytes and over-long paths are [`MetaError::InvalidPath`].
    pub fn parse(path: &str) -> Result<NsPath, MetaError> {
        let bad = |reason: &str| MetaError::InvalidPath {
            path: path.chars().take(200).collect(),
            reason: reason.to_string(),
        };
        if !path.starts_with('/') {
            return Err(bad("not absolute"));
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(bad("longer than 8000 bytes"));
        }
        if path.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if path == "/" {
            return Ok(NsPath::root());
        }
        let body = &path[1..];
        let body = body.strip_suffix('/').unwrap_or(body);
        let mut components = Vec::new();
        for c in body.split('/') {
            match c {
                "" => return Err(bad("empty path component")),
                "." | ".." => return Err(bad("`.` or `..` component")),
                c if c.len() > MAX_COMPONENT_BYTES => {
                    return Err(bad("component longer than 255 bytes"))
                }
                c => components.push(c.to_string()),
            }
        }
        Ok(NsPath { components })
    }

    /// The components, root first.
    pub fn components(&self) -> &[String] {
        &self.components
    }

    /// True for `/`.
    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    /// The last component (`None` for `/`).
    pub fn name(&self) -> Option<&str> {
        self.components.last().map(String::as_str)
    }

    /// The parent path (`None` for `/`).
    pub fn parent(&self) -> Option<NsPath> {
        let (_, init) = self.components.split_last()?;
        Some(NsPath {
            components: init.to_vec(),
        })
    }

    /// True if `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &NsPath) -> bool {
        self.components.starts_with(&other.components)
    }

    /// The path below `self` named `name`.
    pub fn join(&self, name: &str) -> NsPath {
        let mut components = self.components.clone();
        components.push(name.to_string());
        NsPath { components }
    }
}

impl std::fmt::Display for NsPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.components.is_empty() {
            return f.write_str("/");
        }
        for c in &self.components {
            write!(f, "/{c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_paths() {
        assert!(NsPath::parse("/").unwrap().is_root());
        let p = NsPath::parse("/a/b").unwrap();
        assert_eq!(p.components(), ["a", "b"]);
        assert_eq!(p.to_string(), "/a/b");
        assert_eq!(NsPath::parse("/a/b/").unwrap(), p);
        assert_eq!(p.parent().unwrap().to_string(), "/a");
        assert_eq!(p.name(), Some("b"));
        assert!(p.starts_with(&NsPath::parse("/a").unwrap()));
        assert!(!NsPath::parse("/ab")
            .unwrap()
            .starts_with(&NsPath::parse("/a").unwrap()));
    }

    #[test]
    fn invalid_paths() {
        for bad in ["", "a/b", "//", "/a//b", "/a/./b", "/a/..", "/a\0b"] {
            let err = NsPath::parse(bad).expect_err(bad);
            assert!(matches!(err, MetaError::InvalidPath { .. }), "{bad}: {err}");
        }
        let long = format!("/{}", "x".repeat(256));
        assert!(NsPath::parse(&long).is_err());
        let too_long = "/abc".repeat(2001);
        assert!(NsPath::parse(&too_long).is_err());
    }
}
