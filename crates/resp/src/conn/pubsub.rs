//! Pub/sub on a connection: `SUBSCRIBE`/`PSUBSCRIBE` and their inverses, and the delivery of
//! published messages (RESP2 messages in subscribe mode, RESP3 push frames) — including the
//! lock-loss channels this node fills itself (`fenced:lost:session:<id>`,
//! `fenced:lost:owner:<owner>`; docs/resp.md, "Lock-loss events") from the grants that end
//! on it. Those events are a hint: the hub is lossy, and a restart loses them.
//!
//! Only the server publishes on `fenced:*` ([`RESERVED`]): `PUBLISH` there is refused for
//! every user, administrators included ([`reserved_publish`]), and a message that was
//! applied on such a channel anyway is never delivered ([`Connection::deliver_published`]).

use std::time::Duration;

use fenced_core::kv::{Argv, KvEvent, Reply};
use fenced_core::Event;
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
        if st.lost.is_none() {
            st.lost = Some(self.shared.backend.lock_events());
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
            st.lost = None;
        }
    }

    /// A message a `PUBLISH` applied on this node: to this connection's subscriptions,
    /// unless its channel is one of the server's own ([`RESERVED`]). Those are refused at
    /// the front end before they are proposed, but a `PUBLISH` can still be applied on one:
    /// a script's `redis.call('PUBLISH', …)` (the state machine runs it; refusing it there
    /// would change what replicas apply for old log entries, so it needs an
    /// apply-semantics gate), or an entry proposed before the refusal existed. Dropping it
    /// here is what keeps a forged lock-loss event from every subscriber.
    pub(super) fn deliver_published(&mut self, channel: &[u8], message: &[u8]) {
        if !channel.starts_with(RESERVED) {
            push_message(&self.st, channel, message, &mut self.out);
        }
    }

    /// An ended grant (or the loss of some): a message on its session's and its owner's
    /// lock-loss channels, to a user who may `LOCK.ACQUIRE` its name.
    pub(super) fn deliver_lost(&mut self, ev: Result<Event, Lagged>) {
        let Ok(ev) = ev else {
            // Events were lost: say so on every lock-loss channel this connection subscribed
            // to by name, and once on `fenced:lost:lagged` (for its patterns, and a
            // subscriber of that channel).
            let msg = br#"{"reason":"lagged"}"#;
            for c in self.st.channels.iter().filter(|c| c.starts_with(LOST)) {
                if c.as_slice() != LAGGED {
                    let frame = [Reply::bulk("message"), Reply::bulk(c), Reply::bulk(msg)];
                    encode_push(&frame, self.st.proto, &mut self.out);
                }
            }
            push_message(&self.st, LAGGED, msg, &mut self.out);
            return;
        };
        let Event::LockReleased {
            name,
            owner,
            session,
            token,
            reason,
        } = ev
        else {
            return;
        };
        if let Some(user) = &self.st.user {
            if user.permit("LOCK.ACQUIRE", &[name.as_bytes()]).is_err() {
                return;
            }
        }
        let msg = serde_json::json!({
            "name": name,
            "owner": owner,
            "token": token,
            "session": session.unwrap_or(0),
            "reason": reason.name(),
        })
        .to_string();
        let mut channels = vec![format!("fenced:lost:owner:{owner}")];
        if let Some(s) = session {
            channels.push(format!("fenced:lost:session:{s}"));
        }
        for c in channels {
            push_message(&self.st, c.as_bytes(), msg.as_bytes(), &mut self.out);
        }
    }

    /// `session_gone`, once, on each subscribed `fenced:lost:session:<id>` channel whose
    /// session a linearizable read judged at its own time shows gone
    /// ([`crate::Backend::session_gone`]; each read bounded by [`SESSION_CHECK`], a read that
    /// takes longer reports nothing this round).
    pub(super) async fn check_sessions(&mut self) {
        let ids: Vec<u64> = self.st.session_channels().collect();
        self.st.gone.retain(|id| ids.contains(id));
        for id in ids {
            if self.st.gone.contains(&id) {
                continue;
            }
            let gone = tokio::time::timeout(SESSION_CHECK, self.shared.backend.session_gone(id));
            if !gone.await.unwrap_or(false) {
                continue;
            }
            self.st.gone.insert(id);
            let msg = serde_json::json!({ "session": id, "reason": "session_gone" }).to_string();
            let channel = format!("fenced:lost:session:{id}");
            push_message(&self.st, channel.as_bytes(), msg.as_bytes(), &mut self.out);
        }
    }
}

/// The prefix of the channels only the server publishes on (its lock-loss events are under
/// it; docs/resp.md, "Lock-loss events").
pub(super) const RESERVED: &[u8] = b"fenced:";
const RESERVED_ERR: &str =
    "ERR channels starting with 'fenced:' are reserved for the server's own events";

/// The refusal of `argv` if it publishes on a reserved channel: for every user, checked in
/// [`Connection::gate`] before anything is proposed (so the state machine's `PUBLISH`,
/// which old log entries replay, is unchanged). `PUBLISH` is the only command that
/// publishes (there is no `SPUBLISH`); `SUBSCRIBE`/`PSUBSCRIBE` stay allowed.
pub(super) fn reserved_publish(argv: &Argv) -> Option<Reply> {
    (argv[0].eq_ignore_ascii_case(b"PUBLISH")
        && argv.get(1).is_some_and(|c| c.starts_with(RESERVED)))
    .then(|| Reply::err(RESERVED_ERR))
}

/// The prefix of the lock-loss channels.
const LOST: &[u8] = b"fenced:lost:";
/// Where a lost-events notice goes besides every lock-loss channel subscribed by name (so
/// that a `PSUBSCRIBE fenced:lost:*` hears it too).
const LAGGED: &[u8] = b"fenced:lost:lagged";
const SESSION_PREFIX: &[u8] = b"fenced:lost:session:";

/// How often a connection subscribed to a session's lock-loss channel checks whether the
/// session is gone (a linearizable read each: it shares the node's read-index rounds, and
/// commits a tick only when the session's deadline fell between the applied log time and the
/// leader's clock).
pub(crate) const SESSION_CHECK: Duration = Duration::from_secs(1);

/// Events were lost (the subscriber fell behind the hub's buffer).
pub(crate) struct Lagged;

impl State {
    /// The session ids of the `fenced:lost:session:<id>` channels subscribed to.
    fn session_channels(&self) -> impl Iterator<Item = u64> + '_ {
        self.channels.iter().filter_map(|c| {
            std::str::from_utf8(c.strip_prefix(SESSION_PREFIX)?)
                .ok()?
                .parse()
                .ok()
        })
    }

    /// Subscribed to a session's lock-loss channel (which gets `session_gone`).
    pub(super) fn watches_sessions(&self) -> bool {
        self.session_channels().next().is_some()
    }
}

/// The next ended grant; `Err(Lagged)` when some were lost; `None` when the hub closed.
pub(super) async fn recv_lost(
    rx: &mut Option<broadcast::Receiver<Event>>,
) -> Option<Result<Event, Lagged>> {
    let Some(r) = rx.as_mut() else {
        return std::future::pending().await;
    };
    match r.recv().await {
        Ok(e) => Some(Ok(e)),
        Err(broadcast::error::RecvError::Lagged(_)) => Some(Err(Lagged)),
        Err(broadcast::error::RecvError::Closed) => None,
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
