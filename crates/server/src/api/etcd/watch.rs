//! `etcdserverpb.Watch`: one bidirectional stream per client, many watches on it.
//!
//! **Built on the history, woken by apply.** A watch is a key range and a position `after`:
//! every change to the range at or below `after` has been sent (or never existed). Whenever
//! the etcd keyspace changes on this node the hub wakes the stream ([`Hub::etcd_changes`],
//! a wake-up that coalesces, not a feed), and the stream reads the changes after `after`
//! from the keyspace's own change feed ([`StateMachine::etcd_events_since`]) on an O(1) clone
//! of the state. So a watch sees every change of its range in revision order, once, whether
//! it is caught up or far behind, however many wake-ups coalesced, across leader changes and
//! snapshot installs (an install wakes the streams too); and a client that resumes with
//! `start_revision = last seen + 1` on any node continues with no gap and no duplicate.
//!
//! * **Slow watchers never stall apply.** Nothing here holds the state lock while it reads
//!   or sends: each page is computed on its own clone, and sending waits for the client
//!   (a bounded channel). A watcher that falls behind catches up from the history; if
//!   compaction removed a write it had not seen, it is cancelled with etcd's
//!   `compact_revision` (clients see "required revision has been compacted").
//! * **Synced watchers are never compacted**, as in etcd. A stream wakes only when the
//!   keyspace changes, so a quiet watcher's position stays at the last etcd write it saw
//!   while lock commands, keep-alives and failed txns take revisions; a compaction at one of
//!   those (`etcdctl compact $(current)`, fenced's auto-compaction on a busy lock table)
//!   removed nothing the watcher missed. Every watcher reads on from
//!   [`StateMachine::etcd_synced_position`]: the compact revision when compaction removed no
//!   write after its position. So only a watch that would miss a compacted write is
//!   cancelled — one behind a write that was then compacted, or a new one from before such a
//!   write, as etcd cancels an unsynced watcher below its compact revision (in etcd the
//!   compact revision is always a write's; in fenced it may be a lock command's, and a watch
//!   from just after the last write is served, not cancelled). What a node knows of
//!   compacted writes is its own: after a snapshot install or restart it is conservative.
//! * **Pages** hold up to [`PAGE_EVENTS`] events and never split a revision (etcd sends one
//!   revision's events in one response). A watch created with `fragment` has responses over
//!   [`FRAGMENT_BYTES`] split into fragments, the last one with `fragment = false`.
//! * **Positions.** `start_revision` s watches from `after = s - 1`; 0 = from this node's
//!   current revision. A watcher that has seen everything up to the state it read moves its
//!   position to that state's revision.
//! * **Progress.** `progress_notify` watches get an empty response with the current
//!   position every [`PROGRESS_NOTIFY`] without events (etcd's default interval). A
//!   `WatchProgressRequest` is answered (watch id -1, as etcd 3.5) once every watch of the
//!   stream has caught up, with the revision up to which all of them have seen everything —
//!   never above the store's revision (a watch starting in the future has seen everything up
//!   to now, not up to its start): etcd 3.5.1 answers its current revision. A
//!   `progress_notify` answer is capped the same way.
//! * **Ids** as etcd: 0 asks for one (the stream's next free id, from 0), any other must be
//!   unused on the stream; a cancel of an unknown id is ignored.
//! * **Limits**: a stream holds at most [`MAX_WATCHES_PER_STREAM`] watches and
//!   [`MAX_WATCHED_BYTES_PER_STREAM`] bytes of watched keys (etcd has no limit); a create past
//!   either is answered created-and-cancelled with "etcdserver: too many watches on this
//!   stream", and the stream and its other watches go on.
//! * **Permissions**: a watch needs `GET` on its range ([`permit_range`]); refused, it is
//!   answered created-and-cancelled with etcd's reason, like a duplicate id.
//! * **Require leader.** A stream opened with etcd's `hasleader: true` metadata (clientv3's
//!   `WithRequireLeader`) ends with etcd's `Unavailable` "etcdserver: no leader" once this
//!   node has known no leader at [`LEADER_CHECKS`] checks in a row, [`LEADER_CHECK`] apart —
//!   so a client does not wait on a member cut off from the majority and reconnects
//!   elsewhere. Without it the watch stays open and catches up when the member does.
//! * A node fenced out by its divergence alarm ends the stream with its error.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use fenced_core::etcd::{self as core, EtcdError, EventKind, KeyRange};
use fenced_core::StateMachine;
use fenced_proto::etcd::{etcdserverpb as epb, mvccpb};
use fenced_resp::acl::User;
use prost::Message;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::Stream;
use tonic::{Request, Status, Streaming};

