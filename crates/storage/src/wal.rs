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
//! `fdatasync` for every append that arrived meanwhile, then records the last durable log id in
//! the [`hardstate`](crate::hardstate) file, then acknowledges those appends in order.
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
//! * a problem after `recorded` can only be a write that a crash interrupted before its
//!   `fdatasync` and hard-state record completed — nothing this node acknowledged. That tail
//!   is cut off (and the cut made durable) before the log is used again.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use fenced_raft_types::{NodeId, TypeConfig};
use openraft::storage::LogFlushed;
use openraft::{Entry, LogId};

use crate::hardstate::HardState;
use crate::observe::Hook;
use crate::StoreError;

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
/// here). A zero record length ends a segment's records.
const GROW_BYTES: u64 = 1024 * 1024;
/// Recently appended entries kept decoded for the reads that follow at once (apply,
/// replication): at most this many, and this many encoded bytes.
const CACHE_ENTRIES: usize = 4096;
const CACHE_BYTES: usize = 32 * 1024 * 1024;

type LogEntry = Entry<TypeConfig>;

fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

fn header() -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
    h
}

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
pub type Written = (LogId<NodeId>, Arc<File>);

/// One segment file.
struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Byte offset of each record (entry `first + i` at `offsets[i]`).
    offsets: Vec<u64>,
    /// Where the next record goes.
    end: u64,
    /// The file's length: zeros from `end` to here ([`GROW_BYTES`]).
    allocated: u64,
}

impl Segment {
    fn create(dir: &Path, first: u64) -> Result<Segment, StoreError> {
        let path = dir.join(segment_name(first));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| StoreError::file(&path, e))?;
        file.write_all_at(&header(), 0)
            .map_err(|e| StoreError::file(&path, e))?;
        let mut seg = Segment {
            first,
            path,
            file: Arc::new(file),
            offsets: Vec::new(),
            end: HEADER,
            allocated: HEADER,
        };
        seg.grow(HEADER)?;
        seg.file
            .sync_data()
            .map_err(|e| StoreError::file(&seg.path, e))?;
        crate::sync_dir(dir)?;
        Ok(seg)
    }

    /// Make room for `bytes` more records: write zeros past the allocated end, in
    /// [`GROW_BYTES`] steps (made durable by the next sync of the segment).
    fn grow(&mut self, bytes: u64) -> Result<(), StoreError> {
        let need = self.end + bytes;
        if need <= self.allocated {
            return Ok(());
        }
        let target = need.div_ceil(GROW_BYTES) * GROW_BYTES;
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        let mut at = self.allocated;
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64);
            self.file
                .write_all_at(&ZEROS[..n as usize], at)
                .map_err(|e| StoreError::file(&self.path, e))?;
            at += n;
        }
        self.allocated = target;
        Ok(())
    }

    /// One past the last index stored here.
    fn next(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    fn span(&self, i: usize) -> Range<u64> {
        let end = self.offsets.get(i + 1).copied().unwrap_or(self.end);
        self.offsets[i]..end
    }

    fn read_records(&self, indexes: Range<u64>) -> Result<Vec<LogEntry>, StoreError> {
        let (a, b) = (
            (indexes.start - self.first) as usize,
            (indexes.end - self.first) as usize,
        );
        let start = self.offsets[a];
        let stop = self.span(b - 1).end;
        let mut buf = vec![0u8; (stop - start) as usize];
        self.file
            .read_exact_at(&mut buf, start)
            .map_err(|e| StoreError::file(&self.path, e))?;
        let mut out = Vec::with_capacity(b - a);
        for i in a..b {
            let span = self.span(i);
            let rec = &buf[(span.start - start) as usize..(span.end - start) as usize];
            let entry = crate::decode_entry(rec.get(4..).unwrap_or_default())?;
            let want = self.first + i as u64;
            if entry.log_id.index != want {
                return Err(StoreError::LogKeyMismatch {
                    key: want.to_be_bytes().to_vec(),
                    index: entry.log_id.index,
                });
            }
            out.push(entry);
        }
        Ok(out)
    }
}

