//! Write leases: which client holds which open files, and since when it last renewed.
//!
//! Kept in two indexes so that a monitor can scan by expiry cheaply: by holder, and by last
//! renewal time. Leases are not persisted as such: the file records carry their writer, and
//! the leases are rebuilt from them at start (renewed "now", as HDFS does after a restart).

use crate::namespace::InodeId;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

#[derive(Debug)]
struct Lease {
    renewed: Instant,
    files: BTreeSet<InodeId>,
}

/// Every lease.
#[derive(Debug, Default)]
pub struct LeaseManager {
    by_holder: HashMap<String, Lease>,
    by_time: BTreeSet<(Instant, String)>,
}

impl LeaseManager {
    /// No lease.
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives `holder` the lease on `file` (and renews its other leases).
    pub fn add(&mut self, holder: &str, file: InodeId, now: Instant) {
        self.renew(holder, now);
        match self.by_holder.get_mut(holder) {
            Some(lease) => {
                lease.files.insert(file);
            }
            None => {
                self.by_holder.insert(
                    holder.to_string(),
                    Lease {
                        renewed: now,
                        files: BTreeSet::from([file]),
                    },
                );
                self.by_time.insert((now, holder.to_string()));
            }
        }
    }

    /// Releases `holder`'s lease on `file`.
    pub fn remove(&mut self, holder: &str, file: InodeId) {
        let Some(lease) = self.by_holder.get_mut(holder) else {
            return;
        };
        lease.files.remove(&file);
        if lease.files.is_empty() {
            self.by_time.remove(&(lease.renewed, holder.to_string()));
            self.by_holder.remove(holder);
        }
    }

    /// Renews every lease of `holder`. False if it holds none.
    pub fn renew(&mut self, holder: &str, now: Instant) -> bool {
        let Some(lease) = self.by_holder.get_mut(holder) else {
            return false;
        };
        self.by_time.remove(&(lease.renewed, holder.to_string()));
        lease.renewed = now;
        self.by_time.insert((now, holder.to_string()));
        true
    }

    /// Holders not renewed for `limit` at `now`, oldest first, with their files.
    pub fn expired(&self, now: Instant, limit: Duration) -> Vec<(String, Vec<InodeId>)> {
        let mut out = Vec::new();
        for (renewed, holder) in &self.by_time {
            if now.saturating_duration_since(*renewed) < limit {
                break;
            }
            if let Some(lease) = self.by_holder.get(holder) {
                out.push((holder.clone(), lease.files.iter().copied().collect()));
            }
        }
        out
    }

    /// The files `holder` holds open.
    pub fn files_of(&self, holder: &str) -> Vec<InodeId> {
        self.by_holder
            .get(holder)
            .map(|l| l.files.iter().copied().collect())
            .unwrap_or_default()
    }

    /// When `holder` last renewed (`None`: it holds no lease).
    pub fn renewed_at(&self, holder: &str) -> Option<Instant> {
        self.by_holder.get(holder).map(|l| l.renewed)
    }

    /// Number of holders.
    #[cfg(test)]
    pub fn holders(&self) -> usize {
        self.by_holder.len()
    }

    /// Number of files open for writing.
    pub fn files(&self) -> usize {
        self.by_holder.values().map(|l| l.files.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_and_expire() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut m = LeaseManager::new();
        m.add("c1", InodeId(10), t0);
        m.add("c1", InodeId(11), t0);
        m.add("c2", InodeId(12), t0 + s(5));
        assert_eq!(m.files(), 3);
        assert!(m.expired(t0 + s(59), s(60)).is_empty());
        let exp = m.expired(t0 + s(60), s(60));
        assert_eq!(
            exp,
            vec![("c1".to_string(), vec![InodeId(10), InodeId(11)])]
        );
        assert_eq!(m.files_of("c1"), vec![InodeId(10), InodeId(11)]);
        assert_eq!(m.renewed_at("c2"), Some(t0 + s(5)));
        assert!(m.renew("c1", t0 + s(61)));
        assert_eq!(m.expired(t0 + s(66), s(60))[0].0, "c2");
        m.remove("c2", InodeId(12));
        assert_eq!(m.holders(), 1);
        assert!(!m.renew("c2", t0));
        assert!(m.expired(t0 + s(100), s(60)).is_empty());
    }
}
