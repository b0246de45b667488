//! Opening the log: every record checked, a tail nobody was promised cut off (see the
//! module docs of [`super`]).

use std::io;
use std::path::Path;
use std::sync::Arc;

use fenced_fs::{Fs, Mode};
use fenced_raft_types::NodeId;
use openraft::LogId;

use super::segment::{segment_name, Segment};
use super::{remove_segment, Wal, DIR, FILE_VERSION, HEADER, MAGIC};
use crate::hardstate::HardState;
use crate::StoreError;

/// What [`Wal::open`] found wrong at some point of the log.
struct Problem {
    /// The index the bad spot should have held.
    index: u64,
    error: StoreError,
    /// Where to cut to drop it and everything after it: segment position and byte offset.
    segment: usize,
    offset: u64,
}

impl Wal {
    /// [`Wal::check_on`] on the real file system.
    #[cfg(test)]
    pub(crate) fn open(
        data_dir: &Path,
        recorded: Option<LogId<NodeId>>,
        purged: Option<u64>,
    ) -> Result<Wal, StoreError> {
        Wal::check_on(&fenced_fs::os(), data_dir, recorded, purged)
    }

    /// Open (or create) the log in `data_dir` on `fs` ([`Wal::check_on`] against the log end
    /// `hard` records; `purged` is the last purged index), then raise that record to the
    /// log's end before anything is served. The entries past the record were written again
    /// and synced, and the segments' names too: they are durable, and the record says so now
    /// rather than at the next append round. Left trailing, an idle node would keep it across
    /// restarts, and damage to entries it had acknowledged would read as a torn tail, cut
    /// instead of refused.
    pub fn open_on(
        fs: &Arc<dyn Fs>,
        data_dir: &Path,
        hard: &mut HardState,
        purged: Option<u64>,
    ) -> Result<Wal, StoreError> {
        let wal = Wal::check_on(fs, data_dir, hard.value().last_log_id, purged)?;
        let recorded = hard.value().last_log_id;
        if wal.last.map(|l| l.index) > recorded.map(|r| r.index) {
            let mut value = hard.value().clone();
            value.last_log_id = wal.last;
            hard.write(value)?;
        }
        Ok(wal)
    }

