//! `fenced.v1.Cluster`: status of this node and of the cluster.

use fenced_proto::v1 as pb;
use openraft::ServerState;
use tonic::Request;

use fenced_proto::v1::cluster_server::Cluster;

use super::{Api, Reply};

#[tonic::async_trait]
impl Cluster for Api {
    async fn status(&self, _req: Request<pb::StatusRequest>) -> Reply<pb::StatusResponse> {
        let m = self.node.raft().metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members: Vec<pb::Member> = membership
            .nodes()
            .map(|(id, n)| pb::Member {
                id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
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
            members,
            id: self.node.id(),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            leader_addr,
            state: state.into(),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            revision: self.node.local(|sm| sm.revision()),
        }))
    }
}
