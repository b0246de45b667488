//! `holdback`: a new leader's blank reaches one follower only in an append of several
//! entries, and that follower's power goes in that very append (the WAL zero-length search,
//! docs/simulation.md).
//!
//! One episode: the fault arms the network ([`Hold::arm`]), crashes the leader (back within
//! 1.5 s) and waits for a leader of a term newer than any node's at that moment. Then, in the
//! network ([`Hold::judge`]), that leader's `AppendEntries` of its term that carry its blank
//! (the first entry of its term) are lost:
//!
//! * to one follower `F` (drawn then, among the nodes up), while the blank is all they carry —
//!   so `F` gets it only in an append of several entries;
//! * to every other follower, always — so no one else has that blank, and a later leader can
//!   write its own entry at its index.
//!
//! A fenced leader serves nothing before it applied its blank (`Node::leader_term`), so no
//! request ever follows an uncommitted blank: the other entries of that append come before
//! the blank — entries `F` lacked, or the same leader's blank of an earlier term (the new
//! leader crashes 50–600 ms after it took office, back within 300 ms, and often wins again: its
//! log has the blank, the others' do not). Such an append fires only once `F` takes it whole
//! (its `prev_log_id` at or before `F`'s last entry; else it passes, to be refused).
//!
//! Empty appends (heartbeats) and everything else pass. When the append fires, `F`'s power goes
//! at its next sync (that append's: a later page may reach the disk, an earlier one not), the
//! leader is cut off from every node for a while (so that `F`, back within 300 ms, and the
//! others elect a leader of a newer term without those entries), and `F`'s power flickers after
//! its restart ([`crate::flicker::cycles`]: lost again among its first syncs, so that its next
//! start reads what the newer leader wrote over the lost entry). Nothing is lost when no new
//! term starts within the fault's time.
//!
//! Each loss is one the network and the disk faults already have; only their aim is new. Off
//! unless `--faults …,holdback` (not in `all`); a run without it never decodes a message here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use fenced_fs::SimFs;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::raft::AppendEntriesRequest;
use openraft::EntryPayload;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::world::Cluster;

/// Where an episode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Armed: waiting for a leader of a term after `after`.
    Waiting { after: u64 },
    /// `leader`'s blank of `term` is held back from `follower` (alone) and from the others.
    Holding {
        leader: NodeId,
        term: u64,
        follower: NodeId,
    },
    /// The blank reached `follower` with `more` other entries; `follower`'s power goes at its
    /// next sync. The blank still reaches no one else (`follower` may have it again).
    Fired {
        leader: NodeId,
        term: u64,
        follower: NodeId,
        more: usize,
        /// The append's `prev_log_id` index, and the follower's last log index as last seen.
        prev: Option<u64>,
        last: Option<u64>,
    },
}

struct Armed {
    rng: StdRng,
    disks: BTreeMap<NodeId, SimFs>,
    phase: Phase,
    /// Each node's last log index, as the episode last saw it (at most 1 ms ago).
    last: BTreeMap<NodeId, Option<u64>>,
}

/// The network's hold on a new leader's first appends (inert until armed).
#[derive(Default)]
pub struct Hold {
    armed: Mutex<Option<Armed>>,
}

/// What an append carries, as far as the hold cares: the leader's term, and where its blank
/// of that term is among the entries (and how many follow it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carried {
    pub term: u64,
    /// `Some(n)`: the term's blank is carried, with `n` entries after it.
    pub blank_then: Option<usize>,
    /// Entries carried.
    pub entries: usize,
    /// The index of the entry before them (`prev_log_id`).
    pub prev: Option<u64>,
}

impl Carried {
    /// Read an `AppendEntries` message's payload (`None` if it does not decode).
    pub fn of(data: &[u8]) -> Option<Carried> {
        let req: AppendEntriesRequest<TypeConfig> = fenced_network::codec::decode(data).ok()?;
        let term = req.vote.leader_id.term;
        let blank_then = req
            .entries
            .iter()
            .position(|e| {
                e.log_id.leader_id.term == term && matches!(e.payload, EntryPayload::Blank)
            })
            .map(|at| req.entries.len() - at - 1);
        let entries = req.entries.len();
        Some(Carried {
            term,
            blank_then,
            entries,
            prev: req.prev_log_id.map(|l| l.index),
        })
    }
}

