//! etcd's v3 API from Rust: the keyspace (`KV`), watches that resume by revision, and leases
//! with a keep-alive task — the same port, endpoints, TLS and credentials as the rest of the
//! client ([`Client::etcd`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::ClientError> {
//! use fenced_client::Client;
//! let etcd = Client::connect(["127.0.0.1:7380", "127.0.0.2:7380"])?.etcd();
//! let rev = etcd.put("config/a", "1", None).await?;
//! let mut watch = etcd.watch_prefix("config/", rev);
//! let ev = watch.next().await?; // the put above, then every later change, once, in order
//! println!("{:?} {} at {}", ev.kind, String::from_utf8_lossy(&ev.kv.key), ev.revision());
//! # Ok(()) }
//! ```
//!
//! * **Credentials** are the client's ([`crate::ClientOptions::credentials`]): the same
//!   `authorization: Bearer` token fenced's own calls send, which a node accepts on etcd's
//!   services too (etcd clients' `token` metadata is not needed).
//! * **Retries**: a call goes to the next endpoint when one is unreachable, like every call
//!   of [`Client`]. etcd's requests carry no request id, so a `put`, `delete` or `grant`
//!   retried after an unknown outcome may apply twice — as with etcd's own clients.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::mvccpb;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::{Code, Streaming};

use epb::kv_client::KvClient;
use epb::lease_client::LeaseClient;
use epb::watch_client::WatchClient;

use crate::{is_retryable, Client, ClientError};

/// How long a watch or keep-alive stream waits for its first answer from a node.
const STREAM_OPEN: Duration = Duration::from_secs(5);
/// Pause between attempts on the next endpoint.
const BACKOFF: Duration = Duration::from_millis(100);

/// One key's value, as etcd's `mvccpb.KeyValue`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Revision of the put that created the key (since its last delete).
    pub create_revision: i64,
    /// Revision of its last change (of the delete, in a delete event). A fencing token.
    pub mod_revision: i64,
    /// Puts since it was created (1 after the first).
    pub version: i64,
    /// Lease the key is attached to; 0 for none.
    pub lease: i64,
}

impl From<mvccpb::KeyValue> for KeyValue {
    fn from(kv: mvccpb::KeyValue) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

/// What a [`WatchEvent`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change seen by a [`Watch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub kind: EventKind,
    /// The key after a put; after a delete, the key with an empty value and the delete's
    /// revision as `mod_revision`.
    pub kv: KeyValue,
}

impl WatchEvent {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }
}

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

/// `range_end` of every key starting with `prefix` (etcd's `GetPrefixRangeEnd`).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Empty, or all 0xff: every key from `prefix` on.
    vec![0]
}

/// etcd's API through a [`Client`]'s endpoints and options ([`Client::etcd`]). Cheap to
/// clone.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
}

impl Client {
    /// etcd's v3 API (keys, watches, leases) over this client's endpoints, TLS and
    /// credentials.
    ///
    /// ```no_run
    /// # async fn demo(client: fenced_client::Client) -> Result<(), fenced_client::ClientError> {
    /// let etcd = client.etcd();
    /// etcd.put("config/a", "1", None).await?;
    /// assert_eq!(etcd.get("config/a").await?.map(|kv| kv.value), Some(b"1".to_vec()));
    /// # Ok(()) }
    /// ```
    pub fn etcd(&self) -> Etcd {
        Etcd {
            client: self.clone(),
        }
    }
}

