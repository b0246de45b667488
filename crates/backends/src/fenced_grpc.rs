//! fenced over gRPC, through `fenced-client`. Waiting is server-side and FIFO; the token is the
//! store revision of the granting command.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fenced_client::{Client, ClientError, ClientOptions};

use crate::{random_id, DistLock, Grant, LockError};

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
        let sent = Instant::now();
        let g = self
            .client
            .acquire(key, &self.owner, ttl, wait, 0)
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
