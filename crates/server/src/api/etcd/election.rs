//! `v3electionpb.Election`: etcd's server-side election on fenced's lock table, as
//! [`lock`](super::lock) serves etcd's lock — one election per lock name.
//!
//! * `Campaign(name, lease, value)` is `Lock` with a value: it waits FIFO on the server until
//!   the lease is leader, then the leader key `name/<lease hex>` holds `value`, and its
//!   `create_revision` — the answer's `leader.rev` and `header.revision` — is the term's
//!   **fencing token**. Campaigning again with the leading lease answers the same key, and
//!   proclaims its value if it differs (as etcd's Campaign does).
//! * `Proclaim(leader, value)` writes the leader key only while the lease still leads with
//!   that key (a txn comparing its `create_revision` with `leader.rev`); otherwise etcd's
//!   "election: not leader".
//! * `Resign(leader)` ends that term (only that one: `leader.rev` must be its token) and hands
//!   the election to the next candidate at one revision.
//! * `Leader(name)` and `Observe(name)` read the keyspace as etcd defines the leader: the live
//!   key under `name/` with the lowest `create_revision`. Waiting candidates put no key, so
//!   it is the lock's holder's (do not put other keys under an election's prefix).
//!   `Leader` is a linearizable read; "election: no leader" when there is none.
//! * `Observe` sends the current leader, then every change in revision order — a new leader
//!   (a hand-over's delete and put are one revision: one message) or a proclaimed value —
//!   from the keyspace's change feed, woken like a watch; it never skips a term, whatever
//!   the wake-ups coalesce, and resynchronises from the current state if compaction passed
//!   its position. Opened with etcd's `hasleader: true` metadata (clientv3's
//!   `WithRequireLeader`), it ends with "etcdserver: no leader" as a require-leader watch
//!   does ([`super::watch`]), so an observer does not wait on a member cut off from the
//!   majority.
//! * Permissions: `LOCK.ACQUIRE` on the name to campaign and proclaim, `LOCK.RELEASE` to
//!   resign, `LOCK.INFO` to read the leader.

use std::collections::BTreeMap;
use std::pin::Pin;

use fenced_core::etcd::{
    self as core, Compare, CompareResult, CompareTarget, EtcdError, EventKind, KeyRange,
    PutRequest, RangeRequest, RequestOp, SortOrder, SortTarget, TxnRequest,
};
use fenced_core::{lock_key, Command, EtcdCommand, EtcdReply, Response, StateMachine};
use fenced_proto::etcd::v3electionpb as elpb;
use fenced_resp::acl::User;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Status};

use elpb::election_server::Election;

use super::convert::kv;
use super::lock::{lock_lease, lock_name, parse_key};
use super::{not_etcd, queue, rev_in, rev_out, status_of, watch, EtcdApi, Reply};

/// Events one read of an `Observe` takes from the change feed.
const PAGE_EVENTS: usize = 1_000;

type ObserveStream = Pin<Box<dyn Stream<Item = Result<elpb::LeaderResponse, Status>> + Send>>;

/// etcd's `concurrency.ErrElectionNoLeader`, as etcd's server answers it.
fn no_leader() -> Status {
    Status::unknown("election: no leader")
}

/// etcd's `concurrency.ErrElectionNotLeader`.
fn not_leader() -> Status {
    Status::unknown("election: not leader")
}

/// The leader key of a request: its name and lease, and that the key is theirs.
fn leader_of(leader: Option<&elpb::LeaderKey>) -> Result<(String, u64, i64), Status> {
    let l = leader.ok_or_else(|| Status::invalid_argument("fenced: no leader key given"))?;
    let name = lock_name(&l.name)?;
    let (key_name, lease) = parse_key(&l.key)?;
    if key_name != name || lock_lease(l.lease)? != lease {
        return Err(not_leader());
    }
    Ok((name, lease, l.rev))
}

