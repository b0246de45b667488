//! The snapshot file handle: openraft's `SnapshotData`. How a snapshot file is laid out,
//! written, checked and installed is the storage's business (`fenced_storage::snapshot`).

use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use fenced_fs::{Cursor, File, Fs, Mode};

/// A snapshot file as openraft's `SnapshotData`: the bytes openraft streams to a follower,
/// or receives from the leader.
///
/// Two ways to do its I/O, chosen when it is made: on tokio's blocking pool (production,
/// [`SnapshotFile::new`]: the file must be a real one, [`File::try_std`]), or **inline** in
/// the task that polls it ([`SnapshotFile::new_inline`]: the deterministic simulator's, whose
/// runtime must never wait on another thread — each poll completes at once with a blocking
/// positional read or write of the [`fenced_fs::File`]).
pub struct SnapshotFile {
    file: Handle,
    path: PathBuf,
}

enum Handle {
    Pool(tokio::fs::File),
    /// The file and the position of the next read or write.
    Inline(Cursor<Arc<dyn File>>),
}

impl SnapshotFile {
    /// The open `file` found at `path`, its I/O on tokio's blocking pool (on a duplicate of
    /// its descriptor). Fails if `file` is not a real file ([`File::try_std`]).
    pub fn new(file: Arc<dyn File>, path: PathBuf) -> io::Result<SnapshotFile> {
        let Some(std) = file.try_std() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{}: not a real file, its I/O cannot run on tokio's blocking pool (use \
                     inline I/O)",
                    path.display()
                ),
            ));
        };
        Ok(SnapshotFile {
            file: Handle::Pool(tokio::fs::File::from_std(std)),
            path,
        })
    }

    /// The open `file` found at `path`, its I/O done inline when polled, from its start.
    pub fn new_inline(file: Arc<dyn File>, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            file: Handle::Inline(Cursor::new(file)),
            path,
        }
    }

    /// Open the snapshot file at `path` of `fs` for reading (`inline`: see
    /// [`SnapshotFile::new_inline`]).
    pub fn open(fs: &dyn Fs, path: &Path, inline: bool) -> io::Result<SnapshotFile> {
        let file = fs.open(path, Mode::Read)?;
        match inline {
            true => Ok(SnapshotFile::new_inline(file, path.to_owned())),
            false => SnapshotFile::new(file, path.to_owned()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flush and fsync what was written into it.
    pub async fn sync(&mut self) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        match &mut self.file {
            Handle::Pool(f) => {
                f.flush().await?;
                f.sync_all().await
            }
            // Positional writes are not buffered: nothing to flush.
            Handle::Inline(f) => f.file().sync_all(),
        }
    }
}

impl std::fmt::Debug for SnapshotFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotFile")
            .field("path", &self.path)
            .finish()
    }
}

impl tokio::io::AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_read(cx, buf),
            Handle::Inline(f) => {
                let n = io::Read::read(f, buf.initialize_unfilled())?;
                buf.advance(n);
                Poll::Ready(Ok(()))
            }
        }
    }
}

impl tokio::io::AsyncWrite for SnapshotFile {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_write(cx, buf),
            Handle::Inline(f) => Poll::Ready(io::Write::write(f, buf)),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_flush(cx),
            Handle::Inline(_) => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_shutdown(cx),
            Handle::Inline(_) => Poll::Ready(Ok(())),
        }
    }
}

impl tokio::io::AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: SeekFrom) -> io::Result<()> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).start_seek(position),
            Handle::Inline(f) => io::Seek::seek(f, position).map(|_| ()),
        }
    }

    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_complete(cx),
            Handle::Inline(f) => Poll::Ready(Ok(f.position())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

    /// Write, seek and read back through both handles on the real file system.
    #[tokio::test]
    async fn pool_and_inline_handles_read_what_was_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fs = fenced_fs::os();
        for inline in [false, true] {
            let path = dir.path().join(format!("snap-{inline}"));
            let file = fs.open(&path, Mode::Create).expect("create");
            let mut w = match inline {
                true => SnapshotFile::new_inline(file, path.clone()),
                false => SnapshotFile::new(file, path.clone()).expect("a real file"),
            };
            w.write_all(b"hello, snapshot").await.expect("write");
            w.seek(SeekFrom::Start(7)).await.expect("seek");
            w.write_all(b"S").await.expect("overwrite");
            w.sync().await.expect("sync");
            drop(w);
            assert_eq!(fs.read(&path).expect("read"), b"hello, Snapshot");

            let mut r = SnapshotFile::open(&*fs, &path, inline).expect("open");
            assert_eq!(r.seek(SeekFrom::End(-8)).await.expect("seek"), 7);
            let mut tail = String::new();
            r.read_to_string(&mut tail).await.expect("read");
            assert_eq!(tail, "Snapshot");
            assert_eq!(r.seek(SeekFrom::Current(-3)).await.expect("seek"), 12);
            assert!(r.seek(SeekFrom::Current(-13)).await.is_err());
        }
    }
}