/// What [`Wal::open`] found wrong at some point of the log.
struct Problem {
    /// The index the bad spot should have held.
    index: u64,
    error: StoreError,
    /// Where to cut to drop it and everything after it: segment position and byte offset.
    segment: usize,
    offset: u64,
}

/// The log: its segments (the last one open for appends) and a cache of recent entries.
pub struct Wal {
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
    /// A log with no segments yet, in `dir` (the log directory).
    fn empty(dir: PathBuf, purged: Option<u64>) -> Wal {
        Wal {
            dir,
            segments: Vec::new(),
            last: None,
            purged,
            cache: VecDeque::new(),
            cache_bytes: 0,
            segment_bytes: SEGMENT_BYTES,
        }
    }

    /// Open (or create) the log in `data_dir`, checking every record. `recorded` is the last
    /// log id the hard state says this node made durable; `purged` the last purged index.
    pub fn open(
        data_dir: &Path,
        recorded: Option<LogId<NodeId>>,
        purged: Option<u64>,
    ) -> Result<Wal, StoreError> {
        let dir = data_dir.join(DIR);
        let listing = match std::fs::read_dir(&dir) {
            Ok(l) => Some(l),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::file(&dir, e)),
        };
        let mut firsts = Vec::new();
        for item in listing.into_iter().flatten() {
            let item = item.map_err(|e| StoreError::file(&dir, e))?;
            let name = item.file_name();
            let name = name.to_string_lossy();
            match name
                .strip_suffix(".wal")
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(first) => firsts.push(first),
                None => {
                    return Err(StoreError::Damaged {
                        path: item.path(),
                        detail: "an unknown file in the log directory".into(),
                    })
                }
            }
        }
        firsts.sort_unstable();

        let mut wal = Wal::empty(dir, purged);
        let mut problem = None;
        // After a purge the log must go on right after the purged prefix: a first segment
        // that starts later lost its predecessor (`purge` records the purged id durably
        // before it deletes segments).
        let start = purged.map(|p| p + 1);
        'segments: for (pos, first) in firsts.iter().copied().enumerate() {
            let path = wal.dir.join(segment_name(first));
            let expected = match (wal.last, start) {
                (Some(l), _) => l.index + 1,
                (None, Some(s)) => first.min(s),
                (None, None) => first,
            };
            if first != expected {
                problem = Some(Problem {
                    index: expected,
                    error: StoreError::LogHole {
                        after: expected.saturating_sub(1),
                        next: first,
                    },
                    segment: pos,
                    offset: 0,
                });
                break;
            }
            let bytes = std::fs::read(&path).map_err(|e| StoreError::file(&path, e))?;
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| StoreError::file(&path, e))?;
            if bytes.len() < HEADER as usize || &bytes[..8] != MAGIC {
                problem = Some(Problem {
                    index: first,
                    error: StoreError::Damaged {
                        path: path.clone(),
                        detail: "not a log segment (bad or missing header)".into(),
                    },
                    segment: pos,
                    offset: 0,
                });
                break;
            }
            let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
            if version != FILE_VERSION {
                return Err(StoreError::UnknownFormat {
                    what: "log segment",
                    found: version,
                    supported: FILE_VERSION,
                });
            }
            let mut seg = Segment {
                first,
                path: path.clone(),
                file: Arc::new(file),
                offsets: Vec::new(),
                end: HEADER,
                allocated: bytes.len() as u64,
            };
            let mut at = HEADER as usize;
            while at < bytes.len() {
                let index = seg.next();
                let bad = |error| Problem {
                    index,
                    error,
                    segment: pos,
                    offset: at as u64,
                };
                let Some(len) = bytes.get(at..at + 4) else {
                    problem = Some(bad(StoreError::LogEndsEarly {
                        found: wal.last.map(|l| l.index),
                        recorded: recorded.map_or(0, |r| r.index),
                    }));
                    wal.segments.push(seg);
                    break 'segments;
                };
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
                if len == 0 {
                    // The zeros ahead of the records ([`GROW_BYTES`]): their end.
                    break;
                }
                let Some(record) = bytes.get(at + 4..at + 4 + len) else {
                    problem = Some(bad(StoreError::LogEndsEarly {
                        found: wal.last.map(|l| l.index),
                        recorded: recorded.map_or(0, |r| r.index),
                    }));
                    wal.segments.push(seg);
                    break 'segments;
                };
                let entry = match crate::decode_entry(record) {
                    Ok(e) => e,
                    Err(error) => {
                        problem = Some(bad(error));
                        wal.segments.push(seg);
                        break 'segments;
                    }
                };
                if entry.log_id.index != index {
                    let found = entry.log_id.index;
                    problem = Some(bad(if found > index {
                        StoreError::LogHole {
                            after: index.saturating_sub(1),
                            next: found,
                        }
                    } else {
                        StoreError::MisplacedEntry {
                            expected: index,
                            found,
                        }
                    }));
                    wal.segments.push(seg);
                    break 'segments;
                }
                seg.offsets.push(at as u64);
                at += 4 + len;
                seg.end = at as u64;
                wal.last = Some(entry.log_id);
                wal.remember(entry, 4 + len);
            }
            wal.segments.push(seg);
        }

        if let Some(p) = problem {
            if recorded.is_some_and(|r| p.index <= r.index) {
                return Err(p.error);
            }
            // Never acknowledged: a write a crash interrupted. Cut it off, durably.
            tracing::warn!(
                index = p.index,
                "dropping the unacknowledged tail of the log ({})",
                p.error
            );
            for first in &firsts[p.segment + 1..] {
                remove_segment(&wal.dir.join(segment_name(*first)))?;
            }
            let cut_path = wal.dir.join(segment_name(firsts[p.segment]));
            if p.offset <= HEADER {
                remove_segment(&cut_path)?;
                wal.segments.truncate(p.segment);
            } else {
                let f = OpenOptions::new()
                    .write(true)
                    .open(&cut_path)
                    .map_err(|e| StoreError::file(&cut_path, e))?;
                f.set_len(p.offset)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| StoreError::file(&cut_path, e))?;
                if let Some(seg) = wal.segments.get_mut(p.segment) {
                    seg.allocated = p.offset;
                }
            }
            crate::sync_dir(&wal.dir)?;
        }
        let last_index = wal.last.map(|l| l.index).max(purged);
        if let Some(r) = recorded {
            if last_index.is_none_or(|i| i < r.index) {
                return Err(StoreError::LogEndsEarly {
                    found: last_index,
                    recorded: r.index,
                });
            }
        }
        if !wal.dir.exists() {
            std::fs::create_dir_all(&wal.dir).map_err(|e| StoreError::file(&wal.dir, e))?;
            crate::sync_dir(data_dir)?;
        }
        Ok(wal)
    }

    /// Write a new log holding `entries` (consecutive) in `data_dir`, replacing any there,
    /// durably (the upgrade from a log kept in sled).
    pub fn create_from(
        data_dir: &Path,
        entries: impl IntoIterator<Item = LogEntry>,
        purged: Option<u64>,
    ) -> Result<(), StoreError> {
        let dir = data_dir.join(DIR);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| StoreError::file(&dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::file(&dir, e))?;
        crate::sync_dir(data_dir)?;
        let mut wal = Wal::empty(dir, purged);
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
            if after.is_some_and(|a| index <= a)
                || (!batch.is_empty() && after != index.checked_sub(1))
            {
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
            self.segments.push(Segment::create(&self.dir, first)?);
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
                remove_segment(&seg.path)?;
                removed = true;
            }
        }
        if let Some(seg) = self.segments.last_mut() {
            let i = (index - seg.first) as usize;
            if i == 0 {
                let path = seg.path.clone();
                self.segments.pop();
                remove_segment(&path)?;
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
            crate::sync_dir(&self.dir)?;
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
            remove_segment(&seg.path)?;
            removed = true;
        }
        if self.last.is_some_and(|l| l.index <= index) {
            for seg in self.segments.drain(..) {
                remove_segment(&seg.path)?;
                removed = true;
            }
            self.last = None;
        }
        if removed {
            crate::sync_dir(&self.dir)?;
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

fn remove_segment(path: &Path) -> Result<(), StoreError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::file(path, e)),
    }
}

