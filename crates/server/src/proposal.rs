//! One proposal as the node's batchers carry it — to the leader's next entry or in a forwarded
//! batch — and what it costs in a batch.

use std::time::Duration;

use fenced_core::{Command, CoreError, RequestId, Response};

use crate::error::NodeError;

/// How long a proposal keeps trying (following leader changes) before giving up as unknown.
pub const PROPOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// After a wait's deadline, how long to keep listening for the entry that ends it (the
/// leader's tick and its commit) before asking the state machine directly.
pub const WAIT_SLACK: Duration = Duration::from_secs(2);

/// One proposal: the request id (if any) and the command.
pub(crate) type Proposal = (Option<RequestId>, Command);
/// The answer to one proposal.
pub(crate) type Proposed = Result<Response, NodeError>;

/// The one rule for outcomes: what the attempts of one request so far allow its caller to be
/// told. Every path that proposes — on the leader, forwarded to it, and a waiting acquire's
/// wait — settles each attempt here.
///
/// * Until an attempt may have been applied, a refusal (not the leader, overloaded, the node
///   stopped, invalid) means nothing was applied, and is passed on as such: RESP `-TRYAGAIN` /
///   `-BUSY`, gRPC `UNAVAILABLE` "not the leader" / `RESOURCE_EXHAUSTED` / `INTERNAL`.
/// * Once one may have been — its outcome was unknown (a timeout, a lost leader, a Raft core
///   that stopped after the entry was handed to it), or it was answered `Pending` (applied,
///   the acquire queued) — every later answer that is not the state machine's record of the
///   request is "outcome unknown" ([`NodeError::Unknown`]): a later attempt's refusal says
///   nothing about the earlier one. So is `RequestTooOld`: the record that would tell is gone.
/// * A request without a request id is not tried again once its outcome is unknown (a repeat
///   could act twice); it stays unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Why an earlier attempt may have been applied; `None` while certainly nothing was.
    maybe_applied: Option<String>,
    /// An attempt was answered `Pending`: applied, the acquire queued.
    queued: bool,
}

impl Outcome {
    /// Nothing attempted yet.
    pub(crate) fn new() -> Outcome {
        Outcome::default()
    }

    /// Whether an attempt may have been applied.
    #[cfg(test)]
    pub(crate) fn maybe_applied(&self) -> bool {
        self.maybe_applied.is_some()
    }

    /// Whether an attempt was answered `Pending` (its wait resumes on the same request id).
    pub(crate) fn queued(&self) -> bool {
        self.queued
    }

    /// An attempt was answered `Pending`: applied, and the acquire queued.
    pub(crate) fn note_queued(&mut self) {
        self.queued = true;
        self.maybe_applied = Some("the acquire was queued; its resolution was not learnt".into());
    }

    /// An attempt may have been applied, for this reason (the first one given is kept).
    fn note_unknown(&mut self, why: String) {
        self.maybe_applied.get_or_insert(why);
    }

    /// One attempt's answer: `None` to try again (`retry`: time is left; `has_id`: the request
    /// carries a request id, so a repeat is answered from its record), or the caller's answer.
    pub(crate) fn settle(
        &mut self,
        attempt: Proposed,
        has_id: bool,
        retry: bool,
    ) -> Option<Proposed> {
        match attempt {
            Err(NodeError::NotLeader { .. }) if retry => None,
            Err(NodeError::Unknown(m)) if has_id && retry => {
                self.note_unknown(m);
                None
            }
            other => Some(self.finish(other)),
        }
    }

    /// A final answer, by the rule: once an attempt may have been applied, anything but the
    /// state machine's record of the request is "outcome unknown".
    pub(crate) fn finish(&mut self, answer: Proposed) -> Proposed {
        let Some(why) = &self.maybe_applied else {
            return answer;
        };
        match answer {
            Ok(Response::Rejected(e @ CoreError::RequestTooOld { .. })) => {
                Err(NodeError::Unknown(format!("{why}; then {e}")))
            }
            Ok(r) => Ok(r),
            Err(NodeError::Unknown(m)) => Err(NodeError::Unknown(m)),
            Err(e) => Err(NodeError::Unknown(format!("{why}; then {e}"))),
        }
    }

