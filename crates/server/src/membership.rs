//! Membership changes on the leader, one at a time: add a learner, promote it to voter once it
//! has caught up, remove a member. Each change is checked first and refused with a clear
//! message when it could not work or would leave the cluster without a quorum; a refused
//! change changes nothing.
//!
//! Member ids are never reused: a removed member's id (and a member that lost its data) comes
//! back only under a new id, so a data dir never votes from a log shorter than what its id
//! acknowledged (README, "Losing a disk").

use std::collections::BTreeSet;
use std::time::Duration;

use fenced_raft_types::identity::fmt_cluster_id;
use fenced_raft_types::{NodeId, Raft};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, LogId, RaftMetrics};
use tokio::time::Instant;

use crate::error::NodeError;
use crate::node::Node;

/// A learner is promoted only when at most this many entries behind the leader.
pub const MAX_PROMOTE_LAG: u64 = 100;
/// A voter counts as reachable for the quorum check when it answered the leader within this
/// (heartbeats go out every `--heartbeat-ms`, 50 ms by default).
const REACH_WINDOW: Duration = Duration::from_secs(2);

type Metrics = RaftMetrics<NodeId, BasicNode>;

/// A member as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberView {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    /// The last log index known to be on the member (the leader's own last log index for
    /// itself); `None` if it has not answered the leader yet, or on a non-leader.
    pub matched: Option<u64>,
}

/// The members and, on the leader, how far each has caught up.
pub fn members(m: &Metrics) -> Vec<MemberView> {
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    let replication = m.replication.as_ref();
    membership
        .nodes()
        .map(|(id, n)| MemberView {
            id: *id,
            addr: n.addr.clone(),
            voter: voters.contains(id),
            matched: if *id == m.id {
                m.last_log_index
            } else {
                replication
                    .and_then(|r| r.get(id))
                    .and_then(|l| l.as_ref())
                    .map(|l| l.index)
            },
        })
        .collect()
}

fn refuse(msg: String) -> NodeError {
    NodeError::Invalid(msg)
}

/// How long the ticker waits for its proposal that finishes a joint configuration.
const FINISH_JOINT_WAIT: Duration = Duration::from_secs(1);
/// How long a committed joint configuration stays unchanged before the leader finishes it
/// itself: a `change_membership` call proposes the second entry at once.
const ABANDONED_JOINT: Duration = Duration::from_secs(2);

fn metrics(raft: &Raft) -> Metrics {
    raft.metrics().borrow().clone()
}

fn change_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> NodeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NotLeader {
            leader: f.leader_node.map(|n| n.addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            refuse(format!("membership change refused: {e}"))
        }
        RaftError::Fatal(e) => NodeError::Fatal(e.to_string()),
    }
}

/// Whether the voters `voters` still have a majority that answers the leader: members that
/// answered one of its calls within [`REACH_WINDOW`] (the leader counts itself).
fn quorum_reachable(node: &Node, voters: &BTreeSet<NodeId>) -> Result<(), String> {
    let reachable: Vec<NodeId> = voters
        .iter()
        .copied()
        .filter(|id| *id == node.id() || node.gate().heard_within(*id, REACH_WINDOW))
        .collect();
    let need = voters.len() / 2 + 1;
    if reachable.len() < need {
        return Err(format!(
            "the voters would be {voters:?}, which need {need} reachable to commit, but only \
             {reachable:?} answered the leader in the last {REACH_WINDOW:?}"
        ));
    }
    Ok(())
}

impl Node {
    /// Finish a voter change that a leader change interrupted. openraft changes voters in two
    /// entries, the joint configuration (old and new voters, each needing a majority) and then
    /// the new one; a leader lost between the two leaves the cluster joint for good. A retry
    /// of the command (what the docs tell an operator after an unanswered one) then found the
    /// member "already a voter" (or "not in the cluster") while a quorum still needed a
    /// majority of the old voters too — in a 3-node cluster, losing one member could stop it.
    /// Found by the simulator (docs/simulation.md). Every membership command finishes such a
    /// change first.
    async fn finish_joint(&self) -> Result<(), NodeError> {
        let m = metrics(self.raft());
        let joint = m.membership_config.membership().get_joint_config().clone();
        let Some(goal) = joint.last().filter(|_| joint.len() > 1).cloned() else {
            return Ok(());
        };
        tracing::warn!(
            ?joint,
            "finishing a membership change a leader change left in the joint configuration"
        );
        self.raft()
            .change_membership(ChangeMembers::ReplaceAllVoters(goal), false)
            .await
            .map_err(change_error)?;
        Ok(())
    }

