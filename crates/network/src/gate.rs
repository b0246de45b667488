//! Identity checks of node-to-node calls: the cluster id, the member ids and — what keeps a
//! wiped member from voting — the incarnation of each member's data dir (see
//! [`fenced_raft_types::identity`]).
//!
//! Every Raft and forwarding call carries a [`PeerIdentity`]; every Raft reply carries the
//! responder's incarnation. A node pins each peer's incarnation the first time it hears of it
//! (from the peer itself, or from another member's pins, which travel with every call, so
//! followers learn each other's through the leader's heartbeats) and from then on refuses:
//! * a call of another cluster, or addressed to another member id;
//! * a call from a member id the membership does not list, or from another address;
//! * a call or a reply from a member under another incarnation than the pinned one.
//!
//! A node that learns that *it* is the stale incarnation (a peer expected another one, or
//! refused it as such) retires itself for good ([`IdentityStore::retire`]): its data dir is
//! not the one its member acknowledged entries from.
//!
//! A member that bootstraps a new cluster ([`MemberState::Bootstrapping`]) neither votes nor
//! accepts appends until it has pinned *every voter* of the membership. A genuine first start
//! waits for all members to be up; a majority of wiped members restarted with
//! `--initial-cluster-state new` while the members that remember them are down waits for
//! those, which then refuse them — instead of electing a leader among themselves. Learners
//! are not waited for: they never vote, and one being added may not have started yet (a
//! first leader, never called by its peers, stayed `Bootstrapping`; when a learner was added
//! and the leader then lost power, it refused every vote, waiting for the learner, and no
//! leader was ever elected again: found by fenced-sim, seed 802977).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_proto::raft::PeerIdentity;
use fenced_raft_types::identity::{IdentityStore, MemberState, Pin};
use fenced_raft_types::NodeId;
use openraft::{BasicNode, Membership};
use tokio::time::Instant;
use tonic::Status;

/// Metadata key on a refusal that tells the caller it is the stale incarnation.
pub const REFUSED_HEADER: &str = "x-fenced-refused";
const STALE: &str = "stale-incarnation";

/// The identity checks of one node. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PeerGate {
    ids: Arc<IdentityStore>,
    addr: String,
    /// When each member last answered a call of this node (for the leader's quorum checks
    /// before a membership change), on tokio's clock (simulated time when paused).
    heard: Arc<Mutex<HashMap<NodeId, Instant>>>,
}

fn refuse(msg: String) -> Status {
    Status::failed_precondition(msg)
}

impl PeerGate {
    /// The gate of the node with identity `ids`, serving at `addr` (its address in the
    /// membership).
    pub fn new(ids: Arc<IdentityStore>, addr: impl Into<String>) -> PeerGate {
        PeerGate {
            ids,
            addr: addr.into(),
            heard: Arc::default(),
        }
    }

    /// Whether member `id` answered a call of this node within `window`.
    pub fn heard_within(&self, id: NodeId, window: Duration) -> bool {
        self.heard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .is_some_and(|t| t.elapsed() <= window)
    }

    pub fn identity(&self) -> &Arc<IdentityStore> {
        &self.ids
    }

    /// The identity to send with a call to member `to`.
    pub fn envelope(&self, to: NodeId) -> PeerIdentity {
        let me = self.ids.get();
        PeerIdentity {
            cluster_id: me.cluster_id,
            member: me.member_id,
            incarnation: me.incarnation,
            addr: self.addr.clone(),
            to,
            to_incarnation: me.pinned(to).unwrap_or(0),
            known: me.peers.into_iter().collect(),
        }
    }

    /// Check an incoming call against this node's identity and `membership` (as this node
    /// knows it); learn the caller's incarnation and its pins.
    pub fn admit(
        &self,
        from: Option<&PeerIdentity>,
        membership: &Membership<NodeId, BasicNode>,
    ) -> Result<(), Status> {
        self.admit_as(from, membership, true)
    }

