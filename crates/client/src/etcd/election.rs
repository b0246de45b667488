//! etcd's server-side election (`v3electionpb.Election`) and lock (`v3lockpb.Lock`): an
//! [`Election`] campaigns with a lease kept alive by a [`KeepAlive`], a [`Leadership`] is
//! one term (its fencing token, proclaim, resign), and [`Observe`] follows the leader of an
//! election across node failures.
//!
//! ```no_run
//! # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ElectionError> {
//! let lease = etcd.grant(5).await?;
//! let election = etcd.election(etcd.keep_alive(lease));
//! let term = election.campaign("scheduler", "node-a").await?; // waits until it leads
//! println!("leading with fencing token {}", term.token());
//! tokio::select! {
//!     loss = term.lost() => eprintln!("lease lost ({loss}): no longer leader, stop work"),
//!     _ = tokio::time::sleep(std::time::Duration::from_secs(30)) => term.resign().await?,
//! }
//! # Ok(()) }
//! ```
//!
//! The server's rules (fenced's `api/etcd/election.rs`): `Campaign` waits FIFO on the
//! server, and the leader key `name/<lease hex>` has `create_revision` = the term's fencing
//! token; a lease's end ends its term. Present the token to the storage you write to
//! ([`crate::Client::fenced_put`], RESP `FENCE.SET`): it refuses a deposed leader's writes
//! once a newer term wrote.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fenced_proto::etcd::v3electionpb as elpb;
use fenced_proto::etcd::v3lockpb as lpb;
use tonic::metadata::AsciiMetadataValue;
use tonic::Streaming;

use elpb::election_client::ElectionClient;
use lpb::lock_client::LockClient;

use super::{
    next_endpoint, stream_failed, Etcd, Fail, KeepAlive, KeyValue, LeaseLoss, STREAM_OPEN,
};
use crate::{Client, ClientError};

