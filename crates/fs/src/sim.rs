//! [`SimFs`]: a simulated disk for the deterministic simulator.
//!
//! Every file has two copies of its bytes: the **cache** (what reads see, what writes change)
//! and the **disk** (what a power loss leaves). `sync_data`/`sync_all` copy the file's dirty
//! pages and its length from the cache to the disk. Names work the same way: creating,
//! renaming and removing change the current names at once and queue the change; syncing the
//! directory makes its queued changes durable.
//!
//! * [`SimFs::power_loss`] — the machine loses power. Each file keeps its disk copy, plus each
//!   dirty page with probability [`DiskFaults::page_survives`] (so a later page can survive
//!   while an earlier one is lost), a surviving page possibly torn at a 512-byte sector
//!   ([`DiskFaults::torn`]); a length change survives or not. A random prefix of the queued
//!   name changes survives (a journal commits them in order). A process crash is not a power
//!   loss: the cache survives it, and nothing here changes.
//! * [`DiskFaults::fsync_error`] — a sync fails with `EIO`, and, as Linux does, forgets the
//!   pages it failed to write: they stay readable but a later successful sync does not write
//!   them (a power loss loses them).
//! * [`DiskFaults::full`] — writes that need new space fail with `ENOSPC`.
//! * [`SimFs::rot`] — one durable byte of one file flips (bit rot), in both copies.
//! * [`SimFs::lose_power_at_sync`] — the power goes at a later sync, in the middle of the
//!   writes before it: that sync and every operation after it fail with `EIO` until
//!   [`SimFs::power_loss`] is applied (the node's process sees its disk die, the machine
//!   then restarts). So a power loss can land between a write and its sync, where the page
//!   cache holds data the disk does not.
//!
//! All randomness comes from the seed given to [`SimFs::new`], and every iteration is in
//! name order, so a seed replays exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{DirEntry, File, Fs, Mode};

const PAGE: u64 = 4096;
const SECTOR: u64 = 512;
/// `ENOSPC`.
const NO_SPACE: i32 = 28;
/// `EIO`.
const IO_ERROR: i32 = 5;

/// The faults a [`SimFs`] injects, changeable at any time ([`SimFs::set_faults`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskFaults {
    /// Probability that a sync fails with `EIO` (and forgets the dirty pages).
    pub fsync_error: f64,
    /// At a power loss, the probability that each dirty page reached the disk anyway.
    pub page_survives: f64,
    /// At a power loss, a surviving page may have reached the disk only up to a sector.
    pub torn: bool,
    /// Writes that need new space fail with `ENOSPC`.
    pub full: bool,
}

impl Default for DiskFaults {
    /// No fsync errors, not full; at a power loss half the dirty pages survive, torn or not.
    fn default() -> Self {
        DiskFaults {
            fsync_error: 0.0,
            page_survives: 0.5,
            torn: true,
            full: false,
        }
    }
}

/// What a power loss did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PowerLoss {
    /// Dirty pages lost (not on disk).
    pub pages_lost: u64,
    /// Dirty pages that reached the disk anyway (torn ones included).
    pub pages_kept: u64,
    /// Surviving pages cut at a sector.
    pub pages_torn: u64,
    /// Queued name changes lost, each as the path it was about (relative to the disk's
    /// root) and what it did.
    pub names_lost: Vec<String>,
}

#[derive(Debug, Default)]
struct Inode {
    cache: Vec<u8>,
    disk: Vec<u8>,
    /// Pages of `cache` not yet on `disk`.
    dirty: BTreeSet<u64>,
    /// `cache.len() != disk.len()` not yet synced.
    resized: bool,
}

type InodeRef = Arc<Mutex<Inode>>;

#[derive(Clone, Debug)]
enum Node {
    Dir,
    File(InodeRef),
}

/// A name change queued until its directory is synced.
#[derive(Clone, Debug)]
enum NameOp {
    Create(PathBuf, Node),
    /// Remove the name and everything under it.
    Remove(PathBuf),
    /// Move the name and everything under it.
    Rename(PathBuf, PathBuf),
}