/// The election's prefix: `name/`.
fn prefix(name: &str) -> KeyRange {
    KeyRange::prefix(format!("{name}/").into_bytes())
}

/// The election's live keys now (key → kv).
fn live_keys(sm: &StateMachine, name: &str) -> Result<BTreeMap<Vec<u8>, core::KeyValue>, Status> {
    let r = sm
        .etcd_range(&RangeRequest::new(prefix(name)))
        .map_err(|e| super::etcd_status(&e))?;
    Ok(r.kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect())
}

/// etcd's leader: the live key with the lowest `create_revision`.
fn leader_in(live: &BTreeMap<Vec<u8>, core::KeyValue>) -> Option<&core::KeyValue> {
    live.values().min_by_key(|kv| kv.create_revision)
}

#[tonic::async_trait]
impl Election for EtcdApi {
    async fn campaign(&self, req: Request<elpb::CampaignRequest>) -> Reply<elpb::CampaignResponse> {
        let name = lock_name(&req.get_ref().name)?;
        let user = self
            .users
            .permit(&req, "LOCK.ACQUIRE", &[name.as_bytes()])?;
        let r = req.into_inner();
        let lease = lock_lease(r.lease)?;
        if !self.node.stamp_semantics().keyspace_locks() {
            if let Some(token) = self.take_lock(&user, &name, lease, r.value.clone()).await? {
                return self
                    .campaigned_in_lock_table(&user, &name, lease, &r, token)
                    .await;
            }
        }
        // etcd's concurrency.Election.Campaign: the key on the lease (its value proclaimed if
        // it existed with another), then the wait for every older key's delete.
        let held = self
            .queue_and_wait(&user, &name, r.lease, r.value.clone(), true)
            .await?;
        Ok(tonic::Response::new(elpb::CampaignResponse {
            header: self.header(held.enqueued.revision),
            leader: Some(elpb::LeaderKey {
                name: name.clone().into_bytes(),
                key: held.enqueued.key,
                rev: rev_out(held.enqueued.create_revision),
                lease: r.lease,
            }),
        }))
    }

    async fn proclaim(&self, req: Request<elpb::ProclaimRequest>) -> Reply<elpb::ProclaimResponse> {
        let (name, lease, rev) = leader_of(req.get_ref().leader.as_ref())?;
        let user = self
            .users
            .permit(&req, "LOCK.ACQUIRE", &[name.as_bytes()])?;
        let r = req.into_inner();
        let lease_id = r.leader.as_ref().map_or(0, |l| l.lease);
        let revision = self
            .put_leader_value(&user, &name, lease, lease_id, rev, r.value)
            .await?
            .ok_or_else(not_leader)?;
        Ok(tonic::Response::new(elpb::ProclaimResponse {
            header: self.header(revision),
        }))
    }

    async fn leader(&self, req: Request<elpb::LeaderRequest>) -> Reply<elpb::LeaderResponse> {
        let name = lock_name(&req.get_ref().name)?;
        self.users.permit(&req, "LOCK.INFO", &[name.as_bytes()])?;
        let (revision, leader) = self
            .node
            .read_clone(|sm| {
                let mut r = RangeRequest::new(prefix(&name));
                r.sort_target = SortTarget::Create;
                r.sort_order = SortOrder::Ascend;
                r.limit = 1;
                (sm.revision(), sm.etcd_range(&r))
            })
            .await
            .map_err(status_of)?;
        let leader = leader.map_err(|e| super::etcd_status(&e))?;
        let kv = leader.kvs.into_iter().next().ok_or_else(no_leader)?;
        Ok(tonic::Response::new(elpb::LeaderResponse {
            header: self.header(revision),
            kv: Some(super::convert::kv(kv)),
        }))
    }

    type ObserveStream = ObserveStream;

