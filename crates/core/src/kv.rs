//! The replicated keyspace behind the RESP front end (strings, hashes, lists, sorted sets with
//! expiry in log time, per-key create/mod revisions and fence high-water marks).
//!
//! Owned by the RESP work (issue 5); the lock machine only routes [`Command::Kv`] here.
//!
//! [`Command::Kv`]: crate::Command::Kv

use serde::{Deserialize, Serialize};

use crate::{Index, Millis};

/// A keyspace command, applied at a log index and log time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum KvCommand {
    /// Placeholder until the keyspace lands.
    Noop,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum KvResponse {
    Ok,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyspace {}

impl Keyspace {
    /// Apply `cmd` at `index` (its revision) and log time `now`.
    pub fn apply(&mut self, _index: Index, _now: Millis, cmd: &KvCommand) -> KvResponse {
        match cmd {
            KvCommand::Noop => KvResponse::Ok,
        }
    }

    /// Remove keys whose expiry is at or before `now`.
    pub fn expire_due(&mut self, _now: Millis) {}

    /// The earliest key expiry, if any.
    pub fn next_deadline(&self) -> Option<Millis> {
        None
    }
}
