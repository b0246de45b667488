//! The apply-semantics gate and the divergence alarm: the leader's periodic check of every
//! member (`fenced.raft.v1.Forward/Check`), modelled on etcd's corruption check
//! (`server/etcdserver/corrupt.go`: members compare hashes at one revision and raise
//! `CORRUPT`).
//!
//! Every [`CHECK_EVERY`] the leader asks every member (voters and learners) for
//! * the newest apply rules ([`Semantics`]) it runs. The leader stamps each new entry with
//!   the newest rules *every* member runs: the oldest any member told it in this term, and,
//!   for a member it has not heard from, the rules of the last entry this node applied (a
//!   leader checked every member before it stamped them; members never downgrade). So before
//!   the first switch, a member that does not answer, or runs code without the check
//!   (`UNIMPLEMENTED`, counted as [`Semantics::REVISIONS`]), keeps the cluster on the old
//!   rules; after it, a member that goes down or a leader change does not flip the rules back
//!   (older rules let Lua show addresses, the very divergence this gate prevents). A member
//!   that answers with older rules does.
//! * the digests of its state at recent log indexes (`fenced_storage::digests`: every
//!   `--digest-interval` indexes, on a copy-on-write clone, off the apply path).
//!
//! At every index for which digests are in, the leader looks for a digest more than half of
//! the members (voters and learners, as etcd counts every member) not already alarmed share.
//! A member whose digest at that index differs has diverged: the leader tells it so in its
//! next check call (`corrupt`), and the member raises its alarm — persisted in its data dir
//! (`fenced_storage::alarm`), so it survives restarts. If the leader itself is the odd one
//! out, it raises the alarm on itself and stops leading. While members yet to answer could
//! still make a majority, nobody is fenced and the leader logs the disagreement; once no
//! majority is possible, the leader proposes the cluster-wide `CORRUPT` alarm
//! (`Command::ClusterAlarm`, replicated): every member then refuses client reads and writes
//! ([`Node::serving`], checked again after a read's barrier) until an operator's disarm
//! (etcd's `Maintenance.Alarm` DEACTIVATE of `CORRUPT`), the one proposal it lets through.
//!
//! An alarmed member serves no client reads or writes ([`NodeError::Corrupt`]: RESP
//! `-CORRUPT`, gRPC `UNAVAILABLE` with `x-fenced-alarm: corrupt`), `/ready` fails, it never
//! campaigns (`runtime_config().elect(false)`, and a hand-off's `Campaign` is refused) and,
//! as a leader, stops proposing and sending heartbeats so that a healthy voter takes over. It
//! goes on replicating and voting: its log is not what is wrong, and the cluster keeps its
//! quorum.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_core::Semantics;
use fenced_fs::Fs;
use fenced_proto::raft::{CheckReply, CorruptVerdict, IndexDigest};
use fenced_raft_types::NodeId;
use fenced_storage::alarm::AlarmRecord;
use fenced_storage::DigestLog;
use openraft::ServerState;
use tokio::sync::watch;

use crate::error::NodeError;
use crate::node::Node;

/// How [`Node::cluster_serving`]'s refusal starts: a [`NodeError::Corrupt`] with it is the
/// cluster's alarm, not one member's ([`NodeError::cluster_corrupt`]; forwarded answers carry
/// the text).
pub const CLUSTER_CORRUPT: &str = "the cluster's CORRUPT alarm is raised";

/// How often the leader checks the members.
pub const CHECK_EVERY: Duration = Duration::from_millis(500);
/// How long one member may take to answer a check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// This member's alarm and, while it leads, the gate's state.
pub struct Alarms {
    /// The node's file system, and its data dir on it.
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    /// Why the alarm is raised (`None`: it is not).
    raised: Mutex<Option<String>>,
    is_raised: AtomicBool,
    /// The newest rules this member tells the leader it runs.
    advertise: Semantics,
    /// The Lua build fingerprint this member tells the leader it runs
    /// ([`fenced_core::kv::lua_build`], or a test hook's).
    lua_build: AtomicU64,
    /// On the leader: the members whose Lua build differs from its own, with theirs, as of
    /// the last check round. While any does, scripts are refused ([`Node::admit`]).
    lua_differs: Mutex<Vec<(NodeId, u64)>>,
    /// The rules the leader stamps on new entries now.
    stamp: AtomicU8,
    /// On the leader: every member, with the rules it said it runs in this term (`None`:
    /// not heard from), as of the last check round. For [`Node::admit`].
    member_rules: Mutex<Vec<fenced_core::gate::MemberRules>>,
    digests: DigestLog,
    /// On the leader: the members whose alarm is raised, as they answered.
    alarmed_members: Mutex<BTreeSet<NodeId>>,
    /// `true` once raised (for watchers: the gRPC health service).
    changes: watch::Sender<bool>,
}