impl Etcd {
    /// Set `key` to `value`, attached to `lease` if given (the key is deleted when the lease
    /// ends). Returns the put's revision.
    ///
    /// ```no_run
    /// # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ClientError> {
    /// let lease = etcd.grant(10).await?;
    /// let rev = etcd.put("workers/w1", "up", Some(lease.id)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        lease: Option<i64>,
    ) -> Result<i64, ClientError> {
        let req = epb::PutRequest {
            key: key.as_ref().to_vec(),
            value: value.as_ref().to_vec(),
            lease: lease.unwrap_or(0),
            ..Default::default()
        };
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                let req = req.clone();
                async move { c.put(req).await }
            })
            .await?;
        Ok(r.header.map_or(0, |h| h.revision))
    }

    async fn range_req(&self, req: epb::RangeRequest) -> Result<Vec<KeyValue>, ClientError> {
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                let req = req.clone();
                async move { c.range(req).await }
            })
            .await?;
        Ok(r.kvs.into_iter().map(KeyValue::from).collect())
    }

    /// Linearizable read of `key`. `None` if it does not exist.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<KeyValue>, ClientError> {
        let kvs = self
            .range_req(epb::RangeRequest {
                key: key.as_ref().to_vec(),
                ..Default::default()
            })
            .await?;
        Ok(kvs.into_iter().next())
    }

    /// Linearizable read of every key starting with `prefix`, in key order.
    ///
    /// ```no_run
    /// # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ClientError> {
    /// for kv in etcd.range("config/").await? {
    ///     println!("{} (rev {})", String::from_utf8_lossy(&kv.key), kv.mod_revision);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn range(&self, prefix: impl AsRef<[u8]>) -> Result<Vec<KeyValue>, ClientError> {
        let key = prefix.as_ref().to_vec();
        let range_end = prefix_end(&key);
        self.range_req(epb::RangeRequest {
            key,
            range_end,
            ..Default::default()
        })
        .await
    }

    /// Delete `key`: how many keys were deleted (0 or 1).
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<i64, ClientError> {
        let req = epb::DeleteRangeRequest {
            key: key.as_ref().to_vec(),
            ..Default::default()
        };
        let r = self
            .client
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                let req = req.clone();
                async move { c.delete_range(req).await }
            })
            .await?;
        Ok(r.deleted)
    }

    /// Forget the history below `revision` (etcd's `Compact`). Watches whose position it
    /// passes end with [`ClientError::Compacted`].
    pub async fn compact(&self, revision: i64) -> Result<(), ClientError> {
        let req = epb::CompactionRequest {
            revision,
            physical: false,
        };
        self.client
            .call(Duration::ZERO, |ch| {
                let mut c = KvClient::new(ch);
                async move { c.compact(req).await }
            })
            .await?;
        Ok(())
    }

    /// Watch `key` from `start_revision` (0: from now). See [`Watch`].
    pub fn watch(&self, key: impl AsRef<[u8]>, start_revision: i64) -> Watch {
        Watch::new(
            self.client.clone(),
            key.as_ref().to_vec(),
            Vec::new(),
            start_revision,
        )
    }

    /// Watch every key starting with `prefix` from `start_revision` (0: from now). See
    /// [`Watch`].
    pub fn watch_prefix(&self, prefix: impl AsRef<[u8]>, start_revision: i64) -> Watch {
        let key = prefix.as_ref().to_vec();
        let end = prefix_end(&key);
        Watch::new(self.client.clone(), key, end, start_revision)
    }

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

/// A watch on a key or prefix that **resumes by revision**: it remembers the revision of
/// the last change it received, and when its stream breaks (the node killed or restarted,
/// cut off from the majority, a transport error) it opens a new one on the next endpoint
/// from that revision + 1. The caller sees every change once, in revision order, whatever
/// nodes fail meanwhile.
///
/// * A stream is opened lazily, by the first [`Watch::next`], with etcd's
///   require-leader metadata (a member that has lost the majority ends it, and the watch
///   moves on).
/// * If the keyspace was compacted past the watch's position, [`Watch::next`] returns
///   [`ClientError::Compacted`] (then again on every later call): the changes in between
///   are gone, and nothing is skipped silently.
/// * If no endpoint serves the watch for [`crate::ClientOptions::retry_for`],
///   [`Watch::next`] returns [`ClientError::Unavailable`]; calling it again tries again from
///   the same position.
/// * Dropping a pending `next()` (a `select!` timeout) loses no event.
///
/// ```no_run
/// # async fn demo(etcd: fenced_client::Etcd) -> Result<(), fenced_client::ClientError> {
/// use fenced_client::ClientError;
/// let mut watch = etcd.watch_prefix("jobs/", 1);
/// loop {
///     match watch.next().await {
///         Ok(ev) => println!("{:?} at {}", ev.kind, ev.revision()),
///         Err(ClientError::Compacted { compact_revision }) => {
///             // Re-read the state (etcd.range) and watch again from compact_revision.
///             break;
///         }
///         Err(e) => return Err(e),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Watch {
    client: Client,
    key: Vec<u8>,
    range_end: Vec<u8>,
    /// The revision to (re)start from: one above the last change received; 0 = "now"
    /// until the first stream is created.
    next_rev: i64,
    /// Changes received, not yet handed out.
    buffer: VecDeque<WatchEvent>,
    stream: Option<WatchStream>,
    /// The endpoint to open the next stream on.
    endpoint: usize,
    compacted: Option<i64>,
}

