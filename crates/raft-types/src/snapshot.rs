//! The snapshot file handle: openraft's `SnapshotData`. How a snapshot file is laid out,
//! written, checked and installed is the storage's business (`fenced_storage::snapshot`).

use std::fs::File;
use std::io::{self, SeekFrom};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

/// A snapshot file as openraft's `SnapshotData`: the bytes openraft streams to a follower,
/// or receives from the leader.
///
/// Two ways to do its I/O, chosen when it is made: on tokio's blocking pool (production,
/// [`SnapshotFile::new`]), or **inline** in the task that polls it
/// ([`SnapshotFile::new_inline`]: the deterministic simulator's, whose runtime must never
/// wait on another thread — each poll completes at once with a blocking read or write).
pub struct SnapshotFile {
    file: Handle,
    path: PathBuf,
}

enum Handle {
    Pool(tokio::fs::File),
    Inline(File),
}

impl SnapshotFile {
    /// The open `file` found at `path`, its I/O on tokio's blocking pool.
    pub fn new(file: File, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            file: Handle::Pool(tokio::fs::File::from_std(file)),
            path,
        }
    }

    /// The open `file` found at `path`, its I/O done inline when polled.
    pub fn new_inline(file: File, path: PathBuf) -> SnapshotFile {
        SnapshotFile {
            file: Handle::Inline(file),
            path,
        }
    }

    /// Open the snapshot file at `path` for reading (`inline`: see [`SnapshotFile::new_inline`]).
    pub fn open(path: &Path, inline: bool) -> io::Result<SnapshotFile> {
        let file = File::open(path)?;
        Ok(match inline {
            true => SnapshotFile::new_inline(file, path.to_owned()),
            false => SnapshotFile::new(file, path.to_owned()),
        })
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
            Handle::Inline(f) => {
                io::Write::flush(f)?;
                f.sync_all()
            }
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
            Handle::Inline(f) => Poll::Ready(io::Write::flush(f)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.file {
            Handle::Pool(f) => Pin::new(f).poll_shutdown(cx),
            Handle::Inline(f) => Poll::Ready(io::Write::flush(f)),
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
            Handle::Inline(f) => Poll::Ready(io::Seek::stream_position(f)),
        }
    }
}