impl Alarms {
    /// This member's alarm as its data dir (`dir` on `fs`) records it. An unreadable alarm
    /// file counts as raised: the member was told its state is wrong.
    /// TEST ONLY: advertise this Lua build fingerprint instead of this build's.
    pub fn advertise_lua_build(&self, fingerprint: u64) {
        self.lua_build.store(fingerprint, Ordering::Relaxed);
    }

    pub fn open(fs: Arc<dyn Fs>, dir: PathBuf, advertise: Semantics, digests: DigestLog) -> Alarms {
        let raised = match fenced_storage::alarm::load_on(&*fs, &dir) {
            Ok(None) => None,
            Ok(Some(rec)) => Some(rec.to_string()),
            Err(e) => Some(format!("the alarm file is unreadable ({e})")),
        };
        if let Some(why) = &raised {
            tracing::error!(
                "divergence alarm raised: {why}. This member serves no client requests until \
                 it is re-seeded (docs/operations.md, 'Divergence alarm')"
            );
        }
        Alarms {
            fs,
            dir,
            is_raised: AtomicBool::new(raised.is_some()),
            changes: watch::Sender::new(raised.is_some()),
            raised: Mutex::new(raised),
            advertise,
            lua_build: AtomicU64::new(fenced_core::kv::lua_build()),
            lua_differs: Mutex::new(Vec::new()),
            stamp: AtomicU8::new(Semantics::REVISIONS.0),
            member_rules: Mutex::new(Vec::new()),
            digests,
            alarmed_members: Mutex::new(BTreeSet::new()),
        }
    }

    fn is_raised(&self) -> bool {
        self.is_raised.load(Ordering::Acquire)
    }

    fn why(&self) -> Option<String> {
        self.raised
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record `rec` durably, then raise. `false` if it was raised already.
    fn raise(&self, rec: &AlarmRecord) -> bool {
        let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
        if raised.is_some() {
            return false;
        }
        if let Err(e) = fenced_storage::alarm::save_on(&*self.fs, &self.dir, rec) {
            tracing::error!("cannot record the divergence alarm in the data dir: {e}");
        }
        *raised = Some(rec.to_string());
        self.is_raised.store(true, Ordering::Release);
        self.changes.send_replace(true);
        true
    }

    fn set_stamp(&self, s: Semantics) -> bool {
        self.stamp.swap(s.0, Ordering::Relaxed) != s.0
    }
}

impl Node {
    /// `Err(Corrupt)` while this member's divergence alarm, or the cluster-wide `CORRUPT`
    /// alarm of the state applied here, is raised: it must not serve client reads or writes
    /// (a disarm of the cluster alarm excepted, [`Node::propose_all`]).
    /// The cluster's alarm is judged first: while it is raised no member serves, so a client
    /// is told so (etcd's `DataLoss`) rather than to try another member.
    pub fn serving(&self) -> Result<(), NodeError> {
        self.cluster_serving()?;
        self.member_serving()
    }

    /// `Err(Corrupt)` while the cluster-wide `CORRUPT` alarm is raised in the state applied
    /// here ([`fenced_core::Command::ClusterAlarm`]).
    pub fn cluster_serving(&self) -> Result<(), NodeError> {
        match self.local(|sm| sm.cluster_alarm().cloned()) {
            None => Ok(()),
            Some(a) => Err(NodeError::Corrupt(format!(
                "{CLUSTER_CORRUPT} (member {} found no majority among the state digests at log \
                 index {}: {}); every member refuses reads and writes until an operator \
                 disarms it (`fenced alarm disarm`, docs/operations.md 'Divergence alarm')",
                a.raised_by, a.index, a.detail
            ))),
        }
    }

