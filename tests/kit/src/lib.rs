//! Helpers that every crate's tests share, so that each exists once: outer timeouts
//! ([`within`], [`with_timeout`]), waiting for a condition instead of sleeping ([`wait_until`]
//! for async conditions, [`wait_for`] for plain ones), reproducible test bytes
//! ([`random_bytes`]), and (in [`fake`]) a fake metadata service and a fake DataNode on real
//! sockets for the client's protocol tests.
//!
//! It depends on `sluice-common` only, so any crate (the client too) may use it in its tests.

// Test scaffolding: a panic here is a failed test, as in the tests themselves.
#![allow(clippy::unwrap_used, clippy::result_large_err)]

pub mod fake;

use std::future::Future;
use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`wait_for`] look again.
const POLL: Duration = Duration::from_millis(10);

/// Runs a test body under an outer timeout of `secs` seconds; panics when it passes.
pub async fn within<F: Future>(secs: u64, f: F) -> F::Output {
    with_timeout(Duration::from_secs(secs), "the test body", f).await
}

/// Runs `fut`, failing the test with `what` if it takes longer than `limit`.
pub async fn with_timeout<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Polls the async `cond` until it returns true; fails the test with `what` after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Polls the plain `cond` until it returns true; fails the test with `what` after `limit`.
pub async fn wait_for(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not reached within {limit:?}: {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `len` pseudo-random bytes (xorshift), the same for the same `seed`.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_are_reproducible_and_depend_on_the_seed() {
        assert_eq!(random_bytes(1000, 7), random_bytes(1000, 7));
        assert_ne!(random_bytes(1000, 7), random_bytes(1000, 8));
        assert_eq!(random_bytes(0, 7), Vec::<u8>::new());
    }

    #[tokio::test]
    #[should_panic(expected = "timed out")]
    async fn with_timeout_fails_the_test_when_the_limit_passes() {
        with_timeout(
            Duration::from_millis(10),
            "never",
            std::future::pending::<()>(),
        )
        .await;
    }

    #[tokio::test]
    #[should_panic(expected = "condition not reached")]
    async fn wait_for_fails_the_test_when_the_condition_never_holds() {
        wait_for(Duration::from_millis(30), "never", || false).await;
    }

    #[tokio::test]
    async fn wait_until_returns_once_the_condition_holds() {
        let mut n = 0;
        wait_until(Duration::from_secs(5), "third poll", || {
            n += 1;
            let done = n >= 3;
            async move { done }
        })
        .await;
        assert_eq!(n, 3);
    }
}