/// Deadline of one attempt of a call that answers at once (not `Campaign`/`Lock`).
const ATTEMPT: Duration = Duration::from_secs(5);
/// How long `Campaign` and `Lock` go on retrying across endpoints: they wait as long as their
/// lease lives, which the caller bounds (a campaign ends when its lease is lost).
const WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// What an election call can answer besides a client error.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// The lease no longer leads with this term's key (etcd's `ErrElectionNotLeader`): a
    /// proclaim of a deposed leader.
    #[error("election: not leader")]
    NotLeader,
    /// The campaign's lease was reported lost ([`KeepAlive::lost`]) before it led.
    #[error("lease lost: {0}")]
    LeaseLost(LeaseLoss),
    /// The node answered without the part the call needs.
    #[error("malformed answer: {0}")]
    Malformed(&'static str),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// etcd's `LeaderKey`: one term of one election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderKey {
    /// The election's name.
    pub name: Vec<u8>,
    /// The leader key, `name/<lease hex>`.
    pub key: Vec<u8>,
    /// The key's `create_revision`: the term's fencing token.
    pub rev: i64,
    /// The lease the term lives with.
    pub lease: i64,
}

impl From<elpb::LeaderKey> for LeaderKey {
    fn from(k: elpb::LeaderKey) -> Self {
        LeaderKey {
            name: k.name,
            key: k.key,
            rev: k.rev,
            lease: k.lease,
        }
    }
}

impl From<&LeaderKey> for elpb::LeaderKey {
    fn from(k: &LeaderKey) -> Self {
        elpb::LeaderKey {
            name: k.name.clone(),
            key: k.key.clone(),
            rev: k.rev,
            lease: k.lease,
        }
    }
}

/// A revision as a fencing token (revisions are positive).
fn token_of(rev: i64) -> u64 {
    u64::try_from(rev).unwrap_or(0)
}

/// A call's error, with etcd's election answers typed.
fn election_error(e: ClientError) -> ElectionError {
    match &e {
        ClientError::Rejected(s) if s.message() == "election: not leader" => {
            ElectionError::NotLeader
        }
        _ => ElectionError::Client(e),
    }
}

impl Etcd {
    /// Campaign in elections with the lease `keep` keeps alive ([`Etcd::keep_alive`]). The
    /// [`Election`] owns the keep-alive: dropping it and its terms stops the keep-alives.
    pub fn election(&self, keep: KeepAlive) -> Election {
        Election {
            etcd: self.clone(),
            keep: Arc::new(keep),
        }
    }

    /// The current leader of election `name` (its key and value; the key's
    /// `create_revision` is the term's token), or `None`. A linearizable read.
    pub async fn leader(&self, name: impl AsRef<[u8]>) -> Result<Option<KeyValue>, ClientError> {
        let req = elpb::LeaderRequest {
            name: name.as_ref().to_vec(),
        };
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = ElectionClient::new(ch);
                let mut req = tonic::Request::new(req.clone());
                req.set_timeout(ATTEMPT);
                async move { c.leader(req).await }
            })
            .await;
        match r {
            Ok(r) => Ok(r.kv.map(KeyValue::from)),
            Err(ClientError::Rejected(s)) if s.message() == "election: no leader" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Follow the leader of election `name`. See [`Observe`].
    pub fn observe(&self, name: impl AsRef<[u8]>) -> Observe {
        let endpoint = self.client.inner.preferred.load(Ordering::Relaxed);
        Observe {
            client: self.client.clone(),
            name: name.as_ref().to_vec(),
            stream: None,
            endpoint,
            last: None,
        }
    }

    /// etcd's server-side `Lock`: take lock `name` for `lease`, waiting FIFO on the server as
    /// long as it takes. Returns the lock's key (`name/<lease hex>`, for [`Etcd::unlock`])
    /// and its fencing token (the key's `create_revision`). Keep the lease alive meanwhile:
    /// its end ends the lock (and the wait). Bound the wait with a timeout if needed;
    /// dropping the call withdraws the wait on the server.
    pub async fn lock(
        &self,
        name: impl AsRef<[u8]>,
        lease: i64,
    ) -> Result<(Vec<u8>, u64), ClientError> {
        let req = lpb::LockRequest {
            name: name.as_ref().to_vec(),
            lease,
        };
        let r = self
            .client
            .call(WAIT, |ch| {
                let mut c = LockClient::new(ch);
                let req = req.clone();
                async move { c.lock(req).await }
            })
            .await?;
        Ok((r.key, token_of(r.header.map_or(0, |h| h.revision))))
    }

    /// etcd's `Unlock`: end the lock whose key [`Etcd::lock`] returned (the next waiter gets
    /// it). Unlocking what is not held succeeds.
    pub async fn unlock(&self, key: impl AsRef<[u8]>) -> Result<(), ClientError> {
        let req = lpb::UnlockRequest {
            key: key.as_ref().to_vec(),
        };
        self.client
            .call(Duration::ZERO, |ch| {
                let mut c = LockClient::new(ch);
                let mut req = tonic::Request::new(req.clone());
                req.set_timeout(ATTEMPT);
                async move { c.unlock(req).await }
            })
            .await?;
        Ok(())
    }
}

/// Campaigns with one lease ([`Etcd::election`]). A lease leads at most once per election
/// name at a time; campaign with another lease to be a second candidate.
pub struct Election {
    etcd: Etcd,
    keep: Arc<KeepAlive>,
}

impl Election {
    /// The lease campaigned with.
    pub fn lease(&self) -> i64 {
        self.keep.id()
    }

    /// The lease's keep-alive.
    pub fn keep_alive(&self) -> &KeepAlive {
        &self.keep
    }

    /// Campaign in election `name` with `value`: waits (FIFO on the server) until this lease
    /// leads, then returns the term. [`ElectionError::LeaseLost`] if the keep-alive reports
    /// the lease lost first (the wait is withdrawn). Campaigning again while leading returns
    /// the same term. A node failing meanwhile: the campaign goes on through another
    /// endpoint, keeping its place in the queue.
    pub async fn campaign(
        &self,
        name: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<Leadership, ElectionError> {
        let lease = self.lease();
        let req = elpb::CampaignRequest {
            name: name.as_ref().to_vec(),
            lease,
            value: value.as_ref().to_vec(),
        };
        let call = self.etcd.client.call(WAIT, |ch| {
            let mut c = ElectionClient::new(ch);
            let req = req.clone();
            async move { c.campaign(req).await }
        });
        let r = tokio::select! {
            r = call => r.map_err(election_error)?,
            loss = self.keep.lost() => return Err(ElectionError::LeaseLost(loss)),
        };
        let key = r.leader.ok_or(ElectionError::Malformed("no leader key"))?;
        Ok(Leadership {
            etcd: self.etcd.clone(),
            keep: self.keep.clone(),
            key: key.into(),
        })
    }
}

/// One term of an election, won by [`Election::campaign`]. It ends with [`Leadership::resign`]
/// or with its lease ([`Leadership::lost`]); dropping it changes nothing on the server.
pub struct Leadership {
    etcd: Etcd,
    keep: Arc<KeepAlive>,
    key: LeaderKey,
}

impl Leadership {
    /// The term's fencing token: its leader key's `create_revision` (`LeaderKey.rev`).
    /// Later terms of the election have higher tokens.
    pub fn token(&self) -> u64 {
        token_of(self.key.rev)
    }

    /// The leader key (for etcd clients: name, key, rev, lease).
    pub fn key(&self) -> &LeaderKey {
        &self.key
    }

    /// Wait until the term's lease is reported lost: the term is over (or must be presumed
    /// over, [`LeaseLoss::Unconfirmed`]), and another candidate may lead.
    pub async fn lost(&self) -> LeaseLoss {
        self.keep.lost().await
    }

    /// The loss reported so far, if any.
    pub fn loss(&self) -> Option<LeaseLoss> {
        self.keep.loss()
    }

    /// Set the leader's value, only while this term leads: [`ElectionError::NotLeader`]
    /// otherwise. Returns the revision of the write.
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<i64, ElectionError> {
        let req = elpb::ProclaimRequest {
            leader: Some((&self.key).into()),
            value: value.as_ref().to_vec(),
        };
        let r = self
            .etcd
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = ElectionClient::new(ch);
                let mut req = tonic::Request::new(req.clone());
                req.set_timeout(ATTEMPT);
                async move { c.proclaim(req).await }
            })
            .await
            .map_err(election_error)?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    /// End this term: the next candidate leads (at once, if one waits). A term already
    /// over resigns successfully; a later term of the same lease is untouched.
    pub async fn resign(self) -> Result<(), ElectionError> {
        let req = elpb::ResignRequest {
            leader: Some((&self.key).into()),
        };
        self.etcd
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = ElectionClient::new(ch);
                let mut req = tonic::Request::new(req.clone());
                req.set_timeout(ATTEMPT);
                async move { c.resign(req).await }
            })
            .await
            .map_err(election_error)?;
        Ok(())
    }
}