    /// `Err(Corrupt)` while this member's own divergence alarm is raised: it must not serve
    /// client requests, lead or campaign.
    pub(crate) fn member_serving(&self) -> Result<(), NodeError> {
        if !self.inner.alarms.is_raised() {
            return Ok(());
        }
        let why = self.inner.alarms.why().unwrap_or_default();
        Err(NodeError::Corrupt(format!(
            "this member is fenced out by its divergence alarm ({why}); use another member"
        )))
    }

    /// Why this member's divergence alarm is raised, if it is.
    pub fn alarm(&self) -> Option<String> {
        self.inner.alarms.why()
    }

    /// Follows whether this member's alarm is raised.
    pub fn alarm_changes(&self) -> watch::Receiver<bool> {
        self.inner.alarms.changes.subscribe()
    }

    /// On the leader: the members whose alarm is raised.
    pub fn alarmed_members(&self) -> Vec<NodeId> {
        let mut out: Vec<NodeId> = self
            .inner
            .alarms
            .alarmed_members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .copied()
            .collect();
        if self.inner.alarms.is_raised() && !out.contains(&self.id()) {
            out.push(self.id());
        }
        out
    }

    /// The rules the leader stamps on the next entry (the gate, module docs).
    pub(crate) fn stamp_semantics(&self) -> Semantics {
        Semantics(self.inner.alarms.stamp.load(Ordering::Relaxed))
    }

    /// On the leader, before proposing `cmd`: `Err(Rejected(NotUpgraded))` — "cluster not
    /// upgraded: member X runs older apply rules …" — if `cmd` needs newer apply rules than
    /// the leader stamps now, i.e. some member runs older code ([`fenced_core::gate::admit`]
    /// decides). An etcd write must pass it on the leader (a follower forwards it first).
    pub fn admit(&self, cmd: &fenced_core::Command) -> Result<(), NodeError> {
        if cmd.runs_script() {
            let differs = self
                .inner
                .alarms
                .lua_differs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .first()
                .copied();
            if let Some((member, theirs)) = differs {
                return Err(NodeError::Rejected(
                    fenced_core::CoreError::LuaBuildDiffers {
                        member,
                        theirs,
                        ours: self.lua_build(),
                    },
                ));
            }
        }
        // Most commands every rule set knows: no lock taken for them.
        if Semantics::needed_by(cmd).0 <= self.stamp_semantics().0 {
            return Ok(());
        }
        let members = self
            .inner
            .alarms
            .member_rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        fenced_core::gate::admit(cmd, self.stamp_semantics(), &members).map_err(NodeError::Rejected)
    }

    /// Stop any campaign of this member once its alarm is raised (at start too).
    pub(crate) fn apply_alarm_to_raft(&self) {
        if self.inner.alarms.is_raised() {
            self.raft().runtime_config().elect(false);
        }
    }

    /// The Lua build fingerprint this member advertises.
    pub fn lua_build(&self) -> u64 {
        self.inner.alarms.lua_build.load(Ordering::Relaxed)
    }

