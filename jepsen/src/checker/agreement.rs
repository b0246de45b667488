//! **replica-agreement**: after a fenced run, every member's state — rebuilt offline from its
//! data dir with `fenced debug digest` once the nodes are stopped — has the same digest at one
//! common log index. Replicas that applied the same log must hold the same state, byte for
//! byte; a difference is a determinism bug (or a corrupted replica), which no client-side
//! checker can see until the divergent node serves a read or becomes leader.
//!
//! The index: the largest one every member's data dir can rebuild (at most each member's last
//! durable entry, at least each member's snapshot). Entries past a member's commit index may
//! be an uncommitted tail that the cluster later overwrote elsewhere, so if the members'
//! entries at that index carry different terms, the check falls back to the largest index
//! every member knew committed (by Raft's log matching, equal terms at an index mean equal
//! logs up to it). If no index fits, the verdict is *unchecked*, with the reason — never a
//! pass.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Verdict;

pub const NAME: &str = "replica-agreement";

/// One line of `fenced debug digest` for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeDigest {
    #[serde(default)]
    pub node: String,
    pub index: u64,
    pub digest: String,
    pub term: u64,
    pub snapshot_index: Option<u64>,
    pub last_index: Option<u64>,
    pub committed_index: Option<u64>,
}

/// The largest index every node can rebuild, from each node's digest at its own end:
/// `Err` with the reason if there is none.
pub fn common_index(ends: &[NodeDigest]) -> Result<u64, String> {
    let hi = ends
        .iter()
        .map(|d| d.last_index.unwrap_or(d.index))
        .min()
        .ok_or("no node to compare")?;
    rebuildable(ends, hi)
}

/// The largest index every node knew committed (each node's log is the committed log up to
/// its own commit index, and its snapshot covers committed entries only), if every node can
/// rebuild it.
pub fn committed_index(ends: &[NodeDigest]) -> Result<u64, String> {
    let safe = ends
        .iter()
        .map(|d| {
            d.committed_index
                .unwrap_or(0)
                .max(d.snapshot_index.unwrap_or(0))
        })
        .min()
        .ok_or("no node to compare")?;
    rebuildable(ends, safe)
}

/// `index` if every node can rebuild it (it is at or above every node's snapshot), else the
/// reason there is no common index.
fn rebuildable(ends: &[NodeDigest], index: u64) -> Result<u64, String> {
    let lo = ends
        .iter()
        .map(|d| d.snapshot_index.unwrap_or(0))
        .max()
        .unwrap_or(0);
    if lo > index {
        return Err(no_common(ends, lo, index));
    }
    Ok(index)
}

fn no_common(ends: &[NodeDigest], lo: u64, hi: u64) -> String {
    let each: Vec<String> = ends
        .iter()
        .map(|d| {
            format!(
                "{}: snapshot {:?}, committed {:?}, last {:?}",
                d.node, d.snapshot_index, d.committed_index, d.last_index
            )
        })
        .collect();
    format!(
        "no log index every node can rebuild (need one in {lo}..={hi}): {}",
        each.join("; ")
    )
}

/// Whether the nodes' entries at the index carry the same term (then their logs are equal up
/// to it).
pub fn same_log(at: &[NodeDigest]) -> bool {
    at.windows(2).all(|w| w[0].term == w[1].term)
}

/// The verdict over the digests of every node at one index.
pub fn check(at: &[NodeDigest], basis: &str) -> Verdict {
    let digests: BTreeMap<&str, &str> = at
        .iter()
        .map(|d| (d.node.as_str(), d.digest.as_str()))
        .collect();
    let index = at.first().map(|d| d.index);
    let stats = json!({
        "index": index,
        "basis": basis,
        "digests": digests,
        "nodes": at,
    });
    if at.len() < 2 {
        return unchecked(&format!("{} node(s) to compare", at.len()), stats);
    }
    if at.iter().any(|d| Some(d.index) != index) {
        return unchecked("the digests are of different indexes", stats);
    }
    let agree = at.windows(2).all(|w| w[0].digest == w[1].digest);
    if agree {
        return Verdict::new(NAME, 0, vec![], stats);
    }
    let mut by_digest: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for d in at {
        by_digest
            .entry(d.digest.as_str())
            .or_default()
            .push(d.node.as_str());
    }
    let groups: Vec<String> = by_digest
        .iter()
        .map(|(dg, nodes)| format!("{} → {dg}", nodes.join(",")))
        .collect();
    Verdict::new(
        NAME,
        1,
        vec![format!(
            "replicas disagree at log index {}: {}",
            index.unwrap_or(0),
            groups.join("; ")
        )],
        stats,
    )
}

