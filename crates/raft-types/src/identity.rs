//! Who a data dir belongs to: the `identity` file.
//!
//! A data dir carries the cluster id, the member id and a random **incarnation** drawn when
//! the dir was created, plus the incarnations this member has seen of its peers ("pins").
//! Peers refuse Raft and forwarding calls from a member that reappears with another
//! incarnation: a member whose disk was wiped (or replaced) comes back with a new one, and
//! must never vote from its empty log. See `fenced_network::PeerGate` for the checks, and
//! `fenced_storage::datadir` for the rules that create, check and refuse a data dir by it.
//!
//! The file is JSON with a CRC over its content, written atomically (temp file, fsync,
//! rename, fsync of the dir), so it is either the old or the new version, never half. Plain
//! file I/O through the node's [`fenced_fs::Fs`]: it lives here, beside the types the
//! transport uses, so that the transport's identity checks need nothing of the storage crate.
//! [`load`], [`store`] and [`IdentityStore::new`] use the real file system; the `_on`
//! variants take the one to use.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use fenced_fs::{Fs, Mode};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::NodeId;

pub const FILE_NAME: &str = "identity";
const FORMAT: u32 = 1;

/// Errors reading or writing the identity file (the messages are those the storage crate's
/// `StoreError` gives for the same problems in its own files).
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{}: {error}", path.display())]
    File { path: PathBuf, error: io::Error },
    #[error("{} is damaged: {detail}", path.display())]
    Damaged { path: PathBuf, detail: String },
    #[error(
        "{what} has format version {found}, this build reads version {supported}: it was \
         written by another version of fenced (not corrupt; run that version, or a newer one)"
    )]
    UnknownFormat {
        what: &'static str,
        found: u32,
        supported: u32,
    },
}

impl IdentityError {
    fn file(path: &Path, error: io::Error) -> IdentityError {
        IdentityError::File {
            path: path.to_owned(),
            error,
        }
    }
}

/// Where a member stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum MemberState {
    /// Created for a new cluster; the bootstrap (the first membership entry) may not be on
    /// disk yet (a start in this state bootstraps again, idempotently), and the member has not
    /// heard from every other member yet: until it has, it neither votes nor accepts entries
    /// (`fenced_network::PeerGate::bootstrapped`).
    Bootstrapping,
    /// A member with state, past bootstrapping: its data dir must hold a Raft log from now on.
    Ready,
    /// A peer told this member that the cluster knows it under another incarnation: this data
    /// dir is not the one the member acknowledged entries from. It never serves again.
    Retired { reason: String },
}

/// A cluster id as fenced prints it everywhere — `fenced status`, the node's log, error
/// messages, `INFO`: 16 lowercase hex digits, zero-padded, no `0x` (`00c1a5e2b07f3d19`).
pub fn fmt_cluster_id(id: u64) -> String {
    format!("{id:016x}")
}

/// The content of the identity file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub format: u32,
    pub cluster_id: u64,
    pub member_id: NodeId,
    pub incarnation: u64,
    #[serde(flatten)]
    pub state: MemberState,
    pub created_unix_ms: u64,
    /// Incarnation of each peer, as first seen (directly or through another member).
    pub peers: BTreeMap<NodeId, u64>,
}

impl Identity {
    /// A new identity with a fresh random incarnation (drawn through [`crate::rng`]).
    pub fn new(cluster_id: u64, member_id: NodeId, state: MemberState) -> Identity {
        let created_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Identity {
            format: FORMAT,
            cluster_id,
            member_id,
            incarnation: crate::rng::nonzero_u64(),
            state,
            created_unix_ms,
            peers: BTreeMap::new(),
        }
    }
}

impl Identity {
    /// The incarnation pinned for `member` (this member's own for its own id).
    pub fn pinned(&self, member: NodeId) -> Option<u64> {
        if member == self.member_id {
            return Some(self.incarnation);
        }
        self.peers.get(&member).copied()
    }
}

#[derive(Serialize, Deserialize)]
struct OnDisk {
    identity: Identity,
    crc32: u32,
}

fn crc_of(identity: &Identity) -> Result<u32, serde_json::Error> {
    Ok(crc32fast::hash(&serde_json::to_vec(identity)?))
}

