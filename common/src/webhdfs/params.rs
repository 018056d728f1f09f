//! WebHDFS request parameters: the operation, typed parameters validated up front (a bad
//! `offset`, `length`, boolean... is a 400 naming it before anything runs), and the path of the
//! request URL. Parameter names are case-insensitive, as HDFS's `ParamFilter` makes them;
//! unknown parameters are ignored, as HDFS ignores them.

use super::{RemoteError, DEFAULT_USER, PREFIX};
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use std::collections::BTreeMap;

/// The operations a WebHDFS gateway dispatches, by HTTP method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// GET: read a file (redirected to a DataNode).
    Open,
    /// GET: one entry.
    GetFileStatus,
    /// GET: a directory's entries.
    ListStatus,
    /// GET: a directory's entries in batches after `startAfter`.
    ListStatusBatch,
    /// GET: counts and sizes under a path.
    GetContentSummary,
    /// GET: the file's checksum (redirected to a DataNode).
    GetFileChecksum,
    /// GET: `/user/<user.name>`.
    GetHomeDirectory,
    /// PUT: create a file (redirected to a DataNode).
    Create,
    /// PUT: create directories.
    Mkdirs,
    /// PUT: move to `destination`.
    Rename,
    /// PUT: change a file's replication factor.
    SetReplication,
    /// POST: append to a file (redirected to a DataNode).
    Append,
    /// DELETE: remove a path.
    Delete,
}

/// HDFS operations that exist but Sluice does not serve: refused as unsupported, not unknown.
const UNSUPPORTED: &[&str] = &[
    "GETFILEBLOCKLOCATIONS",
    "GETACLSTATUS",
    "GETXATTRS",
    "LISTXATTRS",
    "CHECKACCESS",
    "GETALLSTORAGEPOLICY",
    "GETSTORAGEPOLICY",
    "GETSNAPSHOTDIFF",
    "GETSNAPSHOTTABLEDIRECTORYLIST",
    "GETDELEGATIONTOKEN",
    "GETTRASHROOT",
    "GETSTATUS",
    "GETQUOTAUSAGE",
    "GETECPOLICY",
    "GETSERVERDEFAULTS",
    "GETLINKTARGET",
    "GETFILELINKSTATUS",
    "GETSNAPSHOTLIST",
    "SETPERMISSION",
    "SETOWNER",
    "SETTIMES",
    "RENEWDELEGATIONTOKEN",
    "CANCELDELEGATIONTOKEN",
    "CREATESYMLINK",
    "SETXATTR",
    "REMOVEXATTR",
    "CREATESNAPSHOT",
    "RENAMESNAPSHOT",
    "MODIFYACLENTRIES",
    "REMOVEACLENTRIES",
    "REMOVEDEFAULTACL",
    "REMOVEACL",
    "SETACL",
    "ALLOWSNAPSHOT",
    "DISALLOWSNAPSHOT",
    "SETSTORAGEPOLICY",
    "SETQUOTA",
    "SETQUOTABYSTORAGETYPE",
    "SATISFYSTORAGEPOLICY",
    "ENABLEECPOLICY",
    "DISABLEECPOLICY",
    "SETECPOLICY",
    "CONCAT",
    "TRUNCATE",
    "UNSETSTORAGEPOLICY",
    "UNSETECPOLICY",
    "DELETESNAPSHOT",
];

impl Op {
    /// The operation named `name` (case-insensitive) for `method`.
    pub fn parse(method: &str, name: &str) -> Result<Op, RemoteError> {
        let upper = name.to_ascii_uppercase();
        let op = match (method, upper.as_str()) {
            ("GET", "OPEN") => Op::Open,
            ("GET", "GETFILESTATUS") => Op::GetFileStatus,
            ("GET", "LISTSTATUS") => Op::ListStatus,
            ("GET", "LISTSTATUS_BATCH") => Op::ListStatusBatch,
            ("GET", "GETCONTENTSUMMARY") => Op::GetContentSummary,
            ("GET", "GETFILECHECKSUM") => Op::GetFileChecksum,
            ("GET", "GETHOMEDIRECTORY") => Op::GetHomeDirectory,
            ("PUT", "CREATE") => Op::Create,
            ("PUT", "MKDIRS") => Op::Mkdirs,
            ("PUT", "RENAME") => Op::Rename,
            ("PUT", "SETREPLICATION") => Op::SetReplication,
            ("POST", "APPEND") => Op::Append,
            ("DELETE", "DELETE") => Op::Delete,
            (_, u) if UNSUPPORTED.contains(&u) => {
                return Err(RemoteError::unsupported(format!(
                    "operation {u} is not supported by Sluice (see docs/webhdfs.md)"
                )))
            }
            _ => {
                return Err(RemoteError::bad_param(
                    "op",
                    name,
                    &format!("no {method} operation of that name"),
                ))
            }
        };
        Ok(op)
    }
}

