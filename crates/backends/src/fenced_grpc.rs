//! fenced over gRPC, through `fenced-client`. Waiting is server-side and FIFO; the token is the
//! store revision of the granting command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fenced_client::{Client, ClientError, ClientOptions};

use fenced_proto::v1 as pb;

use crate::{random_id, DistLock, Grant, LockError, LockMode};

/// One fenced client (its own connections and request numbering) with one owner identity.
pub struct FencedGrpc {
    client: Client,
    owner: String,
    failed: AtomicU64,
}

impl FencedGrpc {
    /// `endpoints`: gRPC `host:port` of any nodes of the cluster; the first is preferred.
    /// Connects lazily. The client's own retries are off (`retry_for` zero): one call is one
    /// attempt, and an unreachable node is an [`LockError::Unavailable`], like the other
    /// backends. Use [`FencedGrpc::with_client`] for a client that fails over by itself.
    pub fn connect<I, S>(endpoints: I) -> Result<FencedGrpc, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let options = ClientOptions {
            retry_for: Duration::ZERO,
            ..ClientOptions::default()
        };
        let client = Client::connect_with(endpoints, options).map_err(map_err)?;
        Ok(FencedGrpc::with_client(client))
    }

    /// Wrap an existing client (its retry settings apply).
    pub fn with_client(client: Client) -> FencedGrpc {
        FencedGrpc {
            owner: format!("dlock-{}", random_id(8)),
            client,
            failed: AtomicU64::new(0),
        }
    }

    /// The underlying client (status, sessions, ...).
    pub fn client(&self) -> &Client {
        &self.client
    }
}

fn map_err(e: ClientError) -> LockError {
    match e {
        ClientError::Unavailable(m) => LockError::Unavailable {
            backend: "fenced",
            message: m,
        },
        ClientError::NoEndpoints | ClientError::InvalidEndpoint(..) => {
            LockError::Invalid(e.to_string())
        }
        other => LockError::Backend {
            backend: "fenced",
            message: other.to_string(),
        },
    }
}

#[async_trait]
impl DistLock for FencedGrpc {
    fn name(&self) -> &'static str {
        "fenced"
    }

    fn issues_tokens(&self) -> bool {
        true
    }

    async fn acquire(
        &self,
        key: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        self.acquire_mode(key, LockMode::Exclusive, ttl, wait).await
    }

    /// The gRPC `Acquire` with `mode` (and `permits`) set.
    async fn acquire_mode(
        &self,
        key: &str,
        mode: LockMode,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<Grant>, LockError> {
        let sent = Instant::now();
        let (pb_mode, permits) = match mode {
            LockMode::Exclusive => (pb::LockMode::Exclusive, 0),
            LockMode::Read => (pb::LockMode::Read, 0),
            LockMode::Write => (pb::LockMode::Write, 0),
            LockMode::Permit { permits } => (pb::LockMode::Permit, permits),
        };
        let g = self
            .client
            .acquire_with(pb::AcquireRequest {
                name: key.to_owned(),
                owner: self.owner.clone(),
                ttl_ms: ttl.as_millis() as u64,
                wait_ms: wait.as_millis() as u64,
                mode: pb_mode as i32,
                permits,
                ..Default::default()
            })
            .await
            .map_err(map_err)?;
        match g {
            Some(g) => Ok(Some(Grant {
                key: key.to_owned(),
                handle: self.owner.clone(),
                token: Some(g.token),
                validity: ttl,
                acquired_at: sent,
            })),
            None => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
        }
    }

    async fn release(&self, grant: &Grant) -> Result<bool, LockError> {
        let token = grant
            .token
            .ok_or_else(|| LockError::Invalid("fenced grant without a token".into()))?;
        self.client
            .release(&grant.key, &grant.handle, token)
            .await
            .map_err(map_err)
    }

    async fn extend(&self, grant: &Grant, ttl: Duration) -> Result<bool, LockError> {
        let token = grant
            .token
            .ok_or_else(|| LockError::Invalid("fenced grant without a token".into()))?;
        self.client
            .renew(&grant.key, &grant.handle, token, ttl)
            .await
            .map_err(map_err)
    }

    fn failed_attempts(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}