    /// On the leader: the members whose Lua build fingerprint differs from its own.
    pub fn lua_build_differs(&self) -> Vec<NodeId> {
        self.inner
            .alarms
            .lua_differs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, _)| *id)
            .collect()
    }

    /// Answer the leader's check (the `Check` RPC): raise the alarm if it says so.
    pub(crate) fn answer_check(
        &self,
        from: NodeId,
        term: u64,
        corrupt: Option<CorruptVerdict>,
    ) -> CheckReply {
        if let Some(v) = corrupt {
            let (current, leader) = {
                let m = self.raft().metrics();
                let m = m.borrow();
                (m.current_term, m.current_leader)
            };
            if term >= current && leader == Some(from) {
                self.raise_alarm(AlarmRecord {
                    index: v.index,
                    digest: v.digest,
                    majority: v.majority,
                    raised_by: from,
                    raised_at_ms: self.clock().unix_ms(),
                });
            } else {
                tracing::warn!(
                    from,
                    term,
                    "ignoring a divergence verdict from a member that is not the current leader"
                );
            }
        }
        CheckReply {
            semantics: u32::from(self.inner.alarms.advertise.0),
            digests: self
                .inner
                .alarms
                .digests
                .recent()
                .into_iter()
                .map(|(index, digest)| IndexDigest { index, digest })
                .collect(),
            alarmed: self.inner.alarms.is_raised(),
            lua_build: self.lua_build(),
        }
    }

    /// Raise this member's alarm (persisted), stop it from campaigning and, if it leads,
    /// from leading.
    fn raise_alarm(&self, rec: AlarmRecord) {
        if !self.inner.alarms.raise(&rec) {
            return;
        }
        tracing::error!(
            index = rec.index,
            digest = format!("{:016x}", rec.digest),
            majority = format!("{:016x}", rec.majority),
            "DIVERGENCE ALARM: {rec}. This member now serves no client requests and never \
             campaigns; re-seed it from a snapshot (docs/operations.md, 'Divergence alarm')"
        );
        let raft = self.raft();
        raft.runtime_config().elect(false);
        if raft.metrics().borrow().state == ServerState::Leader {
            // `leader_term` now refuses: nothing new is proposed. Without heartbeats the
            // followers' lease runs out and a healthy voter is elected.
            raft.runtime_config().heartbeat(false);
            tracing::error!("stepping down: the leader's own state is the odd one out");
        }
    }

    /// The leader's check, every [`CHECK_EVERY`] (module docs). Runs on every node; acts
    /// only while this node leads.
    pub(crate) async fn checker(self, mut shutdown: watch::Receiver<bool>) {
        let mut round = Round::default();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
            match self.leader_term() {
                Ok(term) => self.check_round(term, &mut round).await,
                Err(_) => {
                    round = Round::default();
                    // What this node stamps in its first moments as leader, before its first
                    // round: the rules the last leader stamped.
                    let floor = floor(self.inner.alarms.digests.applied_semantics());
                    let own = self.inner.alarms.advertise;
                    self.inner
                        .alarms
                        .set_stamp(if own.0 < floor.0 { own } else { floor });
                    self.inner
                        .alarms
                        .alarmed_members
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                    self.inner
                        .alarms
                        .member_rules
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                }
            }
        }
    }

    async fn check_round(&self, term: u64, round: &mut Round) {
        if round.term != term {
            *round = Round {
                term,
                ..Round::default()
            };
        }
        let me = self.id();
        let members: Vec<(NodeId, String)> = {
            let m = self.raft().metrics();
            let m = m.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        };
        let mut digests: BTreeMap<NodeId, Vec<(u64, u64)>> = BTreeMap::new();
        let mut alarmed = BTreeSet::new();
        let mut lua_builds: Vec<(NodeId, u64)> = Vec::new();
        digests.insert(me, self.inner.alarms.digests.recent());
        round.semantics.insert(me, self.inner.alarms.advertise);
        let mut calls = tokio::task::JoinSet::new();
        for (id, addr) in members.iter().filter(|(id, _)| *id != me) {
            let (forwarder, id, addr) = (self.inner.forwarder.clone(), *id, addr.clone());
            calls.spawn(async move {
                let r = forwarder.check(&addr, term, None, CHECK_TIMEOUT).await;
                (id, r)
            });
        }
        while let Some(joined) = calls.join_next().await {
            let Ok((id, answer)) = joined else { continue };
            match answer {
                Ok(r) => {
                    let s = u8::try_from(r.semantics).unwrap_or(u8::MAX);
                    round.semantics.insert(id, Semantics(s));
                    digests.insert(id, r.digests.iter().map(|d| (d.index, d.digest)).collect());
                    lua_builds.push((id, r.lua_build));
                    if r.alarmed {
                        alarmed.insert(id);
                    }
                }
                // Code without the check: it applies the old rules only.
                Err(s) if s.code() == tonic::Code::Unimplemented => {
                    round.semantics.insert(id, Semantics::REVISIONS);
                }
                Err(s) => tracing::debug!(member = id, "check: {s}"),
            }
        }
        round
            .semantics
            .retain(|id, _| members.iter().any(|(m, _)| m == id));
        let ids: Vec<NodeId> = members.iter().map(|(id, _)| *id).collect();
        let floor = floor(self.inner.alarms.digests.applied_semantics());
        let stamp = gate(&ids, &round.semantics, floor);
        *self
            .inner
            .alarms
            .member_rules
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = ids
            .iter()
            .map(|id| (*id, round.semantics.get(id).copied()))
            .collect();
        if self.inner.alarms.set_stamp(stamp) {
            tracing::info!(
                semantics = stamp.0,
                "new entries are now applied by rules {} (the newest every member runs)",
                stamp.0
            );
        }
        *self
            .inner
            .alarms
            .alarmed_members
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = alarmed.clone();

        self.note_lua_builds(lua_builds);

        let voting = members.len() - alarmed.len().min(members.len());
        let (verdicts, undecided, corrupt) = compare(&digests, &alarmed, voting);
        if let Some((index, detail)) = corrupt {
            self.raise_cluster_alarm(index, detail).await;
        }
        for index in undecided {
            if round.warned.insert(index) {
                tracing::warn!(
                    index,
                    ?digests,
                    "members' state digests differ at log index {index} and no majority \
                     agrees yet (some members have not answered): nobody is fenced out"
                );
            }
        }
        for (id, v) in verdicts {
            if alarmed.contains(&id) {
                continue;
            }
            tracing::error!(
                member = id,
                index = v.index,
                digest = format!("{:016x}", v.digest),
                majority = format!("{:016x}", v.majority),
                "member {id}'s state diverged from the majority's at log index {}: raising \
                 its divergence alarm",
                v.index
            );
            if id == me {
                self.raise_alarm(AlarmRecord {
                    index: v.index,
                    digest: v.digest,
                    majority: v.majority,
                    raised_by: me,
                    raised_at_ms: self.clock().unix_ms(),
                });
                return;
            }
            let Some((_, addr)) = members.iter().find(|(m, _)| *m == id) else {
                continue;
            };
            if let Err(s) = self
                .inner
                .forwarder
                .check(addr, term, Some(v), CHECK_TIMEOUT)
                .await
            {
                tracing::warn!(member = id, "telling it of its divergence: {s}");
            }
        }
    }
}

