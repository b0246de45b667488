//! The request dedup table: the remembered response of each client's recent requests, so a
//! retried request is answered with its first outcome and never acts twice.

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

impl StateMachine {
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
