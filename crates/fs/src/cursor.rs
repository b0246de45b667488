//! [`Cursor`]: a [`File`] as a stream — `std::io` reads, writes and seeks over its
//! positional I/O.

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Deref;

use crate::File;

/// A [`File`] (behind any pointer: `&dyn File`, `Arc<dyn File>`) read and written from a
/// position that each read, write and seek moves. Writes are positional and unbuffered:
/// `flush` has nothing to do.
#[derive(Debug)]
pub struct Cursor<F> {
    file: F,
    pos: u64,
}

impl<F> Cursor<F>
where
    F: Deref,
    F::Target: File,
{
    /// `file` from its start.
    pub fn new(file: F) -> Cursor<F> {
        Cursor { file, pos: 0 }
    }

    /// The file.
    pub fn file(&self) -> &F::Target {
        &self.file
    }

    /// Where the next read or write goes.
    pub fn position(&self) -> u64 {
        self.pos
    }
}

impl<F> Read for Cursor<F>
where
    F: Deref,
    F::Target: File,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<F> Write for Cursor<F>
where
    F: Deref,
    F::Target: File,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.pos)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<F> Seek for Cursor<F>
where
    F: Deref,
    F::Target: File,
{
    fn seek(&mut self, position: SeekFrom) -> io::Result<u64> {
        let (base, delta) = match position {
            SeekFrom::Start(n) => {
                self.pos = n;
                return Ok(n);
            }
            SeekFrom::End(d) => (self.file.len()?, d),
            SeekFrom::Current(d) => (self.pos, d),
        };
        self.pos = base.checked_add_signed(delta).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "invalid seek to a negative or overflowing position",
            )
        })?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Fs, Mode, SimFs};
    use std::path::Path;

    #[test]
    fn reads_writes_and_seeks_from_its_position() {
        let fs = SimFs::new("/r", 1);
        let file = fs.open(Path::new("/r/f"), Mode::Create).expect("create");
        let mut c = Cursor::new(&*file);
        c.write_all(b"hello world").expect("write");
        assert_eq!(c.position(), 11);
        assert_eq!(c.seek(SeekFrom::End(-5)).expect("seek"), 6);
        let mut word = String::new();
        c.read_to_string(&mut word).expect("read");
        assert_eq!(word, "world");
        assert_eq!(c.seek(SeekFrom::Current(-11)).expect("seek"), 0);
        assert!(c.seek(SeekFrom::Current(-1)).is_err(), "before the start");
        assert_eq!(c.position(), 0);
    }
}
