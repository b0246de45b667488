//! The hard-state file: the vote and the last appended log id, kept *apart from* sled (which
//! older layouts used for the rest, and which is now gone from a node).
//!
//! sled recovers from a damaged file by dropping everything after the first bad record, as if
//! the tail had never been written. For a Raft member that is amnesia: a log that silently
//! ends early, or a forgotten vote, lets it vote for a candidate that lacks entries it already
//! acknowledged. This small file is the durable record of what the node acknowledged; on
//! start, a log that ends before it is refused (see [`crate::open`]).
//!
//! Layout: two slots of [`SLOT`] bytes; each write goes to the slot not holding the newest
//! value and is fdatasync'ed before it returns, so a torn write leaves the previous value
//! readable. A vote is written before it is acknowledged; the log's end is written by the
//! group commit's recorder just after the appends it names are acknowledged (it trails them
//! by about one sync: [`crate::wal::Flusher`]). A slot is `magic | seq u64 | len u32 | crc32 u32 | payload`,
//! the payload being bincode of [`HardStateValue`]; the valid slot with the larger `seq` wins.
//! Magic `FHS2` slots carry `committed` too; `FHS1` slots (the first layout) are still read.
//!
//! A damaged newer slot and a torn, unacknowledged write look alike (a bad checksum), so the
//! older slot is read in both cases. For `last_log_id` that is harmless: the log reaches
//! further, and entries past the recorded id are rewritten and synced at start. For the vote
//! it is not: a node that forgot its vote could vote twice in one term. So a new vote is
//! written into both slots, each synced, before it is acknowledged; a damaged slot then
//! leaves the same vote in the other. Votes are rare (one per election): the second sync
//! costs nothing measurable. (Found by reading, after fenced-sim rotted a newer slot.)

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::{File, Fs, Mode};

use fenced_raft_types::NodeId;
use openraft::{LogId, Vote};
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// File name inside the data dir.
pub const FILE_NAME: &str = "hardstate";
/// Slots written by this build: [`HardStateValue`] with `committed`.
const MAGIC: &[u8; 4] = b"FHS2";
/// Slots of the first layout (no `committed`), still read.
const MAGIC_V1: &[u8; 4] = b"FHS1";
const SLOT: u64 = 4096;
const HEADER: usize = 4 + 8 + 4 + 4;

/// What the file records.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardStateValue {
    /// The vote, authoritative (sled keeps no copy).
    pub vote: Option<Vote<NodeId>>,
    /// The last log id this node has made durable and may have acknowledged. The log on disk
    /// must reach at least its index.
    pub last_log_id: Option<LogId<NodeId>>,
    /// The last committed log id this node knew when the record was written (openraft's
    /// `save_committed`: a hint to re-apply committed entries at start, not needed durable).
    pub committed: Option<LogId<NodeId>>,
}

/// The first layout of the record (`FHS1`).
#[derive(Deserialize)]
struct HardStateValueV1 {
    vote: Option<Vote<NodeId>>,
    last_log_id: Option<LogId<NodeId>>,
}

/// The open file and its current value. Not synchronized: the owner wraps it in a mutex.
#[derive(Debug)]
pub struct HardState {
    path: PathBuf,
    file: Arc<dyn File>,
    seq: u64,
    value: HardStateValue,
}