impl Node {
    /// On the leader, after a check round: the members (heard from, running code that
    /// advertises it) whose Lua build fingerprint differs from this one's. Logged when the
    /// set changes; scripts are refused while it is not empty ([`Node::admit`]).
    fn note_lua_builds(&self, heard: Vec<(NodeId, u64)>) {
        let ours = self.lua_build();
        let differs: Vec<(NodeId, u64)> = heard
            .into_iter()
            .filter(|(_, theirs)| *theirs != 0 && *theirs != ours)
            .collect();
        let mut known = self
            .inner
            .alarms
            .lua_differs
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *known != differs {
            if differs.is_empty() {
                tracing::info!("every member runs this Lua build again: scripts are accepted");
            } else {
                tracing::error!(
                    ?differs,
                    ours = format!("{ours:016x}"),
                    "members run another Lua build (fingerprint differs from the leader's): \
                     scripts are refused until every member runs the same build \
                     (docs/operations.md, 'Scripts')"
                );
            }
            *known = differs;
        }
    }
}

impl Node {
    /// On the leader: propose the cluster-wide `CORRUPT` alarm (once: not while the state
    /// applied here has it), for the digests at `index` that no majority shares.
    async fn raise_cluster_alarm(&self, index: u64, detail: String) {
        if self.local(|sm| sm.cluster_alarm().is_some()) {
            return;
        }
        tracing::error!(
            index,
            "CLUSTER CORRUPT ALARM: the members' state digests at log index {index} have no \
             majority among the members not already alarmed ({detail}); raising the \
             cluster-wide CORRUPT alarm: every member refuses reads and writes until an \
             operator disarms it (docs/operations.md, 'Divergence alarm')"
        );
        let cmd = fenced_core::Command::ClusterAlarm {
            raise: Some(fenced_core::CorruptAlarm {
                index,
                raised_by: self.id(),
                detail,
            }),
        };
        if let Err(e) = self.admit(&cmd) {
            tracing::error!("cannot raise the cluster alarm: {e}");
            return;
        }
        if let Err(e) = self.propose_local(None, cmd).await {
            tracing::error!("proposing the cluster alarm: {e}");
        }
    }
}

