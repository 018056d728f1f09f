//! The ready line: once a service binary has bound its sockets it prints one JSON line to
//! stdout naming the addresses it chose, so that a supervisor (a test harness, a script) that
//! started it with port 0 learns the ports without reading log text. Logs go to stderr.
//!
//! ```text
//! {"ready":"datanode","node":"dn-…","addresses":{"data":"127.0.0.1:40123","http":"127.0.0.1:40124"}}
//! ```

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;

/// What a service announces when it is ready: its kind, optionally its node id, and its bound
/// addresses by name (`rpc`, `http`, `data`, ...).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ready {
    /// The service: `metadata` or `datanode`.
    pub ready: String,
    /// The node id, for services that have one (DataNodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Bound addresses by name.
    pub addresses: BTreeMap<String, SocketAddr>,
}

impl Ready {
    /// A ready line for `service` with no addresses yet.
    pub fn new(service: &str) -> Ready {
        Ready {
            ready: service.to_string(),
            node: None,
            addresses: BTreeMap::new(),
        }
    }

    /// Adds the bound address `name`.
    pub fn address(mut self, name: &str, addr: SocketAddr) -> Ready {
        self.addresses.insert(name.to_string(), addr);
        self
    }

    /// Sets the node id.
    pub fn node(mut self, node: impl ToString) -> Ready {
        self.node = Some(node.to_string());
        self
    }

    /// The line, without its newline.
    pub fn to_line(&self) -> String {
        // A struct of strings and addresses always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses a ready line; `None` for any other line.
    pub fn parse(line: &str) -> Option<Ready> {
        serde_json::from_str(line.trim()).ok()
    }

    /// Prints the line to stdout and flushes it.
    pub fn announce(&self) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", self.to_line())?;
        out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_line_parses_back_and_other_lines_do_not() {
        let addr: SocketAddr = "127.0.0.1:4321".parse().unwrap();
        let ready = Ready::new("datanode").node("dn-1").address("data", addr);
        let line = ready.to_line();
        assert!(!line.contains('\n'));
        assert_eq!(Ready::parse(&line), Some(ready));
        assert_eq!(
            Ready::parse(&line).and_then(|r| r.addresses.get("data").copied()),
            Some(addr)
        );
        assert_eq!(
            Ready::parse("2026-12-02T18:00:00Z INFO serving data=127.0.0.1:1"),
            None
        );
        assert_eq!(Ready::parse(r#"{"other":1}"#), None);
    }
}
