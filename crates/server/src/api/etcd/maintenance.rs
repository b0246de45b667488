//! `etcdserverpb.Maintenance`: `Status` (what `etcdctl endpoint status` shows) and `Alarm`
//! (fenced's divergence alarm as etcd's `CORRUPT`); the rest answer `UNIMPLEMENTED` saying
//! what to use instead. Both served calls are open to every caller, like `fenced.v1.Cluster/Status`.

use std::pin::Pin;

use fenced_proto::etcd::etcdserverpb as epb;
use openraft::ServerState;
use tokio_stream::Stream;
use tonic::{Request, Status};

use epb::maintenance_server::Maintenance;

use super::{unimplemented, EtcdApi, Reply, VERSION};

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<epb::SnapshotResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Maintenance for EtcdApi {
    type SnapshotStream = SnapshotStream;

    /// `GET` lists the members whose divergence alarm is raised, as this node knows them
    /// (the leader knows every member's), as `CORRUPT`. fenced raises and clears that alarm
    /// itself (docs/operations.md, "Divergence alarm"); it has no `NOSPACE` quota alarm yet.
    async fn alarm(&self, req: Request<epb::AlarmRequest>) -> Reply<epb::AlarmResponse> {
        use epb::alarm_request::AlarmAction;
        let r = req.into_inner();
        match AlarmAction::try_from(r.action) {
            Ok(AlarmAction::Get) => {}
            _ => {
                return Err(Status::unimplemented(
                    "fenced raises and clears its alarms itself: the divergence alarm \
                     (CORRUPT) clears when the member's data is replaced (docs/operations.md, \
                     \"Divergence alarm\"); there is no NOSPACE alarm",
                ))
            }
        }
        let want = epb::AlarmType::try_from(r.alarm).unwrap_or(epb::AlarmType::None);
        let alarms = self
            .node
            .alarmed_members()
            .into_iter()
            .filter(|id| r.member_id == 0 || *id == r.member_id)
            .filter(|_| matches!(want, epb::AlarmType::None | epb::AlarmType::Corrupt))
            .map(|id| epb::AlarmMember {
                member_id: id,
                alarm: epb::AlarmType::Corrupt as i32,
            })
            .collect();
        Ok(tonic::Response::new(epb::AlarmResponse {
            header: self.header_now(),
            alarms,
        }))
    }

    /// This node's view: `leader` is the leader's id (0 if none is known), `raftIndex` the
    /// last log index, `raftAppliedIndex` the last applied one; `dbSize` and `dbSizeInUse`
    /// are the bytes of the etcd keyspace's stored history (with a per-version overhead:
    /// what `Compact` frees), not a file size; `errors` holds the divergence alarm, if raised.
    async fn status(&self, _req: Request<epb::StatusRequest>) -> Reply<epb::StatusResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let db = self.node.local(|sm| sm.etcd().history_bytes());
        let db = i64::try_from(db).unwrap_or(i64::MAX);
        Ok(tonic::Response::new(epb::StatusResponse {
            header: self.header_now(),
            version: VERSION.into(),
            db_size: db,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors: self.node.alarm().into_iter().collect(),
            db_size_in_use: db,
            is_learner: m.state == ServerState::Learner,
        }))
    }

    async fn defragment(
        &self,
        _req: Request<epb::DefragmentRequest>,
    ) -> Reply<epb::DefragmentResponse> {
        Err(unimplemented(
            "Maintenance.Defragment",
            "fenced compacts its log into snapshots by itself; nothing to defragment",
        ))
    }

    async fn hash(&self, _req: Request<epb::HashRequest>) -> Reply<epb::HashResponse> {
        Err(unimplemented(
            "Maintenance.Hash",
            "members compare state digests by themselves (the divergence alarm); \
             `fenced debug digest` prints a stopped member's",
        ))
    }

    async fn hash_kv(&self, _req: Request<epb::HashKvRequest>) -> Reply<epb::HashKvResponse> {
        Err(unimplemented(
            "Maintenance.HashKV",
            "members compare state digests by themselves (the divergence alarm)",
        ))
    }

    async fn snapshot(&self, _req: Request<epb::SnapshotRequest>) -> Reply<Self::SnapshotStream> {
        Err(unimplemented(
            "Maintenance.Snapshot",
            "use `fenced snapshot save` (fenced.v1.Cluster/SnapshotSave); its file restores \
             with `fenced snapshot restore`, not etcdutl",
        ))
    }

    async fn move_leader(
        &self,
        _req: Request<epb::MoveLeaderRequest>,
    ) -> Reply<epb::MoveLeaderResponse> {
        Err(unimplemented(
            "Maintenance.MoveLeader",
            "use `fenced leader step-down` (fenced.v1.Cluster/LeaderStepDown)",
        ))
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
