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

use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::mvccpb;

use epb::kv_client::KvClient;

use crate::{is_retryable, Client, ClientError};

mod election;
mod lease;
mod watcher;

pub use election::{Election, ElectionError, LeaderKey, Leadership, Observe};

pub use lease::{KeepAlive, Lease, LeaseLoss, LeaseTimeToLive};
pub use watcher::{EventKind, Watch, WatchEvent};

/// How long a watch or keep-alive stream waits for its first answer from a node.
const STREAM_OPEN: Duration = Duration::from_secs(5);
/// Pause between attempts on the next endpoint.
const BACKOFF: Duration = Duration::from_millis(100);

/// Why a step of a resuming stream ([`Watch`], [`Observe`]) did not go on.
enum Fail {
    /// The stream broke or could not be opened: try the next endpoint.
    Retry(String),
    /// Returned to the caller.
    Final(ClientError),
}

/// A stream on endpoint `i` failed with `s`: retried elsewhere unless the node refused it for
/// good.
async fn stream_failed(client: &Client, i: usize, s: tonic::Status) -> Fail {
    let i = i % client.inner.endpoints.len();
    if s.code() == tonic::Code::Unauthenticated
        && client.inner.options.credentials.is_some()
        && client.inner.tokens[i].lock().await.is_some()
    {
        // The node forgot our token (restart): log in again there next time. (Without a
        // token this was the login itself, refused: a wrong password is final.)
        client.forget_token(i).await;
        return Fail::Retry(s.message().to_owned());
    }
    if is_retryable(&s) {
        Fail::Retry(format!("{}: {}", s.code(), s.message()))
    } else {
        Fail::Final(ClientError::Rejected(s))
    }
}

/// A resuming stream failed on `endpoint`: move to the next one, after a pause.
/// `Err(())` once no endpoint has served it for `retry_for` since `failing_since` (the first
/// failure of this run of failures).
async fn next_endpoint(
    client: &Client,
    endpoint: &mut usize,
    failing_since: &mut Option<std::time::Instant>,
) -> Result<(), ()> {
    *endpoint = (*endpoint + 1) % client.inner.endpoints.len();
    client
        .inner
        .retries
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
    if since.elapsed() >= client.inner.options.retry_for {
        return Err(());
    }
    tokio::time::sleep(BACKOFF).await;
    Ok(())
}

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

/// `range_end` of every key starting with `prefix` (etcd's `GetPrefixRangeEnd`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
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
}