impl HardState {
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(FILE_NAME)
    }

    /// Create the file with `value` in `dir` on the real file system (it must not exist
    /// yet), durably.
    pub fn create(dir: &Path, value: HardStateValue) -> Result<HardState, StoreError> {
        HardState::create_on(&fenced_fs::OsFs, dir, value)
    }

    /// [`HardState::create`] on `fs`.
    pub fn create_on(
        fs: &dyn Fs,
        dir: &Path,
        value: HardStateValue,
    ) -> Result<HardState, StoreError> {
        let path = Self::path_in(dir);
        // An existing file is not overwritten.
        let file = fs
            .open(&path, Mode::CreateNew)
            .map_err(|e| StoreError::file(&path, e))?;
        let mut hs = HardState {
            path,
            file,
            seq: 0,
            value: HardStateValue::default(),
        };
        hs.write(value)?;
        crate::sync_dir(fs, dir)?;
        Ok(hs)
    }

    /// [`HardState::open_on`] on the real file system.
    #[cfg(test)]
    pub(crate) fn open(dir: &Path) -> Result<Option<HardState>, StoreError> {
        HardState::open_on(&fenced_fs::OsFs, dir)
    }

    /// Open an existing file in `dir` on `fs`; `Ok(None)` if there is none.
    pub fn open_on(fs: &dyn Fs, dir: &Path) -> Result<Option<HardState>, StoreError> {
        let path = Self::path_in(dir);
        let file = match fs.open(&path, Mode::Write) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::file(&path, e)),
        };
        let (seq, value) = newest_slot(&*file, &path)?;
        Ok(Some(HardState {
            path,
            file,
            seq,
            value,
        }))
    }

    /// The value of the file in `dir` on `fs`, opened read-only (offline tools: nothing is
    /// written); `Ok(None)` if there is none.
    pub fn read_on(fs: &dyn Fs, dir: &Path) -> Result<Option<HardStateValue>, StoreError> {
        let path = Self::path_in(dir);
        let file = match fs.open(&path, Mode::Read) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::file(&path, e)),
        };
        newest_slot(&*file, &path).map(|(_, value)| Some(value))
    }

    pub fn value(&self) -> &HardStateValue {
        &self.value
    }

    /// Write the value read into both slots again, each synced: what a store opened from is
    /// made durable before it acts on it. The value may be in the page cache only: a process
    /// whose sync of it failed (Linux marks the pages clean although they never reached the
    /// disk) left it there, and [`HardState::write`] skips an unchanged value. Found by
    /// fenced-sim (seed 675 with `--faults holdback,flicker,disk,…`): a truncation recorded
    /// the shorter log and its sync failed; the next process read the shorter log, cut the
    /// entry from the WAL durably and skipped the equal hard state; a power loss then brought
    /// back the durable hard state recording the entry the WAL no longer had, and the node
    /// refused its dir.
    pub fn rewrite(&mut self) -> Result<(), StoreError> {
        let value = self.value.clone();
        self.write_slot(value.clone())?;
        self.write_slot(value)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durably replace the value (no-op if unchanged). A new vote goes into both slots,
    /// one after the other, each synced: a damaged newer slot then cannot give back the
    /// previous vote (see the module docs).
    pub fn write(&mut self, value: HardStateValue) -> Result<(), StoreError> {
        if value == self.value && self.seq > 0 {
            return Ok(());
        }
        let new_vote = value.vote != self.value.vote;
        self.write_slot(value.clone())?;
        if new_vote {
            self.write_slot(value)?;
        }
        Ok(())
    }

    /// Write `value` into the slot not holding the newest value, and sync it.
    fn write_slot(&mut self, value: HardStateValue) -> Result<(), StoreError> {
        let payload = bincode::serialize(&value).map_err(|source| StoreError::Encode {
            what: "hard state",
            source,
        })?;
        let seq = self.seq + 1;
        let mut buf = Vec::with_capacity(HEADER + payload.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&seq.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&crc(seq, &payload).to_le_bytes());
        buf.extend_from_slice(&payload);
        if buf.len() as u64 > SLOT {
            return Err(StoreError::Damaged {
                path: self.path.clone(),
                detail: format!("hard state of {} bytes does not fit a slot", buf.len()),
            });
        }
        let offset = (seq % 2) * SLOT;
        self.file
            .write_all_at(&buf, offset)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| StoreError::file(&self.path, e))?;
        self.seq = seq;
        self.value = value;
        Ok(())
    }
}

/// The valid slot with the larger `seq`.
fn newest_slot(file: &dyn File, path: &Path) -> Result<(u64, HardStateValue), StoreError> {
    let mut best: Option<(u64, HardStateValue)> = None;
    for slot in 0..2 {
        if let Some((seq, value)) = read_slot(file, slot).map_err(|e| StoreError::file(path, e))? {
            if best.as_ref().is_none_or(|(s, _)| seq > *s) {
                best = Some((seq, value));
            }
        }
    }
    best.ok_or_else(|| StoreError::Damaged {
        path: path.to_owned(),
        detail: "neither copy of the vote and last log id is intact".into(),
    })
}

