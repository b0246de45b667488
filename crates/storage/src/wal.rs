//! The Raft log on disk: an append-only write-ahead log of segment files, made durable by one
//! flusher thread (group commit).
//!
//! Layout, in `<data dir>/wal/`:
//!
//! ```text
//! <first index, 20 digits>.wal    one segment: a header, then records of consecutive entries
//! header  = "FNCDWAL\0" | file version: u32 LE | reserved: u32
//! record  = length of the sealed entry: u32 LE | sealed entry (crate::frame: version, crc32,
//!           bincode of openraft::Entry)
//! ...     = zeros to the end of the file: a segment grows ahead of its records
//! ```
//!
//! A segment is closed once it passes [`SEGMENT_BYTES`] and a new one starts with the next
//! entry. Entries are written with `pwrite` by the caller of [`Wal::append`] (openraft's core
//! task: a copy into the page cache) and made durable by the [`Flusher`] thread, which runs one
//! `fdatasync` for every append that arrived meanwhile and then acknowledges those appends in
//! order; its recorder thread then records the last durable log id in the
//! [`hardstate`](crate::hardstate) file, in parallel with the next round's `fdatasync`.
//!
//! **What a crash or damage leaves, and what [`Wal::open`] does with it.** Every record is
//! checked (checksum, index, no gap between records or segments) when the log is opened. The
//! hard state holds the last log id this node made durable and may have acknowledged
//! (`recorded`):
//!
//! * a problem at or before `recorded` — a record that fails its checksum, a gap, an entry of
//!   the wrong index, a log that ends early — is damage to acknowledged entries: the data dir
//!   is refused, never repaired, because a node that votes from a shorter log could help
//!   elect a leader that lacks entries this node acknowledged;
//! * a problem after `recorded` is taken for a write that a crash interrupted before its
//!   `fdatasync` completed — nothing this node acknowledged. That tail is cut off (and the
//!   cut made durable) before the log is used again. (The record trails the acknowledgements
//!   by about one `fdatasync`, so damage to the last round acknowledged right before a crash
//!   would be cut too: see [`Flusher`] for that window.)
//! * intact entries after `recorded` are kept, but written again and synced before the log
//!   is used, and then the hard state's record is raised to the log's end before the log is
//!   served ([`Wal::open_on`]), so the trailing window closes at the restart instead of
//!   lasting, on an idle node, until the next append round. They may be in the page cache
//!   only: after a failed `fdatasync` Linux marks the
//!   pages clean although they never reached the disk, so a restarted node reads them and a
//!   later successful sync does not write them. Left so, the next append would record them
//!   as durable, and a power loss would then take acknowledged entries away (found by
//!   fenced-sim's disk faults). They are not cut off: `recorded` is behind the log when the
//!   newer hard-state copy was damaged and the older one read, and then entries after it
//!   may have been acknowledged.
//!
//! A gap between two segments is a hole unless it holds purged entries only: a snapshot
//! installed past the log's end purges every entry and the log goes on in a new segment
//! after the purge point, and a crash between recording the purge and removing the segments
//! it emptied (durably) leaves them behind. They are kept (the next purge removes them).
//!
//! A zero record length ends a segment's records only if nothing but zeros follows it. The
//! kernel writes a file's dirty pages back in any order, so a crash can lose the page of one
//! record while a later one reached the disk: the bytes after the zero are such records, and
//! they are a problem at the lost record's index like any other. Cutting them off with it
//! matters: left in place, a new leader's entry of the same size written over the lost one
//! would make them readable again on the next start — entries of an older term after a
//! newer one. The cut is one `ftruncate` made durable before anything is appended, so a
//! crash at any moment leaves either the old file (found and cut again on the next start)
//! or the cut one.

mod flusher;
mod recover;
mod segment;

use std::collections::VecDeque;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::{File, Fs};
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::{Entry, LogId};

use crate::StoreError;
use segment::Segment;

pub(crate) use flusher::note_committed;
pub use flusher::Flusher;

