//! Waiting for conditions instead of sleeping, and outer timeouts for tests.

use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `fut`, failing the test with `what` if it takes longer than `limit`.
pub async fn with_timeout<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Polls `cond` every 20 ms until it returns true; fails with `what` after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if cond().await {
            return;
        }
        if Instant::now() >= deadline {
            panic!("condition not reached within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
