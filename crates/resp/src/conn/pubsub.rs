//! Pub/sub on a connection: `SUBSCRIBE`/`PSUBSCRIBE` and their inverses, and the delivery of
//! published messages (RESP2 messages in subscribe mode, RESP3 push frames).

use fenced_core::kv::{KvEvent, Reply};
use tokio::sync::broadcast;

use super::{Connection, State};
use crate::frame::encode_push;

impl Connection {
    /// `SUBSCRIBE` (`pattern`: `PSUBSCRIBE`): one confirmation per channel, written here.
    pub(super) fn subscribe(&mut self, pattern: bool, a: &[Vec<u8>]) {
        let st = &mut self.st;
        if st.events.is_none() {
            st.events = Some(self.shared.backend.events());
        }
        for ch in a {
            let set = if pattern {
                &mut st.patterns
            } else {
                &mut st.channels
            };
            if set.insert(ch.clone()) {
                self.shared.subs.add(pattern, ch);
            }
            let count = (st.channels.len() + st.patterns.len()) as i64;
            let kind = if pattern { "psubscribe" } else { "subscribe" };
            encode_push(
                &[
                    Reply::bulk(kind),
                    Reply::Bulk(ch.clone()),
                    Reply::Int(count),
                ],
                st.proto,
                &mut self.out,
            );
        }
    }

    /// `UNSUBSCRIBE` (`pattern`: `PUNSUBSCRIBE`); no names: all of them.
    pub(super) fn unsubscribe(&mut self, pattern: bool, a: &[Vec<u8>]) {
        let st = &mut self.st;
        let kind = if pattern {
            "punsubscribe"
        } else {
            "unsubscribe"
        };
        let names: Vec<Vec<u8>> = if a.is_empty() {
            if pattern {
                st.patterns.iter().cloned().collect()
            } else {
                st.channels.iter().cloned().collect()
            }
        } else {
            a.to_vec()
        };
        if names.is_empty() {
            let count = (st.channels.len() + st.patterns.len()) as i64;
            encode_push(
                &[Reply::bulk(kind), Reply::Nil, Reply::Int(count)],
                st.proto,
                &mut self.out,
            );
        }
        for ch in names {
            let set = if pattern {
                &mut st.patterns
            } else {
                &mut st.channels
            };
            if set.remove(&ch) {
                self.shared.subs.remove(pattern, &ch);
            }
            let count = (st.channels.len() + st.patterns.len()) as i64;
            encode_push(
                &[Reply::bulk(kind), Reply::Bulk(ch), Reply::Int(count)],
                st.proto,
                &mut self.out,
            );
        }
        if !st.subscribed() {
            st.events = None;
        }
    }
}

pub(super) async fn recv(rx: &mut Option<broadcast::Receiver<KvEvent>>) -> Option<KvEvent> {
    let Some(r) = rx.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        match r.recv().await {
            Ok(e) => return Some(e),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!("a subscriber fell behind and lost {n} events");
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

pub(super) fn push_message(st: &State, channel: &[u8], message: &[u8], out: &mut Vec<u8>) {
    if st.channels.contains(channel) {
        encode_push(
            &[
                Reply::bulk("message"),
                Reply::bulk(channel),
                Reply::bulk(message),
            ],
            st.proto,
            out,
        );
    }
    for p in &st.patterns {
        if fenced_core::kv::glob_match(p, channel) {
            encode_push(
                &[
                    Reply::bulk("pmessage"),
                    Reply::Bulk(p.clone()),
                    Reply::bulk(channel),
                    Reply::bulk(message),
                ],
                st.proto,
                out,
            );
        }
    }
}
