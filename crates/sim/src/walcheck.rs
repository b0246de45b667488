//! `log-terms`: the log a node starts from never has an entry of an older term after one of a
//! newer term. Raft's logs only ever grow by a leader's entries after a matching one, and
//! conflicting tails are cut before anything is written after them, so a node's log read in
//! index order has terms that never go down. A log that does not is one whose recovery kept
//! records it should have cut: the WAL's zero-length bug (fixed in ffb7a18), where records that
//! reached the disk after a lost one came back once a new leader's entry of the same size was
//! written over the lost one.
//!
//! After every start of a node, its log is read here as its files are on its simulated disk —
//! the segments in name order, each record's length and sealed entry, stopping at the first
//! record that is not whole — and the terms are checked. The read changes nothing (no file is
//! opened for writing), and it runs right after the node's recovery, before the node is on the
//! network.
//!
//! It also counts, after every power loss, the logs left with bytes after a zero record
//! length (records that reached the disk while an earlier record's page did not): the state
//! the bug needed, whatever the recovery then makes of it. The count is in the verdict's
//! details, not in the trace.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use fenced_fs::Fs;
use fenced_jepsen::checker::Verdict;
use fenced_raft_types::NodeId;
use openraft::LogId;
use serde_json::json;

/// A log segment's header: magic, file version, reserved (`fenced_storage::wal`).
const HEADER: usize = 16;

/// A node's log as its files hold it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    /// `(index, term)` of each whole record, in file order.
    pub ids: LogIds,
    /// A zero record length followed by bytes that are not zero: `(segment, zero at, data at)`.
    pub stale: Option<(String, usize, usize)>,
}

/// Read the log of the data dir `data_dir` on `fs`, changing nothing.
pub fn scan(fs: &dyn Fs, data_dir: &Path) -> Scan {
    let dir = data_dir.join(fenced_storage::wal::DIR);
    let mut out = Scan::default();
    let Ok(listing) = fs.read_dir(&dir) else {
        return out;
    };
    let mut names: Vec<String> = listing
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.ends_with(".wal"))
        .collect();
    names.sort();
    for name in names {
        let Ok(bytes) = fs.read(&dir.join(&name)) else {
            continue;
        };
        let (ids, stale) = records(&bytes);
        out.ids.extend(ids);
        if out.stale.is_none() {
            out.stale = stale.map(|(zero, data)| (name.clone(), zero, data));
        }
    }
    out
}

/// `(index, term)` of a log's entries.
type LogIds = Vec<(u64, u64)>;

/// The log ids of one segment's whole records, and where a zero length is followed by data.
fn records(bytes: &[u8]) -> (LogIds, Option<(usize, usize)>) {
    let mut ids = Vec::new();
    let mut at = HEADER;
    while let Some(len) = bytes.get(at..at + 4) {
        let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len == 0 {
            let stale = bytes[at..]
                .iter()
                .position(|b| *b != 0)
                .map(|d| (at, at + d));
            return (ids, stale);
        }
        let Some(record) = bytes.get(at + 4..at + 4 + len) else {
            break;
        };
        let Ok((_, payload)) = fenced_storage::frame::unseal_versioned("log entry", record) else {
            break;
        };
        // An entry starts with its log id (bincode, as the storage encodes it).
        let Ok(id) = bincode::deserialize::<LogId<NodeId>>(payload) else {
            break;
        };
        ids.push((id.index, id.leader_id.term));
        at += 4 + len;
    }
    (ids, None)
}

/// Where the terms of `ids` (in log order) go down, if they do.
pub fn terms_go_down(ids: &[(u64, u64)]) -> Option<String> {
    ids.windows(2).find(|w| w[1].1 < w[0].1).map(|w| {
        format!(
            "entry {} of term {} after entry {} of term {}",
            w[1].0, w[1].1, w[0].0, w[0].1
        )
    })
}

/// What the checks found over a run (shared by the cluster's clones).
#[derive(Clone, Debug, Default)]
pub struct LogTerms {
    inner: Rc<RefCell<Found>>,
}

#[derive(Debug, Default)]
struct Found {
    anomalies: Vec<String>,
    starts: u64,
    /// Power losses that left bytes after a zero record length.
    stale_after_loss: u64,
}