    /// Open (or create) the log in `data_dir` on `fs`, checking every record. `recorded` is
    /// the last log id the hard state says this node made durable; `purged` the last purged
    /// index. The record itself is left as it is ([`Wal::open_on`] raises it).
    pub(crate) fn check_on(
        fs: &Arc<dyn Fs>,
        data_dir: &Path,
        recorded: Option<LogId<NodeId>>,
        purged: Option<u64>,
    ) -> Result<Wal, StoreError> {
        let dir = data_dir.join(DIR);
        let listing = match fs.read_dir(&dir) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StoreError::file(&dir, e)),
        };
        let mut firsts = Vec::new();
        for item in listing {
            match item
                .name
                .strip_suffix(".wal")
                .and_then(|n| n.parse::<u64>().ok())
            {
                Some(first) => firsts.push(first),
                None => {
                    return Err(StoreError::Damaged {
                        path: dir.join(&item.name),
                        detail: "an unknown file in the log directory".into(),
                    })
                }
            }
        }
        firsts.sort_unstable();

        let mut wal = Wal::empty(fs, dir, purged);
        let mut problem = None;
        // After a purge the log must go on right after the purged prefix: a first segment
        // that starts later lost its predecessor (`purge` records the purged id durably
        // before it deletes segments).
        let start = purged.map(|p| p + 1);
        'segments: for (pos, first) in firsts.iter().copied().enumerate() {
            let path = wal.dir.join(segment_name(first));
            let expected = match (wal.last, start) {
                // Segments the purge emptied, left behind by a crash between recording the
                // purge and removing them (their removal not yet durable), then the segment
                // the log went on in after the purge point (a snapshot installed past the
                // log's end): a gap in purged entries only, not a hole.
                (Some(l), Some(s)) if l.index < s && (l.index + 1..=s).contains(&first) => {
                    if first != l.index + 1 {
                        // The cache holds consecutive entries only (see `append`).
                        wal.cache.clear();
                        wal.cache_bytes = 0;
                    }
                    first
                }
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
            let bytes = fs.read(&path).map_err(|e| StoreError::file(&path, e))?;
            let file = fs
                .open(&path, Mode::Write)
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
                file,
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
                    // The zeros ahead of the records ([`GROW_BYTES`]) end them — if nothing
                    // but zeros follows. Bytes after a zero length are records that reached
                    // the disk while the page of an earlier one did not (a crash between
                    // writing and `fdatasync`): never acknowledged (unless at or before
                    // `recorded`, which is damage), and they must go with the lost one. Left
                    // in place, an entry of the same size written later over the lost one
                    // would make them readable again: older terms after a newer one.
                    if let Some(stale) = bytes[at..].iter().position(|b| *b != 0) {
                        problem = Some(bad(StoreError::Damaged {
                            path: path.clone(),
                            detail: format!(
                                "a zero record length at byte {at}, then data at byte {} \
                                 (a write lost in a crash before later ones)",
                                at + stale
                            ),
                        }));
                        wal.segments.push(seg);
                        break 'segments;
                    }
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
                remove_segment(&**fs, &wal.dir.join(segment_name(*first)))?;
            }
            let cut_path = wal.dir.join(segment_name(firsts[p.segment]));
            if p.offset <= HEADER {
                remove_segment(&**fs, &cut_path)?;
                wal.segments.truncate(p.segment);
            } else {
                let f = fs
                    .open(&cut_path, Mode::Write)
                    .map_err(|e| StoreError::file(&cut_path, e))?;
                f.set_len(p.offset)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| StoreError::file(&cut_path, e))?;
                if let Some(seg) = wal.segments.get_mut(p.segment) {
                    seg.allocated = p.offset;
                }
            }
            crate::sync_dir(&**fs, &wal.dir)?;
        }
        wal.rewrite_unrecorded(recorded)?;
        let last_index = wal.last.map(|l| l.index).max(purged);
        if let Some(r) = recorded {
            if last_index.is_none_or(|i| i < r.index) {
                return Err(StoreError::LogEndsEarly {
                    found: last_index,
                    recorded: r.index,
                });
            }
        }
        crate::create_dir_all_durably(&**fs, &wal.dir)?;
        // The segments' names may not be durable: a process whose directory fsync failed
        // left them in the cache only, and this one appends to them (found by fenced-sim:
        // a learner's first segment vanished in a power loss with 76 acknowledged entries).
        crate::sync_dir(&**fs, &wal.dir)?;
        Ok(wal)
    }
}