impl NameOp {
    /// The directories whose sync makes this durable.
    fn dirs(&self) -> Vec<PathBuf> {
        let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
        match self {
            NameOp::Create(p, _) | NameOp::Remove(p) => vec![parent(p)],
            NameOp::Rename(a, b) => vec![parent(a), parent(b)],
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, Node>) {
        match self {
            NameOp::Create(p, n) => {
                names.insert(p.clone(), n.clone());
            }
            NameOp::Remove(p) => {
                for k in subtree(names, p) {
                    names.remove(&k);
                }
            }
            NameOp::Rename(a, b) => {
                let moved = subtree(names, a);
                if moved.is_empty() {
                    return;
                }
                for k in subtree(names, b) {
                    names.remove(&k);
                }
                for k in moved {
                    if let Some(n) = names.remove(&k) {
                        let rest = k.strip_prefix(a).map(Path::to_path_buf).unwrap_or_default();
                        let to = if rest.as_os_str().is_empty() {
                            b.clone()
                        } else {
                            b.join(rest)
                        };
                        names.insert(to, n);
                    }
                }
            }
        }
    }
}

/// `p` and every name under it.
fn subtree(names: &BTreeMap<PathBuf, Node>, p: &Path) -> Vec<PathBuf> {
    names
        .range(p.to_path_buf()..)
        .take_while(|(k, _)| k.starts_with(p))
        .map(|(k, _)| k.clone())
        .collect()
}

#[derive(Debug)]
struct State {
    rng: StdRng,
    faults: DiskFaults,
    /// Directories that exist before anything (the root and its ancestors): always there.
    root: PathBuf,
    names: BTreeMap<PathBuf, Node>,
    durable: BTreeMap<PathBuf, Node>,
    queued: Vec<NameOp>,
    /// Syncs left before the power goes ([`SimFs::lose_power_at_sync`]).
    syncs_to_live: Option<u64>,
    /// The power went: every operation fails until [`SimFs::power_loss`].
    dead: bool,
}

impl State {
    /// `EIO` if the power went.
    fn alive(&self) -> io::Result<()> {
        match self.dead {
            true => Err(io::Error::from_raw_os_error(IO_ERROR)),
            false => Ok(()),
        }
    }

    /// Count a sync down to the power loss; `EIO` if the power goes now or went before.
    fn sync_or_die(&mut self) -> io::Result<()> {
        self.alive()?;
        if let Some(n) = self.syncs_to_live {
            if n <= 1 {
                self.syncs_to_live = None;
                self.dead = true;
                return Err(io::Error::from_raw_os_error(IO_ERROR));
            }
            self.syncs_to_live = Some(n - 1);
        }
        Ok(())
    }

    fn is_dir(&self, p: &Path) -> bool {
        self.root.starts_with(p) || matches!(self.names.get(p), Some(Node::Dir))
    }

    fn parent_is_dir(&self, p: &Path) -> io::Result<()> {
        match p.parent() {
            Some(d) if self.is_dir(d) => Ok(()),
            _ => Err(not_found(p)),
        }
    }

    fn exists(&self, p: &Path) -> bool {
        self.is_dir(p) || self.names.contains_key(p)
    }

    fn change(&mut self, op: NameOp) {
        op.apply(&mut self.names);
        self.queued.push(op);
    }

    fn children<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = (&'a PathBuf, &'a Node)> {
        self.names
            .range(dir.to_path_buf()..)
            .take_while(move |(k, _)| k.starts_with(dir))
            .filter(move |(k, _)| k.parent() == Some(dir))
    }
}

fn not_found(p: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file or directory", p.display()),
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A simulated disk (see the module's docs). Cheap to clone; clones share the disk.
#[derive(Clone, Debug)]
pub struct SimFs {
    state: Arc<Mutex<State>>,
}

impl SimFs {
    /// An empty disk under `root` (which, with its ancestors, always exists), its faults'
    /// randomness drawn from `seed`.
    pub fn new(root: impl Into<PathBuf>, seed: u64) -> SimFs {
        SimFs {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                faults: DiskFaults::default(),
                root: root.into(),
                names: BTreeMap::new(),
                durable: BTreeMap::new(),
                queued: Vec::new(),
                syncs_to_live: None,
                dead: false,
            })),
        }
    }

    pub fn faults(&self) -> DiskFaults {
        lock(&self.state).faults.clone()
    }

    pub fn set_faults(&self, faults: DiskFaults) {
        lock(&self.state).faults = faults;
    }

    /// Change some of the faults, the rest as they are.
    pub fn change_faults(&self, change: impl FnOnce(&mut DiskFaults)) {
        change(&mut lock(&self.state).faults);
    }

    /// The power goes at the `n`th sync from now (1: the next one), which fails, like every
    /// operation after it until [`SimFs::power_loss`].
    pub fn lose_power_at_sync(&self, n: u64) {
        lock(&self.state).syncs_to_live = Some(n.max(1));
    }

