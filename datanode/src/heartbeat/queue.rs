//! The queue of incremental replica events (`Received`, `Deleted`) waiting to be sent to the
//! metadata service with `block_received`. Producers push and wake the heartbeat task; the task
//! takes everything, sends it, and puts it back at the front if the call failed.

use sluice_common::rpc::ReplicaEvent;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::Notify;

/// Pending incremental replica events.
#[derive(Debug, Default)]
pub struct EventQueue {
    events: Mutex<VecDeque<ReplicaEvent>>,
    notify: Notify,
}

impl EventQueue {
    /// Queues an event and wakes the sender.
    pub fn push(&self, e: ReplicaEvent) {
        self.lock().push_back(e);
        self.notify.notify_one();
    }

    /// Takes every queued event.
    pub fn take(&self) -> Vec<ReplicaEvent> {
        self.lock().drain(..).collect()
    }

    /// Puts events that could not be sent back at the front, in order.
    pub fn put_back(&self, events: Vec<ReplicaEvent>) {
        let mut q = self.lock();
        for e in events.into_iter().rev() {
            q.push_front(e);
        }
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves after the next push (or at once if one happened since the last wait).
    pub async fn pushed(&self) {
        self.notify.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<ReplicaEvent>> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_common::{BlockId, ExtendedBlock, GenerationStamp};

    #[test]
    fn failed_sends_go_back_in_order() {
        let q = EventQueue::default();
        let b = |n| ReplicaEvent::Received(ExtendedBlock::new(BlockId(n), GenerationStamp(1), 0));
        q.push(b(1));
        q.push(b(2));
        let taken = q.take();
        q.push(b(3));
        q.put_back(taken);
        assert_eq!(q.take(), vec![b(1), b(2), b(3)]);
        assert!(q.is_empty());
    }
}