fn damaged(path: &Path, detail: impl Into<String>) -> IdentityError {
    IdentityError::Damaged {
        path: path.to_owned(),
        detail: detail.into(),
    }
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Read the identity file of `dir` on the real file system; `Ok(None)` if there is none.
pub fn load(dir: &Path) -> Result<Option<Identity>, IdentityError> {
    load_on(&fenced_fs::OsFs, dir)
}

/// Read the identity file of `dir` on `fs`; `Ok(None)` if there is none.
pub fn load_on(fs: &dyn Fs, dir: &Path) -> Result<Option<Identity>, IdentityError> {
    let path = path_in(dir);
    let bytes = match fs.read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(IdentityError::file(&path, e)),
    };
    let on_disk: OnDisk = serde_json::from_slice(&bytes)
        .map_err(|e| damaged(&path, format!("not a valid identity file ({e})")))?;
    let crc = crc_of(&on_disk.identity).map_err(|e| damaged(&path, e.to_string()))?;
    if crc != on_disk.crc32 {
        return Err(damaged(
            &path,
            format!(
                "checksum mismatch (stored {:08x}, computed {crc:08x})",
                on_disk.crc32
            ),
        ));
    }
    if on_disk.identity.format != FORMAT {
        return Err(IdentityError::UnknownFormat {
            what: "identity file",
            found: on_disk.identity.format,
            supported: FORMAT,
        });
    }
    Ok(Some(on_disk.identity))
}

/// Write `identity` into `dir` on the real file system, atomically and durably.
pub fn store(dir: &Path, identity: &Identity) -> Result<(), IdentityError> {
    store_on(&fenced_fs::OsFs, dir, identity)
}

/// Write `identity` into `dir` on `fs`, atomically and durably.
pub fn store_on(fs: &dyn Fs, dir: &Path, identity: &Identity) -> Result<(), IdentityError> {
    let path = path_in(dir);
    let crc32 = crc_of(identity).map_err(|e| damaged(&path, e.to_string()))?;
    let mut text = serde_json::to_vec_pretty(&OnDisk {
        identity: identity.clone(),
        crc32,
    })
    .map_err(|e| damaged(&path, e.to_string()))?;
    text.push(b'\n');
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let write = || -> io::Result<()> {
        let f = fs.open(&tmp, Mode::Truncate)?;
        f.write_all_at(&text, 0)?;
        f.sync_all()?;
        fs.rename(&tmp, &path)
    };
    write().map_err(|e| IdentityError::file(&path, e))?;
    fs.sync_dir(dir).map_err(|e| IdentityError::file(dir, e))
}

/// What [`IdentityStore::learn`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pin {
    /// The same incarnation as pinned before.
    Known,
    /// First sight of this member: now pinned (durably).
    New,
    /// The member was pinned with another incarnation.
    Conflict { pinned: u64 },
}

/// The loaded identity of a running node: its own ids, its pins, and whether it was retired.
#[derive(Debug)]
pub struct IdentityStore {
    fs: Arc<dyn Fs>,
    dir: PathBuf,
    current: Mutex<Identity>,
    retired: watch::Sender<Option<String>>,
}

impl IdentityStore {
    /// The identity of the data dir `dir` on the real file system.
    pub fn new(dir: &Path, identity: Identity) -> IdentityStore {
        IdentityStore::new_on(&fenced_fs::os(), dir, identity)
    }