    /// Whether a power loss is due at a later sync ([`SimFs::lose_power_at_sync`]).
    pub fn power_due(&self) -> bool {
        lock(&self.state).syncs_to_live.is_some()
    }

    /// Whether the power went ([`SimFs::lose_power_at_sync`]) and the loss is not applied yet.
    pub fn is_dead(&self) -> bool {
        lock(&self.state).dead
    }

    /// The machine loses power: only what reached the disk stays (see the module's docs).
    /// Files opened before are dead (their process is).
    pub fn power_loss(&self) -> PowerLoss {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        st.dead = false;
        st.syncs_to_live = None;
        let mut report = PowerLoss::default();
        // Names: a prefix of the queued changes reached the journal.
        let keep = st.rng.gen_range(0..=st.queued.len());
        for op in st.queued.drain(..keep) {
            op.apply(&mut st.durable);
        }
        let rel = |p: &Path| p.strip_prefix(&st.root).unwrap_or(p).display().to_string();
        report.names_lost = st
            .queued
            .iter()
            .map(|op| match op {
                NameOp::Create(p, Node::Dir) => format!("mkdir {}", rel(p)),
                NameOp::Create(p, Node::File(_)) => format!("create {}", rel(p)),
                NameOp::Remove(p) => format!("remove {}", rel(p)),
                NameOp::Rename(a, b) => format!("rename {} {}", rel(a), rel(b)),
            })
            .collect();
        st.queued.clear();
        // A name whose directory did not survive is gone with it.
        let orphans: Vec<PathBuf> = st
            .durable
            .keys()
            .filter(|k| {
                k.ancestors()
                    .skip(1)
                    .take_while(|a| !st.root.starts_with(a))
                    .any(|a| !matches!(st.durable.get(a), Some(Node::Dir)))
            })
            .cloned()
            .collect();
        for k in orphans {
            st.durable.remove(&k);
        }
        // Bytes: each file's disk copy plus the dirty pages that made it.
        let mut seen = BTreeSet::new();
        let files: Vec<InodeRef> = st
            .names
            .values()
            .chain(st.durable.values())
            .filter_map(|n| match n {
                Node::File(i) => Some(i.clone()),
                Node::Dir => None,
            })
            .filter(|i| seen.insert(Arc::as_ptr(i) as usize))
            .collect();
        // (Iterated in name order; the pointer set only skips hard links seen twice.)
        for inode in files {
            let mut f = lock(&inode);
            let f = &mut *f;
            let mut disk = std::mem::take(&mut f.disk);
            if f.resized && st.rng.gen_bool(0.5) {
                disk.resize(f.cache.len(), 0);
            }
            for &page in &f.dirty {
                let start = page * PAGE;
                if !st.rng.gen_bool(st.faults.page_survives) {
                    report.pages_lost += 1;
                    continue;
                }
                report.pages_kept += 1;
                let mut end = (start + PAGE).min(f.cache.len() as u64);
                if st.faults.torn && st.rng.gen_bool(0.25) {
                    let sectors = (end - start).div_ceil(SECTOR);
                    end = end.min(start + SECTOR * st.rng.gen_range(0..sectors.max(1)));
                    report.pages_torn += 1;
                }
                if end <= start {
                    continue;
                }
                if (disk.len() as u64) < end {
                    disk.resize(end as usize, 0);
                }
                disk[start as usize..end as usize]
                    .copy_from_slice(&f.cache[start as usize..end as usize]);
            }
            f.cache = disk.clone();
            f.disk = disk;
            f.dirty.clear();
            f.resized = false;
        }
        st.names = st.durable.clone();
        report
    }