    async fn observe(&self, req: Request<elpb::LeaderRequest>) -> Reply<Self::ObserveStream> {
        let name = lock_name(&req.get_ref().name)?;
        self.users.permit(&req, "LOCK.INFO", &[name.as_bytes()])?;
        let require_leader = watch::RequireLeader::of(self, &req)?;
        // Where the stream starts: a linearizable read.
        let (after, live) = self
            .node
            .read_clone(|sm| (sm.revision(), live_keys(sm, &name)))
            .await
            .map_err(status_of)?;
        let live = live?;
        let (tx, rx) = mpsc::channel(16);
        let observer = Observer {
            api: self.clone(),
            name,
            tx,
            live,
            after,
            sent: None,
        };
        tokio::spawn(observer.run(require_leader));
        let out: ObserveStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(tonic::Response::new(out))
    }

    async fn resign(&self, req: Request<elpb::ResignRequest>) -> Reply<elpb::ResignResponse> {
        let (name, lease, rev) = leader_of(req.get_ref().leader.as_ref())?;
        let user = self
            .users
            .permit(&req, "LOCK.RELEASE", &[name.as_bytes()])?;
        // etcd's Resign succeeds whether or not that term still leads.
        if !self.node.stamp_semantics().keyspace_locks()
            && self
                .release_lock(
                    &user,
                    name.clone(),
                    lease,
                    Some(rev_in(rev)).filter(|t| *t != 0),
                )
                .await?
        {
            return Ok(tonic::Response::new(elpb::ResignResponse {
                header: self.header_now(),
            }));
        }
        // etcd's Resign: delete the leader key if it is still that term's.
        let key = lock_key(&name, lease);
        let who = (user.name().to_owned(), user.is_admin());
        let (revision, _) = queue::delete_generation(self, &who, key, rev_in(rev)).await?;
        Ok(tonic::Response::new(elpb::ResignResponse {
            header: self.header(revision),
        }))
    }
}

impl EtcdApi {
    /// A campaign the lock table granted (rules older than keyspace locks) with `token`.
    async fn campaigned_in_lock_table(
        &self,
        user: &User,
        name: &str,
        lease: u64,
        r: &elpb::CampaignRequest,
        token: u64,
    ) -> Reply<elpb::CampaignResponse> {
        // Campaigning again while leading, with another value: the value is proclaimed, as
        // etcd's Campaign does (the grant kept the first campaign's value).
        let key = lock_key(name, lease);
        let current = self
            .node
            .read_clone(|sm| sm.etcd_range(&RangeRequest::new(KeyRange::key(key))))
            .await
            .map_err(status_of)?
            .map_err(|e| super::etcd_status(&e))?;
        if current
            .kvs
            .first()
            .is_some_and(|kv| kv.create_revision == token && kv.value != r.value)
        {
            self.put_leader_value(user, name, lease, r.lease, rev_out(token), r.value.clone())
                .await?;
        }
        Ok(tonic::Response::new(elpb::CampaignResponse {
            header: self.header(token),
            leader: Some(elpb::LeaderKey {
                name: name.to_owned().into_bytes(),
                key: lock_key(name, lease),
                rev: rev_out(token),
                lease: r.lease,
            }),
        }))
    }

    /// Put `value` on the leader key of `lease` in election `name` if that lease still leads
    /// with the term whose token is `rev`: the put's revision, `None` if it does not.
    pub(super) async fn put_leader_value(
        &self,
        user: &User,
        name: &str,
        lease: u64,
        lease_id: i64,
        rev: i64,
        value: Vec<u8>,
    ) -> Result<Option<u64>, Status> {
        let key = lock_key(name, lease);
        let mut put = PutRequest::new(key.clone(), value);
        put.lease = lease_id;
        let txn = TxnRequest {
            compare: vec![Compare {
                range: KeyRange::key(key),
                result: CompareResult::Equal,
                target: CompareTarget::CreateRevision(rev),
            }],
            success: vec![RequestOp::Put(put)],
            failure: Vec::new(),
        };
        match self
            .node
            .propose(
                None,
                Command::Etcd(EtcdCommand::Txn(txn)).as_user(user.name(), user.is_admin()),
            )
            .await
            .map_err(status_of)?
        {
            Response::Etcd {
                revision,
                reply: EtcdReply::Txn(t),
                ..
            } => Ok(t.succeeded.then_some(revision)),
            other => Err(not_etcd(other)),
        }
    }
}

