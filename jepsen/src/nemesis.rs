//! Nemesis schedules: which fault, on whom, when — drawn from a seeded RNG before the run
//! starts, so the same `--seed` (with the same system, node/client counts, nemeses and time
//! limit) gives the same schedule. One fault is active at a time; between faults the system
//! gets a quiet period to recover.
//!
//! `membership` (fenced clusters only) replaces one voter by a new node: the generator keeps
//! track of the members, so a new node always gets the next id (`n4`, `n5`, … — never one
//! used before), the node removed is one of the current voters, and every later fault that
//! names nodes (kill, pause, partition, clock) draws them from the members of that moment.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::system::System;

/// Every nemesis name accepted by `--nemesis`.
pub const KINDS: &[&str] = &[
    "partition",
    "kill",
    "pause",
    "clock",
    "restart-empty",
    "restart-delayed",
    "membership",
];

/// At most this many new members per run (ids `nodes + 1 ..= nodes + MAX_JOINERS`): every
/// name a schedule can use gets a host before the run starts.
pub const MAX_JOINERS: usize = 20;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// Each `victim` drops every packet from the hosts listed for it.
    Partition {
        variant: String,
        grudge: BTreeMap<String, Vec<String>>,
    },
    /// SIGKILL now, restart (with its data) at the end.
    Kill { targets: Vec<String> },
    /// SIGSTOP now, SIGCONT at the end. Targets are nodes or clients.
    Pause { targets: Vec<String> },
    /// Step the targets' wall clocks by `offset_ms` now, back to true time at the end.
    Clock {
        targets: Vec<String>,
        offset_ms: i64,
    },
    /// SIGKILL now; restart with empty data at the end (`delayed`: the end is at least one
    /// lock TTL later — Redlock's "delayed restart" mitigation).
    RestartEmpty { targets: Vec<String>, delayed: bool },
    /// Replace voter `remove` by a new member `join` (member id `id`, never used before):
    /// at the start, add `join` as a learner, start it with an empty data dir and `--join`,
    /// promote it once it has caught up (the cluster has 4 voters until the end); at the end,
    /// remove `remove` and stop it for good. `dead`: `remove` is SIGKILLed first (its disk
    /// died) and stays down — the replace-a-dead-node procedure of docs/operations.md.
    Membership {
        join: String,
        id: u64,
        remove: String,
        dead: bool,
    },
}

impl Fault {
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Partition { .. } => "partition",
            Fault::Kill { .. } => "kill",
            Fault::Pause { .. } => "pause",
            Fault::Clock { .. } => "clock",
            Fault::RestartEmpty { delayed: false, .. } => "restart-empty",
            Fault::RestartEmpty { delayed: true, .. } => "restart-delayed",
            Fault::Membership { .. } => "membership",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Fault::Partition { variant, grudge } => {
                let g: Vec<String> = grudge
                    .iter()
                    .map(|(v, from)| format!("{v}✗{}", from.join(",")))
                    .collect();
                format!("{variant}: {}", g.join(" "))
            }
            Fault::Kill { targets } => format!("kill {}", targets.join(",")),
            Fault::Pause { targets } => format!("pause {}", targets.join(",")),
            Fault::Clock { targets, offset_ms } => {
                format!("clock {} {offset_ms:+} ms", targets.join(","))
            }
            Fault::RestartEmpty { targets, delayed } => format!(
                "{} {}",
                if *delayed {
                    "restart-delayed"
                } else {
                    "restart-empty"
                },
                targets.join(",")
            ),
            Fault::Membership {
                join, remove, dead, ..
            } => format!(
                "replace {}{remove} by {join}",
                if *dead { "dead " } else { "" }
            ),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scheduled {
    pub start_ms: u64,
    pub end_ms: u64,
    #[serde(flatten)]
    pub fault: Fault,
}

/// What the schedule generator needs to know about the run.
#[derive(Clone, Debug)]
pub struct Topology {
    pub system: System,
    /// Server node names (n1..nN).
    pub nodes: Vec<String>,
    /// Client names (c1..cC).
    pub clients: Vec<String>,
    pub ttl_ms: u64,
    /// Partitions cut clients from servers only (loopback mode: links are proxies).
    pub client_partitions: bool,
    /// The clock nemesis also steps some *clients'* clocks (the limiter workload: the Lua
    /// limiter takes "now" from its client). Off: the draws are those of before the flag.
    pub client_clocks: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NemesisError {
    #[error("unknown nemesis {0:?} (known: {known})", known = KINDS.join(", "))]
    Unknown(String),
    #[error("the {nemesis} nemesis does not apply to {system}: {why}")]
    NotApplicable {
        nemesis: String,
        system: System,
        why: &'static str,
    },
}

/// Parse `--nemesis a,b,c` (`none` or empty: no faults). Every nemesis but `membership`
/// applies to every system: a fenced node restarted with an empty data dir retires itself
/// (see run.rs); Redis and Redlock have no members to change.
pub fn parse(list: &str, system: System) -> Result<Vec<String>, NemesisError> {
    let mut out = Vec::new();
    for k in list.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        if k == "none" {
            continue;
        }
        if !KINDS.contains(&k) {
            return Err(NemesisError::Unknown(k.to_owned()));
        }
        if let Some(why) = system.unsupported_nemesis(k) {
            return Err(NemesisError::NotApplicable {
                nemesis: k.to_owned(),
                system,
                why,
            });
        }
        if !out.iter().any(|o| o == k) {
            out.push(k.to_owned());
        }
    }
    Ok(out)
}

fn pick<'a>(rng: &mut StdRng, v: &'a [String], n: usize) -> Vec<String> {
    let mut c: Vec<&'a String> = v.iter().collect();
    c.shuffle(rng);
    let mut out: Vec<String> = c.into_iter().take(n).cloned().collect();
    out.sort();
    out
}

