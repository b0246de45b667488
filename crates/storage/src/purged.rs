//! The `purged` file: the last purged log id (openraft's `last_purged_log_id`), kept in a file
//! of its own beside the [`hardstate`](crate::hardstate) file. Data dirs of layout 3 kept it in
//! sled; [`crate::open`] moves it here once (see `open.rs`).
//!
//! Layout: `"FNCDPRG\0"` then one record sealed by [`frame`](crate::frame) (format version,
//! crc32) of bincode `Option<LogId>`. A write goes to `purged.tmp`, which is fsynced and
//! renamed over `purged`, then the directory is fsynced: a crash leaves the old value or the
//! new one, never a torn one. Any damage — bad magic, a failed checksum, bytes that do not
//! decode — refuses the data dir: an older value would claim entries the log no longer
//! holds, a lost one would hide that the log was purged.
//!
//! The file exists in every data dir of layout 4 that holds a hard-state file: it is created
//! first (before the hard state) in a new data dir, and written before sled's files are
//! removed in an upgraded one.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fenced_fs::Fs;
use fenced_raft_types::NodeId;
use openraft::LogId;

use crate::{frame, StoreError};

/// File name inside the data dir.
pub const FILE_NAME: &str = "purged";
const TMP_NAME: &str = "purged.tmp";
const MAGIC: &[u8; 8] = b"FNCDPRG\0";

/// The file in one data dir and the value it holds. Not synchronized: the owner wraps it in a
/// mutex.
#[derive(Debug)]
pub struct Purged {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    value: Option<LogId<NodeId>>,
}

impl Purged {
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(FILE_NAME)
    }

    /// [`Purged::create_on`] on the real file system.
    #[cfg(test)]
    pub(crate) fn create(dir: &Path, value: Option<LogId<NodeId>>) -> Result<Purged, StoreError> {
        Purged::create_on(&fenced_fs::os(), dir, value)
    }

    /// Create (or replace) the file in `dir` on `fs` with `value`, durably.
    pub fn create_on(
        fs: &Arc<dyn Fs>,
        dir: &Path,
        value: Option<LogId<NodeId>>,
    ) -> Result<Purged, StoreError> {
        let mut p = Purged {
            fs: fs.clone(),
            dir: dir.to_owned(),
            value: None,
        };
        p.store(value)?;
        Ok(p)
    }

    /// [`Purged::open_on`] on the real file system.
    #[cfg(test)]
    pub(crate) fn open(dir: &Path) -> Result<Option<Purged>, StoreError> {
        Purged::open_on(&fenced_fs::os(), dir)
    }

    /// The file in `dir` on `fs`; `Ok(None)` if there is none. Read-only (offline tools may
    /// use it).
    pub fn open_on(fs: &Arc<dyn Fs>, dir: &Path) -> Result<Option<Purged>, StoreError> {
        let path = Self::path_in(dir);
        let bytes = match fs.read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(StoreError::file(&path, e)),
        };
        let damaged = |detail: String| StoreError::Damaged {
            path: path.clone(),
            detail,
        };
        let Some(record) = bytes.strip_prefix(MAGIC.as_slice()) else {
            return Err(damaged("not a purged-log-id file (bad magic)".into()));
        };
        let payload = match frame::unseal("last purged log id", record) {
            Ok(p) => p,
            Err(e @ StoreError::UnknownFormat { .. }) => return Err(e),
            Err(e) => return Err(damaged(e.to_string())),
        };
        let value = bincode::deserialize(payload).map_err(|e| damaged(e.to_string()))?;
        Ok(Some(Purged {
            fs: fs.clone(),
            dir: dir.to_owned(),
            value,
        }))
    }

    pub fn value(&self) -> Option<LogId<NodeId>> {
        self.value
    }

    /// Durably replace the value (no-op if unchanged).
    pub fn write(&mut self, value: Option<LogId<NodeId>>) -> Result<(), StoreError> {
        if value == self.value {
            return Ok(());
        }
        self.store(value)
    }

    fn store(&mut self, value: Option<LogId<NodeId>>) -> Result<(), StoreError> {
        let payload = bincode::serialize(&value).map_err(|source| StoreError::Encode {
            what: "last purged log id",
            source,
        })?;
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&frame::seal(&payload));
        crate::replace_file(&*self.fs, &self.dir, FILE_NAME, TMP_NAME, &bytes)?;
        self.value = value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn id(index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(2, 1), index))
    }

    #[test]
    fn roundtrips_and_missing_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(Purged::open(dir.path()).expect("open").is_none());
        let mut p = Purged::create(dir.path(), None).expect("create");
        assert_eq!(
            Purged::open(dir.path()).expect("open").map(|p| p.value()),
            Some(None)
        );
        p.write(id(7)).expect("write");
        p.write(id(9)).expect("write");
        let back = Purged::open(dir.path()).expect("open").expect("exists");
        assert_eq!(back.value(), id(9));
        assert!(!dir.path().join(TMP_NAME).exists());
    }

    #[test]
    fn every_flipped_bit_and_a_cut_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        Purged::create(dir.path(), id(41)).expect("create");
        let path = Purged::path_in(dir.path());
        let good = std::fs::read(&path).expect("read");
        let mut bad_files = Vec::new();
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                bad_files.push(bad);
            }
        }
        for len in 0..good.len() {
            bad_files.push(good[..len].to_vec());
        }
        for bad in bad_files {
            std::fs::write(&path, &bad).expect("write");
            match Purged::open(dir.path()) {
                Err(e @ StoreError::Damaged { .. }) => {
                    assert!(e.to_string().contains(FILE_NAME), "{e}")
                }
                Err(StoreError::UnknownFormat { .. }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