    /// Flip one bit of one synced byte of a file under `under` (bit rot), in both copies.
    /// Returns the file (relative to `under`) and the byte's offset, or `None` if there is
    /// no such byte. Half the time the byte is one that is not zero (a record, more likely
    /// than the zeros ahead of them).
    pub fn rot(&self, under: &Path) -> Option<(PathBuf, u64)> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let files: Vec<(PathBuf, InodeRef)> = st
            .durable
            .iter()
            .filter(|(k, _)| k.starts_with(under))
            .filter_map(|(k, n)| match n {
                Node::File(i) if !lock(i).disk.is_empty() => Some((k.clone(), i.clone())),
                _ => None,
            })
            .collect();
        if files.is_empty() {
            return None;
        }
        let (path, inode) = &files[st.rng.gen_range(0..files.len())];
        let mut f = lock(inode);
        let nonzero: Vec<usize> = if st.rng.gen_bool(0.5) {
            f.disk
                .iter()
                .enumerate()
                .filter(|(_, b)| **b != 0)
                .map(|(i, _)| i)
                .collect()
        } else {
            Vec::new()
        };
        let at = match nonzero.is_empty() {
            false => nonzero[st.rng.gen_range(0..nonzero.len())],
            true => st.rng.gen_range(0..f.disk.len()),
        };
        let bit = 1u8 << st.rng.gen_range(0..8);
        f.disk[at] ^= bit;
        if let Some(b) = f.cache.get_mut(at) {
            *b ^= bit;
        }
        let rel = path.strip_prefix(under).unwrap_or(path).to_path_buf();
        Some((rel, at as u64))
    }

    /// Bytes on the disk under `under` (files' durable lengths).
    pub fn disk_bytes(&self, under: &Path) -> u64 {
        lock(&self.state)
            .durable
            .iter()
            .filter(|(k, _)| k.starts_with(under))
            .map(|(_, n)| match n {
                Node::File(i) => lock(i).disk.len() as u64,
                Node::Dir => 0,
            })
            .sum()
    }
}

/// An open file of a [`SimFs`].
#[derive(Debug)]
struct SimFile {
    fs: SimFs,
    inode: InodeRef,
    path: PathBuf,
    writable: bool,
}

impl SimFile {
    fn writable(&self) -> io::Result<()> {
        match self.writable {
            true => Ok(()),
            false => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: opened read-only", self.path.display()),
            )),
        }
    }

    /// Whether the disk is full; `EIO` if the power went.
    fn full(&self) -> io::Result<bool> {
        let st = lock(&self.fs.state);
        st.alive()?;
        Ok(st.faults.full)
    }

    fn sync(&self) -> io::Result<()> {
        let fail = {
            let mut st = lock(&self.fs.state);
            st.sync_or_die()?;
            let p = st.faults.fsync_error;
            p > 0.0 && st.rng.gen_bool(p.min(1.0))
        };
        let mut f = lock(&self.inode);
        let f = &mut *f;
        if fail {
            // Linux marks the pages clean although they never reached the disk.
            f.dirty.clear();
            f.resized = false;
            return Err(io::Error::from_raw_os_error(IO_ERROR));
        }
        f.disk.resize(f.cache.len(), 0);
        for &page in &f.dirty {
            let start = (page * PAGE) as usize;
            let end = (start + PAGE as usize).min(f.cache.len());
            if start < end {
                f.disk[start..end].copy_from_slice(&f.cache[start..end]);
            }
        }
        f.dirty.clear();
        f.resized = false;
        Ok(())
    }
}

