//! Identity checks of node-to-node calls: the cluster id, the member ids and — what keeps a
//! wiped member from voting — the incarnation of each member's data dir (see
//! `fenced_storage::identity`).
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

use std::sync::Arc;

use fenced_proto::raft::PeerIdentity;
use fenced_storage::identity::{IdentityStore, Pin};
use fenced_storage::NodeId;
use openraft::{BasicNode, Membership};
use tonic::Status;

/// Metadata key on a refusal that tells the caller it is the stale incarnation.
pub const REFUSED_HEADER: &str = "x-fenced-refused";
const STALE: &str = "stale-incarnation";

/// The identity checks of one node. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PeerGate {
    ids: Arc<IdentityStore>,
    addr: String,
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
        }
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
            to_incarnation: if to == me.member_id {
                me.incarnation
            } else {
                me.peers.get(&to).copied().unwrap_or(0)
            },
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
        let me = self.ids.get();
        if let Some(reason) = self.ids.retired().borrow().as_ref() {
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
                "call from cluster {:016x}, but this node belongs to cluster {:016x}",
                from.cluster_id, me.cluster_id
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
                "member {} knows member {} as incarnation {:016x}, but this data dir is \
                 incarnation {:016x}: it is not the data dir this member acknowledged entries \
                 from",
                from.member, me.member_id, from.to_incarnation, me.incarnation
            );
            self.ids.retire(&reason);
            return Err(refuse(reason));
        }
        if membership.nodes().next().is_some() {
            match membership.get_node(&from.member) {
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
                    "member {} reappeared as incarnation {:016x}, but this node knows it as \
                     {pinned:016x}: its data dir is not the one it acknowledged entries from, \
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
                    "member {} has pinned member {member} as incarnation {incarnation:016x}, \
                     this node as {pinned:016x}; keeping this node's",
                    from.member
                );
            }
        }
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
                "pinned member {member} at incarnation {incarnation:016x}"
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
            Ok(Pin::Known | Pin::New) => Ok(()),
            Ok(Pin::Conflict { pinned }) => Err(format!(
                "member {target} answered as incarnation {incarnation:016x}, but this node \
                 knows it as {pinned:016x}: its answer does not count"
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