use epb::watch_server::Watch;

use super::convert::{kv, range_of};
use super::perm::permit_range;
use super::{rev_in, rev_out, status_of, EtcdApi, Reply};

/// Most events in one response (more go in the next; a revision is never split).
pub const PAGE_EVENTS: usize = 1_000;
/// Size above which a `fragment` watch's response is split: etcd's request limit.
pub const FRAGMENT_BYTES: usize = core::MAX_REQUEST_BYTES;
/// How often an idle `progress_notify` watch hears its position (etcd's default).
pub const PROGRESS_NOTIFY: Duration = Duration::from_secs(600);
/// Responses queued for a slow client before the stream waits for it.
const QUEUE: usize = 16;
/// A catch-up of more than this many revisions reads on a blocking thread (a narrow watch
/// far behind may scan many changes to other keys).
const INLINE_GAP: u64 = 4_096;

/// How often a require-leader stream checks that this node knows a leader, and how many
/// checks without one end it (etcd waits about three election timeouts).
pub const LEADER_CHECK: Duration = Duration::from_millis(500);
pub const LEADER_CHECKS: u32 = 3;

/// etcd's reason for a watch id already in use on the stream.
const DUPLICATE_ID: &str = "mvcc: duplicate watch ID provided on the WatchStream";
/// Watches one stream may hold at once (etcd sets no limit; fenced bounds what one client can
/// make a node keep and walk at every change). Past it a create is answered
/// created-and-cancelled with [`TOO_MANY`], like a duplicate id, and the stream goes on.
pub const MAX_WATCHES_PER_STREAM: usize = 10_000;
/// Bytes of watched keys (`key` plus `range_end`) one stream may hold at once, for the same
/// reason: each create may name up to a request's worth of key.
pub const MAX_WATCHED_BYTES_PER_STREAM: usize = 64 << 20;
const TOO_MANY: &str = "etcdserver: too many watches on this stream";
/// etcd's id for "no watch" (a refused create, a progress answer).
const NO_WATCH: i64 = -1;

type WatchStream = Pin<Box<dyn Stream<Item = Result<epb::WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Watch for EtcdApi {
    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<Streaming<epb::WatchRequest>>) -> Reply<Self::WatchStream> {
        let user = self.users.caller(&req)?;
        self.node.serving().map_err(status_of)?;
        let require_leader = RequireLeader::of(self, &req)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let stream = Feed {
            api: self.clone(),
            user,
            tx,
            watchers: BTreeMap::new(),
            watched_bytes: 0,
            next_id: 0,
        };
        tokio::spawn(stream.run(req.into_inner(), require_leader));
        let out: WatchStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(out))
    }
}

/// What a watch's range counts against [`MAX_WATCHED_BYTES_PER_STREAM`].
fn range_bytes(range: &KeyRange) -> usize {
    range.key.len() + range.range_end.len()
}

/// One watch of a stream.
struct Watcher {
    range: KeyRange,
    /// Every change of `range` at or below this revision has been sent or never existed.
    after: u64,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    fragment: bool,
    progress_notify: bool,
    /// When it last sent anything (for progress notifications).
    last_sent: Instant,
}

/// A watch stream's state, owned by its task.
struct Feed {
    api: EtcdApi,
    user: Arc<User>,
    tx: mpsc::Sender<Result<epb::WatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    /// Bytes of the watchers' ranges ([`MAX_WATCHED_BYTES_PER_STREAM`]).
    watched_bytes: usize,
    next_id: i64,
}

/// The client went away: the stream ends.
struct Gone;

impl Drop for Feed {
    fn drop(&mut self) {
        let open = i64::try_from(self.watchers.len()).unwrap_or(i64::MAX);
        self.api.node.metrics().etcd_watchers(-open);
    }
}

impl Feed {
    async fn run(
        mut self,
        mut inbound: Streaming<epb::WatchRequest>,
        mut require_leader: Option<RequireLeader>,
    ) {
        let mut changes = self.api.node.hub().etcd_changes();
        let mut progress = tokio::time::interval(PROGRESS_NOTIFY / 10);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Whether the client may still send: one that closed its side goes on receiving
        // (etcd ends a stream when its client goes away, not when it stops sending; etcd's
        // JSON gateway closes its side when the HTTP body ends).
        let mut sending = true;
        loop {
            let step = tokio::select! {
                msg = inbound.message(), if sending => match msg {
                    Ok(Some(req)) => self.request(req).await,
                    Ok(None) => {
                        sending = false;
                        Ok(())
                    }
                    // The connection failed.
                    Err(_) => return,
                },
                changed = changes.changed() => match changed {
                    Ok(()) => self.catch_up().await,
                    Err(_) => return,
                },
                _ = progress.tick() => self.notify_progress().await,
                () = RequireLeader::lost(&mut require_leader) => {
                    let _ = self.tx.send(Err(no_leader())).await;
                    return;
                }
                () = self.tx.closed() => return,
            };
            if step.is_err() {
                return;
            }
        }
    }