/// The leader changes of an election ([`Etcd::observe`]): the leader when the stream opens,
/// then each new term or proclaimed value, in revision order. It **resumes across node
/// failures**: when its stream breaks it re-issues `Observe` on the next endpoint, which
/// answers the current leader first; changes are deduplicated by term and value — a later term
/// has a higher `create_revision` (terms follow their keys' create order), a proclaim of the
/// same term a higher `mod_revision` — so none is reported twice and none goes back. (A new
/// term's key may be older than the last proclaim: it was put when its campaign began.) Changes *between* the failure and
/// the new stream are not replayed: the leader at reconnection is reported as the current
/// one (a term that began and ended meanwhile is not seen; watch the election's prefix,
/// [`Etcd::watch_prefix`], to see every one).
///
/// Streams are opened with etcd's require-leader metadata: a member cut off from the
/// majority ends the stream, and the observe moves on. A node that stops answering at all
/// (paused) stalls the stream until it answers or the connection breaks: there is no idle
/// deadline, as a quiet election sends nothing.
///
/// ```no_run
/// # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ClientError> {
/// let mut leaders = etcd.observe("scheduler");
/// loop {
///     let kv = leaders.next().await?;
///     println!("leader {} (token {})", String::from_utf8_lossy(&kv.value), kv.create_revision);
/// }
/// # }
/// ```
pub struct Observe {
    client: Client,
    name: Vec<u8>,
    stream: Option<Streaming<elpb::LeaderResponse>>,
    /// The endpoint to open the next stream on.
    endpoint: usize,
    /// The last change handed out: (key, create_revision, mod_revision).
    last: Option<(Vec<u8>, i64, i64)>,
}