struct WatchStream {
    /// Kept open: closing it would end the stream.
    _requests: mpsc::Sender<epb::WatchRequest>,
    responses: Streaming<epb::WatchResponse>,
}

/// Why a step of [`Watch::next`] did not go on.
enum Fail {
    /// The stream broke or could not be opened: try the next endpoint.
    Retry(String),
    /// Returned to the caller.
    Final(ClientError),
}

impl Watch {
    fn new(client: Client, key: Vec<u8>, range_end: Vec<u8>, start_revision: i64) -> Watch {
        let endpoint = client.inner.preferred.load(Ordering::Relaxed);
        Watch {
            client,
            key,
            range_end,
            next_rev: start_revision.max(0),
            buffer: VecDeque::new(),
            stream: None,
            endpoint,
            compacted: None,
        }
    }

    /// The revision the watch would resume from: one above the last change received (the
    /// start revision before any).
    pub fn next_revision(&self) -> i64 {
        self.next_rev
    }

    /// The next change, waiting for one. See [`Watch`] for the errors.
    pub async fn next(&mut self) -> Result<WatchEvent, ClientError> {
        let n = self.client.inner.endpoints.len();
        let mut failing_since: Option<Instant> = None;
        loop {
            if let Some(ev) = self.buffer.pop_front() {
                return Ok(ev);
            }
            if let Some(compact_revision) = self.compacted {
                return Err(ClientError::Compacted { compact_revision });
            }
            let step = match self.stream.as_mut() {
                None => self.open().await,
                Some(s) => match s.responses.message().await {
                    Ok(Some(resp)) => self.take(resp),
                    Ok(None) => Err(Fail::Retry("the watch stream ended".into())),
                    Err(s) => Err(self.failed(s).await),
                },
            };
            match step {
                Ok(()) => failing_since = None,
                Err(Fail::Final(e)) => {
                    self.stream = None;
                    return Err(e);
                }
                Err(Fail::Retry(why)) => {
                    tracing::debug!(
                        endpoint = %self.client.inner.endpoints[self.endpoint % n],
                        next_revision = self.next_rev,
                        "watch stream broken, resuming elsewhere: {why}"
                    );
                    self.stream = None;
                    self.endpoint = (self.endpoint + 1) % n;
                    self.client.inner.retries.fetch_add(1, Ordering::Relaxed);
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= self.client.inner.options.retry_for {
                        return Err(ClientError::Unavailable(format!(
                            "no endpoint serves the watch: {why}"
                        )));
                    }
                    tokio::time::sleep(BACKOFF).await;
                }
            }
        }
    }

    /// A failed stream: retried elsewhere unless the node refused the watch for good.
    async fn failed(&self, s: tonic::Status) -> Fail {
        let i = self.endpoint % self.client.inner.endpoints.len();
        if s.code() == Code::Unauthenticated
            && self.client.inner.options.credentials.is_some()
            && self.client.inner.tokens[i].lock().await.is_some()
        {
            // The node forgot our token (restart): log in again there next time. (Without a
            // token this was the login itself, refused: a wrong password is final.)
            self.client.forget_token(i).await;
            return Fail::Retry(s.message().to_owned());
        }
        if is_retryable(&s) {
            Fail::Retry(format!("{}: {}", s.code(), s.message()))
        } else {
            Fail::Final(ClientError::Rejected(s))
        }
    }