impl LogTerms {
    /// Node `id` started from `data_dir` on `fs`: its log's terms must not go down.
    pub fn started(&self, id: u64, fs: &dyn Fs, data_dir: &Path) -> Option<String> {
        let sc = scan(fs, data_dir);
        let found = terms_go_down(&sc.ids)
            .map(|why| format!("n{id} started from a log whose terms go down: {why}"));
        let mut f = self.inner.borrow_mut();
        f.starts += 1;
        if let Some(why) = &found {
            f.anomalies.push(why.clone());
        }
        found
    }

    /// Node `id`'s machine lost power: count a log left with bytes after a zero length.
    pub fn lost_power(&self, fs: &dyn Fs, data_dir: &Path) {
        let sc = scan(fs, data_dir);
        if sc.stale.is_some() {
            self.inner.borrow_mut().stale_after_loss += 1;
        }
    }

    pub fn verdict(&self) -> Verdict {
        let f = self.inner.borrow();
        Verdict::new(
            "log-terms",
            f.anomalies.len() as u64,
            f.anomalies.clone(),
            json!({ "starts": f.starts, "stale_after_power_loss": f.stale_after_loss }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_fs::{Mode, SimFs};
    use fenced_raft_types::TypeConfig;
    use openraft::{CommittedLeaderId, Entry, EntryPayload};
    use std::path::PathBuf;
    use std::sync::Arc;

    fn record(term: u64, index: u64) -> Vec<u8> {
        let entry: Entry<TypeConfig> = Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        };
        let sealed = fenced_storage::frame::seal(&bincode::serialize(&entry).expect("serialize"));
        let mut out = (sealed.len() as u32).to_le_bytes().to_vec();
        out.extend(sealed);
        out
    }

    /// A data dir whose one segment holds `records`, then `zeros` zero bytes, then `tail`.
    fn dir_with(records: &[Vec<u8>], zeros: usize, tail: &[u8]) -> (SimFs, PathBuf) {
        let root = PathBuf::from("/sim");
        let fs = SimFs::new(&root, 7);
        let data = root.join("n1");
        let arc: Arc<dyn Fs> = Arc::new(fs.clone());
        arc.create_dir_all(&data.join(fenced_storage::wal::DIR))
            .expect("mkdir");
        let mut bytes = b"FNCDWAL\0".to_vec();
        bytes.extend(1u32.to_le_bytes());
        bytes.extend(0u32.to_le_bytes());
        for r in records {
            bytes.extend(r);
        }
        bytes.extend(vec![0; zeros]);
        bytes.extend(tail);
        let path = data
            .join(fenced_storage::wal::DIR)
            .join("00000000000000000001.wal");
        let f = arc.open(&path, Mode::Create).expect("open");
        f.write_all_at(&bytes, 0).expect("write");
        (fs, data)
    }

    #[test]
    fn a_log_whose_terms_go_down_fails() {
        // What the bug left: term-1 records that reached the disk after a lost one, readable
        // again behind a term-2 entry of the same size written over the lost one.
        let (fs, dir) = dir_with(
            &[record(1, 1), record(2, 2), record(1, 3), record(1, 4)],
            100,
            &[],
        );
        let scan = scan(&fs, &dir);
        assert_eq!(scan.ids, vec![(1, 1), (2, 2), (3, 1), (4, 1)]);
        let terms = LogTerms::default();
        let why = terms.started(2, &fs, &dir).expect("found");
        assert!(
            why.contains("entry 3 of term 1 after entry 2 of term 2"),
            "{why}"
        );
        let v = terms.verdict();
        assert_eq!(
            (v.checker.as_str(), v.valid, v.anomalies),
            ("log-terms", Some(false), 1)
        );
    }

    #[test]
    fn a_log_whose_terms_rise_passes_and_stale_bytes_are_counted() {
        let (fs, dir) = dir_with(&[record(1, 1), record(1, 2), record(3, 3)], 0, &[]);
        let terms = LogTerms::default();
        assert_eq!(terms.started(1, &fs, &dir), None);
        terms.lost_power(&fs, &dir);
        // A lost record: zeros, then a later record that reached the disk.
        let (fs, dir) = dir_with(&[record(1, 1)], 60, &record(1, 3));
        let scan = scan(&fs, &dir);
        assert_eq!(scan.ids, vec![(1, 1)]);
        assert!(scan.stale.is_some());
        terms.lost_power(&fs, &dir);
        let v = terms.verdict();
        assert_eq!(v.valid, Some(true));
        assert_eq!(v.stats["stale_after_power_loss"], 1);
        assert_eq!(v.stats["starts"], 1);
    }
}