/// The group commit: one thread that makes appended entries durable and acknowledges them.
///
/// For everything queued since its last round it runs one `fdatasync` of the open segment,
/// then records the last log id in the hard state (its own `fdatasync`), then calls the
/// appends' callbacks in order. An append is never acknowledged before an `fdatasync` that
/// started after its entries were written. After a failed sync every later append fails
/// too: the kernel may have dropped the dirty pages, so a later successful sync proves
/// nothing (and openraft stops the node on the first failure anyway).
pub struct Flusher {
    jobs: mpsc::Sender<Job>,
}

enum Job {
    Append {
        file: Arc<File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        /// When openraft called `append` (for [`StorageObserver::wal_append`]).
        since: Instant,
    },
    /// Answered once every append queued before it is acknowledged.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

impl Flusher {
    /// Start the thread; it ends when the last [`Flusher`] handle is dropped.
    /// `committed` is written with every hard-state record (see
    /// [`HardStateValue::committed`](crate::hardstate::HardStateValue)). The thread reports
    /// its fsync and append timings to the observer in `hook`, once one is installed.
    pub(crate) fn start(
        hard: Arc<Mutex<HardState>>,
        committed: Arc<Mutex<Option<LogId<NodeId>>>>,
        hook: Hook,
    ) -> Result<Flusher, StoreError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("fenced-wal".into())
            .spawn(move || flush_loop(&rx, &hard, &committed, &hook))
            .map_err(|e| StoreError::file(Path::new("fenced-wal thread"), e))?;
        Ok(Flusher { jobs })
    }

