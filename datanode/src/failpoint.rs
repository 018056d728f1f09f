//! Named failpoints at protocol points (the `fail` crate), compiled in only with the
//! `failpoints` feature; without it every check is a constant `None`.
//!
//! Points: `dn::setup` (before connecting downstream), `dn::before_forward`,
//! `dn::after_forward` (around forwarding a packet downstream), `dn::before_write` (before the
//! packet goes to the replica writer), `dn::before_fsync` (in the writer, before the fsync of
//! an hsync or of the close with `sync.on.close`), `dn::flush` (a buffered replica's flush to
//! its block file: a write failure), `dn::before_ack` (in the responder, before an ack goes
//! upstream), `dn::finalize` (before the replica is finalized), `dn::map` (mapping a block
//! file to send cached pieces from: the mapping fails).
//!
//! **Scoping convention.** Several DataNodes share one process in tests, and the `fail`
//! registry is global. A point fires on a DataNode only when the configured `return` value
//! names it: `return(<scope>:<action>)`, where `<scope>` is the DataNode's bound data port or
//! its node id, or `*` for every DataNode, and `<action>` is
//!
//! - `error`: the op fails with this DataNode's status (`ERROR`, in its own ack slot or
//!   `OpResponse`), then the connections close as for any local error;
//! - `drop`: the connections are closed at once, nothing sent (a crash as the peers see it).
//!
//! Example: `fail::cfg("dn::before_write", "return(40123:error)")`. A value that names
//! another DataNode, or does not parse, leaves the point inert. Beware of counts
//! (`1*return(..)`): every DataNode that reaches the point consumes one, whether or not it is
//! the one named, so a count can be used up by another node.

/// What a fired failpoint makes the DataNode do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailAction {
    /// Fail the op with an error status.
    Error,
    /// Close the connections without a word.
    Drop,
}

/// Identifies one DataNode to the failpoints.
#[derive(Clone, Debug, Default)]
pub struct FailScope {
    port: String,
    node: String,
}

impl FailScope {
    /// The scope of the DataNode with this data port and node id.
    pub fn new(port: u16, node: &str) -> FailScope {
        FailScope {
            port: port.to_string(),
            node: node.to_string(),
        }
    }

    /// Evaluates failpoint `name` for this DataNode.
    #[cfg(feature = "failpoints")]
    pub fn check(&self, name: &'static str) -> Option<FailAction> {
        let action = fail::eval(name, |arg| arg.and_then(|a| self.parse(&a)))?;
        if action.is_some() {
            tracing::warn!(failpoint = name, node = %self.node, "failpoint fired: {action:?}");
        }
        action
    }

    /// Evaluates failpoint `name` for this DataNode (failpoints compiled out: never fires).
    #[cfg(not(feature = "failpoints"))]
    pub fn check(&self, _name: &'static str) -> Option<FailAction> {
        None
    }

    /// Parses `<scope>:<action>` and keeps it if the scope is this DataNode.
    #[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
    fn parse(&self, arg: &str) -> Option<FailAction> {
        let (scope, action) = arg.rsplit_once(':')?;
        let scope = scope.trim();
        if scope != "*" && scope != self.port && scope != self.node {
            return None;
        }
        match action.trim() {
            "error" => Some(FailAction::Error),
            "drop" => Some(FailAction::Drop),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_matches_port_node_or_star() {
        let s = FailScope::new(4000, "dn-1");
        assert_eq!(s.parse("4000:error"), Some(FailAction::Error));
        assert_eq!(s.parse("dn-1:drop"), Some(FailAction::Drop));
        assert_eq!(s.parse("*:drop"), Some(FailAction::Drop));
        assert_eq!(s.parse("4001:error"), None);
        assert_eq!(s.parse("4000:explode"), None);
        assert_eq!(s.parse("error"), None);
    }
}