impl Observe {
    /// The next leader change, waiting for one. [`ClientError::Unavailable`] if no endpoint
    /// serves the stream for [`crate::ClientOptions::retry_for`] (calling again tries
    /// again); [`ClientError::Rejected`] if a node refuses it (a permission).
    pub async fn next(&mut self) -> Result<KeyValue, ClientError> {
        let n = self.client.inner.endpoints.len();
        let mut failing_since: Option<Instant> = None;
        loop {
            let step = match self.stream.as_mut() {
                None => self.open().await.map(|()| None),
                Some(s) => match s.message().await {
                    Ok(Some(resp)) => Ok(resp.kv.map(KeyValue::from)),
                    Ok(None) => Err(Fail::Retry("the observe stream ended".into())),
                    Err(s) => Err(stream_failed(&self.client, self.endpoint, s).await),
                },
            };
            match step {
                Ok(Some(kv)) => {
                    failing_since = None;
                    if self.is_new(&kv) {
                        self.last = Some((kv.key.clone(), kv.create_revision, kv.mod_revision));
                        return Ok(kv);
                    }
                }
                Ok(None) => failing_since = None,
                Err(Fail::Final(e)) => {
                    self.stream = None;
                    return Err(e);
                }
                Err(Fail::Retry(why)) => {
                    tracing::debug!(
                        endpoint = %self.client.inner.endpoints[self.endpoint % n],
                        "observe stream broken, resuming elsewhere: {why}"
                    );
                    self.stream = None;
                    next_endpoint(&self.client, &mut self.endpoint, &mut failing_since)
                        .await
                        .map_err(|()| {
                            ClientError::Unavailable(format!(
                                "no endpoint serves the observe: {why}"
                            ))
                        })?;
                }
            }
        }
    }

    /// Not reported yet: a later term than the last one (a higher create revision), or a
    /// later value of the same term (same key and create revision, higher mod revision).
    fn is_new(&self, kv: &KeyValue) -> bool {
        match &self.last {
            None => true,
            Some((key, created, modified)) => {
                kv.create_revision > *created
                    || (kv.create_revision == *created
                        && kv.key == *key
                        && kv.mod_revision > *modified)
            }
        }
    }

    async fn open(&mut self) -> Result<(), Fail> {
        let i = self.endpoint % self.client.inner.endpoints.len();
        let ch = match self.client.authed(i).await {
            Ok(ch) => ch,
            Err(s) => return Err(stream_failed(&self.client, i, s).await),
        };
        let mut req = tonic::Request::new(elpb::LeaderRequest {
            name: self.name.clone(),
        });
        req.metadata_mut()
            .insert("hasleader", AsciiMetadataValue::from_static("true"));
        match tokio::time::timeout(STREAM_OPEN, ElectionClient::new(ch).observe(req)).await {
            Ok(Ok(r)) => {
                self.stream = Some(r.into_inner());
                Ok(())
            }
            Ok(Err(s)) => Err(stream_failed(&self.client, i, s).await),
            Err(_) => Err(Fail::Retry("no answer to the observe".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, create_revision: i64, mod_revision: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision,
            mod_revision,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn observe_reports_each_change_once_and_never_goes_back() {
        let client = Client::connect(["127.0.0.1:1"]).unwrap_or_else(|e| panic!("{e}"));
        let mut o = client.etcd().observe("e");
        assert!(o.is_new(&kv("e/1", 2, 5)));
        o.last = Some((b"e/1".to_vec(), 2, 5));
        // The same change again, from a new stream after a failover: not reported.
        assert!(!o.is_new(&kv("e/1", 2, 5)));
        // An older state (a node behind): not reported.
        assert!(!o.is_new(&kv("e/0", 1, 3)));
        assert!(!o.is_new(&kv("e/1", 2, 4)));
        // A proclaim, a new term: reported.
        assert!(o.is_new(&kv("e/1", 2, 6)));
        assert!(o.is_new(&kv("e/2", 9, 9)));
        // The next term's key was put while e/1 led, before e/1's last proclaim: its mod
        // revision is older than the last change's, and it is still a new term.
        assert!(o.is_new(&kv("e/2", 3, 3)));
    }

    #[test]
    fn election_answers_are_typed_and_not_retried() {
        let not_leader = ClientError::Rejected(tonic::Status::unknown("election: not leader"));
        assert!(matches!(
            election_error(not_leader),
            ElectionError::NotLeader
        ));
        assert!(!crate::is_retryable(&tonic::Status::unknown(
            "election: no leader"
        )));
        assert!(crate::is_retryable(&tonic::Status::unknown(
            "h2 protocol error"
        )));
        assert_eq!(token_of(-1), 0);
        assert_eq!(token_of(42), 42);
    }
}
