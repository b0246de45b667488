//! [`OsFs`]: the real file system, one `std::fs` call per method.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use crate::{DirEntry, File, Fs, Mode};

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsFs;

impl File for std::fs::File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        std::fs::File::set_len(self, len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn sync_data(&self) -> io::Result<()> {
        std::fs::File::sync_data(self)
    }
    fn sync_all(&self) -> io::Result<()> {
        std::fs::File::sync_all(self)
    }
    fn try_std(&self) -> Option<std::fs::File> {
        self.try_clone().ok()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl Fs for OsFs {
    fn open(&self, path: &Path, mode: Mode) -> io::Result<Arc<dyn File>> {
        let mut o = OpenOptions::new();
        match mode {
            Mode::Read => o.read(true),
            Mode::Write => o.read(true).write(true),
            Mode::Create => o.read(true).write(true).create(true),
            Mode::Truncate => o.read(true).write(true).create(true).truncate(true),
            Mode::CreateNew => o.read(true).write(true).create_new(true),
        };
        Ok(Arc::new(o.open(path)?))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<DirEntry>> {
        let mut names = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let item = item?;
            names.push(DirEntry {
                name: item.file_name().to_string_lossy().into_owned(),
                is_dir: item.file_type()?.is_dir(),
            });
        }
        names.sort();
        Ok(names)
    }

    fn create_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir(dir)
    }

    fn remove_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }

    fn len(&self, path: &Path) -> io::Result<u64> {
        let m = std::fs::metadata(path)?;
        Ok(if m.is_dir() { 0 } else { m.len() })
    }

    fn is_dir(&self, path: &Path) -> io::Result<bool> {
        Ok(std::fs::metadata(path)?.is_dir())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn copy(&self, from: &Path, to: &Path) -> io::Result<u64> {
        std::fs::copy(from, to)
    }
}