/// What the leader learnt in this term.
#[derive(Default)]
struct Round {
    term: u64,
    /// The rules each member said it runs.
    semantics: HashMap<NodeId, Semantics>,
    /// Indexes already logged as undecided.
    warned: BTreeSet<u64>,
}

/// The rules to stamp: the oldest any member runs, counting `floor` (the rules of the last
/// applied entry) for a member not heard from. Never [`Semantics::INDEX_TOKENS`] (only
/// entries read back from the first log format have it).
fn gate(members: &[NodeId], known: &HashMap<NodeId, Semantics>, floor: Semantics) -> Semantics {
    let mut stamp = Semantics::NEWEST;
    for id in members {
        let s = known.get(id).copied().unwrap_or(floor);
        if s.0 < stamp.0 {
            stamp = s;
        }
    }
    self::floor(stamp)
}

/// `s` as a rule set a leader may stamp: [`Semantics::REVISIONS`] for anything older than
/// [`Semantics::DETERMINISTIC`] or newer than this build knows.
fn floor(s: Semantics) -> Semantics {
    if s.0 >= Semantics::DETERMINISTIC.0 && s.supported() {
        s
    } else {
        Semantics::REVISIONS
    }
}

/// The verdicts of [`compare`]: per member, the verdict; the indexes still undecided; the
/// first index with no possible majority, and what each member had there.
type Compared = (
    Vec<(NodeId, CorruptVerdict)>,
    Vec<u64>,
    Option<(u64, String)>,
);

