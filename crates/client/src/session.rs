//! The session a client's guards share: a keep-alive watchdog and a lock-loss watcher.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{Client, ClientError};

/// Per-grant poison flags, keyed by (lock name, token).
type Grants = HashMap<(String, u64), Arc<watch::Sender<bool>>>;

/// Losses reported before their guard registered (a grant lost right after it was made).
const EARLY_LOSSES: usize = 1024;

#[derive(Default)]
struct Registry {
    grants: Grants,
    early: std::collections::VecDeque<(String, u64)>,
}

pub(crate) struct SharedSession {
    pub(crate) id: u64,
    lost: watch::Sender<bool>,
    grants: Mutex<Registry>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl SharedSession {
    fn grants(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.grants.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// A poison flag for a grant of this session (on every lock of a multi-lock).
    pub(crate) fn register(&self, names: &[String], token: u64) -> watch::Receiver<bool> {
        let mut reg = self.grants();
        let lost_early = names
            .iter()
            .any(|n| reg.early.iter().any(|(e, t)| e == n && *t == token));
        let (tx, rx) = watch::channel(self.is_lost() || lost_early);
        let tx = Arc::new(tx);
        for name in names {
            reg.grants.insert((name.clone(), token), tx.clone());
        }
        rx
    }

    pub(crate) fn unregister(&self, names: &[String], token: u64) {
        let mut reg = self.grants();
        for name in names {
            reg.grants.remove(&(name.clone(), token));
        }
    }

    fn poison(&self, name: &str, token: u64) {
        let mut reg = self.grants();
        match reg.grants.get(&(name.to_owned(), token)) {
            Some(tx) => {
                tx.send_replace(true);
            }
            None => {
                if reg.early.len() >= EARLY_LOSSES {
                    reg.early.pop_front();
                }
                reg.early.push_back((name.to_owned(), token));
            }
        }
    }

    /// The session is gone (or may be): every grant is lost.
    pub(crate) fn poison_all(&self) {
        self.lost.send_replace(true);
        for tx in self.grants().grants.values() {
            tx.send_replace(true);
        }
    }
}

impl Drop for SharedSession {
    fn drop(&mut self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// Open a session and start its watchdog and watcher. The tasks hold only a weak reference:
/// they stop when the last guard and the client let go of the session.
pub(crate) async fn open(
    client: &Client,
    ttl: Duration,
) -> Result<Arc<SharedSession>, ClientError> {
    let id = client.open_session(ttl).await?;
    let session = Arc::new(SharedSession {
        id,
        lost: watch::channel(false).0,
        grants: Mutex::new(Registry::default()),
        tasks: Mutex::new(Vec::new()),
    });
    let keep_alive = tokio::spawn(keep_alive(client.clone(), Arc::downgrade(&session), ttl));
    let watcher = tokio::spawn(watch_loss(client.clone(), Arc::downgrade(&session)));
    session
        .tasks
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend([keep_alive, watcher]);
    Ok(session)
}

/// Renew the session every `ttl/3`. If the cluster says it is gone, or no renewal succeeded
/// for a whole `ttl` (measured from when the last successful one was *sent*), every grant of
/// the session must be presumed lost.
async fn keep_alive(client: Client, session: Weak<SharedSession>, ttl: Duration) {
    let period = (ttl / 3).max(Duration::from_millis(10));
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(period).await;
        let Some(id) = session.upgrade().map(|s| s.id) else {
            return;
        };
        let sent = Instant::now();
        let alive = match client.keep_alive(id).await {
            Ok(true) => {
                last_ok = sent;
                true
            }
            Ok(false) => {
                tracing::warn!(session = id, "session expired: its locks are lost");
                false
            }
            Err(e) => {
                tracing::warn!(session = id, "keep-alive failed: {e}");
                last_ok.elapsed() < ttl
            }
        };
        if !alive {
            if let Some(s) = session.upgrade() {
                s.poison_all();
            }
            return;
        }
    }
}

/// Follow the server's lock-loss events for the session, reconnecting while it lives.
async fn watch_loss(client: Client, session: Weak<SharedSession>) {
    loop {
        let Some(id) = session.upgrade().map(|s| s.id) else {
            return;
        };
        let mut stream = match client.watch(id).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(session = id, "lock-loss watch unavailable: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        while let Ok(Some(event)) = stream.message().await {
            let Some(s) = session.upgrade() else {
                return;
            };
            match event.reason.as_str() {
                // Our own release.
                "released" => {}
                // The whole session ended: every grant of it is gone.
                "session_gone" | "session_expired" | "session_closed" => {
                    s.poison_all();
                    return;
                }
                "lagged" => s.poison_all(),
                _ => s.poison(&event.name, event.token),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