    /// The identity of the data dir `dir` on `fs` (where its changes are stored).
    pub fn new_on(fs: &Arc<dyn Fs>, dir: &Path, identity: Identity) -> IdentityStore {
        let retired = match &identity.state {
            MemberState::Retired { reason } => Some(reason.clone()),
            _ => None,
        };
        IdentityStore {
            fs: fs.clone(),
            dir: dir.to_owned(),
            current: Mutex::new(identity),
            retired: watch::channel(retired).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Identity> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self) -> Identity {
        self.lock().clone()
    }

    /// Run `f` over the current identity (no copy).
    pub fn read<T>(&self, f: impl FnOnce(&Identity) -> T) -> T {
        f(&self.lock())
    }

    pub fn cluster_id(&self) -> u64 {
        self.lock().cluster_id
    }

    pub fn member_id(&self) -> NodeId {
        self.lock().member_id
    }

    pub fn incarnation(&self) -> u64 {
        self.lock().incarnation
    }

    /// The incarnation pinned for `member` (this node's own for its own id).
    pub fn pinned(&self, member: NodeId) -> Option<u64> {
        self.lock().pinned(member)
    }

    /// Pin `member` at `incarnation` unless it is pinned already; a new pin is on disk
    /// before this returns.
    pub fn learn(&self, member: NodeId, incarnation: u64) -> Result<Pin, IdentityError> {
        let mut id = self.lock();
        match id.pinned(member) {
            Some(p) if p == incarnation => Ok(Pin::Known),
            Some(p) => Ok(Pin::Conflict { pinned: p }),
            None => {
                let mut next = id.clone();
                next.peers.insert(member, incarnation);
                store_on(&*self.fs, &self.dir, &next)?;
                *id = next;
                Ok(Pin::New)
            }
        }
    }

    /// Record a new state durably.
    pub fn set_state(&self, state: MemberState) -> Result<(), IdentityError> {
        let mut id = self.lock();
        if id.state == state {
            return Ok(());
        }
        let mut next = id.clone();
        next.state = state;
        store_on(&*self.fs, &self.dir, &next)?;
        *id = next;
        Ok(())
    }

    /// Retire this member for good (see [`MemberState::Retired`]); [`IdentityStore::retired`]
    /// watchers are told. The first reason is kept.
    pub fn retire(&self, reason: &str) {
        if self.retired.borrow().is_some() {
            return;
        }
        tracing::error!("retiring this member: {reason}");
        if let Err(e) = self.set_state(MemberState::Retired {
            reason: reason.to_owned(),
        }) {
            tracing::error!("could not record the retirement in the identity file: {e}");
        }
        self.retired.send_replace(Some(reason.to_owned()));
    }

    /// Why this member was retired, if it was.
    pub fn retired_reason(&self) -> Option<String> {
        self.retired.borrow().clone()
    }

    /// Resolves with the reason once this member is retired.
    pub fn retired(&self) -> watch::Receiver<Option<String>> {
        self.retired.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_pins_and_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let id = Identity::new(42, 2, MemberState::Ready);
        store(dir.path(), &id).expect("store");
        assert_eq!(load(dir.path()).expect("load"), Some(id.clone()));

        let s = IdentityStore::new(dir.path(), id.clone());
        assert_eq!(s.learn(1, 7).expect("learn"), Pin::New);
        assert_eq!(s.learn(1, 7).expect("learn"), Pin::Known);
        assert_eq!(s.learn(1, 8).expect("learn"), Pin::Conflict { pinned: 7 });
        assert_eq!(
            s.learn(2, id.incarnation + 1).expect("learn"),
            Pin::Conflict {
                pinned: id.incarnation
            }
        );
        let back = load(dir.path()).expect("load").expect("present");
        assert_eq!(back.peers.get(&1), Some(&7));

        // A half-written or edited file is refused, naming the file.
        let path = path_in(dir.path());
        let text = std::fs::read(&path).expect("read");
        std::fs::write(&path, &text[..text.len() / 2]).expect("truncate");
        let e = load(dir.path()).expect_err("half a file");
        assert!(e.to_string().contains(FILE_NAME), "{e}");
        let edited = String::from_utf8(text)
            .expect("utf8")
            .replace("\"member_id\": 2", "\"member_id\": 3");
        std::fs::write(&path, edited).expect("edit");
        assert!(matches!(
            load(dir.path()),
            Err(IdentityError::Damaged { .. })
        ));
    }

    #[test]
    fn incarnations_differ() {
        let a = Identity::new(1, 1, MemberState::Ready);
        let b = Identity::new(1, 1, MemberState::Ready);
        assert_ne!(a.incarnation, b.incarnation);
    }
}

#[cfg(test)]
mod fmt_tests {
    #[test]
    fn cluster_ids_print_as_16_hex_digits() {
        assert_eq!(super::fmt_cluster_id(0xc1), "00000000000000c1");
        assert_eq!(super::fmt_cluster_id(u64::MAX), "ffffffffffffffff");
    }
}
