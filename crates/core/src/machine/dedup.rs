//! The request dedup table: the remembered response of each client's recent requests, so a
//! retried request is answered with its first outcome and never acts twice. Under
//! [`Semantics::REQUEST_DIGESTS`] each remembered response has a digest of its command
//! beside it (`request_digests`), and a request id seen before with a different command is
//! refused ([`CoreError::RequestIdReused`]) rather than answered the other command's outcome.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::expiry::Due;
use super::StateMachine;
use crate::command::*;
use crate::limits::*;
use crate::CoreError;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct ClientRecord {
    pub(super) last_seen: Millis,
    /// Responses of the client's most recent requests, by seq.
    pub(super) responses: BTreeMap<u64, Response>,
}

/// XXH3 of the bincode encoding of `cmd` — the command a [`Command::AsUser`] carries, so
/// that an attempt proposed unwrapped while the leader stamped older rules matches a retry
/// proposed wrapped. The same on every replica (the encoding is the log's).
pub(super) fn command_digest(cmd: &Command) -> u64 {
    struct Hashing(xxhash_rust::xxh3::Xxh3);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Hashing(xxhash_rust::xxh3::Xxh3::new());
    // Encoding a command in memory cannot fail; if it ever did, the digest of what was
    // written is still the same on every replica.
    let _ = bincode::Options::serialize_into(super::body::options(), &mut h, cmd.inner());
    h.0.digest()
}

impl StateMachine {
    /// [`dedup_lookup`](Self::dedup_lookup), and with `digest` (the request's command's,
    /// under [`Semantics::REQUEST_DIGESTS`]) a remembered request whose command had another
    /// digest is refused. A record without a digest (stored under older rules, or by
    /// [`StateMachine::apply_quarantined`]) answers as before.
    pub(super) fn dedup_lookup_for(&self, rid: RequestId, digest: Option<u64>) -> Option<Response> {
        let previous = self.dedup_lookup(rid)?;
        if let Some(d) = digest {
            let stored = self
                .request_digests
                .get(&rid.client_id)
                .and_then(|m| m.get(&rid.seq));
            if stored.is_some_and(|s| *s != d) {
                return Some(Response::Rejected(CoreError::RequestIdReused {
                    client_id: rid.client_id,
                    seq: rid.seq,
                }));
            }
        }
        Some(previous)
    }

    /// Remember the digest of the command of `rid`, whose response was just stored.
    pub(super) fn dedup_note_digest(&mut self, rid: RequestId, digest: u64) {
        self.request_digests
            .get_or_insert_with(rid.client_id, BTreeMap::new)
            .insert(rid.seq, digest);
    }

    pub(super) fn dedup_lookup(&self, rid: RequestId) -> Option<Response> {
        let rec = self.clients.get(&rid.client_id)?;
        if let Some(r) = rec.responses.get(&rid.seq) {
            return Some(r.clone());
        }
        let newest = rec.responses.last_key_value().map_or(0, |(s, _)| *s);
        if rid.seq + DEDUP_WINDOW <= newest {
            return Some(Response::Rejected(CoreError::RequestTooOld {
                client_id: rid.client_id,
                seq: rid.seq,
            }));
        }
        None
    }

    pub(super) fn dedup_store(&mut self, rid: RequestId, response: Response) {
        let now = self.now;
        let rec = self
            .clients
            .get_or_insert_with(rid.client_id, || ClientRecord {
                last_seen: now,
                responses: BTreeMap::new(),
            });
        let old_due = (
            rec.last_seen + CLIENT_IDLE_MS,
            Due::ClientIdle(rid.client_id),
        );
        rec.last_seen = now;
        rec.responses.insert(rid.seq, response);
        let newest = rec.responses.last_key_value().map_or(0, |(s, _)| *s);
        // Queued acquires stay until resolved (their waits are bounded by `MAX_WAIT_MS`), so a
        // retry always learns the outcome. Pruned in bulk once the record holds twice the
        // window, so the scan costs O(1) per request on average (a retry a little older than
        // the window may still find its answer, which is only better).
        if rec.responses.len() as u64 > 2 * DEDUP_WINDOW {
            rec.responses
                .retain(|seq, r| seq + DEDUP_WINDOW > newest || *r == Response::Pending);
            let kept = &rec.responses;
            if let Some(digests) = self.request_digests.get_mut(&rid.client_id) {
                digests.retain(|seq, _| kept.contains_key(seq));
            }
        }
        self.deadlines.remove(&old_due);
        self.deadlines
            .insert((now + CLIENT_IDLE_MS, Due::ClientIdle(rid.client_id)));
    }

    /// Replace the remembered response of a request that was answered `Pending`.
    pub(super) fn dedup_resolve(&mut self, rid: RequestId, response: Response) {
        if let Some(rec) = self.clients.get_mut(&rid.client_id) {
            if let Some(slot) = rec.responses.get_mut(&rid.seq) {
                *slot = response;
            }
        }
    }
}