/// Directory of the segments inside the data dir.
pub const DIR: &str = "wal";
const MAGIC: &[u8; 8] = b"FNCDWAL\0";
/// Version of the segment file layout (the records inside carry their own format version).
const FILE_VERSION: u32 = 1;
const HEADER: u64 = 16;
/// A segment is closed once it holds this many bytes.
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
/// Segments grow in steps of zeros written ahead of the records, so that most fsyncs find
/// the file's size unchanged and write only data, not its metadata (~8 % more throughput
/// here). A zero record length followed by nothing but zeros ends a segment's records.
const GROW_BYTES: u64 = 1024 * 1024;
/// Recently appended entries kept decoded for the reads that follow at once (apply,
/// replication): at most this many, and this many encoded bytes.
const CACHE_ENTRIES: usize = 4096;
const CACHE_BYTES: usize = 32 * 1024 * 1024;

type LogEntry = Entry<TypeConfig>;

/// Append the record of `entry` to `buf`; returns the record's length.
fn encode_record(entry: &LogEntry, buf: &mut Vec<u8>) -> Result<usize, StoreError> {
    let sealed = crate::encode("log entry", entry)?;
    let len = u32::try_from(sealed.len()).map_err(|_| StoreError::Encode {
        what: "log entry",
        source: Box::new(bincode::ErrorKind::SizeLimit),
    })?;
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&sealed);
    Ok(4 + sealed.len())
}

/// What [`Wal::append`] wrote: the last entry's log id, and the file to sync for it.
pub type Written = (LogId<NodeId>, Arc<dyn File>);

/// The log: its segments (the last one open for appends) and a cache of recent entries.
pub struct Wal {
    /// The file system the segments are on.
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    segments: Vec<Segment>,
    last: Option<LogId<NodeId>>,
    /// Entries at or below this index are purged: never served, and dropped with their
    /// segment once the whole segment is purged.
    purged: Option<u64>,
    cache: VecDeque<(LogEntry, usize)>,
    cache_bytes: usize,
    /// [`SEGMENT_BYTES`]; smaller in tests.
    segment_bytes: u64,
}

impl Wal {
    /// A log with no segments yet, in `dir` (the log directory) on `fs`.
    fn empty(fs: &Arc<dyn Fs>, dir: PathBuf, purged: Option<u64>) -> Wal {
        Wal {
            fs: fs.clone(),
            dir,
            segments: Vec::new(),
            last: None,
            purged,
            cache: VecDeque::new(),
            cache_bytes: 0,
            segment_bytes: SEGMENT_BYTES,
        }
    }

    /// Write a new log holding `entries` (consecutive) in `data_dir` on the real file
    /// system, replacing any there, durably (the upgrade from a log kept in sled).
    pub fn create_from(
        data_dir: &Path,
        entries: impl IntoIterator<Item = LogEntry>,
        purged: Option<u64>,
    ) -> Result<(), StoreError> {
        Wal::create_from_on(&fenced_fs::os(), data_dir, entries, purged)
    }

    /// [`Wal::create_from`] on `fs`.
    pub fn create_from_on(
        fs: &Arc<dyn Fs>,
        data_dir: &Path,
        entries: impl IntoIterator<Item = LogEntry>,
        purged: Option<u64>,
    ) -> Result<(), StoreError> {
        let dir = data_dir.join(DIR);
        if fs.exists(&dir) {
            fs.remove_dir_all(&dir)
                .map_err(|e| StoreError::file(&dir, e))?;
        }
        crate::create_dir_all_durably(&**fs, &dir)?;
        let mut wal = Wal::empty(fs, dir, purged);
        wal.append(entries)?;
        for s in &wal.segments {
            s.file
                .sync_data()
                .map_err(|e| StoreError::file(&s.path, e))?;
        }
        Ok(())
    }

