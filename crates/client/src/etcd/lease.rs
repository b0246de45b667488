//! Leases: grant, revoke, time-to-live, and [`KeepAlive`], the task that keeps one alive and
//! reports its loss.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

use epb::lease_client::LeaseClient;

use super::{Etcd, BACKOFF, STREAM_OPEN};
use crate::{Client, ClientError};

/// A lease granted by [`Etcd::grant`]: its id and TTL in seconds (etcd's rules: at least 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    pub ttl: i64,
}

/// [`Etcd::time_to_live`]'s answer about a live lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTimeToLive {
    pub id: i64,
    /// Whole seconds left (counted in the cluster's log time).
    pub ttl: i64,
    /// The TTL it was granted, in seconds.
    pub granted_ttl: i64,
    /// Keys attached to it (when asked for).
    pub keys: Vec<Vec<u8>>,
}

/// Why a [`KeepAlive`] reports its lease lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseLoss {
    /// The cluster answered that the lease does not exist (its TTL ran out, or it was
    /// revoked): its keys are deleted. The keep-alive task has stopped.
    #[error("lease expired or revoked")]
    Expired,
    /// No keep-alive was answered for a whole TTL (counted from when the last answered one
    /// was sent): the lease must be presumed gone. The task keeps trying, and reports
    /// [`LeaseLoss::Expired`] if the cluster later says so.
    #[error("no keep-alive answered for a whole TTL")]
    Unconfirmed,
}

impl Etcd {
    /// Grant a lease of `ttl` seconds (etcd's rules: below 2 s raised to 2 s). The cluster
    /// picks its id. Keep it alive with [`Etcd::keep_alive`].
    pub async fn grant(&self, ttl: i64) -> Result<Lease, ClientError> {
        let req = epb::LeaseGrantRequest { ttl, id: 0 };
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = LeaseClient::new(ch);
                async move { c.lease_grant(req).await }
            })
            .await?;
        if !r.error.is_empty() {
            return Err(ClientError::Rejected(tonic::Status::failed_precondition(
                r.error,
            )));
        }
        Ok(Lease {
            id: r.id,
            ttl: r.ttl,
        })
    }

    /// End lease `id` now: its keys are deleted. A lease that does not exist is
    /// [`ClientError::Rejected`] ("etcdserver: requested lease not found").
    pub async fn revoke(&self, id: i64) -> Result<(), ClientError> {
        self.client
            .call(Duration::ZERO, |ch| {
                let mut c = LeaseClient::new(ch);
                async move { c.lease_revoke(epb::LeaseRevokeRequest { id }).await }
            })
            .await?;
        Ok(())
    }

    /// Time left of lease `id`, and its keys if `keys`. `None`: it does not exist (expired,
    /// revoked, never granted).
    pub async fn time_to_live(
        &self,
        id: i64,
        keys: bool,
    ) -> Result<Option<LeaseTimeToLive>, ClientError> {
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = LeaseClient::new(ch);
                async move {
                    c.lease_time_to_live(epb::LeaseTimeToLiveRequest { id, keys })
                        .await
                }
            })
            .await?;
        Ok((r.ttl >= 0).then_some(LeaseTimeToLive {
            id: r.id,
            ttl: r.ttl,
            granted_ttl: r.granted_ttl,
            keys: r.keys,
        }))
    }

    /// Ids of the live leases (fenced's sessions included: a session is a lease).
    pub async fn leases(&self) -> Result<Vec<i64>, ClientError> {
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = LeaseClient::new(ch);
                async move { c.lease_leases(epb::LeaseLeasesRequest {}).await }
            })
            .await?;
        Ok(r.leases.into_iter().map(|l| l.id).collect())
    }

    /// Keep `lease` alive in the background until the returned handle is dropped: a task
    /// sends a keep-alive every `ttl/3` on a `LeaseKeepAlive` stream, moving to another
    /// endpoint when one fails, and reports the lease's loss through
    /// [`KeepAlive::lost`].
    ///
    /// ```no_run
    /// # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ClientError> {
    /// let lease = etcd.grant(10).await?;
    /// etcd.put("workers/w1", "up", Some(lease.id)).await?;
    /// let keep = etcd.keep_alive(lease);
    /// tokio::select! {
    ///     loss = keep.lost() => eprintln!("lease lost: {loss}"),
    ///     _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
    /// }
    /// drop(keep); // no more keep-alives: the lease lapses after its TTL, and its keys go
    /// # Ok(()) }
    /// ```
    pub fn keep_alive(&self, lease: Lease) -> KeepAlive {
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(keep_alive_task(self.client.clone(), lease, tx));
        KeepAlive {
            id: lease.id,
            lost: rx,
            task,
        }
    }
}