    /// As leader, finish a voter change left joint, without waiting for the operator's next
    /// command (etcd's raft leaves a joint configuration by itself too). openraft's
    /// `change_membership` writes the second entry from its caller's task: a leader lost
    /// between the two, or a caller that gave up (an admin call whose client timed out),
    /// leaves the voters joint (found by fenced-sim, seed 1309 with `--faults
    /// membership,wipes,crashes,partitions,noise`). A committed joint configuration that stays
    /// the same for [`ABANDONED_JOINT`] has no caller driving it. `seen` is the caller's memory
    /// of the joint configuration it saw first and when. Called by the ticker.
    pub(crate) async fn finish_abandoned_joint(&self, seen: &mut Option<(LogId<NodeId>, Instant)>) {
        // Borrowed, not cloned: the ticker runs this often.
        let unsettled = {
            let m = self.raft().metrics();
            let m = m.borrow();
            let stored = &m.membership_config;
            let joint = stored.membership().get_joint_config().len() > 1;
            let committed = stored.log_id().is_some_and(|id| Some(id) <= m.last_applied);
            stored.log_id().filter(|_| joint && committed)
        };
        let Some(at) = unsettled else {
            *seen = None;
            return;
        };
        match seen {
            Some((id, since)) if *id == at => {
                if since.elapsed() < ABANDONED_JOINT {
                    return;
                }
            }
            _ => {
                *seen = Some((at, Instant::now()));
                return;
            }
        }
        // Bounded, so the ticker goes on ticking; the entry stays proposed.
        match tokio::time::timeout(FINISH_JOINT_WAIT, self.finish_joint()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("finishing the joint configuration: {e}"),
            Err(_) => tracing::debug!("finishing the joint configuration: not committed yet"),
        }
    }

    /// Add member `id` at `addr` as a learner. Refused when `id` or `addr` is already a
    /// member, or `id` was a member before (ids are never reused).
    pub async fn member_add(&self, id: NodeId, addr: &str) -> Result<Vec<MemberView>, NodeError> {
        self.check_leader()?;
        self.finish_joint().await?;
        let m = metrics(self.raft());
        if id == 0 {
            return Err(refuse("member ids start at 1".into()));
        }
        if addr.is_empty() {
            return Err(refuse("a member needs an address (HOST:PORT)".into()));
        }
        for v in members(&m) {
            if v.id == id {
                return Err(refuse(format!(
                    "member {id} is already a {} at {}",
                    if v.voter { "voter" } else { "learner" },
                    v.addr
                )));
            }
            if v.addr == addr {
                return Err(refuse(format!(
                    "{addr} is already member {}'s address",
                    v.id
                )));
            }
        }
        if let Some(incarnation) = self.gate().identity().pinned(id) {
            return Err(refuse(format!(
                "member id {id} was used before (incarnation {incarnation}); ids are never \
                 reused, so that a data dir can never vote from a log shorter than what its id \
                 acknowledged: add the new node under a new id"
            )));
        }
        self.raft()
            .add_learner(
                id,
                BasicNode {
                    addr: addr.to_owned(),
                },
                false,
            )
            .await
            .map_err(change_error)?;
        tracing::info!(member = id, addr, "added a learner");
        Ok(members(&metrics(self.raft())))
    }