/// One `Observe` stream: the election's live keys as of revision `after`, and the leader
/// last sent (key, mod revision).
struct Observer {
    api: EtcdApi,
    name: String,
    tx: mpsc::Sender<Result<elpb::LeaderResponse, Status>>,
    live: BTreeMap<Vec<u8>, core::KeyValue>,
    after: u64,
    sent: Option<(Vec<u8>, u64)>,
}

/// The stream's reader went away.
struct Gone;

impl Observer {
    async fn run(mut self, mut require_leader: Option<watch::RequireLeader>) {
        let mut changes = self.api.node.hub().etcd_changes();
        if self.send_leader(self.after).await.is_err() {
            return;
        }
        loop {
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() || self.catch_up().await.is_err() {
                        return;
                    }
                }
                () = watch::RequireLeader::lost(&mut require_leader) => {
                    let _ = self.tx.send(Err(watch::no_leader())).await;
                    return;
                }
                () = self.tx.closed() => return,
            }
        }
    }

    /// Send the leader if it changed since the last message (none: nothing to send).
    async fn send_leader(&mut self, revision: u64) -> Result<(), Gone> {
        let Some(leader) = leader_in(&self.live) else {
            self.sent = None;
            return Ok(());
        };
        let now = (leader.key.clone(), leader.mod_revision);
        if self.sent.as_ref() == Some(&now) {
            return Ok(());
        }
        let msg = elpb::LeaderResponse {
            header: self.api.header(revision),
            kv: Some(kv(leader.clone())),
        };
        self.sent = Some(now);
        self.tx.send(Ok(msg)).await.map_err(|_| Gone)
    }

    /// Read the election's changes since `after`, one revision at a time.
    async fn catch_up(&mut self) -> Result<(), Gone> {
        loop {
            if let Err(e) = self.api.node.serving() {
                let _ = self.tx.send(Err(status_of(e))).await;
                return Err(Gone);
            }
            let sm = self.api.node.local(StateMachine::clone);
            let state_rev = sm.revision();
            let page =
                match sm.etcd_events_since(self.after, &prefix(&self.name), PAGE_EVENTS, false) {
                    Ok(page) => page,
                    Err(EtcdError::Compacted { .. }) => {
                        // Compaction passed this stream's position: go on from the state now.
                        match live_keys(&sm, &self.name) {
                            Ok(live) => self.live = live,
                            Err(e) => {
                                let _ = self.tx.send(Err(e)).await;
                                return Err(Gone);
                            }
                        }
                        self.after = state_rev;
                        return self.send_leader(state_rev).await;
                    }
                    Err(e) => {
                        let _ = self.tx.send(Err(super::etcd_status(&e))).await;
                        return Err(Gone);
                    }
                };
            let mut events = page.events.into_iter().peekable();
            while let Some(first) = events.next() {
                let revision = first.kv.mod_revision;
                let mut group = vec![first];
                while let Some(e) = events.next_if(|e| e.kv.mod_revision == revision) {
                    group.push(e);
                }
                for e in group {
                    match e.kind {
                        EventKind::Put => {
                            self.live.insert(e.kv.key.clone(), e.kv);
                        }
                        EventKind::Delete => {
                            self.live.remove(&e.kv.key);
                        }
                    }
                }
                self.send_leader(revision).await?;
            }
            self.after = if page.more {
                page.resume_after
            } else {
                page.resume_after.max(state_rev)
            };
            if !page.more {
                return Ok(());
            }
        }
    }
}