    /// [`PeerGate::admit`]; with `members_only` false, a caller missing from `membership` is
    /// admitted too (its address is still checked when it is in it).
    fn admit_as(
        &self,
        from: Option<&PeerIdentity>,
        membership: &Membership<NodeId, BasicNode>,
        members_only: bool,
    ) -> Result<(), Status> {
        let me = self.ids.get();
        if let Some(reason) = self.ids.retired_reason() {
            return Err(refuse(format!(
                "member {} is retired: {reason}",
                me.member_id
            )));
        }
        let Some(from) = from else {
            return Err(refuse(
                "node-to-node call without a sender identity (a fenced from before identity \
                 checks?)"
                    .into(),
            ));
        };
        if from.cluster_id != me.cluster_id {
            return Err(refuse(format!(
                "call from cluster {}, but this node belongs to cluster {}",
                fenced_raft_types::identity::fmt_cluster_id(from.cluster_id),
                fenced_raft_types::identity::fmt_cluster_id(me.cluster_id)
            )));
        }
        if from.to != me.member_id {
            return Err(refuse(format!(
                "call for member {} reached member {} at {} (check the addresses in \
                 --initial-cluster)",
                from.to, me.member_id, self.addr
            )));
        }
        if from.to_incarnation != 0 && from.to_incarnation != me.incarnation {
            let reason = format!(
                "member {} knows member {} as incarnation {}, but this data dir is \
                 incarnation {}: it is not the data dir this member acknowledged entries \
                 from",
                from.member, me.member_id, from.to_incarnation, me.incarnation
            );
            self.ids.retire(&reason);
            return Err(refuse(reason));
        }
        if membership.nodes().next().is_some() {
            match membership.get_node(&from.member) {
                None if !members_only => {}
                None => {
                    return Err(refuse(format!(
                        "member {} is not in the membership this node knows",
                        from.member
                    )))
                }
                Some(n) if n.addr != from.addr => {
                    return Err(refuse(format!(
                        "member {} is at {} in the membership, but this call comes from a \
                         node serving at {}",
                        from.member, n.addr, from.addr
                    )))
                }
                Some(_) => {}
            }
        }
        match self.learn(from.member, from.incarnation)? {
            Pin::Known | Pin::New => {}
            Pin::Conflict { pinned } => {
                let mut s = refuse(format!(
                    "member {} reappeared as incarnation {}, but this node knows it as \
                     {pinned}: its data dir is not the one it acknowledged entries from, \
                     so its votes and acknowledgements cannot count",
                    from.member, from.incarnation
                ));
                s.metadata_mut().insert(
                    REFUSED_HEADER,
                    tonic::metadata::MetadataValue::from_static(STALE),
                );
                return Err(s);
            }
        }
        for (&member, &incarnation) in &from.known {
            if member == from.member || member == me.member_id {
                continue;
            }
            if let Pin::Conflict { pinned } = self.learn(member, incarnation)? {
                tracing::warn!(
                    from = from.member,
                    member,
                    "member {} has pinned member {member} as incarnation {incarnation}, \
                     this node as {pinned}; keeping this node's",
                    from.member
                );
            }
        }
        Ok(())
    }

    /// [`PeerGate::admit`] for a Raft call (vote, append, snapshot): also refused while this
    /// member bootstraps and has not heard from every voter ([`PeerGate::bootstrapped`]).
    pub fn admit_raft(
        &self,
        from: Option<&PeerIdentity>,
        membership: &Membership<NodeId, BasicNode>,
    ) -> Result<(), Status> {
        self.admit_raft_vote(from, membership, true)
    }

    /// [`PeerGate::admit_raft`] for a vote request. `settled`: this node has applied its newest
    /// membership entry (so a quorum committed it). Until then that entry may be cut by the
    /// next leader, and a quorum may still need the voters of the configuration before it: a
    /// caller missing from it is admitted too (its address is still checked when it is in it).
    /// Found by fenced-sim (seed 1507718 with `--faults all`): n2 had appended, uncommitted,
    /// the entry that removed n4 and refused n4's vote requests, so n2 never learned the terms
    /// n4 campaigned in; n1 voted for n4 in each of them, n4 could not win without n2, and n2
    /// always asked n1 for a term n1 had already given n4 — no leader for good.
    pub fn admit_raft_vote(
        &self,
        from: Option<&PeerIdentity>,
        membership: &Membership<NodeId, BasicNode>,
        settled: bool,
    ) -> Result<(), Status> {
        self.admit_as(from, membership, settled)?;
        self.admit_bootstrapped(membership)
    }