impl File for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        lock(&self.fs.state).alive()?;
        let f = lock(&self.inode);
        let len = f.cache.len() as u64;
        if offset >= len {
            return Ok(0);
        }
        let n = (len - offset).min(buf.len() as u64) as usize;
        buf[..n].copy_from_slice(&f.cache[offset as usize..offset as usize + n]);
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writable()?;
        let end = offset + buf.len() as u64;
        let full = self.full()?;
        let mut f = lock(&self.inode);
        if end > f.cache.len() as u64 {
            if full {
                return Err(io::Error::from_raw_os_error(NO_SPACE));
            }
            f.cache.resize(end as usize, 0);
            f.resized = true;
        }
        f.cache[offset as usize..end as usize].copy_from_slice(buf);
        if !buf.is_empty() {
            for page in offset / PAGE..=(end - 1) / PAGE {
                f.dirty.insert(page);
            }
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let full = self.full()?;
        let mut f = lock(&self.inode);
        let old = f.cache.len() as u64;
        if len > old && full {
            return Err(io::Error::from_raw_os_error(NO_SPACE));
        }
        f.cache.resize(len as usize, 0);
        f.resized = true;
        if len > old {
            for page in old / PAGE..len.div_ceil(PAGE) {
                f.dirty.insert(page);
            }
        } else {
            let keep = len.div_ceil(PAGE);
            f.dirty.retain(|p| *p < keep);
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(lock(&self.inode).cache.len() as u64)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
}

impl Fs for SimFs {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn File>> {
        let mut st = lock(&self.state);
        st.alive()?;
        let inode = match st.names.get(path) {
            Some(_) if mode == Mode::CreateNew => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", path.display()),
                ))
            }
            Some(Node::File(i)) => {
                let i = i.clone();
                if mode == Mode::Truncate {
                    let mut f = lock(&i);
                    if !f.cache.is_empty() {
                        f.cache.clear();
                        f.dirty.clear();
                        f.resized = true;
                    }
                }
                i
            }
            Some(Node::Dir) => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    format!("{}: is a directory", path.display()),
                ))
            }
            None if matches!(mode, Mode::Create | Mode::Truncate | Mode::CreateNew) => {
                st.parent_is_dir(path)?;
                let i = InodeRef::default();
                st.change(NameOp::Create(path.to_path_buf(), Node::File(i.clone())));
                i
            }
            None => return Err(not_found(path)),
        };
        Ok(Arc::new(SimFile {
            fs: self.clone(),
            inode,
            path: path.to_path_buf(),
            writable: mode != Mode::Read,
        }))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let st = lock(&self.state);
        if !st.is_dir(dir) {
            return Err(not_found(dir));
        }
        let mut out: Vec<DirEntry> = st
            .children(dir)
            .filter_map(|(k, n)| {
                Some(DirEntry {
                    name: k.file_name()?.to_string_lossy().into_owned(),
                    is_dir: matches!(n, Node::Dir),
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        if st.exists(dir) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{}: exists", dir.display()),
            ));
        }
        st.parent_is_dir(dir)?;
        st.change(NameOp::Create(dir.to_path_buf(), Node::Dir));
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        let missing: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|a| !st.is_dir(a))
            .map(Path::to_path_buf)
            .collect();
        for d in missing.into_iter().rev() {
            if st.names.contains_key(&d) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: a file", d.display()),
                ));
            }
            st.change(NameOp::Create(d, Node::Dir));
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        match st.names.get(path) {
            Some(Node::File(_)) => {
                st.change(NameOp::Remove(path.to_path_buf()));
                Ok(())
            }
            Some(Node::Dir) => Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{}: is a directory", path.display()),
            )),
            None => Err(not_found(path)),
        }
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        if !matches!(st.names.get(dir), Some(Node::Dir)) {
            return Err(not_found(dir));
        }
        if st.children(dir).next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{}: not empty", dir.display()),
            ));
        }
        st.change(NameOp::Remove(dir.to_path_buf()));
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        if !matches!(st.names.get(dir), Some(Node::Dir)) {
            return Err(not_found(dir));
        }
        st.change(NameOp::Remove(dir.to_path_buf()));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = lock(&self.state);
        st.alive()?;
        if !st.names.contains_key(from) {
            return Err(not_found(from));
        }
        st.parent_is_dir(to)?;
        if matches!(st.names.get(to), Some(Node::Dir)) && st.children(to).next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::DirectoryNotEmpty,
                format!("{}: not empty", to.display()),
            ));
        }
        st.change(NameOp::Rename(from.to_path_buf(), to.to_path_buf()));
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        if !st.is_dir(dir) {
            return Err(not_found(dir));
        }
        st.sync_or_die()?;
        let fail = st.faults.fsync_error > 0.0 && st.rng.gen_bool(st.faults.fsync_error.min(1.0));
        // The queued changes of this directory, in order; a change also queued for another
        // directory (a rename across two) goes too.
        let (now, later): (Vec<NameOp>, Vec<NameOp>) = std::mem::take(&mut st.queued)
            .into_iter()
            .partition(|op| op.dirs().iter().any(|d| d == dir));
        st.queued = later;
        if fail {
            // The journal did not commit them; they stay queued, as unsure as before.
            let mut back = now;
            back.append(&mut st.queued);
            st.queued = back;
            return Err(io::Error::from_raw_os_error(IO_ERROR));
        }
        for op in now {
            op.apply(&mut st.durable);
        }
        Ok(())
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        let st = lock(&self.state);
        match st.names.get(path) {
            Some(Node::File(i)) => Ok(lock(i).cache.len() as u64),
            Some(Node::Dir) => Ok(0),
            None if st.is_dir(path) => Ok(0),
            None => Err(not_found(path)),
        }
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        let st = lock(&self.state);
        match st.names.get(path) {
            Some(n) => Ok(matches!(n, Node::Dir)),
            None if st.is_dir(path) => Ok(true),
            None => Err(not_found(path)),
        }
    }
}

#[cfg(test)]
mod tests;
