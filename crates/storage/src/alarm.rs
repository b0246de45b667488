//! The divergence alarm's file: once raised, a member's alarm survives restarts.
//!
//! `alarm` in the data dir holds one sealed ([`crate::frame`]) bincode [`AlarmRecord`]:
//! written to `alarm.tmp`, fsync'ed, renamed and the directory fsync'ed, so it is either
//! absent or whole. A file that exists but fails its checksum still counts as an alarm
//! ([`load`] says so): the member must not serve from a state it was told is wrong.

use std::path::{Path, PathBuf};

use fenced_fs::Fs;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// File name inside the data dir.
pub const FILE_NAME: &str = "alarm";

/// Why this member is fenced out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmRecord {
    /// The log index at which the digests were compared.
    pub index: u64,
    /// This member's digest of its state at `index`.
    pub digest: u64,
    /// The digest the majority of the members computed at `index`.
    pub majority: u64,
    /// The member (the leader) that found the disagreement.
    pub raised_by: u64,
    /// Wall-clock time the alarm was raised (ms since the Unix epoch), for people.
    pub raised_at_ms: u64,
}

impl std::fmt::Display for AlarmRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state diverged at log index {}: this member's digest {:016x}, the majority's \
             {:016x} (found by member {})",
            self.index, self.digest, self.majority, self.raised_by
        )
    }
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// [`load_on`] on the real file system.
#[cfg(test)]
pub(crate) fn load(dir: &Path) -> Result<Option<AlarmRecord>, StoreError> {
    load_on(&fenced_fs::OsFs, dir)
}

/// The alarm recorded in `dir` on `fs`, if any. `Err` only when the file exists but cannot
/// be read or fails its checksum: the caller must treat that as raised too.
pub fn load_on(fs: &dyn Fs, dir: &Path) -> Result<Option<AlarmRecord>, StoreError> {
    let path = path_in(dir);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::file(&path, e)),
    };
    crate::decode("divergence alarm", &bytes).map(Some)
}

/// [`save_on`] on the real file system.
#[cfg(test)]
pub(crate) fn save(dir: &Path, alarm: &AlarmRecord) -> Result<(), StoreError> {
    save_on(&fenced_fs::OsFs, dir, alarm)
}

/// Record `alarm` in `dir` on `fs`, durably (see the module docs).
pub fn save_on(fs: &dyn Fs, dir: &Path, alarm: &AlarmRecord) -> Result<(), StoreError> {
    let bytes = crate::encode("divergence alarm", alarm)?;
    crate::replace_file(fs, dir, FILE_NAME, &format!("{FILE_NAME}.tmp"), &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_alarm_survives_and_a_damaged_file_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load(dir.path()).expect("no file"), None);
        let a = AlarmRecord {
            index: 40,
            digest: 1,
            majority: 2,
            raised_by: 3,
            raised_at_ms: 4,
        };
        save(dir.path(), &a).expect("save");
        assert_eq!(load(dir.path()).expect("load"), Some(a));
        let mut bytes = std::fs::read(path_in(dir.path())).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(path_in(dir.path()), bytes).expect("write");
        assert!(load(dir.path()).is_err());
    }
}