    /// [`PeerGate::admit_raft`] for entries from a leader (append, snapshot): the caller need
    /// not be in the membership this node knows. A leader added after this node's last
    /// membership entry — a follower that was down while it joined, a learner that installed
    /// a snapshot taken before it joined — is known only through the entries it sends; to
    /// refuse them would leave this node behind for good. Raft's vote comparison still
    /// rejects a stale leader (a removed one included); votes keep the membership check
    /// once the membership entry is applied ([`PeerGate::admit_raft_vote`]).
    pub fn admit_raft_entries(
        &self,
        from: Option<&PeerIdentity>,
        membership: &Membership<NodeId, BasicNode>,
    ) -> Result<(), Status> {
        self.admit_as(from, membership, false)?;
        self.admit_bootstrapped(membership)
    }

    fn admit_bootstrapped(&self, membership: &Membership<NodeId, BasicNode>) -> Result<(), Status> {
        self.bootstrapped(membership).map_err(|missing| {
            refuse(format!(
                "member {} is starting a new cluster and waits to hear from every voter \
                 before it votes or accepts entries (not yet from {missing:?})",
                self.ids.member_id()
            ))
        })
    }

    /// Whether this member may vote and accept appends: it is past bootstrapping, or it has
    /// now pinned every voter of `membership` (then it records that it is
    /// [`MemberState::Ready`]). Otherwise the members it has not heard of yet.
    pub fn bootstrapped(
        &self,
        membership: &Membership<NodeId, BasicNode>,
    ) -> Result<(), Vec<NodeId>> {
        // `None` once past bootstrapping (every call but the first few: no copy, no scan).
        let missing: Option<Vec<NodeId>> = self.ids.read(|me| {
            (me.state == MemberState::Bootstrapping).then(|| {
                membership
                    .voter_ids()
                    .filter(|id| me.pinned(*id).is_none())
                    .collect()
            })
        });
        let Some(missing) = missing else {
            return Ok(());
        };
        if !missing.is_empty() || membership.voter_ids().next().is_none() {
            return Err(missing);
        }
        if let Err(e) = self.ids.set_state(MemberState::Ready) {
            tracing::error!("recording that this member met every peer: {e}");
            return Err(missing);
        }
        tracing::info!("heard from every voter of the new cluster: voting from now on");
        Ok(())
    }

    fn learn(&self, member: NodeId, incarnation: u64) -> Result<Pin, Status> {
        let pin = self
            .ids
            .learn(member, incarnation)
            .map_err(|e| Status::internal(format!("recording a peer's incarnation: {e}")))?;
        if pin == Pin::New {
            tracing::info!(
                member,
                "pinned member {member} at incarnation {incarnation}"
            );
        }
        Ok(pin)
    }

    /// Check the incarnation a reply from `target` carries.
    pub fn accept_reply(&self, target: NodeId, incarnation: u64) -> Result<(), String> {
        if incarnation == 0 {
            return Err(format!(
                "member {target} answered without its incarnation (a fenced from before \
                 identity checks?)"
            ));
        }
        match self.ids.learn(target, incarnation) {
            Ok(Pin::Known | Pin::New) => {
                self.heard
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(target, Instant::now());
                Ok(())
            }
            Ok(Pin::Conflict { pinned }) => Err(format!(
                "member {target} answered as incarnation {incarnation}, but this node \
                 knows it as {pinned}: its answer does not count"
            )),
            Err(e) => Err(format!("recording member {target}'s incarnation: {e}")),
        }
    }

