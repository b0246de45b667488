//! The operator's quarantine list: log indexes whose entries are applied as a no-op
//! ([`fenced_core::StateMachine::apply_quarantined`]) instead of being run.
//!
//! It exists to recover a *poisoned* log: a committed entry whose apply hangs or panics on
//! every replica stops every node for good, because each replays it at start. The operator
//! stops every member and runs `fenced debug quarantine --data-dir DIR --index N` on each
//! data dir (docs/operations.md, "Recover from a poisoned log entry"); [`crate::open`] loads
//! the list, and the state machine store and [`crate::inspect`] consult it for every normal
//! entry they apply. The replacement is a pure function of the index and the entry, so
//! members that quarantined the same indexes keep equal states; a member that did not would
//! either hang on the entry again or, if it could apply it, hold another state, which the
//! divergence alarm's digests catch (a quarantined entry takes no revision, an applied one
//! does).
//!
//! `quarantine` in the data dir holds one sealed ([`crate::frame`]) bincode list of indexes,
//! ascending: written to `quarantine.tmp`, fsync'ed, renamed and the directory fsync'ed, so
//! it is absent or whole. A file that exists but fails its checksum refuses the data dir
//! ([`load_on`] says so): which entries to skip is not known.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use fenced_fs::Fs;

use crate::StoreError;

/// File name inside the data dir.
pub const FILE_NAME: &str = "quarantine";
const WHAT: &str = "quarantine list";

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// The quarantined indexes recorded in `dir` on `fs` (none without the file). `Err` when the
/// file exists but cannot be read or fails its checksum.
pub fn load_on(fs: &dyn Fs, dir: &Path) -> Result<BTreeSet<u64>, StoreError> {
    let path = path_in(dir);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(StoreError::file(&path, e)),
    };
    let list: Vec<u64> = crate::decode(WHAT, &bytes).map_err(|e| match e {
        e @ StoreError::UnknownFormat { .. } => e,
        e => StoreError::Damaged {
            path: path.clone(),
            detail: e.to_string(),
        },
    })?;
    Ok(list.into_iter().collect())
}

/// Add `index` to the list in `dir` on `fs`, durably; the whole list after it. Offline only:
/// a running node reads the list once, when it opens its data dir.
pub fn add_on(fs: &dyn Fs, dir: &Path, index: u64) -> Result<BTreeSet<u64>, StoreError> {
    let mut set = load_on(fs, dir)?;
    if set.insert(index) {
        let list: Vec<u64> = set.iter().copied().collect();
        let bytes = crate::encode(WHAT, &list)?;
        crate::replace_file(fs, dir, FILE_NAME, &format!("{FILE_NAME}.tmp"), &bytes)?;
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_accumulate_survive_and_a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = fenced_fs::OsFs;
        assert!(load_on(&fs, dir.path()).expect("no file").is_empty());
        add_on(&fs, dir.path(), 40).expect("add");
        add_on(&fs, dir.path(), 7).expect("add");
        let set = add_on(&fs, dir.path(), 40).expect("add again");
        assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![7, 40]);
        let back = load_on(&fs, dir.path()).expect("load");
        assert_eq!(back.into_iter().collect::<Vec<_>>(), vec![7, 40]);
        assert!(!dir.path().join("quarantine.tmp").exists());
        let good = std::fs::read(path_in(dir.path())).expect("read");
        for byte in 0..good.len() {
            let mut bad = good.clone();
            bad[byte] ^= 0x10;
            std::fs::write(path_in(dir.path()), &bad).expect("write");
            assert!(load_on(&fs, dir.path()).is_err(), "flip in byte {byte}");
        }
    }
}