impl Hold {
    fn lock(&self) -> MutexGuard<'_, Option<Armed>> {
        self.armed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arm an episode for the first leader of a term after `after` (false if one is armed).
    pub fn arm(&self, seed: u64, disks: BTreeMap<NodeId, SimFs>, after: u64) -> bool {
        let mut a = self.lock();
        if a.is_some() {
            return false;
        }
        *a = Some(Armed {
            rng: StdRng::seed_from_u64(seed),
            disks,
            phase: Phase::Waiting { after },
            last: BTreeMap::new(),
        });
        true
    }

    /// Each node's last log index now.
    pub fn set_last(&self, last: BTreeMap<NodeId, Option<u64>>) {
        if let Some(a) = self.lock().as_mut() {
            a.last = last;
        }
    }

    pub fn disarm(&self) {
        *self.lock() = None;
    }

    pub fn phase(&self) -> Option<Phase> {
        self.lock().as_ref().map(|a| a.phase)
    }

    /// Whether the `AppendEntries` from `from` to `to` with payload `data` is lost; `up` are
    /// the nodes up now (a new episode's follower is drawn among them).
    pub fn judge(&self, from: NodeId, to: NodeId, data: &[u8], up: &BTreeSet<NodeId>) -> bool {
        let mut guard = self.lock();
        let Some(a) = guard.as_mut() else {
            return false;
        };
        let Some(c) = Carried::of(data) else {
            return false;
        };
        let last = a.last.get(&to).copied().flatten();
        match decide(&mut a.phase, &mut a.rng, from, to, c, up, last) {
            Verdict::Pass => false,
            Verdict::Lose => true,
            Verdict::Fire => {
                // The power goes at the sync of this very append.
                if let Some(fs) = a.disks.get(&to) {
                    if !fs.power_due() && !fs.is_dead() {
                        fs.lose_power_at_sync(1);
                    }
                }
                false
            }
        }
    }
}

/// What becomes of one append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    Lose,
    /// It passes, and it is the blank with other entries, to the chosen follower.
    Fire,
}

/// The hold's rule (pure, for the unit tests): what becomes of the append, and the next phase.
/// `last` is the target's last log index: the append fires only if the target takes it whole
/// (its `prev_log_id` at or before that), else it passes, to be refused as a conflict (the
/// leader then sends from further back).
fn decide(
    phase: &mut Phase,
    rng: &mut StdRng,
    from: NodeId,
    to: NodeId,
    c: Carried,
    up: &BTreeSet<NodeId>,
    last: Option<u64>,
) -> Verdict {
    // A newer leader than the one held back (or the first after arming): hold it instead.
    let newer = match *phase {
        Phase::Waiting { after } => c.term > after,
        Phase::Holding { term, .. } => c.term > term,
        Phase::Fired { .. } => false,
    };
    if newer {
        let others: Vec<NodeId> = up.iter().copied().filter(|id| *id != from).collect();
        let Some(follower) = others.choose(rng).copied() else {
            return Verdict::Pass;
        };
        *phase = Phase::Holding {
            leader: from,
            term: c.term,
            follower,
        };
    }
    match *phase {
        Phase::Waiting { .. } => Verdict::Pass,
        Phase::Holding {
            leader,
            term,
            follower,
        } => {
            if from != leader || c.term != term {
                return Verdict::Pass;
            }
            match c.blank_then {
                None => Verdict::Pass,
                Some(_) if to == follower && c.entries > 1 && c.prev > last => Verdict::Pass,
                Some(_) if to == follower && c.entries > 1 => {
                    *phase = Phase::Fired {
                        leader,
                        term,
                        follower,
                        more: c.entries - 1,
                        prev: c.prev,
                        last,
                    };
                    Verdict::Fire
                }
                Some(_) => Verdict::Lose,
            }
        }
        Phase::Fired {
            leader,
            term,
            follower,
            ..
        } => match from == leader && to != follower && c.term == term && c.blank_then.is_some() {
            true => Verdict::Lose,
            false => Verdict::Pass,
        },
    }
}