/// The check could not run: `valid` stays undecided and the reason is in `stats.unchecked`.
pub fn unchecked(why: &str, mut stats: Value) -> Verdict {
    if !stats.is_object() {
        stats = json!({});
    }
    stats["unchecked"] = json!(why);
    Verdict {
        checker: NAME.to_owned(),
        valid: None,
        anomalies: 0,
        examples: vec![format!("unchecked: {why}")],
        stats,
    }
}

/// A verdict stored in a run's `meta.replica_agreement` (written when the run ended, kept
/// when `check` re-runs the history checkers).
pub fn from_meta(v: &Value) -> Option<Verdict> {
    let o = v.as_object()?;
    Some(Verdict {
        checker: NAME.to_owned(),
        valid: o.get("valid").and_then(Value::as_bool),
        anomalies: o.get("anomalies").and_then(Value::as_u64).unwrap_or(0),
        examples: o
            .get("examples")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default(),
        stats: o.get("stats").cloned().unwrap_or(Value::Null),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(node: &str, index: u64, digest: &str, term: u64) -> NodeDigest {
        NodeDigest {
            node: node.into(),
            index,
            digest: digest.into(),
            term,
            snapshot_index: Some(10),
            last_index: Some(index),
            committed_index: Some(index.saturating_sub(1)),
        }
    }

    #[test]
    fn equal_digests_pass_and_differing_ones_fail() {
        let same = [
            d("n1", 50, "00000000000000aa", 3),
            d("n2", 50, "00000000000000aa", 3),
            d("n3", 50, "00000000000000aa", 3),
        ];
        let v = check(&same, "last common index");
        assert_eq!((v.valid, v.anomalies), (Some(true), 0));

        let mut differ = same.clone();
        differ[2].digest = "00000000000000bb".into();
        let v = check(&differ, "last common index");
        assert_eq!((v.valid, v.anomalies), (Some(false), 1));
        assert!(v.examples[0].contains("n3 → 00000000000000bb"), "{v:?}");

        // Through results.json: the run is invalid, and a re-check keeps the verdict.
        let r = crate::report::results(&[], std::slice::from_ref(&v), json!({}));
        assert_eq!(r["valid"], false);
        assert_eq!(r["anomalies"][NAME], 1);
        let again = from_meta(&serde_json::to_value(&v).expect("json")).expect("verdict");
        assert_eq!(again, v);
    }

    #[test]
    fn the_common_index_lies_between_every_snapshot_and_every_end() {
        let mut ends = [
            d("n1", 80, "a", 3),
            d("n2", 75, "b", 3),
            d("n3", 90, "c", 3),
        ];
        assert_eq!(common_index(&ends), Ok(75));
        assert_eq!(committed_index(&ends), Ok(74));
        // n3 compacted past n2's end: nothing to compare, said so (never a pass).
        ends[2].snapshot_index = Some(78);
        let why = common_index(&ends).expect_err("no common index");
        assert!(why.contains("n2") && why.contains("78..=75"), "{why}");
        let v = unchecked(&why, json!({}));
        assert_eq!(v.valid, None);
        let r = crate::report::results(&[], &[v], json!({}));
        assert_eq!(r["anomalies"][NAME], 0);
        assert!(r["checkers"][0]["stats"]["unchecked"].is_string());
    }

    #[test]
    fn one_node_or_mixed_indexes_are_unchecked() {
        assert_eq!(check(&[d("n1", 5, "a", 1)], "x").valid, None);
        assert_eq!(
            check(&[d("n1", 5, "a", 1), d("n2", 6, "a", 1)], "x").valid,
            None
        );
        assert!(!same_log(&[d("n1", 5, "a", 1), d("n2", 5, "a", 2)]));
    }
}
