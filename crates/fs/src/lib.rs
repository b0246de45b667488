//! The file system behind fenced's storage (the WAL's segments, the hard state, snapshots,
//! the identity and the small checksummed files): one seam, two implementations.
//!
//! * [`OsFs`] — the real one, what `fenced serve` uses: each call is the `std::fs` call it
//!   names, nothing added.
//! * [`SimFs`] — a simulated disk for the deterministic simulator (docs/simulation.md): an
//!   in-memory page cache over a "platter" that only `fsync` (and a directory's `fsync`, for
//!   names) writes to. A process crash keeps the cache; a **power loss** keeps only what was
//!   synced, plus any subset of the dirty pages (a lost page beside a written one), possibly
//!   torn at a sector; `fsync` can fail (and, as on Linux, forget the pages it failed to
//!   write); the disk can be full; a synced byte can rot.
//!
//! The storage code is written once against [`Fs`] and [`File`]; which one it gets is the
//! caller's choice (`fenced_storage::open_with`).

mod cursor;
mod os;
mod sim;

use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

pub use cursor::Cursor;
pub use os::OsFs;
pub use sim::{DiskFaults, PowerLoss, SimFs};

/// An open file: positional reads and writes, its length, and its `fsync`.
pub trait File: Send + Sync + fmt::Debug {
    /// Read up to `buf.len()` bytes at `offset`; fewer at the end of the file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Write all of `buf` at `offset`, growing the file if it ends before.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Cut the file to `len` bytes, or grow it with zeros.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// `fdatasync`: the file's data (and the length needed to read it) reach the disk.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: the data and all metadata.
    fn sync_all(&self) -> io::Result<()>;
    /// The `std::fs::File` behind it, duplicated, if it is a real file (tokio's blocking
    /// file I/O needs one).
    fn try_std(&self) -> Option<std::fs::File> {
        None
    }

    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Fill `buf` from `offset`, or fail with `UnexpectedEof`.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "failed to fill whole buffer",
                    ))
                }
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }
}

/// How [`Fs::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    Write,
    /// Read and write; created (empty) if missing.
    Create,
    /// Read and write; created if missing, emptied if present.
    Truncate,
    /// Read and write; created, and `AlreadyExists` if something is there (`O_EXCL`).
    CreateNew,
}

/// One name in a directory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// A file system: files, directories and their names.
///
/// Names (create, rename, remove) are durable once their directory is synced
/// ([`Fs::sync_dir`]); a file's bytes once the file is synced.
pub trait Fs: Send + Sync + fmt::Debug {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn File>>;
    /// The names in `dir`, sorted.
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>>;
    fn create_dir(&self, dir: &Path) -> io::Result<()>;
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Remove an empty directory.
    fn remove_dir(&self, dir: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, dir: &Path) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// `fsync` a directory: the names in it (created, renamed, removed) reach the disk.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// A file's length; `NotFound` if there is nothing at `path`, and for a directory 0.
    fn len(&self, path: &Path) -> io::Result<u64>;
    /// Whether `path` names a directory (`NotFound` if nothing).
    fn is_dir(&self, path: &Path) -> io::Result<bool>;

    /// The whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let f = self.open(path, Mode::Read)?;
        let mut buf = vec![0; f.len()? as usize];
        f.read_exact_at(&mut buf, 0)?;
        Ok(buf)
    }

    /// Replace the file's contents with `bytes` (not synced).
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.open(path, Mode::Truncate)?.write_all_at(bytes, 0)
    }

    /// Copy a file's bytes to `to` (created or emptied; not synced). Returns the bytes copied.
    fn copy(&self, from: &Path, to: &Path) -> io::Result<u64> {
        let bytes = self.read(from)?;
        self.write(to, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// Whether anything is at `path`.
    fn exists(&self, path: &Path) -> bool {
        self.is_dir(path).is_ok()
    }
}

/// The real file system, shared.
pub fn os() -> Arc<dyn Fs> {
    Arc::new(OsFs)
}