fn crc(seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&seq.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// One slot's `(seq, value)`, or `None` if it is empty, torn or damaged.
fn read_slot(file: &dyn File, slot: u64) -> io::Result<Option<(u64, HardStateValue)>> {
    let mut buf = vec![0u8; SLOT as usize];
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], slot * SLOT + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    let buf = &buf[..filled];
    if buf.len() < HEADER || (&buf[..4] != MAGIC && &buf[..4] != MAGIC_V1) {
        return Ok(None);
    }
    let seq = u64::from_le_bytes(buf[4..12].try_into().unwrap_or_default());
    let len = u32::from_le_bytes(buf[12..16].try_into().unwrap_or_default()) as usize;
    let stored = u32::from_le_bytes(buf[16..20].try_into().unwrap_or_default());
    let Some(payload) = buf.get(HEADER..HEADER + len) else {
        return Ok(None);
    };
    if crc(seq, payload) != stored {
        return Ok(None);
    }
    if &buf[..4] == MAGIC_V1 {
        let old: Option<HardStateValueV1> = bincode::deserialize(payload).ok();
        return Ok(old.map(|v| {
            let value = HardStateValue {
                vote: v.vote,
                last_log_id: v.last_log_id,
                committed: None,
            };
            (seq, value)
        }));
    }
    Ok(bincode::deserialize(payload).ok().map(|v| (seq, v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use std::fs::OpenOptions;

    fn value(index: u64) -> HardStateValue {
        HardStateValue {
            vote: Some(Vote::new(3, 2)),
            last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 2), index)),
            committed: Some(LogId::new(CommittedLeaderId::new(3, 2), index - 1)),
        }
    }

    #[test]
    fn first_layout_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v1 = HardStateValueV1Out {
            vote: Some(Vote::new(3, 2)),
            last_log_id: Some(LogId::new(CommittedLeaderId::new(3, 2), 9)),
        };
        let payload = bincode::serialize(&v1).expect("encode");
        let mut buf = MAGIC_V1.to_vec();
        buf.extend_from_slice(&1u64.to_le_bytes());
        buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        buf.extend_from_slice(&crc(1, &payload).to_le_bytes());
        buf.extend_from_slice(&payload);
        std::fs::write(HardState::path_in(dir.path()), &buf).expect("write");
        let hs = HardState::open(dir.path()).expect("open").expect("exists");
        assert_eq!(hs.value().last_log_id, v1.last_log_id);
        assert_eq!(hs.value().vote, v1.vote);
        assert_eq!(hs.value().committed, None);
    }

    #[derive(Serialize)]
    struct HardStateValueV1Out {
        vote: Option<Vote<NodeId>>,
        last_log_id: Option<LogId<NodeId>>,
    }

    #[test]
    fn newest_intact_slot_wins_and_a_torn_write_keeps_the_previous_value() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut hs = HardState::create(dir.path(), value(1)).expect("create");
        hs.write(value(2)).expect("write");
        hs.write(value(3)).expect("write");
        let newer = hs.seq % 2;
        drop(hs);
        let hs = HardState::open(dir.path()).expect("open").expect("exists");
        assert_eq!(hs.value(), &value(3));

        // Damage the newest slot: the previous value comes back.
        damage_slot(dir.path(), newer);
        let hs = HardState::open(dir.path()).expect("open").expect("exists");
        assert_eq!(hs.value(), &value(2));

        // Both damaged: refused, naming the file.
        damage_slot(dir.path(), 1 - newer);
        match HardState::open(dir.path()) {
            Err(e @ StoreError::Damaged { .. }) => {
                assert!(e.to_string().contains(FILE_NAME), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_damaged_newer_slot_never_gives_back_an_older_vote() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut hs = HardState::create(dir.path(), value(1)).expect("create");
        hs.write(value(2)).expect("write");
        let voted = HardStateValue {
            vote: Some(Vote::new(4, 3)),
            ..value(2)
        };
        hs.write(voted.clone()).expect("write");
        let newer = hs.seq % 2;
        drop(hs);
        damage_slot(dir.path(), newer);
        let hs = HardState::open(dir.path()).expect("open").expect("exists");
        assert_eq!(hs.value().vote, voted.vote, "the vote went back");
    }

    /// A value whose sync failed is in the page cache only: the next process reads it, and
    /// must make it durable before acting on it (seed 675 of fenced-sim).
    #[test]
    fn a_value_read_from_the_cache_only_is_made_durable_by_rewrite() {
        for rewrite in [false, true] {
            let disk = fenced_fs::SimFs::new("/sim", 1);
            let fs: &dyn Fs = &disk;
            let dir = Path::new("/sim/d");
            fs.create_dir_all(dir).expect("mkdir");
            fs.sync_dir(Path::new("/sim")).expect("sync");
            let mut hs = HardState::create_on(fs, dir, value(1)).expect("create");
            disk.change_faults(|f| f.fsync_error = 1.0);
            assert!(hs.write(value(2)).is_err(), "the sync fails");
            disk.change_faults(|f| f.fsync_error = 0.0);
            drop(hs);
            let mut next = HardState::open_on(fs, dir).expect("open").expect("exists");
            assert_eq!(next.value(), &value(2), "read from the cache");
            if rewrite {
                next.rewrite().expect("rewrite");
            }
            drop(next);
            disk.power_loss();
            let after = HardState::open_on(fs, dir).expect("open").expect("exists");
            let want = if rewrite { value(2) } else { value(1) };
            assert_eq!(after.value(), &want, "rewrite: {rewrite}");
        }
    }

    /// Two bytes of slot `slot`'s payload in `dir`'s file go bad.
    fn damage_slot(dir: &Path, slot: u64) {
        OpenOptions::new()
            .write(true)
            .open(HardState::path_in(dir))
            .expect("open")
            .write_all_at(b"\xff\xff", slot * SLOT + 30)
            .expect("poke");
    }

    #[test]
    fn missing_file_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(HardState::open(dir.path()).expect("open").is_none());
    }
}