/// Booleans: `true`/`false` in any case (HDFS `BooleanParam`).
const BOOLEANS: &[&str] = &["overwrite", "recursive", "noredirect", "createparent"];
/// Non-negative longs.
const LONGS: &[&str] = &["offset", "length", "blocksize"];

/// The query parameters of one request, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    pairs: BTreeMap<String, String>,
}

impl Params {
    /// Parses and validates a query string (`a=1&b=2`, form-encoded).
    pub fn parse(query: &str) -> Result<Params, RemoteError> {
        let pairs: BTreeMap<String, String> = form_urlencoded::parse(query.as_bytes())
            .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
            .collect();
        let params = Params { pairs };
        params.validate()?;
        Ok(params)
    }

    fn validate(&self) -> Result<(), RemoteError> {
        for name in BOOLEANS {
            if let Some(v) = self.get(name) {
                parse_bool(name, v)?;
            }
        }
        for name in LONGS {
            if let Some(v) = self.get(name) {
                parse_long(name, v)?;
            }
        }
        if let Some(v) = self.get("buffersize") {
            if parse_long("buffersize", v)? == 0 || parse_long("buffersize", v)? > i32::MAX as u64 {
                return Err(RemoteError::bad_param(
                    "buffersize",
                    v,
                    "must be a positive int",
                ));
            }
        }
        if let Some(v) = self.get("replication") {
            match v.parse::<i16>() {
                Ok(r) if r > 0 => {}
                _ => {
                    return Err(RemoteError::bad_param(
                        "replication",
                        v,
                        "must be a positive short",
                    ))
                }
            }
        }
        if let Some(v) = self.get("permission") {
            match u32::from_str_radix(v, 8) {
                Ok(p) if p <= 0o1777 => {}
                _ => {
                    return Err(RemoteError::bad_param(
                        "permission",
                        v,
                        "must be an octal number from 0 to 1777",
                    ))
                }
            }
        }
        Ok(())
    }

    /// A parameter's raw value.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs.get(name).map(String::as_str)
    }

    /// The operation for `method`; a missing `op` is a 400.
    pub fn op(&self, method: &str) -> Result<Op, RemoteError> {
        match self.get("op") {
            Some(name) => Op::parse(method, name),
            None => Err(RemoteError::bad_param("op", "", "missing")),
        }
    }

    /// A validated boolean, `default` when absent.
    pub fn flag(&self, name: &str, default: bool) -> bool {
        self.get(name)
            .and_then(|v| parse_bool(name, v).ok())
            .unwrap_or(default)
    }

    /// A validated number, `None` when absent.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.get(name).and_then(|v| v.parse().ok())
    }

    /// `user.name`, or [`DEFAULT_USER`].
    pub fn user(&self) -> &str {
        self.get("user.name")
            .filter(|u| !u.is_empty())
            .unwrap_or(DEFAULT_USER)
    }

    /// Sets a parameter (e.g. before forwarding in a redirect).
    pub fn set(&mut self, name: &str, value: impl Into<String>) {
        self.pairs.insert(name.to_ascii_lowercase(), value.into());
    }

    /// The parameters as a query string, without those named in `skip`.
    pub fn to_query(&self, skip: &[&str]) -> String {
        let mut ser = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.pairs {
            if !skip.contains(&k.as_str()) {
                ser.append_pair(k, v);
            }
        }
        ser.finish()
    }
}

fn parse_bool(name: &str, v: &str) -> Result<bool, RemoteError> {
    if v.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if v.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(RemoteError::bad_param(name, v, "must be true or false"))
    }
}

