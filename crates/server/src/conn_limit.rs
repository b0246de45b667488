//! `--max-clients` on the gRPC port: a connection past the limit is closed at once (the client
//! sees it unavailable and tries another node) instead of taking memory and a share of the
//! node. The RESP port has the same limit in `fenced_resp::serve` (Redis's "max number of
//! clients reached").

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// An accepted connection holding one of the listener's permits until it closes.
pub struct Limited {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
}

/// Admit `socket` if fewer than the limit's connections are open, else close it.
pub fn admit(limit: &Arc<Semaphore>, socket: TcpStream) -> Option<Limited> {
    match try_admit(limit, socket) {
        Ok(limited) => Some(limited),
        Err(socket) => {
            tracing::warn!(
                peer = ?socket.peer_addr().ok(),
                "gRPC connection refused: --max-clients connections are open"
            );
            None
        }
    }
}

/// `socket` holding one of `limit`'s permits, or back if none is free (the caller closes
/// it, and says so its own way).
pub fn try_admit(limit: &Arc<Semaphore>, socket: TcpStream) -> Result<Limited, TcpStream> {
    match limit.clone().try_acquire_owned() {
        Ok(permit) => Ok(Limited {
            inner: socket,
            _permit: permit,
        }),
        Err(_) => Err(socket),
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connected for Limited {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