    /// Open a stream on the current endpoint and create the watch at `next_rev`.
    async fn open(&mut self) -> Result<(), Fail> {
        let i = self.endpoint % self.client.inner.endpoints.len();
        let ch = match self.client.authed(i).await {
            Ok(ch) => ch,
            Err(s) => return Err(self.failed(s).await),
        };
        let (tx, rx) = mpsc::channel(4);
        let create = epb::WatchRequest {
            request_union: Some(epb::watch_request::RequestUnion::CreateRequest(
                epb::WatchCreateRequest {
                    key: self.key.clone(),
                    range_end: self.range_end.clone(),
                    start_revision: self.next_rev,
                    ..Default::default()
                },
            )),
        };
        // Cannot fail: the receiver is alive and the channel empty.
        let _ = tx.send(create).await;
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut()
            .insert("hasleader", AsciiMetadataValue::from_static("true"));
        let opened = tokio::time::timeout(STREAM_OPEN, WatchClient::new(ch).watch(req)).await;
        let mut responses = match opened {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => return Err(self.failed(s).await),
            Err(_) => return Err(Fail::Retry("no answer to the watch".into())),
        };
        let created = match tokio::time::timeout(STREAM_OPEN, responses.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Err(Fail::Retry("the watch stream ended".into())),
            Ok(Err(s)) => return Err(self.failed(s).await),
            Err(_) => return Err(Fail::Retry("the watch was not created in time".into())),
        };
        if !created.created {
            return Err(Fail::Retry(
                "the node's first answer did not create the watch".into(),
            ));
        }
        self.take(created)?;
        self.stream = Some(WatchStream {
            _requests: tx,
            responses,
        });
        Ok(())
    }

    /// Take one response's changes into the buffer and move the position past them. A
    /// response holds whole revisions (the server never splits one), so the position is
    /// always between revisions.
    fn take(&mut self, resp: epb::WatchResponse) -> Result<(), Fail> {
        if resp.canceled {
            if resp.compact_revision > 0 {
                self.compacted = Some(resp.compact_revision);
                return Err(Fail::Final(ClientError::Compacted {
                    compact_revision: resp.compact_revision,
                }));
            }
            return Err(Fail::Final(ClientError::WatchCanceled(resp.cancel_reason)));
        }
        if resp.created && self.next_rev <= 0 {
            // Watching from "now": the node's revision when it created the watch.
            let now = resp.header.as_ref().map_or(0, |h| h.revision);
            self.next_rev = now + 1;
        }
        let mut last = None;
        for ev in resp.events {
            let Some(kv) = ev.kv else {
                return Err(Fail::Retry("an event without its key".into()));
            };
            let kind = if ev.r#type == mvccpb::event::EventType::Delete as i32 {
                EventKind::Delete
            } else {
                EventKind::Put
            };
            last = Some(kv.mod_revision);
            self.buffer.push_back(WatchEvent {
                kind,
                kv: kv.into(),
            });
        }
        if let Some(last) = last {
            self.next_rev = last + 1;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_etcds() {
        assert_eq!(prefix_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    fn put_event(key: &str, rev: i64) -> mvccpb::Event {
        mvccpb::Event {
            r#type: mvccpb::event::EventType::Put as i32,
            kv: Some(mvccpb::KeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: rev,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn watch() -> Watch {
        let client = Client::connect(["127.0.0.1:1"]).unwrap_or_else(|e| panic!("{e}"));
        client.etcd().watch_prefix("p/", 5)
    }

    #[tokio::test]
    async fn the_position_moves_past_each_response_and_compaction_sticks() {
        let mut w = watch();
        assert_eq!(w.next_revision(), 5);
        let resp = epb::WatchResponse {
            events: vec![put_event("p/a", 7), put_event("p/b", 9)],
            ..Default::default()
        };
        assert!(w.take(resp).is_ok());
        assert_eq!(
            w.next_revision(),
            10,
            "resume one above the last revision received"
        );
        assert_eq!(w.buffer.len(), 2);
        let cancel = epb::WatchResponse {
            canceled: true,
            compact_revision: 20,
            ..Default::default()
        };
        assert!(matches!(
            w.take(cancel),
            Err(Fail::Final(ClientError::Compacted {
                compact_revision: 20
            }))
        ));
        // Buffered events first, then the compaction, for good.
        assert!(w.next().await.is_ok());
        assert!(w.next().await.is_ok());
        for _ in 0..2 {
            assert!(matches!(
                w.next().await,
                Err(ClientError::Compacted {
                    compact_revision: 20
                })
            ));
        }
    }
}