fn parse_long(name: &str, v: &str) -> Result<u64, RemoteError> {
    match v.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n as u64),
        Ok(_) => Err(RemoteError::bad_param(name, v, "must not be negative")),
        Err(_) => Err(RemoteError::bad_param(name, v, "not a number")),
    }
}

/// Characters escaped in a path put back into a URL ('/' stays).
const PATH_SET: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'?')
    .add(b'<')
    .add(b'>')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'&')
    .add(b'+');

/// The Sluice path of a request URL path (`/webhdfs/v1/a/b` → `/a/b`): percent-decoded, then
/// [`normalize`]d.
pub fn path_of(url_path: &str) -> Result<String, RemoteError> {
    let rest = url_path.strip_prefix(PREFIX).unwrap_or(url_path);
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8()
        .map_err(|_| RemoteError::bad_param("path", rest, "not UTF-8"))?;
    normalize(&decoded)
}

/// A path with empty components and a trailing `/` dropped; `.` or `..` components are a 400.
pub fn normalize(path: &str) -> Result<String, RemoteError> {
    let mut out = String::new();
    for c in path.split('/').filter(|c| !c.is_empty()) {
        if c == "." || c == ".." {
            return Err(RemoteError::new(
                400,
                "IllegalArgumentException",
                format!("Invalid path name {path}: '{c}' is not allowed in a path"),
            ));
        }
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    Ok(out)
}

/// The URL path of a Sluice path (`/a b` → `/webhdfs/v1/a%20b`).
pub fn url_path(path: &str) -> String {
    format!("{PREFIX}{}", utf8_percent_encode(path, PATH_SET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_400s_naming_the_parameter() {
        for q in [
            "op=OPEN&offset=-1",
            "op=OPEN&length=ten",
            "op=DELETE&recursive=yes",
            "op=CREATE&replication=0",
            "op=CREATE&permission=999",
            "op=CREATE&buffersize=0",
        ] {
            let e = Params::parse(q).expect_err(q);
            assert_eq!(e.status, 400, "{q}");
            assert_eq!(e.exception, "IllegalArgumentException");
            let name = q.split('&').nth(1).and_then(|p| p.split('=').next());
            assert!(
                e.message.contains(name.unwrap_or("?")),
                "{q}: {}",
                e.message
            );
        }
    }

    #[test]
    fn names_are_case_insensitive_and_booleans_any_case() {
        let p = Params::parse("OP=liststatus&Recursive=True&user.name=ann").expect("parse");
        assert_eq!(p.op("GET"), Ok(Op::ListStatus));
        assert!(p.flag("recursive", false));
        assert_eq!(p.user(), "ann");
        assert_eq!(Params::parse("").expect("empty").user(), DEFAULT_USER);
    }

    #[test]
    fn unknown_ops_are_bad_parameters_and_known_ones_unsupported() {
        let p = Params::parse("op=FROB").expect("parse");
        assert_eq!(
            p.op("GET").map_err(|e| e.exception),
            Err("IllegalArgumentException")
        );
        let p = Params::parse("op=setowner").expect("parse");
        assert_eq!(
            p.op("PUT").map_err(|e| (e.status, e.exception)),
            Err((400, "UnsupportedOperationException"))
        );
        // An op under the wrong method is unknown for that method.
        let p = Params::parse("op=MKDIRS").expect("parse");
        assert_eq!(p.op("GET").map_err(|e| e.status), Err(400));
    }

    #[test]
    fn paths_decode_and_refuse_dot_components() {
        assert_eq!(path_of("/webhdfs/v1").as_deref(), Ok("/"));
        assert_eq!(path_of("/webhdfs/v1/").as_deref(), Ok("/"));
        assert_eq!(path_of("/webhdfs/v1/a%20b//c/").as_deref(), Ok("/a b/c"));
        assert_eq!(
            path_of("/webhdfs/v1/a/../b").map_err(|e| e.status),
            Err(400)
        );
        assert_eq!(
            path_of("/webhdfs/v1/a/%2E%2E/b").map_err(|e| e.status),
            Err(400)
        );
        assert_eq!(url_path("/a b/c&d"), "/webhdfs/v1/a%20b/c%26d");
    }
}
