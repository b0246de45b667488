//! Leadership hand-off: a leader that stops (SIGTERM) or is asked to (`fenced leader
//! step-down`) passes leadership to a caught-up voter instead of leaving the cluster to notice
//! its absence by election timeout.
//!
//! openraft 0.9 has no leader transfer, and a voter refuses to vote while its leader's lease
//! (`--election-timeout-ms`'s MAX since the last heartbeat) runs. So the leader:
//! 1. picks the voter that has caught up furthest and answers ([`Node::step_down`]);
//! 2. stops serving: proposals and reads arriving now wait (the propose and read paths retry
//!    a `NotLeader` without a hint) instead of failing, and the entries in flight commit;
//! 3. waits until that voter holds its whole log, then stops its heartbeats;
//! 4. asks the voter to campaign once the lease has run out on the other voters
//!    (`fenced.raft.v1.Forward/Campaign`, [`Node::campaign`]);
//! 5. steps down when the new leader's first entry reaches it; the waiting requests then go
//!    to the new leader through the usual forwarding.
//!
//! Clients see one lease (450 ms by default) of extra latency and no error, where a killed
//! leader costs the election timeout (750–900 ms) plus the clients' retries. If anything
//! fails, the leader serves again as before.

use std::sync::atomic::Ordering;
use std::time::Duration;

use fenced_raft_types::NodeId;
use openraft::ServerState;
use tokio::time::Instant;

use crate::error::NodeError;
use crate::membership::members;
use crate::node::Node;

/// How long the chosen voter may take to hold the leader's whole log.
const CATCH_UP: Duration = Duration::from_secs(2);
/// Campaigning ends after this (the leader gives up the hand-off sooner).
const CAMPAIGN_FOR: Duration = Duration::from_secs(3);
/// A hand-off that has not produced a new leader by then is abandoned.
const HAND_OFF_FOR: Duration = Duration::from_secs(4);
/// Margin past the lease before the first campaign.
const PAST_LEASE: Duration = Duration::from_millis(30);

/// A completed hand-off.
#[derive(Clone, Debug)]
pub struct HandOff {
    pub from: NodeId,
    pub to: NodeId,
    /// From the call until this node saw the new leader.
    pub took: Duration,
}

impl Node {
    /// Hand leadership to a caught-up voter (module docs). Refused on a non-leader
    /// (`NotLeader` with the leader's address) and when no other voter is reachable.
    pub async fn step_down(&self) -> Result<HandOff, NodeError> {
        self.step_down_to(None).await
    }

    /// [`Node::step_down`] to voter `target` (etcd's `MoveLeader`), if given: refused when
    /// `target` is not a caught-up voter this leader hears from.
    pub async fn step_down_to(&self, target: Option<NodeId>) -> Result<HandOff, NodeError> {
        // A task of its own: a caller that goes away (a client hanging up) must not leave the
        // hand-off half done, with heartbeats off and nothing served.
        let node = self.clone();
        tokio::spawn(async move { node.hand_off(target).await })
            .await
            .map_err(|e| NodeError::Unknown(format!("the hand-off task failed: {e}")))?
    }

    async fn hand_off(&self, target: Option<NodeId>) -> Result<HandOff, NodeError> {
        let started = Instant::now();
        self.check_leader()?;
        let (to, addr) = self.handoff_target(target)?;
        self.inner.handing_off.store(true, Ordering::SeqCst);
        let result = self.hand_to(to, &addr, started).await;
        self.raft().runtime_config().heartbeat(true);
        self.inner.handing_off.store(false, Ordering::SeqCst);
        match &result {
            Ok(h) => tracing::info!(
                to = h.to,
                ms = h.took.as_millis() as u64,
                "handed off leadership"
            ),
            Err(e) => tracing::warn!(to, "leadership hand-off failed: {e}"),
        }
        result
    }

    /// The voter to hand to: reachable, and the furthest caught up.
    fn handoff_target(&self, target: Option<NodeId>) -> Result<(NodeId, String), NodeError> {
        let m = self.raft().metrics().borrow().clone();
        if let Some(t) = target {
            let known = members(&m)
                .into_iter()
                .any(|v| v.voter && v.id == t && t != self.id());
            if !known {
                return Err(NodeError::Invalid(format!(
                    "member {t} is not a voter other than this leader: it cannot take leadership"
                )));
            }
        }
        members(&m)
            .into_iter()
            .filter(|v| target.is_none_or(|t| v.id == t))
            .filter(|v| v.voter && v.id != self.id() && v.matched.is_some())
            .filter(|v| self.gate().heard_within(v.id, Duration::from_secs(1)))
            .max_by_key(|v| (v.matched, std::cmp::Reverse(v.id)))
            .map(|v| (v.id, v.addr))
            .ok_or_else(|| {
                NodeError::Invalid(
                    "no other voter answers this leader: there is nobody to hand leadership to"
                        .into(),
                )
            })
    }

    async fn hand_to(
        &self,
        to: NodeId,
        addr: &str,
        started: Instant,
    ) -> Result<HandOff, NodeError> {
        let raft = self.raft();
        // New work waits from now on; what is in flight commits. Then `to` must hold it all.
        raft.wait(Some(CATCH_UP))
            .metrics(
                |m| {
                    let last = m.last_log_index;
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&to))
                        .is_some_and(|l| l.map(|l| l.index) == last)
                },
                "hand-off target caught up",
            )
            .await
            .map_err(|e| NodeError::Unknown(format!("member {to} did not catch up: {e}")))?;
        raft.runtime_config().heartbeat(false);
        let lease = Duration::from_millis(raft.config().election_timeout_max);
        self.inner
            .forwarder
            .campaign(addr, lease + PAST_LEASE)
            .await?;
        let me = self.id();
        let left = HAND_OFF_FOR.saturating_sub(started.elapsed());
        let m = raft
            .wait(Some(left))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != me),
                "a new leader",
            )
            .await
            .map_err(|e| NodeError::Unknown(format!("no new leader: {e}")))?;
        Ok(HandOff {
            from: me,
            to: m.current_leader.unwrap_or(to),
            took: started.elapsed(),
        })
    }

    /// Asked by the leader `from` (a hand-off): campaign from `after` on until a leader other
    /// than `from` is known, for [`CAMPAIGN_FOR`] at most. Returns at once.
    pub fn campaign(&self, from: NodeId, after: Duration) -> Result<(), NodeError> {
        // A member fenced out by its divergence alarm never leads.
        self.member_serving()?;
        let m = self.raft().metrics().borrow().clone();
        if !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == self.id())
        {
            return Err(NodeError::Invalid(format!(
                "member {} is not a voter",
                self.id()
            )));
        }
        let node = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            let until = Instant::now() + CAMPAIGN_FOR;
            let retry = Duration::from_millis(node.raft().config().election_timeout_min / 2);
            while Instant::now() < until {
                let done = {
                    let m = node.raft().metrics();
                    let m = m.borrow();
                    m.state == ServerState::Leader || m.current_leader.is_some_and(|l| l != from)
                };
                if done {
                    return;
                }
                if let Err(e) = node.raft().trigger().elect().await {
                    tracing::warn!("campaign for a hand-off: {e}");
                    return;
                }
                tokio::time::sleep(retry).await;
            }
        });
        Ok(())
    }
}
