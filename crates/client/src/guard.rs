//! Guards: one held grant each, living in the client's shared session.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fenced_proto::v1 as pb;
use tokio::sync::watch;

use crate::session::{self, SharedSession};
use crate::{Client, ClientError};

/// Options of the guard-returning calls ([`Client::lock`] and friends).
#[derive(Clone, Copy, Debug, Default)]
pub struct LockOptions {
    /// How long to wait in the lock's FIFO queue (zero: try once).
    pub wait: Duration,
    /// After this grant *expires* (the session was lost), nobody gets the lock for this long
    /// (Chubby/Consul lock-delay): time for the lost holder's in-flight writes to land or fail.
    pub lock_delay: Duration,
}

impl LockOptions {
    pub fn wait(wait: Duration) -> Self {
        LockOptions {
            wait,
            ..Default::default()
        }
    }
}

/// A held grant: an exclusive lock, a read or write lock, a semaphore permit, or a multi-lock.
/// Present [`LockGuard::token`] with every write to the protected storage.
pub struct LockGuard {
    client: Client,
    session: Arc<SharedSession>,
    names: Vec<String>,
    owner: String,
    token: u64,
    poisoned: watch::Receiver<bool>,
    released: bool,
}

impl LockGuard {
    /// The fencing token of this grant, or `None` once the grant is known or presumed lost.
    pub fn token(&self) -> Option<u64> {
        (!self.is_lost()).then_some(self.token)
    }

    /// The lock's name (the first one, for a multi-lock).
    pub fn name(&self) -> &str {
        &self.names[0]
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The owner string this grant was taken under (unique per guard).
    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn session(&self) -> u64 {
        self.session.id
    }

    /// True once the grant is known or presumed lost (expired, force-unlocked, session gone,
    /// or the cluster unreachable for a whole session TTL).
    pub fn is_lost(&self) -> bool {
        *self.poisoned.borrow()
    }

    /// Resolves when the grant is lost (never, while it is kept).
    pub async fn lost(&mut self) {
        let _ = self.poisoned.wait_for(|l| *l).await;
    }

    /// Run `callback` once when the grant is lost (not when it is released).
    pub fn on_lost(&self, callback: impl FnOnce() + Send + 'static) {
        let mut poisoned = self.poisoned.clone();
        tokio::spawn(async move {
            if poisoned.wait_for(|l| *l).await.is_ok() {
                callback();
            }
        });
    }

    /// Release the grant. `Ok(false)`: it was already gone.
    pub async fn release(mut self) -> Result<bool, ClientError> {
        self.released = true;
        self.session.unregister(&self.names, self.token);
        let names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        self.client
            .release_all(&names, &self.owner, self.token)
            .await
    }
}

impl Drop for LockGuard {
    /// Best effort: release in the background.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.session.unregister(&self.names, self.token);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let names = std::mem::take(&mut self.names);
            let owner = std::mem::take(&mut self.owner);
            let token = self.token;
            rt.spawn(async move {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let _ = client.release_all(&names, &owner, token).await;
            });
        }
    }
}

impl Client {
    /// The client's session, opened on first use and reopened after it was lost.
    async fn shared_session(&self) -> Result<Arc<SharedSession>, ClientError> {
        let mut slot = self.inner.session.lock().await;
        if let Some(s) = slot.as_ref().filter(|s| !s.is_lost()) {
            return Ok(s.clone());
        }
        let s = session::open(self, self.inner.options.session_ttl).await?;
        *slot = Some(s.clone());
        Ok(s)
    }

    async fn guard(
        &self,
        names: &[&str],
        mode: pb::LockMode,
        permits: u32,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        match self.guard_in_session(names, mode, permits, opts).await {
            // The session ended before the client noticed: once more in a fresh one.
            Err(ClientError::Rejected(s)) if s.code() == tonic::Code::NotFound => {
                self.guard_in_session(names, mode, permits, opts).await
            }
            other => other,
        }
    }

    async fn guard_in_session(
        &self,
        names: &[&str],
        mode: pb::LockMode,
        permits: u32,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        let session = self.shared_session().await?;
        let owner = format!(
            "{:016x}-{}",
            self.client_id(),
            self.inner.guards.fetch_add(1, Ordering::Relaxed) + 1
        );
        let (name, multi) = crate::name_fields(names);
        let req = pb::AcquireRequest {
            name,
            names: multi,
            owner: owner.clone(),
            mode: mode as i32,
            permits,
            wait_ms: opts.wait.as_millis() as u64,
            session: session.id,
            lock_delay_ms: opts.lock_delay.as_millis() as u64,
            ..Default::default()
        };
        let grant = match self.acquire_with(req).await {
            Ok(Some(grant)) => grant,
            Ok(None) => return Ok(None),
            Err(e) => {
                if matches!(&e, ClientError::Rejected(s) if s.code() == tonic::Code::NotFound) {
                    session.poison_all();
                }
                return Err(e);
            }
        };
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let poisoned = session.register(&names, grant.token);
        Ok(Some(LockGuard {
            client: self.clone(),
            session,
            names,
            owner,
            token: grant.token,
            poisoned,
            released: false,
        }))
    }

    /// Close the client's session, releasing every grant still held under it.
    pub async fn close(&self) -> Result<(), ClientError> {
        let session = self.inner.session.lock().await.take();
        match session {
            Some(s) if !s.is_lost() => self.close_session(s.id).await.map(|_| ()),
            _ => Ok(()),
        }
    }

    /// A fair exclusive lock. `None` if not granted within `opts.wait`.
    pub async fn lock(
        &self,
        name: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        self.guard(&[name], pb::LockMode::Exclusive, 0, opts).await
    }

    /// The shared side of read-write lock `name`.
    pub async fn read_lock(
        &self,
        name: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        self.guard(&[name], pb::LockMode::Read, 0, opts).await
    }

    /// The exclusive side of read-write lock `name`.
    pub async fn write_lock(
        &self,
        name: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        self.guard(&[name], pb::LockMode::Write, 0, opts).await
    }

    /// One permit of semaphore `name`, which has `permits` permits in all.
    pub async fn semaphore(
        &self,
        name: &str,
        permits: u32,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        self.guard(&[name], pb::LockMode::Permit, permits, opts)
            .await
    }

    /// All of `names` at once, in one log entry with one token, or none of them.
    pub async fn multi_lock(
        &self,
        names: &[&str],
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, ClientError> {
        if names.is_empty() {
            return Err(ClientError::Rejected(tonic::Status::invalid_argument(
                "a multi-lock needs at least one name",
            )));
        }
        self.guard(names, pb::LockMode::Exclusive, 0, opts).await
    }
}
