//! Connections per peer address, for the services' accept loops (the DataNode's
//! `data.connections.per-peer.max`, the metadata service's `rpc.connections.per-peer.max`): a
//! count per IP, taken at accept and given back when the connection ends.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The open connections of each peer address.
#[derive(Debug, Clone)]
pub struct PeerCounts {
    max: usize,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One admitted connection; dropping it gives its place back.
#[derive(Debug)]
pub struct PeerSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PeerCounts {
    /// At most `max` connections per peer address.
    pub fn new(max: usize) -> PeerCounts {
        PeerCounts {
            max,
            open: Arc::default(),
        }
    }

    /// A place for one more connection from `ip`; `None` when it holds `max` already.
    pub fn admit(&self, ip: IpAddr) -> Option<PeerSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            ip,
            open: Arc::clone(&self.open),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_peer_gets_max_places_and_a_closed_one_is_given_back() {
        let p = PeerCounts::new(2);
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let a1 = p.admit(a).unwrap();
        let _a2 = p.admit(a).unwrap();
        assert!(p.admit(a).is_none(), "a third from the same peer");
        let _b1 = p.admit(b).expect("another peer is not affected");
        drop(a1);
        assert!(
            p.admit(a).is_some(),
            "a closed connection gives its place back"
        );
        assert_eq!(p.open.lock().unwrap().len(), 2);
    }
}
