//! Fuzz target body for the namespace path parser (cargo feature `fuzzing`; see
//! `docs/security.md`, "Fuzzing"): a path as it comes in an RPC, and as a WebHDFS URL path.
//! The unit test below replays every input kept in `fuzz/regressions/path/`.

use crate::namespace::path::{NsPath, MAX_COMPONENT_BYTES, MAX_PATH_BYTES};
use sluice_common::webhdfs::params::{path_of, url_path};

/// `data` as a path string (RPC) and as a URL path (WebHDFS). Never panics; a parsed path is
/// absolute, within the length limits, and made of non-empty components without `/`, NUL,
/// `.` or `..`; it prints back to a string that parses to itself, its parent joined with its
/// name is itself, and its WebHDFS URL decodes back to it.
pub fn path(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for candidate in [Some(s.to_string()), path_of(s).ok()].into_iter().flatten() {
        let Ok(p) = NsPath::parse(&candidate) else {
            continue;
        };
        for c in p.components() {
            assert!(!c.is_empty() && c.len() <= MAX_COMPONENT_BYTES, "{c:?}");
            assert!(!c.contains('/') && !c.contains('\0'), "{c:?}");
            assert!(c != "." && c != "..", "{c:?}");
        }
        let printed = p.to_string();
        assert!(printed.len() <= MAX_PATH_BYTES);
        assert_eq!(
            NsPath::parse(&printed).ok().as_ref(),
            Some(&p),
            "{printed:?}"
        );
        if let (Some(parent), Some(name)) = (p.parent(), p.name()) {
            assert_eq!(parent.join(name), p);
            assert!(p.starts_with(&parent));
        }
        let url = url_path(&printed);
        assert_eq!(path_of(&url).ok(), Some(printed), "{url}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn path_regressions_pass() {
        let n = sluice_common::fuzzing::replay(env!("CARGO_MANIFEST_DIR"), "path", super::path);
        assert!(n > 0, "no path inputs kept");
    }
}