/// Grudge that cuts every link between the components (each victim drops from all hosts in
/// other components).
fn cut(components: &[Vec<String>]) -> BTreeMap<String, Vec<String>> {
    let mut g = BTreeMap::new();
    for (i, a) in components.iter().enumerate() {
        for v in a {
            let from: Vec<String> = components
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .flat_map(|(_, b)| b.iter().cloned())
                .collect();
            if !from.is_empty() {
                g.insert(v.clone(), from);
            }
        }
    }
    g
}

fn partition(rng: &mut StdRng, t: &Topology) -> Fault {
    let n = t.nodes.len();
    if t.system.has_peers() && !t.client_partitions {
        let mut variants = vec!["isolate", "majority-minority", "bridge"];
        if n >= 5 {
            variants.push("ring");
        }
        let variant = *variants.choose(rng).unwrap_or(&"isolate");
        let mut nodes = t.nodes.clone();
        nodes.shuffle(rng);
        let grudge = match variant {
            "isolate" => cut(&[vec![nodes[0].clone()], nodes[1..].to_vec()]),
            "majority-minority" => {
                let m = n / 2;
                cut(&[nodes[..m].to_vec(), nodes[m..].to_vec()])
            }
            "bridge" => {
                // nodes[0] sees everyone; the two halves of the rest see only their half + it.
                let rest = &nodes[1..];
                let h = rest.len() / 2;
                let (a, b) = rest.split_at(h);
                let mut g = BTreeMap::new();
                for x in a {
                    g.insert(x.clone(), b.to_vec());
                }
                for x in b {
                    g.insert(x.clone(), a.to_vec());
                }
                g
            }
            _ => {
                // ring: each node talks only to its two neighbours.
                let mut g = BTreeMap::new();
                for (i, x) in nodes.iter().enumerate() {
                    let from: Vec<String> = nodes
                        .iter()
                        .enumerate()
                        .filter(|(j, _)| {
                            let d = (i + n - j) % n;
                            d != 0 && d != 1 && d != n - 1
                        })
                        .map(|(_, y)| y.clone())
                        .collect();
                    g.insert(x.clone(), from);
                }
                g
            }
        };
        let mut grudge = grudge;
        for v in grudge.values_mut() {
            v.sort();
        }
        return Fault::Partition {
            variant: variant.to_owned(),
            grudge,
        };
    }
    // Redis / Redlock: servers do not talk to each other; cut clients from servers. The
    // masters split into two sides and each client sees only one side.
    let mut masters = t.nodes.clone();
    masters.shuffle(rng);
    let m = if n == 1 { 1 } else { rng.gen_range(1..n) };
    let (a, b) = masters.split_at(m);
    let mut grudge: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in &t.clients {
        let other = if rng.gen_bool(0.5) { b } else { a };
        for s in other {
            grudge.entry(s.clone()).or_default().push(c.clone());
            grudge.entry(c.clone()).or_default().push(s.clone());
        }
    }
    for v in grudge.values_mut() {
        v.sort();
    }
    Fault::Partition {
        variant: "clients-split".into(),
        grudge,
    }
}