    /// The last entry's log id (`None`: the log holds no entry).
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.last
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_none()
    }

    /// Write `entries` (consecutive, after the last one) into the open segment, not yet
    /// durable. Returns the last one's log id and the file to sync, or `None` for no entries.
    ///
    /// Entries that do not follow the last one start a new segment. Raft never leaves such a
    /// gap (openraft's storage test suite does), and [`Wal::open`] refuses a log that has one.
    pub fn append(
        &mut self,
        entries: impl IntoIterator<Item = LogEntry>,
    ) -> Result<Option<Written>, StoreError> {
        let mut buf = Vec::new();
        let mut batch: Vec<(LogEntry, usize)> = Vec::new();
        for entry in entries {
            let index = entry.log_id.index;
            let after = match batch.last() {
                Some((prev, _)) => Some(prev.log_id.index),
                None => self.last.map(|l| l.index),
            };
            let follows = after.is_some_and(|a| Some(a) == index.checked_sub(1));
            // The first entry may leave a gap after the last one only over purged entries (a
            // snapshot installed past the log's end). Anything else is a hole: openraft 0.9's
            // leader once sent entries 251.. after 143, read from a log purged meanwhile, and a
            // follower at 208 appended them (found by fenced-sim, seed 1008664).
            let over_purged = self
                .purged
                .is_some_and(|p| index.checked_sub(1).is_none_or(|prev| p >= prev));
            let may_start = batch.is_empty() && (after.is_none() || over_purged);
            if after.is_some_and(|a| index <= a) || !(follows || may_start) {
                return Err(StoreError::LogHole {
                    after: after.unwrap_or(0),
                    next: index,
                });
            }
            let len = encode_record(&entry, &mut buf)?;
            batch.push((entry, len));
        }
        let (Some((first, _)), Some((last, _))) = (batch.first(), batch.last()) else {
            return Ok(None);
        };
        let (first, last) = (first.log_id.index, last.log_id);
        let roll = self
            .segments
            .last()
            .is_none_or(|s| s.end >= self.segment_bytes || s.next() != first);
        if roll {
            // Appends still queued for the closing segment carry its file: the flusher syncs
            // every file of a round.
            self.segments
                .push(Segment::create(&*self.fs, &self.dir, first)?);
        }
        let Some(seg) = self.segments.last_mut() else {
            return Ok(None);
        };
        seg.grow(buf.len() as u64)?;
        seg.file
            .write_all_at(&buf, seg.end)
            .map_err(|e| StoreError::file(&seg.path, e))?;
        for (_, len) in &batch {
            seg.offsets.push(seg.end);
            seg.end += *len as u64;
        }
        let file = seg.file.clone();
        if self.last.is_some_and(|l| l.index + 1 != first) {
            // After a gap the cache would not be contiguous.
            self.cache.clear();
            self.cache_bytes = 0;
        }
        self.last = Some(last);
        for (entry, len) in batch {
            self.remember(entry, len);
        }
        Ok(Some((last, file)))
    }

    /// Entries with indexes in `range` (clamped to what is stored and not purged), in order.
    pub fn read(&self, range: Range<u64>) -> Result<Vec<LogEntry>, StoreError> {
        let Some(last) = self.last else {
            return Ok(Vec::new());
        };
        let lowest = self.segments.first().map_or(0, |s| s.first);
        let start = range
            .start
            .max(lowest)
            .max(self.purged.map_or(0, |p| p + 1));
        let end = range.end.min(last.index + 1);
        if start >= end {
            return Ok(Vec::new());
        }
        let cached_from = self.cache.front().map_or(u64::MAX, |(e, _)| e.log_id.index);
        let mut out = Vec::with_capacity((end - start) as usize);
        let disk_end = end.min(cached_from).max(start);
        let mut at = start;
        while at < disk_end {
            let pos = self.segments.partition_point(|s| s.first <= at);
            let Some(seg) = pos.checked_sub(1).map(|p| &self.segments[p]) else {
                break;
            };
            if at >= seg.next() {
                // In a gap between segments (see `append`): go on with the next one.
                at = match self.segments.get(pos) {
                    Some(next) => next.first,
                    None => disk_end,
                };
                continue;
            }
            let stop = disk_end.min(seg.next());
            out.extend(seg.read_records(at..stop)?);
            at = stop;
        }
        let at = at.max(cached_from.min(end));
        for i in at..end {
            out.push(self.cache[(i - cached_from) as usize].0.clone());
        }
        Ok(out)
    }

    /// Remove every entry from `index` on, durably.
    pub fn truncate(&mut self, index: u64) -> Result<(), StoreError> {
        if self.last.is_none_or(|l| l.index < index) {
            return Ok(());
        }
        // The segment holding `index` keeps what comes before it; later segments go.
        let pos = self.segments.partition_point(|s| s.first <= index);
        let mut removed = false;
        while self.segments.len() > pos {
            if let Some(seg) = self.segments.pop() {
                remove_segment(&*self.fs, &seg.path)?;
                removed = true;
            }
        }
        if let Some(seg) = self.segments.last_mut() {
            let i = (index - seg.first) as usize;
            if i == 0 {
                let path = seg.path.clone();
                self.segments.pop();
                remove_segment(&*self.fs, &path)?;
                removed = true;
            } else if i < seg.offsets.len() {
                let offset = seg.offsets[i];
                // Cut, so no record of the old tail is left past the end.
                seg.file
                    .set_len(offset)
                    .and_then(|()| seg.file.sync_data())
                    .map_err(|e| StoreError::file(&seg.path, e))?;
                seg.offsets.truncate(i);
                seg.end = offset;
                seg.allocated = offset;
            }
        }
        if removed {
            crate::sync_dir(&*self.fs, &self.dir)?;
        }
        while self
            .cache
            .back()
            .is_some_and(|(e, _)| e.log_id.index >= index)
        {
            if let Some((_, len)) = self.cache.pop_back() {
                self.cache_bytes -= len;
            }
        }
        self.last = None;
        if let Some(seg) = self.segments.last() {
            if let Some(prev) = seg.next().checked_sub(1).filter(|p| *p >= seg.first) {
                self.last = seg.read_records(prev..prev + 1)?.pop().map(|e| e.log_id);
            }
        }
        Ok(())
    }

    /// Entries up to `index` (inclusive) are purged: no longer served, and every segment
    /// that holds only purged entries is deleted (durably, before this returns).
    pub fn purge(&mut self, index: u64) -> Result<(), StoreError> {
        self.purged = self.purged.max(Some(index));
        while self
            .cache
            .front()
            .is_some_and(|(e, _)| e.log_id.index <= index)
        {
            if let Some((_, len)) = self.cache.pop_front() {
                self.cache_bytes -= len;
            }
        }
        let mut removed = false;
        // A segment is wholly purged when the next one starts at or below index + 1; the last
        // segment stays (appends continue in it) unless every entry in it is purged and the
        // log ends there.
        while self.segments.len() > 1 && self.segments[1].first <= index + 1 {
            let seg = self.segments.remove(0);
            remove_segment(&*self.fs, &seg.path)?;
            removed = true;
        }
        if self.last.is_some_and(|l| l.index <= index) {
            for seg in self.segments.drain(..) {
                remove_segment(&*self.fs, &seg.path)?;
                removed = true;
            }
            self.last = None;
        }
        if removed {
            crate::sync_dir(&*self.fs, &self.dir)?;
        }
        Ok(())
    }

    /// Bytes the segments take on disk.
    pub fn size_on_disk(&self) -> u64 {
        self.segments.iter().map(|s| s.end).sum()
    }

    /// Remember a just appended (or checked) entry for the reads that follow.
    fn remember(&mut self, entry: LogEntry, len: usize) {
        self.cache.push_back((entry, len));
        self.cache_bytes += len;
        while self.cache.len() > CACHE_ENTRIES || self.cache_bytes > CACHE_BYTES {
            match self.cache.pop_front() {
                Some((_, l)) => self.cache_bytes -= l,
                None => break,
            }
        }
    }
}

