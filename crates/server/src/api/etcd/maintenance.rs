//! `etcdserverpb.Maintenance`: `Status` (what `etcdctl endpoint status` shows) and `Alarm`
//! (the etcd keyspace's space quota alarm `NOSPACE`, and fenced's divergence alarm as etcd's
//! `CORRUPT`), `Hash`/`HashKV` (a hash of the etcd keyspace's history, equal on every
//! member), `Defragment` (nothing to do) and `MoveLeader` (fenced's leadership hand-off); the
//! rest answer `UNIMPLEMENTED` saying what to use instead. `Status` and an
//! alarm `GET` are open to every caller, like `fenced.v1.Cluster/Status`; changing an alarm
//! needs an administrator.

use std::pin::Pin;

use fenced_proto::etcd::etcdserverpb as epb;
use openraft::ServerState;
use tokio_stream::Stream;
use tonic::{Request, Status};

use epb::maintenance_server::Maintenance;

use fenced_core::{EtcdCommand, EtcdReply};

use super::{status_of, unimplemented, EtcdApi, Reply, VERSION};

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<epb::SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for EtcdApi {
    type SnapshotStream = SnapshotStream;

    /// fenced's alarms in etcd's terms, one place for both:
    /// * `NOSPACE`: the etcd keyspace's space quota alarm (`--quota-backend-bytes`), part of
    ///   the replicated state, listed under this node's member id (every replica holds it
    ///   alike). `ACTIVATE` and `DEACTIVATE` (`etcdctl alarm disarm`) go through the log and
    ///   need an administrator; `DEACTIVATE` with alarm `NONE` means it too.
    /// * `CORRUPT`: the members whose divergence alarm is raised, as this node knows them
    ///   (the leader knows every member's). fenced raises and clears that alarm itself
    ///   (docs/operations.md, "Divergence alarm"): activating or deactivating it is refused.
    ///
    /// `GET` (open to every caller, like `fenced.v1.Cluster/Status`) lists `NOSPACE` first,
    /// so that `etcdctl alarm disarm`, which disarms what the list shows in order, clears it
    /// even when a `CORRUPT` alarm it may not clear follows.
    async fn alarm(&self, req: Request<epb::AlarmRequest>) -> Reply<epb::AlarmResponse> {
        use epb::alarm_request::AlarmAction;
        let action = AlarmAction::try_from(req.get_ref().action);
        if !matches!(action, Ok(AlarmAction::Get)) {
            self.users.require_admin(&req, "Maintenance.Alarm")?;
        }
        let r = req.into_inner();
        let want = epb::AlarmType::try_from(r.alarm).unwrap_or(epb::AlarmType::None);
        let activate = match action {
            Ok(AlarmAction::Get) => return self.alarm_list(r.member_id, want),
            Ok(AlarmAction::Activate) => true,
            Ok(AlarmAction::Deactivate) => false,
            Err(_) => return Err(Status::invalid_argument("unknown alarm action")),
        };
        // The cluster-wide CORRUPT alarm (listed under the member that raised it) is the one
        // CORRUPT an operator disarms: `etcdctl alarm disarm`.
        let cluster = self
            .node
            .local(|sm| sm.cluster_alarm().map(|a| a.raised_by));
        if !activate
            && want == epb::AlarmType::Corrupt
            && cluster.is_some_and(|by| r.member_id == 0 || r.member_id == by)
        {
            let disarm = fenced_core::Command::ClusterAlarm { raise: None };
            return match self.node.propose(None, disarm).await.map_err(status_of)? {
                fenced_core::Response::ClusterAlarm { before, .. } => {
                    Ok(tonic::Response::new(epb::AlarmResponse {
                        header: self.header_now(),
                        alarms: before
                            .map(|a| epb::AlarmMember {
                                member_id: a.raised_by,
                                alarm: epb::AlarmType::Corrupt as i32,
                            })
                            .into_iter()
                            .collect(),
                    }))
                }
                other => Err(Status::internal(format!("unexpected answer {other:?}"))),
            };
        }
        if want == epb::AlarmType::Corrupt || (activate && want != epb::AlarmType::Nospace) {
            return Err(Status::unimplemented(
                "fenced raises and clears the divergence alarm (CORRUPT) itself: it clears \
                 when the member's data is replaced (docs/operations.md, \"Divergence alarm\"); \
                 only NOSPACE can be activated or deactivated",
            ));
        }
        let (_, reply) = self.write(EtcdCommand::Alarm { activate }).await?;
        let EtcdReply::Quota { before, after } = reply else {
            return Err(Status::internal(format!("unexpected etcd reply {reply:?}")));
        };
        // etcd answers the alarms the call changed.
        let changed = before.nospace != after.nospace;
        Ok(tonic::Response::new(epb::AlarmResponse {
            header: self.header_now(),
            alarms: changed.then(|| self.nospace_member()).into_iter().collect(),
        }))
    }

    /// This node's view: `leader` is the leader's id (0 if none is known), `raftIndex` the
    /// last log index, `raftAppliedIndex` the last applied one; `dbSize` and `dbSizeInUse`
    /// are the bytes of the etcd keyspace's stored history (with a per-version overhead:
    /// what `Compact` frees, what `--quota-backend-bytes` bounds), not a file size; `errors`
    /// holds the divergence alarm, if raised, and `NOSPACE` as etcd writes it.
    async fn status(&self, _req: Request<epb::StatusRequest>) -> Reply<epb::StatusResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let (db, nospace) = self
            .node
            .local(|sm| (sm.etcd().history_bytes(), sm.etcd_quota().nospace));
        let db = i64::try_from(db).unwrap_or(i64::MAX);
        let mut errors: Vec<String> = self.node.alarm().into_iter().collect();
        if nospace {
            // etcd lists its alarms as `memberID:<id> alarm:NOSPACE `.
            errors.push(format!("memberID:{} alarm:NOSPACE ", self.node.id()));
        }
        Ok(tonic::Response::new(epb::StatusResponse {
            header: self.header_now(),
            version: VERSION.into(),
            db_size: db,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: db,
            is_learner: m.state == ServerState::Learner,
        }))
    }

    /// fenced keeps its state in a log and snapshots it writes itself (no bbolt file to
    /// defragment): success, as etcd answers, with nothing done (administrators only, as in
    /// etcd).
    async fn defragment(
        &self,
        req: Request<epb::DefragmentRequest>,
    ) -> Reply<epb::DefragmentResponse> {
        self.users.require_admin(&req, "Maintenance.Defragment")?;
        self.node.serving().map_err(status_of)?;
        Ok(tonic::Response::new(epb::DefragmentResponse {
            header: self.header_now(),
        }))
    }

    /// [`Maintenance::hash_kv`] at the current revision (etcd's `Hash` covers its whole
    /// backend file; fenced's etcd keyspace is what the etcd API can see).
    async fn hash(&self, req: Request<epb::HashRequest>) -> Reply<epb::HashResponse> {
        self.users.require_admin(&req, "Maintenance.Hash")?;
        let (revision, hash) = self.hash_at(0).await?;
        Ok(tonic::Response::new(epb::HashResponse {
            header: self.header(revision),
            hash,
        }))
    }

    /// A CRC-32 of the etcd keyspace's history at or below `revision` (0: now), equal on
    /// every member that has applied it with the same compact revision
    /// (`fenced_core::EtcdStore::hash_kv`); administrators only, as in etcd.
    async fn hash_kv(&self, req: Request<epb::HashKvRequest>) -> Reply<epb::HashKvResponse> {
        self.users.require_admin(&req, "Maintenance.HashKV")?;
        let (revision, hash) = self.hash_at(req.get_ref().revision).await?;
        let compact_revision = self.node.local(|sm| sm.etcd().compact_revision());
        Ok(tonic::Response::new(epb::HashKvResponse {
            header: self.header(revision),
            hash,
            compact_revision: super::rev_out(compact_revision),
        }))
    }

    async fn snapshot(&self, _req: Request<epb::SnapshotRequest>) -> Reply<Self::SnapshotStream> {
        Err(unimplemented(
            "Maintenance.Snapshot",
            "use `fenced snapshot save` (fenced.v1.Cluster/SnapshotSave); its file restores \
             with `fenced snapshot restore`, not etcdutl",
        ))
    }

    /// etcd's `MoveLeader` (`etcdctl move-leader ID`) on fenced's leadership hand-off
    /// ([`crate::node::Node::step_down_to`]), to member `targetID` (fenced's member ids are
    /// the operator's, as `MemberList` shows them): etcd's "not leader" on a follower, "bad
    /// leader transferee" for an id that is not another voter; administrators only.
    async fn move_leader(
        &self,
        req: Request<epb::MoveLeaderRequest>,
    ) -> Reply<epb::MoveLeaderResponse> {
        self.users.require_admin(&req, "Maintenance.MoveLeader")?;
        let target = req.get_ref().target_id;
        if target == self.node.id() && self.node.check_leader().is_ok() {
            return Ok(tonic::Response::new(epb::MoveLeaderResponse {
                header: self.header_now(),
            }));
        }
        if self.node.check_leader().is_err() {
            return Err(Status::failed_precondition("etcdserver: not leader"));
        }
        match self.node.step_down_to(Some(target)).await {
            Ok(_) => Ok(tonic::Response::new(epb::MoveLeaderResponse {
                header: self.header_now(),
            })),
            Err(crate::error::NodeError::Invalid(_)) => Err(Status::failed_precondition(
                "etcdserver: bad leader transferee",
            )),
            Err(e) => Err(status_of(e)),
        }
    }

    async fn downgrade(
        &self,
        _req: Request<epb::DowngradeRequest>,
    ) -> Reply<epb::DowngradeResponse> {
        Err(unimplemented(
            "Maintenance.Downgrade",
            "fenced members agree on their apply rules by themselves (docs/operations.md, \
             \"Divergence alarm\", upgrades)",
        ))
    }
}