impl Wal {
    /// Write the intact records past `recorded` again, and sync them. They were never
    /// acknowledged, and they may be in the page cache only: after a failed `fdatasync` Linux
    /// marks the pages clean although they never reached the disk, so a restarted node reads
    /// them, and a later successful sync would not write them — yet the next append would
    /// record them as durable, and a power loss would then take acknowledged entries away.
    /// Written again, the pages are dirty and the sync writes them. (Not cut off instead:
    /// `recorded` can be behind the log, when the newest hard-state copy was damaged and the
    /// older one read, and entries past it may have been acknowledged.)
    fn rewrite_unrecorded(&self, recorded: Option<LogId<NodeId>>) -> Result<(), StoreError> {
        let from = recorded.map_or(0, |r| r.index + 1);
        for seg in &self.segments {
            // The segment's first record past `recorded`, if it has one.
            let i = from.saturating_sub(seg.first);
            let Some(&at) = usize::try_from(i).ok().and_then(|i| seg.offsets.get(i)) else {
                continue;
            };
            let mut bytes = vec![0; (seg.end - at) as usize];
            seg.file
                .read_exact_at(&mut bytes, at)
                .and_then(|()| seg.file.write_all_at(&bytes, at))
                .and_then(|()| seg.file.sync_data())
                .map_err(|e| StoreError::file(&seg.path, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{blank, indexes, segment_files, small};
    use super::super::{encode_record, SEGMENT_BYTES};
    use super::*;
    use openraft::CommittedLeaderId;

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

    /// Intact entries past the recorded log are kept, and written to the disk again: they
    /// may be in the page cache only (a failed fsync forgets its pages, Linux marks them
    /// clean), and a later sync would record them.
    #[test]
    fn entries_past_the_recorded_log_are_written_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = fenced_fs::SimFs::new(dir.path(), 1);
        disk.set_faults(fenced_fs::DiskFaults {
            page_survives: 0.0,
            ..Default::default()
        });
        let fs: Arc<dyn Fs> = Arc::new(disk.clone());
        fs.create_dir_all(dir.path()).expect("mkdir");
        let mut wal = Wal::check_on(&fs, dir.path(), None, None).expect("create");
        wal.append([blank(1, 1)]).expect("append");
        for seg in &wal.segments {
            seg.file.sync_data().expect("sync");
        }
        drop(wal);
        // Entries 2 and 3 are written, and their fsync fails: in the cache, not on the disk.
        let mut wal = Wal::check_on(&fs, dir.path(), id(1, 1), None).expect("open");
        disk.set_faults(fenced_fs::DiskFaults {
            fsync_error: 1.0,
            page_survives: 0.0,
            ..Default::default()
        });
        wal.append([blank(1, 2), blank(1, 3)])
            .expect("written to the cache");
        for seg in &wal.segments {
            assert!(seg.file.sync_data().is_err(), "the fsync fails");
        }
        drop(wal);
        disk.set_faults(fenced_fs::DiskFaults {
            page_survives: 0.0,
            ..Default::default()
        });
        // The restarted node still reads them; opening writes them again.
        let wal = Wal::check_on(&fs, dir.path(), id(1, 1), None).expect("reopen");
        assert_eq!(wal.last_log_id(), id(1, 3));
        drop(wal);
        disk.power_loss();
        let wal = Wal::check_on(&fs, dir.path(), id(1, 3), None).expect("after a power loss");
        assert_eq!(wal.last_log_id(), id(1, 3), "the entries reached the disk");
    }

    /// Zero the bytes of entry `index`'s record (its length and its body), as a crash that
    /// lost that page of the file while later records reached the disk leaves it. Returns
    /// the record's length.
    fn lose_record(dir: &Path, index: u64) -> usize {
        let files = segment_files(dir);
        let name = files
            .iter()
            .rev()
            .find(|n| n.trim_end_matches(".wal").parse::<u64>().expect("name") <= index)
            .expect("the segment holding the entry");
        let path = dir.join(DIR).join(name);
        let mut bytes = std::fs::read(&path).expect("read");
        let mut at = HEADER as usize;
        let mut i: u64 = name.trim_end_matches(".wal").parse().expect("name");
        loop {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            assert!(len > 0, "entry {index} is not in {name}");
            if i == index {
                bytes[at..at + 4 + len].fill(0);
                std::fs::write(&path, &bytes).expect("write");
                return 4 + len;
            }
            at += 4 + len;
            i += 1;
        }
    }

    fn terms(wal: &Wal) -> Vec<(u64, u64)> {
        wal.read(0..1_000)
            .expect("read")
            .iter()
            .map(|e| (e.log_id.index, e.log_id.leader_id.term))
            .collect()
    }

    fn id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    /// Recovery stops at a lost record; the records after it (which reached the disk, but
    /// were never acknowledged) must go with it. Left in place, a new leader's entry of the
    /// same size written over the lost one makes them readable again on the next start: a
    /// log whose terms go down (term-1 entries after a term-2 entry).
    /// `last` entries in segments of `segment_bytes`; entry `lost` is lost. Returns how many
    /// segments the log had.
    fn a_lost_record_takes_the_records_after_it_along(
        segment_bytes: u64,
        last: u64,
        lost: u64,
    ) -> usize {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        wal.segment_bytes = segment_bytes;
        for i in 1..=last {
            wal.append([blank(1, i)]).expect("append");
        }
        drop(wal);
        let segments = segment_files(dir.path()).len();
        let len = lose_record(dir.path(), lost);

        // Had the lost entry been acknowledged, this would be damage: refused, not repaired.
        assert!(matches!(
            Wal::open(dir.path(), id(1, last), None),
            Err(StoreError::Damaged { .. } | StoreError::LogEndsEarly { .. })
        ));
        // Entries up to `lost - 1` were acknowledged; the rest were not.
        let mut wal = Wal::open(dir.path(), id(1, lost - 1), None).expect("open");
        assert_eq!(wal.last_log_id(), id(1, lost - 1));
        // A new leader's entry at the lost index, of the same size, made durable.
        let mut record = Vec::new();
        assert_eq!(
            encode_record(&blank(2, lost), &mut record).expect("encode"),
            len
        );
        wal.append([blank(2, lost)]).expect("append");
        for s in &wal.segments {
            s.file.sync_data().expect("sync");
        }
        drop(wal);

        let wal = Wal::open(dir.path(), id(2, lost), None).expect("reopen");
        let found = terms(&wal);
        assert!(
            found.windows(2).all(|w| w[0].1 <= w[1].1),
            "terms go down in the recovered log: {found:?}"
        );
        assert_eq!(wal.last_log_id(), id(2, lost), "{found:?}");
        assert_eq!(
            indexes(&wal.read(0..1_000).expect("read")),
            (1..=lost).collect::<Vec<_>>()
        );
        segments
    }

    /// A snapshot installed past the log's end purges every entry; a crash before the
    /// removal of the segments it emptied was durable leaves them behind, and the log goes on
    /// in a new segment after the purge point. That gap holds purged entries only: the next
    /// start must not refuse it as a hole (fenced-sim seeds 40 and 196, `--clients 32
    /// --faults disk,flicker,crashes,partitions,noise`), nor serve a wrong entry.
    #[test]
    fn segments_a_purge_emptied_left_behind_by_a_crash_are_no_hole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut wal = small(dir.path(), None, None);
        for i in 1..=5 {
            wal.append([blank(1, i)]).expect("append");
        }
        let left: Vec<(String, Vec<u8>)> = segment_files(dir.path())
            .into_iter()
            .map(|n| {
                let bytes = std::fs::read(dir.path().join(DIR).join(&n)).expect("read");
                (n, bytes)
            })
            .collect();
        // A snapshot up to 9 installed: everything purged, the segments removed...
        wal.purge(9).expect("purge");
        assert!(segment_files(dir.path()).is_empty());
        drop(wal);
        // ...but the crash came before their removal was durable.
        for (n, bytes) in &left {
            std::fs::write(dir.path().join(DIR).join(n), bytes).expect("write");
        }
        let mut wal = small(dir.path(), Some(5), Some(9));
        assert_eq!(wal.read(0..100).expect("read"), Vec::new());
        // The log goes on after the purge point, in a new segment.
        wal.append([blank(2, 10), blank(2, 11)]).expect("append");
        for s in &wal.segments {
            s.file.sync_data().expect("sync");
        }
        drop(wal);

        let mut wal = Wal::open(dir.path(), id(2, 11), Some(9)).expect("no hole");
        assert_eq!(wal.last_log_id(), id(2, 11));
        assert_eq!(indexes(&wal.read(0..100).expect("read")), vec![10, 11]);
        assert_eq!(indexes(&wal.read(11..12).expect("read")), vec![11]);
        wal.append([blank(2, 12)]).expect("append");
        assert_eq!(indexes(&wal.read(10..13).expect("read")), vec![10, 11, 12]);
        // The next purge removes what was left behind.
        wal.purge(10).expect("purge");
        assert_eq!(indexes(&wal.read(0..100).expect("read")), vec![11, 12]);
        assert!(segment_files(dir.path()).iter().all(|n| n
            .trim_end_matches(".wal")
            .parse::<u64>()
            .expect("name")
            >= 10));
    }

    #[test]
    fn a_lost_record_in_the_last_segment_takes_the_records_after_it_along() {
        // One segment: the lost record is followed by two more in the same file.
        assert_eq!(
            a_lost_record_takes_the_records_after_it_along(SEGMENT_BYTES, 4, 2),
            1
        );
    }

    #[test]
    fn a_lost_record_before_the_last_segment_takes_the_records_after_it_along() {
        // Many segments: the lost record's segment ends in stale records, the next segments
        // start past the hole.
        assert!(a_lost_record_takes_the_records_after_it_along(200, 40, 2) > 2);
    }
}
