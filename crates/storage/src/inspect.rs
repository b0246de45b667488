//! Offline, read-only inspection of a data dir: the state machine as it stood at a given log
//! index, rebuilt from the member's snapshot file and the entries of its write-ahead log
//! after it, applied with [`fenced_core::StateMachine::apply_batch`] exactly as the node
//! applies them. `fenced debug digest` prints its [`digest`](fenced_core::StateMachine::digest),
//! and the fault-injection harness compares those of every member at one common index.
//!
//! Nothing in the data dir is written, created or removed: sled is not opened (opening it
//! writes), the hard-state file and the snapshot file are opened read-only, and the log's
//! segments are read as files — unlike [`crate::open`], which cuts an unacknowledged tail off
//! the log and removes temporary snapshot files. So it can run beside nothing but a stopped
//! node, and changes nothing a later start would see. Only the current data dir layout (its
//! log in `wal/`) is read; a dir of an older layout must be started once to upgrade it.
//!
//! The index must lie between the snapshot's last index and the last entry the hard state
//! records as durable (entries past it were never acknowledged and may be torn).

use std::path::{Path, PathBuf};

use fenced_fs::Fs;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::{Entry, EntryPayload, LogId};

use crate::hardstate::HardState;
use crate::{snapshot, wal, StoreError};

/// A log segment's header: `"FNCDWAL\0" | file version u32 LE | reserved u32` (see [`wal`]).
const SEGMENT_MAGIC: &[u8; 8] = b"FNCDWAL\0";
const SEGMENT_VERSION: u32 = 1;
const SEGMENT_HEADER: usize = 16;

/// Why a state cannot be rebuilt.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(
        "index {index} is below the snapshot's last index {snapshot_index}: the entries \
         before it are compacted away"
    )]
    BelowSnapshot { index: u64, snapshot_index: u64 },
    #[error(
        "index {index} is covered by this member's snapshot (last index {snapshot_index}): \
         its entry was applied here and is no longer in the log"
    )]
    InSnapshot { index: u64, snapshot_index: u64 },
    #[error("index {index} is past the last durable entry ({})", fmt_index(*last_index))]
    PastLog { index: u64, last_index: Option<u64> },
    #[error("{} holds no snapshot and no log entry: nothing to rebuild", dir.display())]
    Empty { dir: PathBuf },
    #[error(
        "{} has no hard-state file: not a data dir of this version (start the node once to \
         upgrade an older one)",
        dir.display()
    )]
    NoHardState { dir: PathBuf },
    #[error(
        "{} keeps its log in sled (an older layout): start the node once to upgrade it",
        dir.display()
    )]
    OlderLayout { dir: PathBuf },
    #[error("the log should hold entry {index}, it does not ({detail})")]
    MissingEntry { index: u64, detail: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn fmt_index(i: Option<u64>) -> String {
    i.map_or_else(|| "none".to_owned(), |i| i.to_string())
}

/// What a data dir can rebuild: indexes from `snapshot_index` (or the log's first entry) to
/// `last_index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The last log id the snapshot covers (`None`: no snapshot, or one that covers no entry,
    /// as a restored data dir's).
    pub snapshot: Option<LogId<NodeId>>,
    /// The last entry the hard state records as durable.
    pub last: Option<LogId<NodeId>>,
    /// The last committed log id the node knew when it last wrote its hard state (a lower
    /// bound of what was committed; entries up to it are the cluster's committed log).
    pub committed: Option<LogId<NodeId>>,
}

/// The state of a data dir at one log index.
pub struct Rebuilt {
    pub index: u64,
    /// The log id of the entry at `index` (its term: two logs with equal log ids at an index
    /// are equal up to it).
    pub log_id: LogId<NodeId>,
    pub bounds: Bounds,
    pub machine: fenced_core::StateMachine,
}

/// What `dir` can rebuild, on the real file system. Read-only.
pub fn bounds(dir: &Path) -> Result<Bounds, InspectError> {
    bounds_on(&fenced_fs::OsFs, dir)
}

/// What `dir` on `fs` can rebuild. Read-only.
pub fn bounds_on(fs: &dyn Fs, dir: &Path) -> Result<Bounds, InspectError> {
    if !fs.is_dir(&dir.join(wal::DIR)).unwrap_or(false) {
        if fs.exists(&dir.join("db")) {
            return Err(InspectError::OlderLayout {
                dir: dir.to_owned(),
            });
        }
        return Err(StoreError::file(
            &dir.join(wal::DIR),
            std::io::Error::from(std::io::ErrorKind::NotFound),
        )
        .into());
    }
    let hard = HardState::read_on(fs, dir)?.ok_or_else(|| InspectError::NoHardState {
        dir: dir.to_owned(),
    })?;
    let current = snapshot_path(dir);
    let snapshot = if fs.exists(&current) {
        snapshot::read_meta(fs, &current)?.last_log_id
    } else {
        None
    };
    Ok(Bounds {
        snapshot,
        last: hard.last_log_id,
        committed: hard.committed,
    })
}

fn snapshot_path(dir: &Path) -> PathBuf {
    // `SnapshotStore::open` would remove temporary files: name the file directly.
    dir.join(snapshot::DIR).join("current.snap")
}

/// The state machine of `dir` as of log index `index` (default: the last durable entry):
/// the snapshot, then every entry after it up to `index`. Refuses an index below the
/// snapshot's or past the last durable entry. Read-only; blocking. On the real file system.
pub fn state_at(dir: &Path, index: Option<u64>) -> Result<Rebuilt, InspectError> {
    state_at_on(&fenced_fs::OsFs, dir, index)
}

