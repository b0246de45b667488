//! The non-root fallback for partitions: every client→server link goes through its own TCP
//! proxy (client `k` reaches server `j` at a listener of its own), so a link can be cut
//! without touching the kernel's packet filter.
//!
//! A cut link behaves like a partition, not like a crash: bytes already in flight and new
//! connection attempts *stall* (nothing is delivered, nothing is refused) until the link
//! heals, then flow again — TCP's own retransmission would do the same across a short
//! partition. Node↔node links of a fenced cluster are not proxied (a node's peers are named by
//! the Raft membership, one address for everyone, so a proxy could not tell senders apart):
//! in loopback mode the partition nemesis cuts clients from servers only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("proxy runtime: {0}")]
    Runtime(std::io::Error),
    #[error("listening on {0}: {1}")]
    Bind(String, std::io::Error),
}

/// A set of proxied links, each cuttable. Dropping it stops every proxy.
pub struct Proxies {
    rt: Option<tokio::runtime::Runtime>,
    links: Mutex<BTreeMap<(String, String), watch::Sender<bool>>>,
}

/// Copy `from` → `to`, stalling while the link is cut. Bounded by the connection's life.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut cut: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if cut.wait_for(|c| !*c).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

async fn serve(listener: TcpListener, upstream: String, cut: watch::Receiver<bool>) {
    while let Ok((down, _)) = listener.accept().await {
        let upstream = upstream.clone();
        let mut cut = cut.clone();
        tokio::spawn(async move {
            // A connection attempt across a cut link hangs until it heals.
            if cut.wait_for(|c| !*c).await.is_err() {
                return;
            }
            let Ok(up) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = up.set_nodelay(true);
            let _ = down.set_nodelay(true);
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            tokio::join!(pump(dr, uw, cut.clone()), pump(ur, dw, cut));
        });
    }
}

impl Proxies {
    pub fn new() -> Result<Proxies, ProxyError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("jepsen-proxy")
            .enable_all()
            .build()
            .map_err(ProxyError::Runtime)?;
        Ok(Proxies {
            rt: Some(rt),
            links: Mutex::new(BTreeMap::new()),
        })
    }

    /// Proxy link (`client`, `server`): listen on `listen`, forward to `upstream`. Several
    /// listeners may share one link (e.g. a node's gRPC and RESP ports); cutting it cuts all.
    pub fn add(
        &self,
        client: &str,
        server: &str,
        listen: &str,
        upstream: &str,
    ) -> Result<(), ProxyError> {
        let Some(rt) = &self.rt else { return Ok(()) };
        let addr: SocketAddr = listen.parse().map_err(|e| {
            ProxyError::Bind(
                listen.to_owned(),
                std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            )
        })?;
        let std_listener = std::net::TcpListener::bind(addr)
            .map_err(|e| ProxyError::Bind(listen.to_owned(), e))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| ProxyError::Bind(listen.to_owned(), e))?;
        let rx = self
            .lock_links()
            .entry((client.to_owned(), server.to_owned()))
            .or_insert_with(|| watch::channel(false).0)
            .subscribe();
        let upstream = upstream.to_owned();
        let _guard = rt.enter();
        let listener = TcpListener::from_std(std_listener)
            .map_err(|e| ProxyError::Bind(listen.to_owned(), e))?;
        rt.spawn(serve(listener, upstream, rx));
        Ok(())
    }

    fn lock_links(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), watch::Sender<bool>>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cut or heal the link between `a` and `b` (either order). `false` if not proxied.
    pub fn set_cut(&self, a: &str, b: &str, cut: bool) -> bool {
        let links = self.lock_links();
        let key1 = (a.to_owned(), b.to_owned());
        let key2 = (b.to_owned(), a.to_owned());
        match links.get(&key1).or_else(|| links.get(&key2)) {
            Some(tx) => {
                tx.send_replace(cut);
                true
            }
            None => false,
        }
    }

    pub fn heal_all(&self) {
        for tx in self.lock_links().values() {
            tx.send_replace(false);
        }
    }
}

impl Drop for Proxies {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::Duration;

    #[test]
    fn forwards_stalls_when_cut_and_resumes_on_heal() {
        // An echo server.
        let echo = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let echo_addr = echo.local_addr().expect("addr").to_string();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = echo.accept() {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b) {
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let listen = free.local_addr().expect("addr").to_string();
        drop(free);
        let p = Proxies::new().expect("proxies");
        p.add("c0", "n1", &listen, &echo_addr).expect("add");
        let mut s = std::net::TcpStream::connect(&listen).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        s.write_all(b"a").expect("write");
        let mut b = [0u8; 1];
        s.read_exact(&mut b).expect("echo through the proxy");
        assert!(p.set_cut("n1", "c0", true));
        s.write_all(b"b").expect("write");
        assert!(s.read_exact(&mut b).is_err(), "a cut link delivers nothing");
        p.heal_all();
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.read_exact(&mut b).expect("delivered after healing");
        assert_eq!(&b, b"b");
        assert!(!p.set_cut("c9", "n1", true));
    }
}
