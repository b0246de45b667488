//! State machine snapshots as files, written and read as streams.
//!
//! `<data dir>/snapshots/current.snap` is the snapshot of this member; a new one is written
//! to a temporary file in the same directory, fsynced, and renamed over it (then the
//! directory is fsynced), unless the current one is newer. A snapshot received from the
//! leader arrives in such a temporary file too, and is checked before it replaces anything.
//!
//! ```text
//! "FNCDSNP\0" | layout: u32 LE | record format: u8 | meta length: u32 LE | meta (bincode
//! openraft::SnapshotMeta) | state machine (bincode fenced_core::StateMachine) | crc32 of
//! everything before it: u32 LE
//! ```
//!
//! The state is serialized straight into the file (no copy of it in memory), and a file is
//! read twice: once to check its checksum, then to decode — a damaged length inside can then
//! never make the decoder allocate more than the file holds. The same bytes are what
//! openraft streams to a follower that needs the snapshot (through
//! [`fenced_raft_types::SnapshotFile`], the `SnapshotData` of the type configuration).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bincode::Options;
use fenced_raft_types::{NodeId, SnapshotFile};
use openraft::{BasicNode, SnapshotMeta};

use crate::{frame, StoreError};

type Meta = SnapshotMeta<NodeId, BasicNode>;

/// Directory of the snapshots inside the data dir.
pub const DIR: &str = "snapshots";
const CURRENT: &str = "current.snap";
const MAGIC: &[u8; 8] = b"FNCDSNP\0";
/// Version of the file layout.
const LAYOUT: u32 = 1;
const HEADER: usize = 8 + 4 + 1 + 4;

/// bincode with the options of `bincode::serialize` (fixed-width integers), bounded.
fn codec(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(limit)
}

fn damaged(path: &Path, detail: impl Into<String>) -> StoreError {
    StoreError::Checksum {
        what: "state machine snapshot",
        detail: format!("{}: {}", path.display(), detail.into()),
    }
}

/// A writer that keeps the crc32 of what went through it.
struct Crc<W> {
    inner: W,
    hasher: crc32fast::Hasher,
}

impl<W: Write> Write for Crc<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The snapshot files of one data dir.
pub struct SnapshotStore {
    dir: PathBuf,
    /// Held while the current snapshot is compared and replaced.
    replacing: Mutex<()>,
    next_tmp: AtomicU64,
}