fn remove_segment(fs: &dyn Fs, path: &Path) -> Result<(), StoreError> {
    match fs.remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::file(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    pub(super) fn blank(term: u64, index: u64) -> LogEntry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    pub(super) fn indexes(entries: &[LogEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    pub(super) fn small(dir: &Path, recorded: Option<u64>, purged: Option<u64>) -> Wal {
        let recorded = recorded.map(|i| LogId::new(CommittedLeaderId::new(1, 1), i));
        let mut wal = Wal::open(dir, recorded, purged).expect("open");
        wal.segment_bytes = 200;
        wal.cache.clear();
        wal.cache_bytes = 0;
        wal
    }

    pub(super) fn segment_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(DIR))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_append_leaves_a_gap_only_over_purged_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        wal.append((1..=5).map(|i| blank(1, i))).expect("append");
        // What a leader reading a log purged meanwhile sent: refused, nothing written.
        assert!(matches!(
            wal.append([blank(1, 9)]),
            Err(StoreError::LogHole { after: 5, next: 9 })
        ));
        assert_eq!(wal.last_log_id().map(|l| l.index), Some(5));
        // After a snapshot past the log's end, the log goes on after it.
        wal.purge(8).expect("purge");
        wal.append([blank(1, 9)]).expect("append after the purge");
        assert_eq!(indexes(&wal.read(0..100).expect("read")), vec![9]);
    }

    #[test]
    fn segments_roll_over_and_read_back_across_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        for i in 0..=40 {
            wal.append([blank(1, i)]).expect("append");
        }
        wal.cache.clear();
        assert!(
            segment_files(dir.path()).len() > 3,
            "{:?}",
            segment_files(dir.path())
        );
        assert_eq!(
            indexes(&wal.read(0..100).expect("read")),
            (0..=40).collect::<Vec<_>>()
        );
        assert_eq!(
            indexes(&wal.read(7..23).expect("read")),
            (7..23).collect::<Vec<_>>()
        );
        drop(wal);
        let wal = small(dir.path(), Some(40), None);
        assert_eq!(
            indexes(&wal.read(0..100).expect("read")),
            (0..=40).collect::<Vec<_>>()
        );
        assert_eq!(wal.last_log_id().map(|l| l.index), Some(40));
    }

    #[test]
    fn truncate_and_purge_across_segments_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        for i in 0..=40 {
            wal.append([blank(1, i)]).expect("append");
        }
        let before = segment_files(dir.path()).len();
        wal.truncate(15).expect("truncate");
        assert_eq!(wal.last_log_id().map(|l| l.index), Some(14));
        assert!(segment_files(dir.path()).len() < before);
        wal.append([blank(2, 15), blank(2, 16)]).expect("append");
        wal.purge(9).expect("purge");
        assert_eq!(
            indexes(&wal.read(0..100).expect("read")),
            (10..=16).collect::<Vec<_>>()
        );
        let first = segment_files(dir.path())[0].clone();
        let first: u64 = first.trim_end_matches(".wal").parse().expect("name");
        assert!(
            (2..=10).contains(&first),
            "segments before the purge point are deleted"
        );
        drop(wal);
        let mut wal = small(dir.path(), Some(16), Some(9));
        assert_eq!(
            indexes(&wal.read(0..100).expect("read")),
            (10..=16).collect::<Vec<_>>()
        );
        assert_eq!(wal.read(16..17).expect("read")[0].log_id.leader_id.term, 2);
        // Purging everything empties the log; appends go on after the purge point.
        wal.purge(20).expect("purge");
        assert!(wal.is_empty() && segment_files(dir.path()).is_empty());
        wal.append([blank(3, 21)]).expect("append");
        drop(wal);
        let wal = small(dir.path(), Some(21), Some(20));
        assert_eq!(indexes(&wal.read(0..100).expect("read")), vec![21]);
    }
}