    /// A queued acquire's wait asked its request again (same id): `None` while it is still
    /// queued or the answer says nothing (keep listening and asking until the deadline), else
    /// its resolution.
    pub(crate) fn reask(&mut self, answer: Proposed) -> Option<Proposed> {
        match answer {
            Ok(Response::Pending) => {
                self.note_queued();
                None
            }
            Err(e) => {
                self.note_unknown(e.to_string());
                None
            }
            Ok(r) => Some(self.finish(Ok(r))),
        }
    }

    /// The answer when no attempt is left: `Pending` (the caller's "outcome unknown: retry
    /// with the same request id") if an attempt was queued, else unknown.
    pub(crate) fn give_up(&self) -> Proposed {
        if self.queued {
            return Ok(Response::Pending);
        }
        Err(NodeError::Unknown(
            self.maybe_applied
                .clone()
                .unwrap_or_else(|| "no answer in time".into()),
        ))
    }
}

/// A leader's answer to a proposal this node forwarded, as this node's attempt: the leader's
/// node stopping is, from here, an unknown outcome (whether the leader had handed the entry to
/// its Raft core, this node cannot tell).
pub(crate) fn forwarded(answer: Proposed) -> Proposed {
    match answer {
        Err(NodeError::Fatal(m)) => Err(NodeError::Unknown(format!("the leader stopped: {m}"))),
        other => other,
    }
}

/// Every proposal of a batch fails: the node is gone.
pub(crate) fn stopped(n: usize) -> Vec<Proposed> {
    vec![Err(NodeError::Fatal("node stopped".into())); n]
}

/// The most bytes ([`size`]) of one entry's commands, and of one forwarded batch's: half the
/// transport's message limit ([`fenced_network::MAX_MESSAGE_SIZE`], 64 MiB), so that an
/// entry always fits into one append-entries message with room to spare, and a forwarded
/// batch always fits the leader's decode limit. Commands that would take an entry or a
/// forwarded batch past it go into the next one; a command larger than this alone is
/// refused before anything is proposed ([`too_large`]). Size is not the only bound on an
/// entry that replicates: openraft gives one append-entries call a heartbeat interval to
/// complete, so an entry of several MiB can still time out on a slow or loaded node.
pub const MAX_ENTRY_BYTES: usize = fenced_network::MAX_MESSAGE_SIZE / 2;

/// The bytes `cmd` adds to an entry (for the batch bounds): its encoded size (bincode's
/// fixed-width lengths, never less than the transport's varints) plus the request around
/// it. Counted without encoding it; a keyspace command's byte strings by their lengths, as
/// bincode's own count walks a `Vec<u8>` byte by byte.
pub(crate) fn size(cmd: &Command) -> usize {
    /// A request's time and id, and the entry's framing, per command.
    const BASE: usize = 64;
    let encoded = match cmd {
        Command::Kv(kv) => TAG.saturating_add(kv_size(kv)),
        other => serialized(other),
    };
    encoded.saturating_add(BASE)
}

/// An enum variant's tag, a collection's length (bincode's fixed-width encoding).
const TAG: usize = 4;
const LEN: usize = 8;

fn serialized<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    bincode::serialized_size(value).map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX))
}

fn kv_size(kv: &fenced_core::kv::KvCommand) -> usize {
    use fenced_core::kv::{Argv, KvCommand};
    let bytes = |b: &[u8]| LEN + b.len();
    let argvs = |cmds: &[Argv]| {
        LEN + cmds
            .iter()
            .map(|argv| LEN + argv.iter().map(|a| bytes(a)).sum::<usize>())
            .sum::<usize>()
    };
    TAG + match kv {
        KvCommand::Batch(cmds) => argvs(cmds),
        KvCommand::Multi { watches, cmds } => {
            LEN + watches.iter().map(|(k, _)| bytes(k) + 8).sum::<usize>() + argvs(cmds)
        }
        KvCommand::Restricted { limits, cmd } => serialized(limits) + kv_size(cmd),
    }
}