/// [`state_at`] of `dir` on `fs`.
pub fn state_at_on(fs: &dyn Fs, dir: &Path, index: Option<u64>) -> Result<Rebuilt, InspectError> {
    let bounds = bounds_on(fs, dir)?;
    let snapshot_index = bounds.snapshot.map(|l| l.index);
    let last_index = bounds.last.map(|l| l.index).max(snapshot_index);
    let Some(default) = last_index else {
        return Err(InspectError::Empty {
            dir: dir.to_owned(),
        });
    };
    let index = index.unwrap_or(default);
    if let Some(s) = snapshot_index.filter(|s| index < *s) {
        return Err(InspectError::BelowSnapshot {
            index,
            snapshot_index: s,
        });
    }
    if index > default {
        return Err(InspectError::PastLog { index, last_index });
    }
    let current = snapshot_path(dir);
    let mut machine = if fs.exists(&current) {
        snapshot::load(fs, &current)?.1
    } else {
        fenced_core::StateMachine::new()
    };
    let from = snapshot_index.map_or(0, |s| s + 1);
    let mut log_id = bounds.snapshot;
    let quarantined = crate::quarantine::load_on(fs, dir)?;
    for entry in read_entries(fs, dir, from, index)? {
        log_id = Some(entry.log_id);
        // As `StateMachineStore::apply`: only normal entries reach the state machine, and
        // the quarantined ones as a no-op.
        if let EntryPayload::Normal(batch) = &entry.payload {
            if quarantined.contains(&entry.log_id.index) {
                machine.apply_quarantined(entry.log_id.index, batch);
            } else {
                machine.apply_batch(entry.log_id.index, batch);
            }
        }
    }
    let log_id = log_id.ok_or(InspectError::MissingEntry {
        index,
        detail: "the log is empty".into(),
    })?;
    Ok(Rebuilt {
        index,
        log_id,
        bounds,
        machine,
    })
}

/// The entry at `index` of the log in `dir` on `fs`, read-only: `None` when the index is past
/// the last durable entry (the member has not received it yet). Refuses an index the
/// snapshot covers.
pub fn entry_at_on(
    fs: &dyn Fs,
    dir: &Path,
    index: u64,
) -> Result<(Bounds, Option<Entry<TypeConfig>>), InspectError> {
    let bounds = bounds_on(fs, dir)?;
    if let Some(s) = bounds.snapshot.map(|l| l.index).filter(|s| index <= *s) {
        return Err(InspectError::InSnapshot {
            index,
            snapshot_index: s,
        });
    }
    if bounds.last.is_none_or(|l| index > l.index) {
        return Ok((bounds, None));
    }
    let entry = read_entries(fs, dir, index, index)?.pop();
    Ok((bounds, entry))
}

/// The entries `from..=to` of the log in `dir`, read without opening it for writing: every
/// record checked (seal, index, no gap).
fn read_entries(
    fs: &dyn Fs,
    dir: &Path,
    from: u64,
    to: u64,
) -> Result<Vec<Entry<TypeConfig>>, InspectError> {
    if from > to {
        return Ok(Vec::new());
    }
    let wal_dir = dir.join(wal::DIR);
    let mut firsts = Vec::new();
    for item in fs
        .read_dir(&wal_dir)
        .map_err(|e| StoreError::file(&wal_dir, e))?
    {
        if let Some(first) = item
            .name
            .strip_suffix(".wal")
            .and_then(|n| n.parse::<u64>().ok())
        {
            firsts.push(first);
        }
    }
    firsts.sort_unstable();
    // The segment holding `from`: the last one starting at or before it.
    let start = firsts.partition_point(|f| *f <= from).saturating_sub(1);
    let missing = |index: u64, detail: String| InspectError::MissingEntry { index, detail };
    let mut out = Vec::new();
    let mut next = from;
    for first in firsts.iter().skip(start).copied() {
        if first > next {
            return Err(missing(next, format!("the next segment starts at {first}")));
        }
        let path = wal_dir.join(format!("{first:020}.wal"));
        let bytes = fs.read(&path).map_err(|e| StoreError::file(&path, e))?;
        let damaged = |detail: String| StoreError::Damaged {
            path: path.clone(),
            detail,
        };
        if bytes.len() < SEGMENT_HEADER || &bytes[..8] != SEGMENT_MAGIC {
            return Err(damaged("not a log segment (bad or missing header)".into()).into());
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != SEGMENT_VERSION {
            return Err(StoreError::UnknownFormat {
                what: "log segment",
                found: version,
                supported: SEGMENT_VERSION,
            }
            .into());
        }
        let mut at = SEGMENT_HEADER;
        let mut expected = first;
        while let Some(len) = bytes.get(at..at + 4) {
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            if len == 0 {
                break;
            }
            let record = bytes
                .get(at + 4..at + 4 + len)
                .ok_or_else(|| damaged(format!("record of entry {expected} is cut short")))?;
            at += 4 + len;
            if expected < next {
                expected += 1;
                continue;
            }
            let entry = crate::decode_entry(record)?;
            if entry.log_id.index != expected {
                return Err(StoreError::MisplacedEntry {
                    expected,
                    found: entry.log_id.index,
                }
                .into());
            }
            out.push(entry);
            next = expected + 1;
            if next > to {
                return Ok(out);
            }
            expected += 1;
        }
    }
    Err(missing(next, "the log ends before it".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dir_without_a_log_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let before: Vec<_> = std::fs::read_dir(dir.path()).expect("ls").collect();
        assert!(state_at(dir.path(), None).is_err());
        std::fs::create_dir(dir.path().join(wal::DIR)).expect("mkdir");
        assert!(matches!(
            state_at(dir.path(), None),
            Err(InspectError::NoHardState { .. })
        ));
        assert_eq!(before.len(), 0);
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1);
    }
}