impl EtcdApi {
    /// `Maintenance.Alarm` GET: `NOSPACE` (if raised), then the members with a raised
    /// divergence alarm as `CORRUPT`; `member_id` 0 and alarm `NONE` filter nothing.
    fn alarm_list(&self, member_id: u64, want: epb::AlarmType) -> Reply<epb::AlarmResponse> {
        let wanted = |kind: epb::AlarmType| want == epb::AlarmType::None || want == kind;
        let member = |id: u64| member_id == 0 || member_id == id;
        let mut alarms = Vec::new();
        let nospace = self.node.local(|sm| sm.etcd_quota().nospace);
        if nospace && wanted(epb::AlarmType::Nospace) && member(self.node.id()) {
            alarms.push(self.nospace_member());
        }
        if wanted(epb::AlarmType::Corrupt) {
            // The cluster-wide alarm first: `etcdctl alarm disarm` clears it before it meets
            // a member's own divergence alarm, which it may not clear.
            if let Some(by) = self
                .node
                .local(|sm| sm.cluster_alarm().map(|a| a.raised_by))
            {
                if member(by) {
                    alarms.push(epb::AlarmMember {
                        member_id: by,
                        alarm: epb::AlarmType::Corrupt as i32,
                    });
                }
            }
            alarms.extend(
                self.node
                    .alarmed_members()
                    .into_iter()
                    .filter(|id| member(*id))
                    .map(|id| epb::AlarmMember {
                        member_id: id,
                        alarm: epb::AlarmType::Corrupt as i32,
                    }),
            );
        }
        Ok(tonic::Response::new(epb::AlarmResponse {
            header: self.header_now(),
            alarms,
        }))
    }

    /// The `NOSPACE` alarm as listed: under this node's member id.
    fn nospace_member(&self) -> epb::AlarmMember {
        epb::AlarmMember {
            member_id: self.node.id(),
            alarm: epb::AlarmType::Nospace as i32,
        }
    }
}

impl EtcdApi {
    /// The keyspace hash at `revision` (0: now) on a linearizable read: (the read's
    /// revision, the hash), or etcd's compacted / future-revision error.
    async fn hash_at(&self, revision: i64) -> Result<(u64, u32), Status> {
        let at = super::rev_in(revision);
        let (now, hash) = self
            .read(false, true, move |sm| {
                (sm.revision(), sm.etcd().hash_kv(at, sm.revision()))
            })
            .await?;
        let hash = hash.map_err(|e| super::etcd_status(&e))?;
        Ok((now, hash))
    }
}