/// The error of a command larger than an entry may be ([`MAX_ENTRY_BYTES`]): it was refused
/// before it was proposed, so nothing was applied.
pub(crate) fn too_large(size: usize, cap: usize) -> NodeError {
    NodeError::Invalid(format!(
        "the command takes {size} bytes, more than one log entry may carry ({cap} bytes); \
         nothing was applied"
    ))
}

#[cfg(test)]
mod size_tests {
    use super::*;
    use fenced_core::kv::KvCommand;

    /// What a command carries counts, whichever command: a lock name or owner as much as a
    /// value (`LOCK.ACQUIRE` takes them from RESP bulk strings of up to 16 MiB).
    #[test]
    fn size_covers_every_encoding_of_every_command() {
        let big = "x".repeat(100_000);
        let cmds = [
            Command::Acquire {
                name: big.clone(),
                owner: big.clone(),
                ttl_ms: 1_000,
                session: None,
                wait_ms: 0,
            },
            Command::Release {
                name: big.clone(),
                owner: "o".into(),
                token: 1,
            },
            Command::Kv(KvCommand::Batch(vec![vec![
                b"SET".to_vec(),
                b"k".to_vec(),
                big.clone().into_bytes(),
            ]])),
            Command::Kv(KvCommand::Restricted {
                limits: fenced_core::kv::Restriction {
                    user: "u".into(),
                    keys: Some(vec![b"k*".to_vec()]),
                    channels: None,
                    commands: Some(vec!["SET".into()]),
                },
                cmd: Box::new(KvCommand::Multi {
                    watches: vec![(b"w".to_vec(), 7)],
                    cmds: vec![
                        vec![b"SET".to_vec(), big.clone().into_bytes()],
                        vec![b"DEL".to_vec()],
                    ],
                }),
            }),
        ];
        for cmd in cmds {
            let size = size(&cmd);
            let transport = fenced_network::codec::encode(&cmd).expect("encode").len();
            let log = bincode::serialize(&cmd).expect("encode").len();
            assert_eq!(size, log + 64, "counted as bincode encodes it");
            assert!(
                size >= transport && size >= log && size >= 100_000,
                "size {size} of a command that encodes to {transport} / {log} bytes"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_leader() -> Proposed {
        Err(NodeError::NotLeader { leader: None })
    }
    fn unknown(m: &str) -> Proposed {
        Err(NodeError::Unknown(m.into()))
    }
    fn too_old() -> Proposed {
        Ok(Response::Rejected(CoreError::RequestTooOld {
            client_id: 1,
            seq: 1,
        }))
    }
    fn granted() -> Proposed {
        Ok(Response::Granted {
            token: 9,
            holds: 1,
            deadline_ms: None,
        })
    }
    /// Every refusal a node can give: each means "nothing applied" on its own.
    fn refusals() -> Vec<Proposed> {
        vec![
            not_leader(),
            Err(NodeError::Overloaded("full".into())),
            Err(NodeError::Fatal("storage failed".into())),
            Err(NodeError::Invalid("bad".into())),
            Err(NodeError::Rejected(CoreError::WaitNeedsRequestId)),
        ]
    }
    fn is_unknown(p: &Option<Proposed>, why: &str) -> bool {
        matches!(p, Some(Err(NodeError::Unknown(m))) if m.contains(why))
    }

    #[test]
    fn before_anything_may_have_applied_a_refusal_is_passed_on() {
        for r in refusals() {
            let mut o = Outcome::new();
            let want = format!("{r:?}");
            let got = o.settle(r, true, false);
            assert_eq!(format!("{:?}", got.expect("final")), want);
            assert!(!o.maybe_applied());
        }
        // The state machine's own answers are passed on, RequestTooOld included.
        let mut o = Outcome::new();
        assert_eq!(o.settle(too_old(), true, true), Some(too_old()));
        assert_eq!(o.settle(granted(), true, true), Some(granted()));
    }

    #[test]
    fn not_the_leader_is_retried_while_time_is_left() {
        let mut o = Outcome::new();
        assert_eq!(o.settle(not_leader(), true, true), None);
        assert_eq!(o.settle(not_leader(), false, true), None);
        assert!(!o.maybe_applied());
    }

    #[test]
    fn an_unknown_attempt_with_an_id_is_retried_without_an_id_it_is_the_answer() {
        let mut o = Outcome::new();
        assert!(is_unknown(&o.settle(unknown("t"), false, true), "t"));
        let mut o = Outcome::new();
        assert_eq!(o.settle(unknown("timed out"), true, true), None);
        assert!(o.maybe_applied());
        assert!(is_unknown(
            &o.settle(unknown("again"), true, false),
            "again"
        ));
    }

    #[test]
    fn after_an_unknown_attempt_every_refusal_is_unknown() {
        for r in refusals() {
            let mut o = Outcome::new();
            assert_eq!(o.settle(unknown("timed out"), true, true), None);
            let what = format!("{r:?}");
            let got = o
                .settle(r, true, true)
                .or_else(|| o.settle(not_leader(), true, false));
            assert!(is_unknown(&got, "timed out"), "{what} became {got:?}");
        }
    }

    #[test]
    fn after_an_unknown_attempt_the_record_of_the_request_is_the_answer() {
        let mut o = Outcome::new();
        assert_eq!(o.settle(unknown("timed out"), true, true), None);
        assert_eq!(o.settle(granted(), true, true), Some(granted()));
        let mut o = Outcome::new();
        assert_eq!(o.settle(unknown("timed out"), true, true), None);
        assert_eq!(
            o.settle(Ok(Response::NotGranted), true, true),
            Some(Ok(Response::NotGranted))
        );
        // A record that fell out of the dedup window tells nothing.
        let mut o = Outcome::new();
        assert_eq!(o.settle(unknown("timed out"), true, true), None);
        assert!(is_unknown(&o.settle(too_old(), true, true), "timed out"));
    }

    #[test]
    fn a_queued_acquire_never_ends_refused() {
        for r in refusals() {
            let mut o = Outcome::new();
            o.note_queued();
            assert!(o.queued() && o.maybe_applied());
            let what = format!("{r:?}");
            // Re-asked during its wait: a refusal is no resolution, keep waiting.
            assert_eq!(o.reask(r.clone()), None, "{what}");
            // As a final answer: unknown.
            let got = o.settle(r, true, false);
            assert!(is_unknown(&got, "queued"), "{what} became {got:?}");
        }
        let mut o = Outcome::new();
        o.note_queued();
        assert_eq!(o.reask(Ok(Response::Pending)), None);
        assert_eq!(o.reask(unknown("t")), None);
        assert!(is_unknown(&o.reask(too_old()), "queued"));
        assert_eq!(o.reask(granted()), Some(granted()));
        assert_eq!(
            o.reask(Ok(Response::NotGranted)),
            Some(Ok(Response::NotGranted))
        );
        // The wait's deadline passed unresolved: "retry with the same request id".
        assert_eq!(o.give_up(), Ok(Response::Pending));
    }

    #[test]
    fn a_forwarded_attempt_whose_leader_stopped_is_unknown() {
        let got = forwarded(Err(NodeError::Fatal("storage failed".into())));
        assert!(matches!(got, Err(NodeError::Unknown(m)) if m.contains("storage failed")));
        assert_eq!(forwarded(not_leader()), not_leader());
        assert_eq!(forwarded(granted()), granted());
    }

    #[test]
    fn giving_up_without_a_queued_attempt_is_unknown() {
        let mut o = Outcome::new();
        assert!(matches!(o.give_up(), Err(NodeError::Unknown(_))));
        o.note_unknown("lost".into());
        assert!(matches!(o.give_up(), Err(NodeError::Unknown(m)) if m == "lost"));
    }
}