    /// Acknowledge `callback` once the entries up to `last`, written to `file`, are durable.
    /// If the thread is gone, the callback is dropped, which openraft reports as an error.
    /// `since`: when the append began (its duration is reported once it is durable).
    pub fn sync(
        &self,
        file: Arc<File>,
        last: LogId<NodeId>,
        callback: LogFlushed<TypeConfig>,
        since: Instant,
    ) {
        let _ = self.jobs.send(Job::Append {
            file,
            last,
            callback,
            since,
        });
    }

    /// Wait until every append queued so far is acknowledged.
    pub async fn drain(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.jobs.send(Job::Barrier(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Put the latest committed log id into a hard-state record about to be written, if the log
/// it records reaches it.
pub(crate) fn note_committed(
    value: &mut crate::hardstate::HardStateValue,
    committed: &Mutex<Option<LogId<NodeId>>>,
) {
    let c = *committed.lock().unwrap_or_else(PoisonError::into_inner);
    if c.is_some_and(|c| value.last_log_id.is_some_and(|l| c.index <= l.index)) {
        value.committed = c;
    }
}

fn flush_loop(
    rx: &mpsc::Receiver<Job>,
    hard: &Mutex<HardState>,
    committed: &Mutex<Option<LogId<NodeId>>>,
    hook: &Hook,
) {
    let mut failed: Option<String> = None;
    let mut batch = Vec::new();
    while let Ok(first) = rx.recv() {
        batch.push(first);
        batch.extend(rx.try_iter());
        let mut files: Vec<&Arc<File>> = Vec::new();
        let mut last = None;
        for job in &batch {
            if let Job::Append { file, last: l, .. } = job {
                if !files.iter().any(|f| Arc::ptr_eq(f, file)) {
                    files.push(file);
                }
                last = Some(*l);
            }
        }
        if failed.is_none() && last.is_some() {
            let synced = files
                .iter()
                .try_for_each(|f| {
                    let started = Instant::now();
                    f.sync_data()?;
                    if let Some(o) = hook.get() {
                        o.wal_fsync(started.elapsed());
                    }
                    Ok::<(), io::Error>(())
                })
                .map_err(|e| format!("log fsync failed: {e}"))
                .and_then(|()| {
                    let mut h = hard.lock().unwrap_or_else(PoisonError::into_inner);
                    let mut value = h.value().clone();
                    value.last_log_id = last;
                    note_committed(&mut value, committed);
                    h.write(value).map_err(|e| e.to_string())
                });
            if let Err(e) = synced {
                tracing::error!("{e}");
                failed = Some(e);
            }
        }
        let observer = hook.get().filter(|_| failed.is_none());
        for job in batch.drain(..) {
            match job {
                Job::Append {
                    callback, since, ..
                } => {
                    let result = match &failed {
                        None => Ok(()),
                        Some(e) => Err(io::Error::other(e.clone())),
                    };
                    // Observed before the acknowledgement, so that every acknowledged
                    // append has been counted by the time its caller goes on.
                    if let Some(o) = observer {
                        o.wal_append(since.elapsed());
                    }
                    callback.log_io_completed(result);
                }
                Job::Barrier(done) => {
                    let _ = done.send(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn blank(term: u64, index: u64) -> LogEntry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn indexes(entries: &[LogEntry]) -> Vec<u64> {
        entries.iter().map(|e| e.log_id.index).collect()
    }

    fn small(dir: &Path, recorded: Option<u64>, purged: Option<u64>) -> Wal {
        let recorded = recorded.map(|i| LogId::new(CommittedLeaderId::new(1, 1), i));
        let mut wal = Wal::open(dir, recorded, purged).expect("open");
        wal.segment_bytes = 200;
        wal.cache.clear();
        wal.cache_bytes = 0;
        wal
    }

    fn segment_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(DIR))
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
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

    #[test]
    fn a_missing_segment_is_a_hole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        for i in 0..=40 {
            wal.append([blank(1, i)]).expect("append");
        }
        drop(wal);
        let files = segment_files(dir.path());
        std::fs::remove_file(dir.path().join(DIR).join(&files[1])).expect("rm");
        let recorded = Some(LogId::new(CommittedLeaderId::new(1, 1), 40));
        assert!(matches!(
            Wal::open(dir.path(), recorded, None),
            Err(StoreError::LogHole { .. })
        ));
        // The same gap past what was acknowledged is a tail nobody was promised: cut off.
        let kept: u64 = files[1].trim_end_matches(".wal").parse().expect("name");
        let recorded = Some(LogId::new(CommittedLeaderId::new(1, 1), kept - 1));
        let wal = Wal::open(dir.path(), recorded, None).expect("open");
        assert_eq!(wal.last_log_id().map(|l| l.index), Some(kept - 1));
        assert_eq!(segment_files(dir.path()).len(), 1);
    }

    #[test]
    fn a_missing_first_segment_after_a_purge_is_a_hole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        for i in 1..=40 {
            wal.append([blank(1, i)]).expect("append");
        }
        wal.purge(3).expect("purge");
        drop(wal);
        let files = segment_files(dir.path());
        let first: u64 = files[0].trim_end_matches(".wal").parse().expect("name");
        assert!(first <= 4, "the segment holding entry 4 stays");
        std::fs::remove_file(dir.path().join(DIR).join(&files[0])).expect("rm");
        let recorded = Some(LogId::new(CommittedLeaderId::new(1, 1), 40));
        assert!(matches!(
            Wal::open(dir.path(), recorded, Some(3)),
            Err(StoreError::LogHole { after: 3, .. })
        ));
        // Purged past the lost segment, the log legitimately starts later.
        let next: u64 = files[1].trim_end_matches(".wal").parse().expect("name");
        let wal = Wal::open(dir.path(), recorded, Some(next - 1)).expect("open");
        assert_eq!(wal.last_log_id().map(|l| l.index), Some(40));
    }

    #[test]
    fn a_newer_segment_version_is_named_not_called_corrupt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        wal.append([blank(1, 0)]).expect("append");
        drop(wal);
        let path = dir.path().join(DIR).join(segment_name(0));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[8] = 9;
        std::fs::write(&path, bytes).expect("write");
        assert!(matches!(
            Wal::open(dir.path(), None, None),
            Err(StoreError::UnknownFormat { found: 9, .. })
        ));
    }
}
