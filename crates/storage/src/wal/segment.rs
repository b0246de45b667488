//! One segment file of the log: its header, its records' offsets, and the zeros written
//! ahead of them.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::{File, Fs, Mode};

use super::{LogEntry, FILE_VERSION, GROW_BYTES, HEADER, MAGIC};
use crate::StoreError;

pub(super) fn segment_name(first: u64) -> String {
    format!("{first:020}.wal")
}

pub(super) fn header() -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
    h
}

/// One segment file.
pub(super) struct Segment {
    pub(super) first: u64,
    pub(super) path: PathBuf,
    pub(super) file: Arc<dyn File>,
    /// Byte offset of each record (entry `first + i` at `offsets[i]`).
    pub(super) offsets: Vec<u64>,
    /// Where the next record goes.
    pub(super) end: u64,
    /// The file's length: zeros from `end` to here ([`GROW_BYTES`]).
    pub(super) allocated: u64,
}

impl Segment {
    pub(super) fn create(fs: &dyn Fs, dir: &Path, first: u64) -> Result<Segment, StoreError> {
        let path = dir.join(segment_name(first));
        let file = fs
            .open(&path, Mode::Truncate)
            .map_err(|e| StoreError::file(&path, e))?;
        file.write_all_at(&header(), 0)
            .map_err(|e| StoreError::file(&path, e))?;
        let mut seg = Segment {
            first,
            path,
            file,
            offsets: Vec::new(),
            end: HEADER,
            allocated: HEADER,
        };
        seg.grow(HEADER)?;
        seg.file
            .sync_data()
            .map_err(|e| StoreError::file(&seg.path, e))?;
        crate::sync_dir(fs, dir)?;
        Ok(seg)
    }

    /// Make room for `bytes` more records: write zeros past the allocated end, in
    /// [`GROW_BYTES`] steps (made durable by the next sync of the segment).
    pub(super) fn grow(&mut self, bytes: u64) -> Result<(), StoreError> {
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
    pub(super) fn next(&self) -> u64 {
        self.first + self.offsets.len() as u64
    }

    pub(super) fn span(&self, i: usize) -> Range<u64> {
        let end = self.offsets.get(i + 1).copied().unwrap_or(self.end);
        self.offsets[i]..end
    }

    pub(super) fn read_records(&self, indexes: Range<u64>) -> Result<Vec<LogEntry>, StoreError> {
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