/// One episode: at most `lasting` plus 3 s of waiting for the append that fires, then the
/// leader's cut and the follower's flickering power.
pub async fn one(cluster: Cluster, mut rng: StdRng, lasting: Duration) {
    let net = cluster.net().clone();
    let ids = cluster.ids();
    let disks: BTreeMap<NodeId, SimFs> = ids
        .iter()
        .filter_map(|id| cluster.fs(*id).map(|f| (*id, f)))
        .collect();
    let after = ids
        .iter()
        .filter_map(|id| cluster.node(*id))
        .map(|n| n.raft().metrics().borrow().current_term)
        .max()
        .unwrap_or(0);
    if !net.hold().arm(rng.gen(), disks, after) {
        return;
    }
    let trace = cluster.trace().clone();
    trace.line(
        "nemesis",
        format!("holds back the blank of the first leader after term {after}"),
    );
    // A new term: the leader crashes (a process crash, its files kept), back after a while —
    // without the blank, which never reaches it. Its log has nothing past the new leader's.
    if let Some(old) = cluster.leader() {
        cluster.crash(old).await;
        let down = Duration::from_millis(rng.gen_range(100..1_500));
        let c = cluster.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(down).await;
            c.start(old).await;
        });
    }
    let until = tokio::time::Instant::now() + lasting + Duration::from_secs(3);
    let mut shown = None;
    let mut crashed_new = false;
    let (leader, term, follower, more, prev, last) = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let last = ids
            .iter()
            .map(|id| {
                let l = cluster
                    .node(*id)
                    .and_then(|n| n.raft().metrics().borrow().last_log_index);
                (*id, l)
            })
            .collect();
        net.hold().set_last(last);
        let phase = net.hold().phase();
        if let Some(Phase::Fired {
            leader,
            term,
            follower,
            more,
            prev,
            last,
        }) = phase
        {
            break (leader, term, follower, more, prev, last);
        }
        if let (Some(p @ Phase::Holding { .. }), true) = (phase, phase != shown) {
            if let Phase::Holding {
                leader,
                term,
                follower,
            } = p
            {
                trace.line(
                    "nemesis",
                    format!("n{leader} leads term {term}: its blank held back from n{follower} alone, from the others always"),
                );
                // The first leader held back: it crashes soon after, back at once or within
                // 300 ms — elected again (its log has the blank, the others' do not) or
                // not, its next append carries more than its blank.
                if !crashed_new {
                    crashed_new = true;
                    let c = cluster.clone();
                    let after = Duration::from_millis(rng.gen_range(50..600));
                    let down = Duration::from_millis(rng.gen_range(0..300));
                    tokio::task::spawn_local(async move {
                        tokio::time::sleep(after).await;
                        c.crash(leader).await;
                        tokio::time::sleep(down).await;
                        c.start(leader).await;
                    });
                }
            }
            shown = phase;
        }
        if tokio::time::Instant::now() >= until {
            net.hold().disarm();
            trace.line("nemesis", "holdback over: no blank reached its follower");
            return;
        }
    };
    let cut_for = lasting.max(Duration::from_millis(1_000));
    trace.line(
        "nemesis",
        format!(
            "n{leader}'s blank of term {term} reaches n{follower} with {more} other entries, \
             after index {prev:?} (its last {last:?}): \
             n{follower} loses power at its next sync, n{leader} is cut off for {cut_for:?}"
        ),
    );
    let links: Vec<(NodeId, NodeId)> = cluster
        .all_ids()
        .into_iter()
        .filter(|id| *id != leader)
        .flat_map(|id| [(leader, id), (id, leader)])
        .collect();
    // Not before the append is delivered (a hop is at most 60 ms in the noise).
    tokio::time::sleep(Duration::from_millis(61)).await;
    net.cut(&links);
    let times = rng.gen_range(2..=4);
    let flicker = tokio::task::spawn_local(crate::flicker::cycles(
        cluster.clone(),
        StdRng::seed_from_u64(rng.gen()),
        follower,
        times,
        lasting,
        true,
    ));
    tokio::time::sleep(cut_for).await;
    net.uncut(&links);
    let _ = flicker.await;
    net.hold().disarm();
    trace.line("nemesis", "holdback over");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carried(term: u64, blank_then: Option<usize>) -> Carried {
        let entries = blank_then.map_or(0, |n| n + 1);
        Carried {
            term,
            blank_then,
            entries,
            prev: None,
        }
    }

    const P: Verdict = Verdict::Pass;
    const L: Verdict = Verdict::Lose;

    #[test]
    fn the_blank_reaches_one_follower_only_with_other_entries() {
        let up: BTreeSet<NodeId> = [1, 2, 3].into();
        let mut rng = StdRng::seed_from_u64(7);
        let mut phase = Phase::Waiting { after: 4 };
        // The old leader's appends pass.
        assert_eq!(
            decide(&mut phase, &mut rng, 1, 2, carried(4, None), &up, None),
            P
        );
        assert_eq!(phase, Phase::Waiting { after: 4 });
        // n2 leads term 5: its blank alone is lost to everyone.
        assert_eq!(
            decide(&mut phase, &mut rng, 2, 1, carried(5, Some(0)), &up, None),
            L
        );
        let Phase::Holding {
            leader: 2,
            term: 5,
            follower,
        } = phase
        else {
            panic!("not holding: {phase:?}");
        };
        let other = if follower == 1 { 3 } else { 1 };
        assert_eq!(
            decide(
                &mut phase,
                &mut rng,
                2,
                follower,
                carried(5, Some(0)),
                &up,
                None
            ),
            L
        );
        // Heartbeats pass; the blank with other entries is lost to the other follower…
        assert_eq!(
            decide(
                &mut phase,
                &mut rng,
                2,
                follower,
                carried(5, None),
                &up,
                None
            ),
            P
        );
        assert_eq!(
            decide(
                &mut phase,
                &mut rng,
                2,
                other,
                carried(5, Some(2)),
                &up,
                None
            ),
            L
        );
        // …and reaches the chosen one — once it takes it whole: an append after an entry
        // it lacks passes, to be refused.
        let mut ahead = carried(5, Some(2));
        ahead.prev = Some(10);
        let p = decide(&mut phase, &mut rng, 2, follower, ahead, &up, Some(8));
        assert_eq!(p, P);
        assert!(matches!(phase, Phase::Holding { .. }));
        let fire = decide(
            &mut phase,
            &mut rng,
            2,
            follower,
            carried(5, Some(2)),
            &up,
            None,
        );
        assert_eq!(fire, Verdict::Fire);
        assert_eq!(
            phase,
            Phase::Fired {
                leader: 2,
                term: 5,
                follower,
                more: 2,
                prev: None,
                last: None,
            }
        );
        // Afterwards the blank still reaches no one else; a newer leader's appends pass.
        let p = decide(
            &mut phase,
            &mut rng,
            2,
            follower,
            carried(5, Some(3)),
            &up,
            None,
        );
        assert_eq!(p, P);
        assert_eq!(
            decide(
                &mut phase,
                &mut rng,
                2,
                other,
                carried(5, Some(3)),
                &up,
                None
            ),
            L
        );
        assert_eq!(
            decide(
                &mut phase,
                &mut rng,
                other,
                follower,
                carried(6, Some(0)),
                &up,
                None
            ),
            P
        );
    }

    #[test]
    fn an_append_of_the_type_config_is_read() {
        let req: AppendEntriesRequest<TypeConfig> = AppendEntriesRequest {
            vote: openraft::Vote::new_committed(3, 2),
            prev_log_id: None,
            entries: vec![
                openraft::Entry {
                    log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 2), 7),
                    payload: EntryPayload::Blank,
                },
                openraft::Entry {
                    log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(3, 2), 8),
                    payload: EntryPayload::Blank,
                },
            ],
            leader_commit: None,
        };
        let data = fenced_network::codec::encode(&req).expect("encode");
        assert_eq!(Carried::of(&data), Some(carried(3, Some(1))));
        // An older term's blank before this term's: two entries, the blank last.
        let mut req = req;
        req.entries[0].log_id = openraft::LogId::new(openraft::CommittedLeaderId::new(2, 2), 7);
        let data = fenced_network::codec::encode(&req).expect("encode");
        let c = Carried::of(&data).expect("decodes");
        assert_eq!(
            (c.term, c.blank_then, c.entries, c.prev),
            (3, Some(0), 2, None)
        );
        assert_eq!(Carried::of(b"junk"), None);
    }
}