    /// Remove a watch: whether it existed.
    fn remove(&mut self, id: i64) -> bool {
        let Some(gone) = self.watchers.remove(&id) else {
            return false;
        };
        self.watched_bytes = self.watched_bytes.saturating_sub(range_bytes(&gone.range));
        self.api.node.metrics().etcd_watchers(-1);
        true
    }

    async fn send(&self, resp: epb::WatchResponse) -> Result<(), Gone> {
        self.tx.send(Ok(resp)).await.map_err(|_| Gone)
    }

    async fn request(&mut self, req: epb::WatchRequest) -> Result<(), Gone> {
        use epb::watch_request::RequestUnion;
        match req.request_union {
            Some(RequestUnion::CreateRequest(c)) => self.create(c).await,
            Some(RequestUnion::CancelRequest(c)) => {
                if self.remove(c.watch_id) {
                    let revision = self.api.node.local(|sm| sm.revision());
                    self.send(epb::WatchResponse {
                        header: self.api.header(revision),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(RequestUnion::ProgressRequest(_)) => {
                // Catch every watch up first: the answer promises all of them have seen
                // everything up to its revision.
                self.catch_up().await?;
                let now = self.api.node.local(|sm| sm.revision());
                let revision = self
                    .watchers
                    .values()
                    .map(|w| w.after)
                    .min()
                    .map_or(now, |r| r.min(now));
                self.send(epb::WatchResponse {
                    header: self.api.header(revision),
                    watch_id: NO_WATCH,
                    ..Default::default()
                })
                .await
            }
            None => Ok(()),
        }
    }

    async fn create(&mut self, c: epb::WatchCreateRequest) -> Result<(), Gone> {
        let range = range_of(c.key, c.range_end);
        let now = self.api.node.local(|sm| sm.revision());
        let refused = |reason: String| epb::WatchResponse {
            header: self.api.header(now),
            watch_id: NO_WATCH,
            created: true,
            canceled: true,
            cancel_reason: reason,
            ..Default::default()
        };
        if let Err(denied) = permit_range(&self.user, "GET", &range) {
            return self.send(refused(denied.message().to_owned())).await;
        }
        if range.key.is_empty() && range.range_end.is_empty() {
            return self.send(refused(EtcdError::EmptyKey.to_string())).await;
        }
        let bytes = range_bytes(&range);
        if self.watchers.len() >= MAX_WATCHES_PER_STREAM
            || self.watched_bytes.saturating_add(bytes) > MAX_WATCHED_BYTES_PER_STREAM
        {
            return self
                .send(refused(format!(
                    "{TOO_MANY} (at most {MAX_WATCHES_PER_STREAM} watches and \
                     {MAX_WATCHED_BYTES_PER_STREAM} bytes of watched keys per stream; \
                     cancel some or open another stream)"
                )))
                .await;
        }
        let id = if c.watch_id == 0 {
            while self.watchers.contains_key(&self.next_id) {
                self.next_id += 1;
            }
            self.next_id
        } else if self.watchers.contains_key(&c.watch_id) || c.watch_id < 0 {
            return self.send(refused(DUPLICATE_ID.into())).await;
        } else {
            c.watch_id
        };
        let filters = |f: epb::watch_create_request::FilterType| c.filters.contains(&(f as i32));
        let start = rev_in(c.start_revision);
        let after = if start == 0 { now } else { start - 1 };
        self.api.node.metrics().etcd_watchers(1);
        self.watched_bytes += bytes;
        self.watchers.insert(
            id,
            Watcher {
                range,
                after,
                no_put: filters(epb::watch_create_request::FilterType::Noput),
                no_delete: filters(epb::watch_create_request::FilterType::Nodelete),
                prev_kv: c.prev_kv,
                fragment: c.fragment,
                progress_notify: c.progress_notify,
                last_sent: Instant::now(),
            },
        );
        self.send(epb::WatchResponse {
            header: self.api.header(now),
            watch_id: id,
            created: true,
            ..Default::default()
        })
        .await?;
        // A watch from an older revision has history to send now; the stream's other watches
        // catch up when the state changes (walking them all at every create made n creates
        // cost n², 10,000 of them minutes).
        if let Err(e) = self.api.node.serving() {
            let _ = self.tx.send(Err(status_of(e))).await;
            return Err(Gone);
        }
        self.catch_up_one(id).await
    }

    /// Send every watch what changed after its position.
    async fn catch_up(&mut self) -> Result<(), Gone> {
        if let Err(e) = self.api.node.serving() {
            let _ = self.tx.send(Err(status_of(e))).await;
            return Err(Gone);
        }
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        for id in ids {
            self.catch_up_one(id).await?;
        }
        Ok(())
    }

    async fn catch_up_one(&mut self, id: i64) -> Result<(), Gone> {
        loop {
            let Some(w) = self.watchers.get(&id) else {
                return Ok(());
            };
            let (range, prev_kv) = (w.range.clone(), w.prev_kv);
            let sm = self.api.node.local(StateMachine::clone);
            let state_rev = sm.revision();
            // Past a compaction that removed nothing after its position.
            let after = sm.etcd_synced_position(w.after);
            let read = move || sm.etcd_events_since(after, &range, PAGE_EVENTS, prev_kv);
            let page = if state_rev.saturating_sub(after) <= INLINE_GAP {
                read()
            } else {
                match tokio::task::spawn_blocking(read).await {
                    Ok(page) => page,
                    Err(e) => {
                        let _ = self
                            .tx
                            .send(Err(Status::internal(format!("a watch read failed: {e}"))))
                            .await;
                        return Err(Gone);
                    }
                }
            };
            let page = match page {
                Ok(page) => page,
                Err(e) => {
                    // Compacted past its position (etcd's compact_revision tells the client
                    // where it may resume), or refused otherwise: the watch ends.
                    self.remove(id);
                    let compact_revision = match e {
                        EtcdError::Compacted { compact_revision } => rev_out(compact_revision),
                        _ => 0,
                    };
                    return self
                        .send(epb::WatchResponse {
                            header: self.api.header(state_rev),
                            watch_id: id,
                            canceled: true,
                            compact_revision,
                            cancel_reason: super::etcd_status(&e).message().to_owned(),
                            ..Default::default()
                        })
                        .await;
                }
            };
            let Some(w) = self.watchers.get_mut(&id) else {
                return Ok(());
            };
            let events: Vec<mvccpb::Event> = page
                .events
                .into_iter()
                .filter(|e| match e.kind {
                    EventKind::Put => !w.no_put,
                    EventKind::Delete => !w.no_delete,
                })
                .map(event)
                .collect();
            // Nothing else changed up to the state read when this page ended the feed.
            w.after = if page.more {
                page.resume_after
            } else {
                page.resume_after.max(state_rev)
            };
            let fragment = w.fragment;
            if !events.is_empty() {
                w.last_sent = Instant::now();
                self.api.node.metrics().etcd_watch_events(events.len());
                let header = self.api.header(state_rev);
                for resp in responses(id, header, events, fragment) {
                    self.send(resp).await?;
                }
            }
            if !page.more {
                return Ok(());
            }
        }
    }

    /// Tell each idle `progress_notify` watch its position.
    async fn notify_progress(&mut self) -> Result<(), Gone> {
        let due: Vec<i64> = self
            .watchers
            .iter()
            .filter(|(_, w)| w.progress_notify && w.last_sent.elapsed() >= PROGRESS_NOTIFY)
            .map(|(id, _)| *id)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        self.catch_up().await?;
        let now = self.api.node.local(|sm| sm.revision());
        for id in due {
            let Some(w) = self.watchers.get_mut(&id) else {
                continue;
            };
            w.last_sent = Instant::now();
            let header = self.api.header(w.after.min(now));
            self.send(epb::WatchResponse {
                header,
                watch_id: id,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }
}

/// A leader that has not heard from a majority for this long counts as no leader for
/// require-leader streams (etcd's leader steps down then: CheckQuorum).
pub const LEADER_QUORUM_SILENCE_MS: u64 = 1_000;

impl EtcdApi {
    /// Whether this member knows a leader, for require-leader streams: a follower that knows
    /// one, or a leader that heard from a majority within [`LEADER_QUORUM_SILENCE_MS`] — a
    /// leader cut off from the others stays leader in Raft's terms until it hears of a newer
    /// term, but its clients must move on as etcd's would.
    pub(super) fn has_leader(&self) -> bool {
        let m = self.node.raft().metrics().borrow().clone();
        match m.current_leader {
            None => false,
            Some(l) if l == m.id => m
                .millis_since_quorum_ack
                .is_none_or(|ms| ms < LEADER_QUORUM_SILENCE_MS),
            Some(_) => true,
        }
    }
}

/// etcd's require-leader rule of one stream (clientv3's `WithRequireLeader`, the
/// `hasleader: true` metadata): the stream ends with [`no_leader`] once its member has known
/// no leader at [`LEADER_CHECKS`] checks in a row, [`LEADER_CHECK`] apart. Watch, Observe
/// and LeaseKeepAlive streams share it.
pub(super) struct RequireLeader {
    api: EtcdApi,
    checks: tokio::time::Interval,
    leaderless: u32,
}

impl RequireLeader {
    /// The rule of a stream opened with `req`: `None` without `hasleader: true`; refused
    /// at once if this member knows no leader now.
    pub(super) fn of<T>(api: &EtcdApi, req: &Request<T>) -> Result<Option<RequireLeader>, Status> {
        let asked = req
            .metadata()
            .get("hasleader")
            .is_some_and(|v| v.as_bytes() == b"true");
        if !asked {
            return Ok(None);
        }
        if !api.has_leader() {
            return Err(no_leader());
        }
        Ok(Some(RequireLeader {
            api: api.clone(),
            checks: tokio::time::interval(LEADER_CHECK),
            leaderless: 0,
        }))
    }

    /// Resolves when the stream must end for want of a leader (never without the rule).
    /// Cancel-safe: a `select!` may drop it between checks.
    pub(super) async fn lost(rule: &mut Option<RequireLeader>) {
        let Some(rule) = rule else {
            return std::future::pending().await;
        };
        loop {
            rule.checks.tick().await;
            rule.leaderless = if rule.api.has_leader() {
                0
            } else {
                rule.leaderless + 1
            };
            if rule.leaderless >= LEADER_CHECKS {
                return;
            }
        }
    }
}

/// etcd's answer when a require-leader stream's member knows no leader.
pub(super) fn no_leader() -> Status {
    Status::unavailable("etcdserver: no leader")
}

fn event(e: core::Event) -> mvccpb::Event {
    mvccpb::Event {
        r#type: match e.kind {
            EventKind::Put => mvccpb::event::EventType::Put as i32,
            EventKind::Delete => mvccpb::event::EventType::Delete as i32,
        },
        kv: Some(kv(e.kv)),
        prev_kv: e.prev_kv.map(kv),
    }
}

/// One response with `events`, or — for a `fragment` watch whose response would exceed
/// [`FRAGMENT_BYTES`] — fragments of at most that size (at least one event each), every one
/// but the last marked `fragment`.
fn responses(
    id: i64,
    header: Option<epb::ResponseHeader>,
    events: Vec<mvccpb::Event>,
    fragment: bool,
) -> Vec<epb::WatchResponse> {
    let whole = |events: Vec<mvccpb::Event>, fragment: bool| epb::WatchResponse {
        header,
        watch_id: id,
        events,
        fragment,
        ..Default::default()
    };
    if !fragment {
        return vec![whole(events, false)];
    }
    let mut out = Vec::new();
    let (mut part, mut bytes) = (Vec::new(), 0usize);
    for e in events {
        let size = e.encoded_len();
        if !part.is_empty() && bytes + size > FRAGMENT_BYTES {
            out.push(whole(std::mem::take(&mut part), true));
            bytes = 0;
        }
        bytes += size;
        part.push(e);
    }
    out.push(whole(part, false));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(value_len: usize) -> mvccpb::Event {
        mvccpb::Event {
            r#type: 0,
            kv: Some(mvccpb::KeyValue {
                key: b"k".to_vec(),
                value: vec![0; value_len],
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    #[test]
    fn large_responses_of_a_fragment_watch_are_split_and_the_last_fragment_says_so() {
        let events = vec![put(FRAGMENT_BYTES / 3); 5];
        let out = responses(3, None, events.clone(), true);
        assert_eq!(out.len(), 3, "two events per fragment");
        assert!(out[..2].iter().all(|r| r.fragment));
        assert!(!out[2].fragment);
        let joined: Vec<_> = out.into_iter().flat_map(|r| r.events).collect();
        assert_eq!(joined, events, "fragments lose or reorder nothing");
        let whole = responses(3, None, events, false);
        assert_eq!(whole.len(), 1, "without fragment, one response");
    }

    #[test]
    fn an_event_larger_than_a_fragment_goes_alone() {
        let out = responses(1, None, vec![put(FRAGMENT_BYTES + 10), put(1)], true);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].events.len(), 1);
    }
}