    /// Wait up to `wait` until learner `id` is at most [`MAX_PROMOTE_LAG`] entries behind,
    /// then promote it.
    pub async fn member_promote_when_caught_up(
        &self,
        id: NodeId,
        wait: Duration,
    ) -> Result<Vec<MemberView>, NodeError> {
        let give_up = Instant::now() + wait;
        loop {
            match self.member_promote(id).await {
                Err(NodeError::Invalid(m)) if m.contains("behind") && Instant::now() < give_up => {}
                other => return other,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Make learner `id` a voter. Refused unless it has caught up to within
    /// [`MAX_PROMOTE_LAG`] entries, and unless the new voter set has a reachable majority.
    pub async fn member_promote(&self, id: NodeId) -> Result<Vec<MemberView>, NodeError> {
        self.check_leader()?;
        self.finish_joint().await?;
        let m = metrics(self.raft());
        let all = members(&m);
        let Some(v) = all.iter().find(|v| v.id == id) else {
            return Err(refuse(format!(
                "member {id} is not in the cluster; add it first (fenced member add)"
            )));
        };
        if v.voter {
            return Err(refuse(format!("member {id} is already a voter")));
        }
        let last = m.last_log_index.unwrap_or(0);
        match v.matched {
            None => {
                return Err(refuse(format!(
                    "learner {id} has not caught up: it is behind and has not answered the \
                     leader yet (is it running, started with --join?)"
                )))
            }
            Some(i) if last.saturating_sub(i) > MAX_PROMOTE_LAG => {
                return Err(refuse(format!(
                    "learner {id} is {} entries behind the leader; promote it once it has \
                     caught up",
                    last - i
                )))
            }
            Some(_) => {}
        }
        let mut voters: BTreeSet<NodeId> = all.iter().filter(|v| v.voter).map(|v| v.id).collect();
        voters.insert(id);
        quorum_reachable(self, &voters).map_err(refuse)?;
        self.raft()
            .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
            .await
            .map_err(change_error)?;
        tracing::info!(member = id, "promoted a learner to voter");
        Ok(members(&metrics(self.raft())))
    }

    /// Remove member `id` (voter or learner). Refused when it would leave no voter, or
    /// voters without a reachable majority.
    pub async fn member_remove(&self, id: NodeId) -> Result<Vec<MemberView>, NodeError> {
        self.check_leader()?;
        self.finish_joint().await?;
        let m = metrics(self.raft());
        let all = members(&m);
        let Some(v) = all.iter().find(|v| v.id == id) else {
            return Err(refuse(format!("member {id} is not in the cluster")));
        };
        let change = if v.voter {
            let voters: BTreeSet<NodeId> = all
                .iter()
                .filter(|v| v.voter && v.id != id)
                .map(|v| v.id)
                .collect();
            if voters.is_empty() {
                return Err(refuse(format!(
                    "member {id} is the last voter: removing it would leave the cluster \
                     without a quorum"
                )));
            }
            quorum_reachable(self, &voters).map_err(refuse)?;
            ChangeMembers::RemoveVoters([id].into())
        } else {
            ChangeMembers::RemoveNodes([id].into())
        };
        self.raft()
            .change_membership(change, false)
            .await
            .map_err(change_error)?;
        // A voter removed with `retain = false` is gone from the nodes too; make sure.
        let after = metrics(self.raft());
        if after.membership_config.membership().get_node(&id).is_some() {
            self.raft()
                .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
                .await
                .map_err(change_error)?;
        }
        tracing::info!(member = id, "removed a member");
        Ok(members(&metrics(self.raft())))
    }
}

/// One node's answer to `fenced serve --join`'s lookup: whether it leads, its cluster, and
/// every member it knows as `(id, address, voter)`.
#[derive(Clone, Debug)]
pub struct JoinAnswer {
    pub leader: bool,
    pub cluster_id: u64,
    pub members: Vec<(NodeId, String, bool)>,
}

/// Why `fenced serve --join` does not start the node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    #[error("--join: no endpoint answered; an empty data dir needs the cluster to join it")]
    NoAnswer,
    #[error(
        "--join: member {id} is not in the membership of cluster {}; run \
         `fenced member add {id} {addr} --learner` first", fmt_cluster_id(*.cluster_id)
    )]
    NotAdded {
        id: NodeId,
        addr: String,
        cluster_id: u64,
    },
    #[error(
        "--join: member {id} is not in the membership of cluster {} any more \
         (removed?); a removed member never comes back under its old id", fmt_cluster_id(*.cluster_id)
    )]
    Removed { id: NodeId, cluster_id: u64 },
    #[error(
        "--join: cluster {} knows member {id} at {known}, but --grpc-addr is {addr}", fmt_cluster_id(*.cluster_id)
    )]
    OtherAddr {
        id: NodeId,
        cluster_id: u64,
        known: String,
        addr: String,
    },
    #[error(
        "--join: member {id} is a voter of cluster {}: a voter that lost its data \
         must not rejoin under its id (it would vote without the entries it acknowledged); \
         remove it and add this node under a new id", fmt_cluster_id(*.cluster_id)
    )]
    VoterLostData { id: NodeId, cluster_id: u64 },
}

