//! Commands that wait on the connection: `BLPOP`/`BRPOP` (woken by pushes on this node) and
//! a waiting `LOCK.ACQUIRE`, watched for the client leaving so that the node withdraws it.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::BufMut;
use fenced_core::kv::{Argv, KvEvent, Reply};
use tokio::io::AsyncReadExt;
use tokio::sync::broadcast;

use super::{Connection, MAX_BLOCK, READ_CHUNK};
use crate::clients::Client;

impl Connection {
    /// Run `work` (a waiting acquire) while watching the client: what it sends meanwhile is
    /// kept for later (up to [`READ_CHUNK`] unparsed), and if it closes the connection or
    /// is killed, `work` is dropped — the node withdraws a dropped wait — and `None` is
    /// the answer.
    pub(super) async fn unless_gone<T>(
        &mut self,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        let mut killed = self.client.killed();
        loop {
            let watching = self.rbuf.len() < READ_CHUNK;
            let mut room = (&mut self.rbuf).limit(READ_CHUNK);
            tokio::select! {
                out = &mut work => return Some(out),
                r = self.socket.read_buf(&mut room), if watching => match r {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => {
                        self.shared
                            .stats
                            .net_in
                            .fetch_add(n as u64, Ordering::Relaxed);
                        self.account();
                    }
                },
                _ = killed.wait_for(|k| *k) => return None,
            }
        }
    }

    /// `BLPOP`/`BRPOP`: try to pop through the log; if every list is empty, wait (on this
    /// node) for a push to one of the keys and try again, until the timeout.
    pub(super) async fn blocking_pop(&mut self, argv: Argv) -> Reply {
        let Some(secs) = argv
            .last()
            .and_then(|t| std::str::from_utf8(t).ok())
            .and_then(|t| t.parse::<f64>().ok())
            .filter(|t| t.is_finite())
        else {
            return Reply::err("ERR timeout is not a float or out of range");
        };
        if secs < 0.0 {
            return Reply::err("ERR timeout is negative");
        }
        let limit = if secs == 0.0 {
            MAX_BLOCK
        } else {
            Duration::from_secs_f64(secs).min(MAX_BLOCK)
        };
        let deadline = tokio::time::Instant::now() + limit;
        let keys: Vec<Vec<u8>> = argv[1..argv.len() - 1].to_vec();
        let mut shutdown = self.shared.shutdown.clone();
        let mut killed = self.client.killed();
        // Subscribed before the first attempt: an UNBLOCK from now on is seen.
        let mut unblock = self.client.unblocks();
        let (client, shared) = (self.client.clone(), self.shared.clone());
        let _blocked = Blocked::new(&client, &shared.stats);
        loop {
            // Subscribe before trying, so a push right after the attempt is not missed.
            let mut rx = self.shared.backend.events();
            let r = self.write_batch(vec![argv.clone()]).await;
            match r.into_iter().next() {
                Some(Reply::NilArray) => {}
                Some(other) => return other,
                None => return Reply::NilArray,
            }
            loop {
                tokio::select! {
                    ev = rx.recv() => match ev {
                        Ok(KvEvent::Pushed { key }) if keys.contains(&key) => break,
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => break,
                        Err(broadcast::error::RecvError::Closed) => return Reply::NilArray,
                    },
                    _ = tokio::time::sleep_until(deadline) => return Reply::NilArray,
                    _ = shutdown.wait_for(|s| *s) => return Reply::NilArray,
                    _ = killed.wait_for(|k| *k) => return Reply::NilArray,
                    Ok(()) = unblock.changed() => {
                        let (_, error) = *unblock.borrow_and_update();
                        return if error {
                            Reply::err("UNBLOCKED client unblocked via CLIENT UNBLOCK")
                        } else {
                            Reply::NilArray
                        };
                    }
                }
            }
        }
    }
}

/// A connection in a blocking pop: flagged for `CLIENT LIST`/`UNBLOCK` and counted in
/// `INFO`'s `blocked_clients` while it lives.
struct Blocked<'a> {
    client: &'a Client,
    stats: &'a crate::clients::Stats,
}

impl<'a> Blocked<'a> {
    fn new(client: &'a Client, stats: &'a crate::clients::Stats) -> Self {
        client.blocked.store(true, Ordering::Release);
        stats.blocked.fetch_add(1, Ordering::Relaxed);
        Blocked { client, stats }
    }
}

impl Drop for Blocked<'_> {
    fn drop(&mut self) {
        self.client.blocked.store(false, Ordering::Release);
        self.stats.blocked.fetch_sub(1, Ordering::Relaxed);
    }
}