/// The keep-alive task of a lease ([`Etcd::keep_alive`]). Dropping it stops the task; the
/// lease then lapses after its TTL unless kept alive otherwise.
pub struct KeepAlive {
    id: i64,
    lost: watch::Receiver<Option<LeaseLoss>>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// The lease kept alive.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The loss reported so far, if any.
    pub fn loss(&self) -> Option<LeaseLoss> {
        *self.lost.borrow()
    }

    /// Wait until the lease is reported lost ([`LeaseLoss`]).
    pub async fn lost(&self) -> LeaseLoss {
        let mut rx = self.lost.clone();
        let seen = match rx.wait_for(Option::is_some).await {
            Ok(v) => *v,
            // The task ended without a report: it can no longer keep the lease alive.
            Err(_) => None,
        };
        seen.unwrap_or(LeaseLoss::Unconfirmed)
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `LeaseKeepAlive` stream to a node.
struct KeepAliveStream {
    requests: mpsc::Sender<epb::LeaseKeepAliveRequest>,
    responses: Streaming<epb::LeaseKeepAliveResponse>,
}

async fn keep_alive_task(client: Client, lease: Lease, lost: watch::Sender<Option<LeaseLoss>>) {
    let ttl = Duration::from_secs(u64::try_from(lease.ttl).unwrap_or(0).max(1));
    let period = (ttl / 3).max(Duration::from_millis(500));
    // One attempt waits at most this long for its answer before trying elsewhere.
    let attempt = period.min(STREAM_OPEN);
    let n = client.inner.endpoints.len();
    let mut i = client.inner.preferred.load(Ordering::Relaxed) % n;
    let mut stream: Option<KeepAliveStream> = None;
    let mut last_ok = Instant::now();
    loop {
        let sent = Instant::now();
        let answer =
            tokio::time::timeout(attempt, keep_alive_once(&client, &mut stream, i, lease.id))
                .await
                .unwrap_or_else(|_| Err("no answer in time".into()));
        match answer {
            Ok(ttl) if ttl > 0 => {
                last_ok = sent;
                tokio::time::sleep_until((sent + period).into()).await;
            }
            Ok(_) => {
                tracing::warn!(lease = lease.id, "lease expired or revoked");
                lost.send_replace(Some(LeaseLoss::Expired));
                return;
            }
            Err(why) => {
                tracing::warn!(lease = lease.id, endpoint = %client.inner.endpoints[i], "keep-alive failed: {why}");
                stream = None;
                i = (i + 1) % n;
                if last_ok.elapsed() >= ttl {
                    lost.send_if_modified(|v| {
                        let first = v.is_none();
                        if first {
                            *v = Some(LeaseLoss::Unconfirmed);
                        }
                        first
                    });
                }
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
}

/// Send one keep-alive of lease `id` on `stream` (opened on endpoint `i` if needed): the
/// TTL the cluster answered (0 or less: the lease is gone).
async fn keep_alive_once(
    client: &Client,
    stream: &mut Option<KeepAliveStream>,
    i: usize,
    id: i64,
) -> Result<i64, String> {
    let unauthenticated = |s: &tonic::Status| {
        s.code() == Code::Unauthenticated && client.inner.options.credentials.is_some()
    };
    if stream.is_none() {
        let ch = match client.authed(i).await {
            Ok(ch) => ch,
            Err(s) => {
                if unauthenticated(&s) {
                    client.forget_token(i).await;
                }
                return Err(format!("{}: {}", s.code(), s.message()));
            }
        };
        let (tx, rx) = mpsc::channel(4);
        match LeaseClient::new(ch)
            .lease_keep_alive(ReceiverStream::new(rx))
            .await
        {
            Ok(r) => {
                *stream = Some(KeepAliveStream {
                    requests: tx,
                    responses: r.into_inner(),
                })
            }
            Err(s) => {
                if unauthenticated(&s) {
                    client.forget_token(i).await;
                }
                return Err(format!("{}: {}", s.code(), s.message()));
            }
        }
    }
    let Some(s) = stream.as_mut() else {
        return Err("no stream".into());
    };
    s.requests
        .send(epb::LeaseKeepAliveRequest { id })
        .await
        .map_err(|_| "the keep-alive stream closed".to_owned())?;
    match s.responses.message().await {
        Ok(Some(r)) if r.id == id => Ok(r.ttl),
        Ok(Some(r)) => Err(format!("an answer about lease {} instead of {id}", r.id)),
        Ok(None) => Err("the keep-alive stream ended".into()),
        Err(s) => {
            if unauthenticated(&s) {
                client.forget_token(i).await;
            }
            Err(format!("{}: {}", s.code(), s.message()))
        }
    }
}