impl SnapshotStore {
    /// Open `<data_dir>/snapshots` (created with the first snapshot), dropping temporary
    /// files of an earlier run.
    pub fn open(data_dir: &Path) -> Result<SnapshotStore, StoreError> {
        let dir = data_dir.join(DIR);
        let listing = match std::fs::read_dir(&dir) {
            Ok(l) => Some(l),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::file(&dir, e)),
        };
        for item in listing.into_iter().flatten() {
            let path = item.map_err(|e| StoreError::file(&dir, e))?.path();
            if path.extension().is_some_and(|e| e == "tmp") {
                std::fs::remove_file(&path).map_err(|e| StoreError::file(&path, e))?;
            }
        }
        Ok(SnapshotStore {
            dir,
            replacing: Mutex::new(()),
            next_tmp: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn current_path(&self) -> PathBuf {
        self.dir.join(CURRENT)
    }

    /// A new temporary file name in the snapshot directory (created if missing).
    fn tmp_path(&self) -> Result<PathBuf, StoreError> {
        if !self.dir.exists() {
            std::fs::create_dir_all(&self.dir).map_err(|e| StoreError::file(&self.dir, e))?;
            if let Some(parent) = self.dir.parent() {
                crate::sync_dir(&fenced_fs::OsFs, parent)?;
            }
        }
        let n = self.next_tmp.fetch_add(1, Ordering::Relaxed);
        Ok(self.dir.join(format!("{}-{n}.tmp", std::process::id())))
    }

    /// Write `meta` and `machine` into a new temporary file, synced; returns its path.
    /// Blocking (it writes the whole state).
    pub fn write(
        &self,
        meta: &Meta,
        machine: &fenced_core::StateMachine,
    ) -> Result<PathBuf, StoreError> {
        let path = self.tmp_path()?;
        write_file(&path, meta, machine).map(|()| path)
    }

    /// Make the complete snapshot file at `path` (written by [`SnapshotStore::write`] or
    /// received) the current one, unless the current one is newer (then `path` is deleted).
    /// Durable on return.
    pub fn install(&self, path: &Path, meta: &Meta) -> Result<bool, StoreError> {
        let _one = self
            .replacing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = self.current_path();
        if current.exists() {
            let have = read_meta(&current)?;
            if have.last_log_id > meta.last_log_id {
                std::fs::remove_file(path).map_err(|e| StoreError::file(path, e))?;
                return Ok(false);
            }
        }
        std::fs::rename(path, &current).map_err(|e| StoreError::file(path, e))?;
        crate::sync_dir(&fenced_fs::OsFs, &self.dir)?;
        Ok(true)
    }

    /// The current snapshot's meta and path, if there is one (its meta checked, the rest
    /// not: see [`load`]).
    pub fn current(&self) -> Result<Option<(Meta, PathBuf)>, StoreError> {
        let path = self.current_path();
        if !path.exists() {
            return Ok(None);
        }
        Ok(Some((read_meta(&path)?, path)))
    }

    /// A new temporary file to receive a snapshot into (`inline`: its I/O done when polled,
    /// [`SnapshotFile::new_inline`]).
    pub fn receiving(&self, inline: bool) -> Result<SnapshotFile, StoreError> {
        let path = self.tmp_path()?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| StoreError::file(&path, e))?;
        let file: std::sync::Arc<dyn fenced_fs::File> = std::sync::Arc::new(file);
        match inline {
            true => Ok(SnapshotFile::new_inline(file, path)),
            false => SnapshotFile::new(file, path.clone()).map_err(|e| StoreError::file(&path, e)),
        }
    }
}

/// Write a snapshot file (layout in the module docs) of `meta` and `machine` into `w`,
/// which should be buffered. Blocking. The state is serialized straight into `w`.
pub fn write_to(
    w: impl Write,
    meta: &Meta,
    machine: &fenced_core::StateMachine,
) -> Result<(), StoreError> {
    let io_err = |e: io::Error| StoreError::File {
        path: PathBuf::from("(snapshot stream)"),
        error: e,
    };
    let mut w = Crc {
        inner: w,
        hasher: crc32fast::Hasher::new(),
    };
    let meta_bytes = bincode::serialize(meta).map_err(|source| StoreError::Encode {
        what: "snapshot meta",
        source,
    })?;
    let meta_len = u32::try_from(meta_bytes.len()).map_err(|_| StoreError::Encode {
        what: "snapshot meta",
        source: Box::new(bincode::ErrorKind::SizeLimit),
    })?;
    w.write_all(MAGIC)
        .and_then(|()| w.write_all(&LAYOUT.to_le_bytes()))
        .and_then(|()| w.write_all(&[frame::VERSION]))
        .and_then(|()| w.write_all(&meta_len.to_le_bytes()))
        .and_then(|()| w.write_all(&meta_bytes))
        .map_err(io_err)?;
    codec(u64::MAX)
        .serialize_into(&mut w, machine)
        .map_err(|source| match *source {
            bincode::ErrorKind::Io(e) => io_err(e),
            _ => StoreError::Encode {
                what: "state machine",
                source,
            },
        })?;
    let crc = w.hasher.clone().finalize();
    let mut inner = w.inner;
    inner
        .write_all(&crc.to_le_bytes())
        .and_then(|()| inner.flush())
        .map_err(io_err)
}

/// Write a snapshot file of `meta` and `machine` at `path` (created), synced; removed again
/// if anything fails. Blocking.
pub fn write_file(
    path: &Path,
    meta: &Meta,
    machine: &fenced_core::StateMachine,
) -> Result<(), StoreError> {
    let result = (|| {
        let file = File::create(path).map_err(|e| StoreError::file(path, e))?;
        let mut w = BufWriter::with_capacity(1 << 20, &file);
        write_to(&mut w, meta, machine).map_err(|e| match e {
            StoreError::File { error, .. } => StoreError::file(path, error),
            e => e,
        })?;
        drop(w);
        file.sync_all().map_err(|e| StoreError::file(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// The header and meta of a snapshot file.
fn read_header(path: &Path, r: &mut impl Read) -> Result<(u8, Meta), StoreError> {
    let mut head = [0u8; HEADER];
    r.read_exact(&mut head)
        .map_err(|_| damaged(path, "shorter than its header"))?;
    if &head[..8] != MAGIC {
        return Err(damaged(path, "not a snapshot file (bad magic)"));
    }
    let layout = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let format = head[12];
    if layout != LAYOUT || !(2..=frame::VERSION).contains(&format) {
        return Err(StoreError::UnknownFormat {
            what: "snapshot file",
            found: if layout != LAYOUT {
                layout
            } else {
                u32::from(format)
            },
            supported: if layout != LAYOUT {
                LAYOUT
            } else {
                u32::from(frame::VERSION)
            },
        });
    }
    let meta_len = u32::from_le_bytes([head[13], head[14], head[15], head[16]]);
    let meta = codec(u64::from(meta_len))
        .deserialize_from(r.take(u64::from(meta_len)))
        .map_err(|e| damaged(path, format!("meta: {e}")))?;
    Ok((format, meta))
}

/// The meta of the snapshot file at `path`.
pub fn read_meta(path: &Path) -> Result<Meta, StoreError> {
    let mut f = BufReader::new(File::open(path).map_err(|e| StoreError::file(path, e))?);
    read_header(path, &mut f).map(|(_, meta)| meta)
}

/// Check the whole file at `path` against its checksum, then decode it. Blocking.
pub fn load(path: &Path) -> Result<(Meta, fenced_core::StateMachine), StoreError> {
    let mut f = File::open(path).map_err(|e| StoreError::file(path, e))?;
    let len = f.metadata().map_err(|e| StoreError::file(path, e))?.len();
    if len < (HEADER + 4) as u64 {
        return Err(damaged(path, format!("{len} bytes is too short")));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut r = BufReader::with_capacity(1 << 20, &mut f).take(len - 4);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r.read(&mut buf).map_err(|e| StoreError::file(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let mut stored = [0u8; 4];
    f.seek(SeekFrom::Start(len - 4))
        .and_then(|_| f.read_exact(&mut stored))
        .map_err(|e| StoreError::file(path, e))?;
    let (stored, actual) = (u32::from_le_bytes(stored), hasher.finalize());
    if stored != actual {
        return Err(damaged(
            path,
            format!("stored crc32 {stored:08x}, computed {actual:08x}"),
        ));
    }
    f.seek(SeekFrom::Start(0))
        .map_err(|e| StoreError::file(path, e))?;
    let mut r = BufReader::with_capacity(1 << 20, f).take(len - 4);
    let (_, meta) = read_header(path, &mut r)?;
    let machine = codec(len)
        .deserialize_from(&mut r)
        .map_err(|e| damaged(path, format!("state machine: {e}")))?;
    if r.limit() != 0 {
        return Err(damaged(path, "bytes after the state machine"));
    }
    Ok((meta, machine))
}