/// Compare the digests at equal indexes, counting only the `voting` members not already
/// `alarmed` (an alarmed member's state is known wrong: its digest neither makes nor breaks
/// a majority). Returns, per member whose digest differs from one more than half of the
/// voting members share, the verdict (at the lowest such index); the indexes at which
/// digests differ with no such majority yet, but members that have not answered could
/// still make one; and the first index at which no digest can reach a majority even if
/// every member yet to answer agreed with the commonest one — the cluster-wide `CORRUPT`
/// alarm, with each member's digest there.
fn compare(
    digests: &BTreeMap<NodeId, Vec<(u64, u64)>>,
    alarmed: &BTreeSet<NodeId>,
    voting: usize,
) -> Compared {
    let mut at: BTreeMap<u64, Vec<(NodeId, u64)>> = BTreeMap::new();
    for (id, list) in digests {
        if alarmed.contains(id) {
            continue;
        }
        for (index, digest) in list {
            at.entry(*index).or_default().push((*id, *digest));
        }
    }
    let mut verdicts: BTreeMap<NodeId, CorruptVerdict> = BTreeMap::new();
    let mut undecided = Vec::new();
    let mut corrupt = None;
    for (index, found) in at {
        let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
        for (_, d) in &found {
            *counts.entry(*d).or_default() += 1;
        }
        if counts.len() < 2 {
            continue;
        }
        let Some((&majority, _)) = counts.iter().find(|(_, n)| **n * 2 > voting) else {
            let most = counts.values().copied().max().unwrap_or(0);
            let missing = voting.saturating_sub(found.len());
            if (most + missing) * 2 <= voting {
                if corrupt.is_none() {
                    let detail = found
                        .iter()
                        .map(|(id, d)| format!("member {id}: {d:016x}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    corrupt = Some((index, detail));
                }
            } else {
                undecided.push(index);
            }
            continue;
        };
        for (id, digest) in found {
            if digest != majority {
                verdicts.entry(id).or_insert(CorruptVerdict {
                    index,
                    digest,
                    majority,
                });
            }
        }
    }
    (verdicts.into_iter().collect(), undecided, corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_waits_for_every_member_and_takes_the_oldest_rules() {
        let all = [1, 2, 3];
        let old = Semantics::REVISIONS;
        let mut known = HashMap::new();
        known.insert(1, Semantics::DETERMINISTIC);
        known.insert(2, Semantics::DETERMINISTIC);
        // Member 3 has not answered and the log is on the old rules: the old rules.
        assert_eq!(gate(&all, &known, old), Semantics::REVISIONS);
        known.insert(3, Semantics::REVISIONS);
        assert_eq!(gate(&all, &known, old), Semantics::REVISIONS);
        known.insert(3, Semantics::DETERMINISTIC);
        assert_eq!(gate(&all, &known, old), Semantics::DETERMINISTIC);
        // A learner counts too.
        assert_eq!(gate(&[1, 2, 3, 4], &known, old), Semantics::REVISIONS);
        // Once the log is on the new rules, a member not heard from does not go back ...
        let new = Semantics::DETERMINISTIC;
        assert_eq!(gate(&[1, 2, 3, 4], &known, new), Semantics::DETERMINISTIC);
        // ... but one that says it runs older rules does.
        known.insert(4, Semantics::INDEX_TOKENS);
        assert_eq!(gate(&[1, 2, 3, 4], &known, new), Semantics::REVISIONS);
        // Rules this build does not know are never stamped.
        assert_eq!(floor(Semantics(200)), Semantics::REVISIONS);
    }

    #[test]
    fn a_member_unlike_the_majority_at_an_index_is_named() {
        let mut d = BTreeMap::new();
        d.insert(1, vec![(10, 7), (20, 8)]);
        d.insert(2, vec![(10, 7), (20, 9)]);
        d.insert(3, vec![(10, 7)]);
        let none = BTreeSet::new();
        // At 20 only two answered and they differ: no majority of three yet.
        let (v, undecided, corrupt) = compare(&d, &none, 3);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(undecided, vec![20]);
        assert_eq!(corrupt, None);
        d.insert(3, vec![(10, 7), (20, 8)]);
        let (v, undecided, corrupt) = compare(&d, &none, 3);
        assert!(undecided.is_empty());
        assert_eq!(corrupt, None);
        assert_eq!(v.len(), 1);
        let (id, verdict) = &v[0];
        assert_eq!(*id, 2);
        assert_eq!(
            (verdict.index, verdict.digest, verdict.majority),
            (20, 9, 8)
        );
        // Equal everywhere: nothing.
        d.insert(2, vec![(10, 7), (20, 8)]);
        assert_eq!(compare(&d, &none, 3), (vec![], vec![], None));
    }

    /// Issue 39: member 3 is alarmed, and members 1 and 2 disagree — no majority among the
    /// members left, whatever member 3's digest: the cluster-wide alarm. Three distinct
    /// digests among three members: the same.
    #[test]
    fn no_majority_among_the_members_not_alarmed_is_corrupt() {
        let mut d = BTreeMap::new();
        d.insert(1, vec![(30, 7)]);
        d.insert(2, vec![(30, 8)]);
        // The alarmed member shares member 1's digest: it does not vote.
        d.insert(3, vec![(30, 7)]);
        let alarmed: BTreeSet<NodeId> = [3].into_iter().collect();
        let (v, undecided, corrupt) = compare(&d, &alarmed, 2);
        assert!(
            v.is_empty(),
            "nobody fenced out by an alarmed member's vote: {v:?}"
        );
        assert!(undecided.is_empty());
        let (index, detail) = corrupt.expect("no majority: CORRUPT");
        assert_eq!(index, 30);
        assert!(
            detail.contains("member 1") && detail.contains("member 2"),
            "{detail}"
        );
        // Three members, three digests.
        d.insert(3, vec![(30, 9)]);
        let (_, _, corrupt) = compare(&d, &BTreeSet::new(), 3);
        assert_eq!(corrupt.map(|c| c.0), Some(30));
        // Member 2 has not answered: 1 and 3 differ, but 2 could side with either.
        d.remove(&2);
        let (_, undecided, corrupt) = compare(&d, &BTreeSet::new(), 3);
        assert_eq!((undecided, corrupt), (vec![30], None));
    }
}
