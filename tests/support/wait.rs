//! Bounded waiting: every wait panics with what it waited for.

use std::future::Future;
use std::time::{Duration, Instant};

/// Poll `f` until it returns `Ok`, for at most `timeout` (each attempt is cut off at the
/// deadline too). Panics with `what` and the last error on timeout.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    let mut last = String::from("(no attempt finished)");
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, f()).await {
            Ok(Ok(v)) => return v,
            Ok(Err(e)) => last = e,
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Await `fut` for at most `timeout`, panicking with `what` if it takes longer.
pub async fn within<T>(what: &str, timeout: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(timeout, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {timeout:?}: {what}"),
    }
}