fn some_nodes(rng: &mut StdRng, t: &Topology) -> Vec<String> {
    let n = t.nodes.len();
    let k = if n == 1 {
        1
    } else if rng.gen_bool(0.3) {
        n / 2 + 1 // a majority
    } else {
        rng.gen_range(1..=n / 2)
    };
    pick(rng, &t.nodes, k)
}

/// Some clients, never all of them (their clocks must disagree): one up to half, or (30 %)
/// a bare majority when that leaves one out.
fn some_clients(rng: &mut StdRng, t: &Topology) -> Vec<String> {
    let n = t.clients.len();
    if n < 2 {
        return t.clients.clone();
    }
    let k = if rng.gen_bool(0.3) && n / 2 + 1 < n {
        n / 2 + 1
    } else {
        rng.gen_range(1..=n / 2)
    };
    pick(rng, &t.clients, k)
}

/// Draw the schedule for a run of `limit_ms`.
pub fn generate(seed: u64, kinds: &[String], t: &Topology, limit_ms: u64) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    if kinds.is_empty() {
        return out;
    }
    let mut at = 3_000u64;
    // Leave the last seconds quiet so the system recovers before the run ends.
    let last = limit_ms.saturating_sub(3_000);
    // The members as the schedule changes them (`membership`); every other fault draws its
    // nodes from here. Without `membership` it stays `t`, and so do the draws.
    let mut cur = t.clone();
    let mut next_id = t.nodes.len() as u64 + 1;
    for _ in 0..10_000 {
        let kind = kinds[rng.gen_range(0..kinds.len())].as_str();
        let t = &cur;
        let (fault, dur) = match kind {
            "partition" => (partition(&mut rng, t), rng.gen_range(3_000..=8_000)),
            "kill" => (
                Fault::Kill {
                    targets: some_nodes(&mut rng, t),
                },
                rng.gen_range(2_000..=6_000),
            ),
            "pause" => {
                let targets = if rng.gen_bool(0.5) {
                    pick(&mut rng, &t.clients, 1)
                } else {
                    pick(&mut rng, &t.nodes, 1)
                };
                // Often longer than a lease: the pause that outlives a lock.
                let d = rng.gen_range(t.ttl_ms / 2..=t.ttl_ms * 3).max(500);
                (Fault::Pause { targets }, d)
            }
            "clock" => {
                let mag = rng.gen_range(t.ttl_ms.max(1_000)..=30_000) as i64;
                let offset_ms = if rng.gen_bool(0.75) { mag } else { -mag };
                let mut targets = some_nodes(&mut rng, t);
                if t.client_clocks {
                    targets.extend(some_clients(&mut rng, t));
                }
                (
                    Fault::Clock { targets, offset_ms },
                    rng.gen_range(3_000..=8_000),
                )
            }
            "membership" => {
                if next_id > (cur.nodes.len() + MAX_JOINERS) as u64 || t.nodes.is_empty() {
                    continue;
                }
                let remove = t.nodes[rng.gen_range(0..t.nodes.len())].clone();
                let dead = rng.gen_bool(0.3);
                let id = next_id;
                (
                    Fault::Membership {
                        join: format!("n{id}"),
                        id,
                        remove,
                        dead,
                    },
                    rng.gen_range(3_000..=8_000),
                )
            }
            "restart-empty" => (
                Fault::RestartEmpty {
                    targets: some_nodes(&mut rng, t),
                    delayed: false,
                },
                rng.gen_range(200..=1_000),
            ),
            _ => (
                Fault::RestartEmpty {
                    targets: some_nodes(&mut rng, t),
                    delayed: true,
                },
                t.ttl_ms + 1_000,
            ),
        };
        if at + 500 > last {
            break;
        }
        let end = (at + dur).min(last);
        if let Fault::Membership {
            join, id, remove, ..
        } = &fault
        {
            next_id = id + 1;
            cur.nodes.retain(|n| n != remove);
            cur.nodes.push(join.clone());
        }
        out.push(Scheduled {
            start_ms: at,
            end_ms: end,
            fault,
        });
        at = end + rng.gen_range(2_000..=5_000);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(system: &str, n: usize) -> Topology {
        Topology {
            system: System::parse(system).expect("known system"),
            nodes: (1..=n).map(|i| format!("n{i}")).collect(),
            clients: (1..=4).map(|i| format!("c{i}")).collect(),
            ttl_ms: 2_000,
            client_partitions: false,
            client_clocks: false,
        }
    }

    #[test]
    fn limiter_clock_faults_step_some_clients_too() {
        let k = kinds(&["clock", "kill"]);
        let mut t = topo("fenced", 3);
        t.client_clocks = true;
        let mut clients_stepped = 0;
        for seed in 1..50 {
            let a = generate(seed, &k, &t, 60_000);
            assert_eq!(a, generate(seed, &k, &t, 60_000));
            let mut lua = topo("fenced-lua", 3);
            lua.client_clocks = true;
            assert_eq!(
                a,
                generate(seed, &k, &lua, 60_000),
                "same cluster, same faults"
            );
            for s in &a {
                if let Fault::Clock { targets, .. } = &s.fault {
                    let c = targets.iter().filter(|x| x.starts_with('c')).count();
                    assert!(c >= 1 && c < t.clients.len(), "{targets:?}");
                    assert!(targets.iter().any(|x| x.starts_with('n')));
                    clients_stepped += c;
                }
            }
        }
        assert!(clients_stepped > 0);
        // Without the flag no clock fault names a client.
        for seed in 1..20 {
            for s in generate(seed, &k, &topo("redis", 1), 60_000) {
                if let Fault::Clock { targets, .. } = &s.fault {
                    assert!(targets.iter().all(|x| x.starts_with('n')));
                }
            }
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        let kinds: Vec<String> = KINDS[..4].iter().map(|s| s.to_string()).collect();
        let t = topo("fenced", 5);
        let a = generate(7, &kinds, &t, 60_000);
        assert_eq!(a, generate(7, &kinds, &t, 60_000));
        assert_ne!(a, generate(8, &kinds, &t, 60_000));
        assert!(a.len() >= 4, "{a:?}");
        for w in a.windows(2) {
            assert!(w[0].end_ms < w[1].start_ms, "one fault at a time");
        }
        assert!(a.iter().all(|s| s.end_ms <= 57_000));
    }

    #[test]
    fn partitions_cut_links_symmetrically() {
        let t = topo("fenced", 3);
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..50 {
            let Fault::Partition { grudge, variant } = partition(&mut rng, &t) else {
                panic!("not a partition")
            };
            for (v, from) in &grudge {
                assert!(!from.contains(v), "{variant}: {v} drops itself");
                for f in from {
                    assert!(grudge[f].contains(v), "{variant}: asymmetric {v}/{f}");
                }
            }
        }
        let t = topo("redlock", 5);
        let Fault::Partition { grudge, .. } = partition(&mut rng, &t) else {
            panic!("not a partition")
        };
        assert!(grudge.keys().any(|k| k.starts_with('c')));
    }

    #[test]
    fn fenced_cluster_systems_share_schedules() {
        // Same cluster, same faults: a seed gives fenced, fenced-resp and fenced-setnx the
        // same schedule, so their runs compare client against client.
        let kinds: Vec<String> = KINDS[..4].iter().map(|s| s.to_string()).collect();
        for seed in 1..20 {
            let a = generate(seed, &kinds, &topo("fenced", 3), 30_000);
            assert_eq!(a, generate(seed, &kinds, &topo("fenced-resp", 3), 30_000));
            assert_eq!(a, generate(seed, &kinds, &topo("fenced-setnx", 3), 30_000));
            assert_eq!(a, generate(seed, &kinds, &topo("fenced-lua", 3), 30_000));
            for s in &a {
                if let Fault::Partition { grudge, .. } = &s.fault {
                    assert!(grudge.keys().all(|k| k.starts_with('n')), "node↔node only");
                }
            }
        }
    }

    #[test]
    fn parse_rejects_unknown() {
        assert_eq!(
            parse("partition,kill,none", System::Fenced).expect("ok"),
            vec!["partition", "kill"]
        );
        assert!(parse("meteor", System::Redis).is_err());
        assert!(parse("membership,kill", System::FencedResp).is_ok());
        for s in [System::Redis, System::Redlock] {
            assert!(
                matches!(
                    parse("kill,membership", s),
                    Err(NemesisError::NotApplicable { .. })
                ),
                "{s}: no members to change"
            );
        }
        assert!(parse("kill,meteor", System::Fenced).is_err());
        assert!(parse("partition,kill,pause", System::Etcd).is_ok());
        assert!(parse("clock", System::Etcd).is_err());
        for s in System::ALL.into_iter().filter(|s| !s.is_etcd_cluster()) {
            // A wiped fenced node retires itself (the harness then leaves it down).
            assert!(parse("restart-empty,restart-delayed", s).is_ok(), "{s}");
            assert!(parse("partition,kill,pause,clock", s).is_ok(), "{s}");
        }
    }

    fn kinds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn membership_same_seed_same_schedule() {
        for list in [&["membership"][..], &["membership", "kill"][..]] {
            let k = kinds(list);
            let t = topo("fenced", 3);
            for seed in 1..30 {
                let a = generate(seed, &k, &t, 60_000);
                assert_eq!(a, generate(seed, &k, &t, 60_000), "{list:?} seed {seed}");
                assert_eq!(a, generate(seed, &k, &topo("fenced-resp", 3), 60_000));
                assert!(!a.is_empty());
                for w in a.windows(2) {
                    assert!(w[0].end_ms < w[1].start_ms, "one change at a time");
                }
            }
            assert_ne!(generate(1, &k, &t, 60_000), generate(2, &k, &t, 60_000));
        }
        // Adding the kind leaves the schedules of the others as they were.
        let old = kinds(&KINDS[..6]);
        let t = topo("fenced", 3);
        let a = generate(3, &old, &t, 60_000);
        assert!(a.iter().all(|s| s.fault.kind() != "membership"));
    }

    /// Replays a schedule against the member set it implies: every change keeps 3 voters,
    /// adds a node under an id never seen before, removes a current voter, and leaves at
    /// most one voter down while the cluster has 4; every other fault names current members
    /// only.
    #[test]
    fn membership_never_below_quorum_and_never_reuses_ids() {
        for list in [&["membership"][..], &["membership", "kill", "pause"][..]] {
            let k = kinds(list);
            for n in [3usize, 5] {
                let t = topo("fenced", n);
                for seed in 0..200 {
                    let mut voters: Vec<String> = t.nodes.clone();
                    let mut seen: Vec<String> = t.nodes.clone();
                    let mut last_id = n as u64;
                    let mut changes = 0;
                    for s in generate(seed, &k, &t, 120_000) {
                        match &s.fault {
                            Fault::Membership {
                                join,
                                id,
                                remove,
                                dead,
                            } => {
                                changes += 1;
                                assert_eq!(join, &format!("n{id}"));
                                assert!(*id > last_id, "seed {seed}: id {id} after {last_id}");
                                assert!(!seen.contains(join), "seed {seed}: {join} reused");
                                assert!(voters.contains(remove), "seed {seed}: {remove}");
                                last_id = *id;
                                seen.push(join.clone());
                                // During the change: n + 1 voters, at most the dead one down.
                                let during = voters.len() + 1;
                                let down = usize::from(*dead);
                                let quorum = during / 2 + 1;
                                assert!(during - down >= quorum, "seed {seed}");
                                voters.retain(|v| v != remove);
                                voters.push(join.clone());
                                assert_eq!(voters.len(), n, "seed {seed}: always {n} voters");
                            }
                            Fault::Kill { targets } | Fault::Pause { targets } => {
                                for x in targets.iter().filter(|x| x.starts_with('n')) {
                                    assert!(voters.contains(x), "seed {seed}: {x} not a member");
                                }
                            }
                            f => panic!("unexpected {f:?}"),
                        }
                    }
                    assert!(changes > 0 || list.len() > 1, "seed {seed}: no change");
                    assert!(last_id <= (n + MAX_JOINERS) as u64);
                }
            }
        }
        // A long run stops adding members at the cap instead of running out of hosts.
        let a = generate(1, &kinds(&["membership"]), &topo("fenced", 3), 3_600_000);
        assert_eq!(a.len(), MAX_JOINERS);
    }
}
