//! [`Watch`]: a watch on a key or prefix that resumes by revision across node failures.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::mvccpb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::Streaming;

use epb::watch_client::WatchClient;

use super::{next_endpoint, prefix_end, stream_failed, Etcd, Fail, KeyValue, STREAM_OPEN};
use crate::{Client, ClientError};

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

impl Etcd {
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
                    next_endpoint(&self.client, &mut self.endpoint, &mut failing_since)
                        .await
                        .map_err(|()| {
                            ClientError::Unavailable(format!("no endpoint serves the watch: {why}"))
                        })?;
                }
            }
        }
    }

    /// A failed stream: retried elsewhere unless the node refused the watch for good.
    async fn failed(&self, s: tonic::Status) -> Fail {
        stream_failed(&self.client, self.endpoint, s).await
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

#[cfg(test)]
mod tests {
    use super::*;

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