    /// A peer refused a call of this node: if it said this node is a stale incarnation,
    /// retire.
    pub fn on_refusal(&self, status: &Status) {
        let stale = status
            .metadata()
            .get(REFUSED_HEADER)
            .is_some_and(|v| v.as_bytes() == STALE.as_bytes());
        if stale {
            self.ids.retire(status.message());
        } else if status.code() == tonic::Code::FailedPrecondition {
            tracing::warn!("a peer refused a call: {}", status.message());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_raft_types::identity::{Identity, MemberState};
    use std::collections::BTreeSet;

    fn gate(dir: &std::path::Path, member: NodeId) -> PeerGate {
        let id = Identity::new(7, member, MemberState::Ready);
        fenced_raft_types::identity::store(dir, &id).expect("store");
        PeerGate::new(Arc::new(IdentityStore::new(dir, id)), format!("n{member}"))
    }

    fn membership() -> Membership<NodeId, BasicNode> {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into_iter().collect();
        let nodes: std::collections::BTreeMap<NodeId, BasicNode> = (1..=3)
            .map(|i| (i, BasicNode::new(format!("n{i}"))))
            .collect();
        Membership::new(vec![voters], nodes)
    }

    #[test]
    fn followers_learn_each_other_through_the_leader_and_a_stale_member_retires() {
        let (d1, d2, d3) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let (leader, f2, f3) = (gate(d1.path(), 1), gate(d2.path(), 2), gate(d3.path(), 3));
        let m = membership();
        // The leader hears from 3 (its reply), then calls 2: 2 learns 3's incarnation.
        leader
            .accept_reply(3, f3.identity().incarnation())
            .expect("first reply");
        f2.admit(Some(&leader.envelope(2)), &m).expect("admitted");
        assert_eq!(f2.identity().pinned(3), Some(f3.identity().incarnation()));
        assert_eq!(
            f2.identity().pinned(1),
            Some(leader.identity().incarnation())
        );

        // Member 3 loses its disk: a new incarnation. 2 (a candidate) expects the old one:
        // the wiped node refuses and retires; its own calls are refused as stale.
        let d3b = tempfile::tempdir().expect("tmp");
        let wiped = gate(d3b.path(), 3);
        let refusal = wiped
            .admit(Some(&f2.envelope(3)), &m)
            .expect_err("a vote request for the old incarnation");
        assert_eq!(refusal.code(), tonic::Code::FailedPrecondition);
        assert!(wiped.identity().retired_reason().is_some());

        let d3c = tempfile::tempdir().expect("tmp");
        let wiped_again = gate(d3c.path(), 3);
        let refusal = f2
            .admit(Some(&wiped_again.envelope(2)), &m)
            .expect_err("a call from the new incarnation");
        wiped_again.on_refusal(&refusal);
        assert!(wiped_again.identity().retired_reason().is_some());
        // Its answers do not count either.
        assert!(f2
            .accept_reply(3, wiped_again.identity().incarnation())
            .is_err());

        // Another cluster, an unknown member, another address.
        let d9 = tempfile::tempdir().expect("tmp");
        let stranger = gate(d9.path(), 9);
        assert!(f2.admit(Some(&stranger.envelope(2)), &m).is_err());
        let mut other = leader.envelope(2);
        other.cluster_id += 1;
        assert!(f2.admit(Some(&other), &m).is_err());
        let mut moved = leader.envelope(2);
        moved.addr = "elsewhere".into();
        assert!(f2.admit(Some(&moved), &m).is_err());
        assert!(f2.admit(None, &m).is_err());
    }

    /// Found by the simulator (docs/simulation.md): a learner installed a snapshot taken
    /// before the leader itself joined, then refused every call of that leader as "not in
    /// the membership this node knows", and never caught up.
    #[test]
    fn entries_from_a_leader_newer_than_the_known_membership_are_admitted_but_not_its_votes() {
        let (d1, d5) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let (follower, leader) = (gate(d1.path(), 1), gate(d5.path(), 5));
        // The follower knows {1, 2, 3}; member 5 joined after that and now leads.
        let m = membership();
        assert!(follower.admit_raft(Some(&leader.envelope(1)), &m).is_err());
        follower
            .admit_raft_entries(Some(&leader.envelope(1)), &m)
            .expect("entries from a leader the follower does not know yet");
        assert_eq!(
            follower.identity().pinned(5),
            Some(leader.identity().incarnation())
        );
        // A member it knows at another address is still refused.
        let d2 = tempfile::tempdir().expect("tmp");
        let moved = PeerGate::new(
            Arc::new(IdentityStore::new(
                d2.path(),
                Identity::new(7, 2, MemberState::Ready),
            )),
            "elsewhere".to_owned(),
        );
        assert!(follower
            .admit_raft_entries(Some(&moved.envelope(1)), &m)
            .is_err());
    }

    /// Found by the simulator (seed 1507718): a follower that appended, not yet committed, the
    /// entry removing a member refused that member's vote requests, never learned the terms
    /// it campaigned in, and the cluster elected nobody.
    #[test]
    fn votes_from_a_member_an_unsettled_entry_removed_are_admitted() {
        let (d1, d5) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let (follower, removed) = (gate(d1.path(), 1), gate(d5.path(), 5));
        // The follower's newest membership, {1, 2, 3}, no longer lists member 5.
        let m = membership();
        follower
            .admit_raft_vote(Some(&removed.envelope(1)), &m, false)
            .expect("the entry may yet be cut: 5 may still be a voter a quorum needs");
        let refusal = follower
            .admit_raft_vote(Some(&removed.envelope(1)), &m, true)
            .expect_err("once applied, the removal stands");
        assert!(
            refusal.message().contains("not in the membership"),
            "{refusal:?}"
        );
    }

    #[test]
    fn a_bootstrapping_member_votes_only_after_hearing_from_every_member() {
        let (d1, d2, d3) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let boot = |dir: &std::path::Path, member: NodeId| {
            let id = Identity::new(7, member, MemberState::Bootstrapping);
            fenced_raft_types::identity::store(dir, &id).expect("store");
            PeerGate::new(Arc::new(IdentityStore::new(dir, id)), format!("n{member}"))
        };
        let (n1, n2, n3) = (boot(d1.path(), 1), boot(d2.path(), 2), boot(d3.path(), 3));
        let m = membership();
        // Two wiped members, the third down: they never grant each other a vote.
        for _ in 0..3 {
            assert!(n2.admit_raft(Some(&n1.envelope(2)), &m).is_err());
            assert!(n1.admit_raft(Some(&n2.envelope(1)), &m).is_err());
        }
        assert_eq!(n2.identity().get().state, MemberState::Bootstrapping);
        // The third member shows up: from then on n2 votes, and says so on disk.
        assert!(n2.admit_raft(Some(&n3.envelope(2)), &m).is_ok());
        assert!(n2.admit_raft(Some(&n1.envelope(2)), &m).is_ok());
        let on_disk = fenced_raft_types::identity::load(d2.path())
            .expect("load")
            .expect("present");
        assert_eq!(on_disk.state, MemberState::Ready);
    }

    #[test]
    fn a_bootstrapping_member_does_not_wait_for_a_learner() {
        let (d1, d2) = (
            tempfile::tempdir().expect("tmp"),
            tempfile::tempdir().expect("tmp"),
        );
        let id = Identity::new(7, 1, MemberState::Bootstrapping);
        fenced_raft_types::identity::store(d1.path(), &id).expect("store");
        let n1 = PeerGate::new(Arc::new(IdentityStore::new(d1.path(), id)), "n1");
        let n2 = gate(d2.path(), 2);
        // Voters 1 and 2; learner 3 added but not started (never heard from).
        let voters: BTreeSet<NodeId> = [1, 2].into_iter().collect();
        let nodes: std::collections::BTreeMap<NodeId, BasicNode> = (1..=3)
            .map(|i| (i, BasicNode::new(format!("n{i}"))))
            .collect();
        let m = Membership::new(vec![voters], nodes);
        assert!(n1.admit_raft(Some(&n2.envelope(1)), &m).is_ok());
        assert_eq!(n1.identity().get().state, MemberState::Ready);
    }
}
