//! The node-wide cap on read-buffer memory (`read.buffer.max.bytes`): the read-ahead windows of
//! streaming reads and the reply buffers of chunk reads take their bytes from one budget
//! before they allocate. A read that does not fit is refused at once with `ERROR_BUSY` — never
//! queued — so a flood of reads costs bounded memory and the client moves to another replica.

use crate::metrics::{Counter, Gauge};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget of one DataNode.
#[derive(Debug)]
pub(crate) struct ReadMemory {
    budget: Arc<Semaphore>,
    held: Gauge,
    busy: Counter,
}

/// Bytes taken from the budget; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct ReadCharge {
    permit: OwnedSemaphorePermit,
    held: Gauge,
}

impl ReadMemory {
    /// A budget of `max` bytes; `held` follows the bytes taken, `busy` counts refusals.
    pub(crate) fn new(max: u64, held: Gauge, busy: Counter) -> ReadMemory {
        let max = usize::try_from(max)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        ReadMemory {
            budget: Arc::new(Semaphore::new(max)),
            held,
            busy,
        }
    }

    /// `bytes` from the budget, or `None` (counted as a busy refusal) when they are not free.
    pub(crate) fn try_take(&self, bytes: u64) -> Option<ReadCharge> {
        let c = self.try_take_quiet(bytes);
        if c.is_none() {
            self.busy.inc();
        }
        c
    }

    /// As [`ReadMemory::try_take`], without counting a refusal (a first try that has a
    /// smaller fallback).
    pub(crate) fn try_take_quiet(&self, bytes: u64) -> Option<ReadCharge> {
        let n = u32::try_from(bytes.max(1)).ok()?;
        let permit = self.budget.clone().try_acquire_many_owned(n).ok()?;
        self.held.add(i64::from(permit.num_permits() as u32));
        Some(ReadCharge {
            permit,
            held: self.held.clone(),
        })
    }

    /// Bytes free now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.budget.available_permits()
    }
}

impl ReadCharge {
    /// Bytes held.
    pub(crate) fn bytes(&self) -> u64 {
        self.permit.num_permits() as u64
    }
}

impl Drop for ReadCharge {
    fn drop(&mut self) {
        self.held.add(-(self.permit.num_permits() as i64));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_what_fits_refuses_the_rest_and_gives_back_on_drop() {
        let (held, busy) = (Gauge::default(), Counter::default());
        let m = ReadMemory::new(10, held.clone(), busy.clone());
        let a = m.try_take(6).unwrap();
        assert_eq!((a.bytes(), held.get()), (6, 6));
        assert!(m.try_take(5).is_none(), "over the cap");
        assert_eq!(busy.get(), 1);
        let _b = m.try_take(4).unwrap();
        drop(a);
        assert_eq!((m.available(), held.get()), (6, 4));
        assert!(m.try_take(u64::MAX).is_none());
    }
}
