//! `fenced.v1.Cluster`: status of this node and of the cluster, membership changes and the
//! leadership hand-off (run on the leader, through any node: `crate::admin`), backups, and
//! the alarms (the cluster-wide `CORRUPT` alarm's list and disarm).

use std::pin::Pin;

use fenced_proto::v1 as pb;
use openraft::ServerState;
use tokio_stream::Stream;
use tonic::{Request, Status};

use fenced_proto::v1::cluster_server::Cluster;

use super::{Api, Reply};
use crate::admin::{AdminDone, AdminOp};
use crate::membership::{members, MemberView};

fn to_pb(views: Vec<MemberView>) -> Vec<pb::Member> {
    views
        .into_iter()
        .map(|v| pb::Member {
            id: v.id,
            addr: v.addr,
            voter: v.voter,
            matched_index: v.matched.unwrap_or(0),
        })
        .collect()
}

fn alarm_pb(a: &fenced_core::CorruptAlarm) -> pb::ClusterAlarm {
    pb::ClusterAlarm {
        index: a.index,
        raised_by: a.raised_by,
        detail: a.detail.clone(),
    }
}

type SnapshotStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Cluster for Api {
    type SnapshotSaveStream = SnapshotStream;

    async fn leader_step_down(
        &self,
        req: Request<pb::LeaderStepDownRequest>,
    ) -> Reply<pb::LeaderStepDownResponse> {
        self.users.require_admin(&req, "Cluster.LeaderStepDown")?;
        match self.node.admin(AdminOp::StepDown).await? {
            AdminDone::HandedOff { from, to, took_ms } => {
                Ok(self.reply(pb::LeaderStepDownResponse { from, to, took_ms }))
            }
            other => Err(Status::internal(format!("step-down answered {other:?}"))),
        }
    }

    async fn snapshot_save(
        &self,
        req: Request<pb::SnapshotSaveRequest>,
    ) -> Reply<Self::SnapshotSaveStream> {
        self.users.require_admin(&req, "Cluster.SnapshotSave")?;
        let (meta, machine) = self.node.backup().await?;
        let rx = crate::backup::snapshot_stream(meta, machine);
        let stream: SnapshotStream = Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx));
        Ok(self.reply(stream))
    }

    /// The list is open to every caller (like `Status` and etcd's alarm `GET`); the disarm
    /// needs an administrator (like etcd's `DEACTIVATE`), and is proposed through the log
    /// (`Node::propose_all` lets it through the alarm it clears).
    async fn alarm(&self, req: Request<pb::AlarmRequest>) -> Reply<pb::AlarmResponse> {
        let disarmed = if req.get_ref().disarm {
            self.users.require_admin(&req, "Cluster.Alarm")?;
            let disarm = fenced_core::Command::ClusterAlarm { raise: None };
            match self.node.propose(None, disarm).await? {
                fenced_core::Response::ClusterAlarm { before, .. } => before.as_ref().map(alarm_pb),
                other => return Err(Status::internal(format!("the disarm answered {other:?}"))),
            }
        } else {
            None
        };
        Ok(self.reply(pb::AlarmResponse {
            cluster: self.node.local(|sm| sm.cluster_alarm().map(alarm_pb)),
            alarmed_members: self.node.alarmed_members(),
            id: self.node.id(),
            disarmed,
        }))
    }

    /// Open to every caller, token or not (like etcd's `Status`): `--join`, health checks
    /// and `fenced member list` read it; it shows no locks or keys.
    async fn status(&self, _req: Request<pb::StatusRequest>) -> Reply<pb::StatusResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let leader_addr = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| n.addr.clone()))
            .unwrap_or_default();
        let state = match m.state {
            ServerState::Leader => "leader",
            ServerState::Follower => "follower",
            ServerState::Candidate => "candidate",
            ServerState::Learner => "learner",
            ServerState::Shutdown => "shutdown",
        };
        Ok(tonic::Response::new(pb::StatusResponse {
            leader: m.current_leader.unwrap_or(0),
            term: m.current_term,
            commit_index: m.last_applied.map_or(0, |l| l.index),
            members: to_pb(members(&m)),
            id: self.node.id(),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            leader_addr,
            state: state.into(),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            revision: self.node.local(|sm| sm.revision()),
            cluster_id: self.node.gate().identity().cluster_id(),
            last_log_index: m.last_log_index.unwrap_or(0),
            alarm: self.node.alarm().unwrap_or_default(),
            semantics: if m.state == ServerState::Leader {
                u32::from(self.node.stamp_semantics().0)
            } else {
                0
            },
            alarmed_members: self.node.alarmed_members(),
            lua_build: self.node.lua_build(),
            lua_build_differs: if m.state == ServerState::Leader {
                self.node.lua_build_differs()
            } else {
                Vec::new()
            },
            cluster_alarm: self.node.local(|sm| sm.cluster_alarm().map(alarm_pb)),
        }))
    }

    async fn member_add(
        &self,
        req: Request<pb::MemberAddRequest>,
    ) -> Reply<pb::MembershipResponse> {
        self.users.require_admin(&req, "Cluster.MemberAdd")?;
        let r = req.into_inner();
        self.members_after(AdminOp::MemberAdd {
            id: r.id,
            addr: r.addr,
            learner: r.learner,
            wait_ms: r.wait_ms,
        })
        .await
    }

    async fn member_promote(
        &self,
        req: Request<pb::MemberPromoteRequest>,
    ) -> Reply<pb::MembershipResponse> {
        self.users.require_admin(&req, "Cluster.MemberPromote")?;
        let id = req.into_inner().id;
        self.members_after(AdminOp::MemberPromote { id }).await
    }

    async fn member_remove(
        &self,
        req: Request<pb::MemberRemoveRequest>,
    ) -> Reply<pb::MembershipResponse> {
        self.users.require_admin(&req, "Cluster.MemberRemove")?;
        let id = req.into_inner().id;
        self.members_after(AdminOp::MemberRemove { id }).await
    }
}

impl Api {
    /// Run a membership change on the leader (through this node if it is a follower) and
    /// answer with the members after it.
    async fn members_after(&self, op: AdminOp) -> Reply<pb::MembershipResponse> {
        match self.node.admin(op).await? {
            AdminDone::Members(views) => Ok(self.reply(pb::MembershipResponse {
                members: to_pb(views),
            })),
            other => Err(Status::internal(format!(
                "a membership change answered {other:?}"
            ))),
        }
    }
}