/// `fenced serve --join`'s decision for member `id` at `addr`, from the answer of the leader
/// if one answered, else of any member (`None`: nobody answered). `fresh`: the data dir is
/// empty. `Ok(Some(cluster))`: join `cluster` as the learner it was added as;
/// `Ok(None)`: start from the data dir, as any restart does.
///
/// Only a leader's answer says that a member with a data dir was removed: a follower's view
/// of the membership may be behind, or not loaded yet right after its own restart (after a
/// power loss of every node, the first one up answered with an empty membership), or be a
/// learner's that installed a snapshot older than this member. The member then starts from
/// its data dir, as any restart does (found by fenced-sim: refused, or told to try again,
/// the members that the cluster needed for a majority never started).
pub fn join_decision(
    id: NodeId,
    addr: &str,
    fresh: bool,
    answer: Option<&JoinAnswer>,
) -> Result<Option<u64>, JoinError> {
    let Some(a) = answer else {
        return match fresh {
            true => Err(JoinError::NoAnswer),
            false => Ok(None),
        };
    };
    let cluster_id = a.cluster_id;
    match a.members.iter().find(|(m, _, _)| *m == id) {
        None if fresh => Err(JoinError::NotAdded {
            id,
            addr: addr.to_owned(),
            cluster_id,
        }),
        None if !a.leader => Ok(None),
        None => Err(JoinError::Removed { id, cluster_id }),
        Some((_, known, _)) if known != addr => Err(JoinError::OtherAddr {
            id,
            cluster_id,
            known: known.clone(),
            addr: addr.to_owned(),
        }),
        Some((_, _, true)) if fresh => Err(JoinError::VoterLostData { id, cluster_id }),
        // A voter restarting from its data dir: the usual rules.
        Some((_, _, true)) => Ok(None),
        Some(_) => Ok(Some(cluster_id)),
    }
}

#[cfg(test)]
mod join_tests {
    use super::*;

    fn answer(leader: bool, members: &[(NodeId, bool)]) -> JoinAnswer {
        JoinAnswer {
            leader,
            cluster_id: 0xc1,
            members: members
                .iter()
                .map(|(id, voter)| (*id, format!("10.0.0.{id}:7380"), *voter))
                .collect(),
        }
    }

    const ADDR: &str = "10.0.0.4:7380";

    #[test]
    fn a_learner_joins_and_a_voter_restarts_from_its_dir() {
        let a = answer(true, &[(1, true), (4, false)]);
        assert_eq!(join_decision(4, ADDR, true, Some(&a)), Ok(Some(0xc1)));
        let a = answer(false, &[(1, true), (4, true)]);
        assert_eq!(join_decision(4, ADDR, false, Some(&a)), Ok(None));
    }

    #[test]
    fn nobody_answering_stops_only_an_empty_dir() {
        assert_eq!(join_decision(4, ADDR, true, None), Err(JoinError::NoAnswer));
        assert_eq!(join_decision(4, ADDR, false, None), Ok(None));
    }

    #[test]
    fn only_a_leader_says_a_member_with_data_was_removed() {
        // A follower just restarted: its membership not loaded yet (empty), or behind.
        let follower = answer(false, &[]);
        assert_eq!(join_decision(4, ADDR, false, Some(&follower)), Ok(None));
        let leader = answer(true, &[(1, true)]);
        assert!(matches!(
            join_decision(4, ADDR, false, Some(&leader)),
            Err(JoinError::Removed { id: 4, .. })
        ));
        // An empty dir not in the membership: not added yet, whoever answers.
        assert!(matches!(
            join_decision(4, ADDR, true, Some(&follower)),
            Err(JoinError::NotAdded { id: 4, .. })
        ));
    }

    #[test]
    fn a_voter_that_lost_its_data_or_another_address_is_refused() {
        let a = answer(true, &[(1, true), (4, true)]);
        assert!(matches!(
            join_decision(4, ADDR, true, Some(&a)),
            Err(JoinError::VoterLostData { .. })
        ));
        assert!(matches!(
            join_decision(4, "10.9.9.9:7380", false, Some(&a)),
            Err(JoinError::OtherAddr { .. })
        ));
    }
}
