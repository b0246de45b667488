//! What a lock is: its kind (exclusive, read-write, semaphore), its holders and their
//! grants, its FIFO queue and lock-delay; which grants a lock admits; and the checks an
//! acquire passes before it touches any lock.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::StateMachine;
use crate::command::*;
use crate::limits::*;
use crate::small_map::SmallMap;
use crate::CoreError;

/// What a lock is, fixed by the first acquire of its name until the lock is idle again.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    Exclusive,
    ReadWrite,
    Semaphore { permits: u32 },
}

impl LockKind {
    pub(super) fn of(mode: Mode) -> LockKind {
        match mode {
            Mode::Exclusive => LockKind::Exclusive,
            Mode::Read | Mode::Write => LockKind::ReadWrite,
            Mode::Permit { permits } => LockKind::Semaphore { permits },
        }
    }

    pub(super) fn describe(self) -> String {
        match self {
            LockKind::Exclusive => "exclusive".into(),
            LockKind::ReadWrite => "read-write".into(),
            LockKind::Semaphore { permits } => format!("{permits}-permit semaphore"),
        }
    }
}

/// Who holds a grant: an owner, optionally within a session. The same key acquiring again is
/// reentrant.
pub(super) type HolderKey = (String, Option<SessionId>);

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    pub(super) mode: Mode,
    pub(super) token: Token,
    pub(super) holds: u32,
    /// Lease end in log time; `None` when the lease is the session's.
    pub(super) deadline: Option<Millis>,
    pub(super) lock_delay_ms: Millis,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct Lock {
    pub(super) kind: LockKind,
    pub(super) holders: SmallMap<HolderKey, Holder>,
    /// Queued acquires, oldest first (keys of `StateMachine::waiters`).
    pub(super) queue: VecDeque<RequestId>,
    /// No grant before this log time (lock-delay after an expiry).
    pub(super) delay_until: Option<Millis>,
}

impl Lock {
    pub(super) fn new(kind: LockKind) -> Self {
        Lock {
            kind,
            holders: SmallMap::new(),
            queue: VecDeque::new(),
            delay_until: None,
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.delay_until.is_none()
    }

    /// Whether a new grant in `mode` is compatible with the current holders (ignoring the
    /// queue).
    pub(super) fn admits(&self, mode: Mode) -> bool {
        if self.delay_until.is_some() {
            return false;
        }
        match mode {
            Mode::Exclusive | Mode::Write => self.holders.is_empty(),
            Mode::Read => {
                self.holders.values().all(|h| h.mode == Mode::Read)
                    && self.holders.len() < MAX_HOLDERS_PER_LOCK
            }
            Mode::Permit { permits } => self.holders.len() < permits as usize,
        }
    }
}

pub(super) fn check_name(name: &str) -> Result<(), CoreError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(CoreError::InvalidName {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

pub(super) fn check_owner(owner: &str) -> Result<(), CoreError> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(CoreError::InvalidOwner {
            len: owner.len(),
            max: MAX_OWNER_LEN,
        });
    }
    Ok(())
}

pub(super) fn check_ttl(ttl_ms: Millis) -> Result<(), CoreError> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(CoreError::InvalidTtl {
            ttl_ms,
            max: MAX_TTL_MS,
        });
    }
    Ok(())
}

impl StateMachine {
    pub(super) fn validate(&self, spec: &AcquireSpec) -> Result<(), CoreError> {
        let distinct: BTreeSet<&String> = spec.names.iter().collect();
        if spec.names.is_empty()
            || spec.names.len() > MAX_MULTI_LOCK
            || distinct.len() != spec.names.len()
        {
            return Err(CoreError::InvalidNames {
                got: spec.names.len(),
                max: MAX_MULTI_LOCK,
            });
        }
        for name in &spec.names {
            check_name(name)?;
        }
        if spec.names.len() > 1 && spec.mode != Mode::Exclusive {
            return Err(CoreError::MultiLockMode);
        }
        check_owner(&spec.owner)?;
        if spec.session.is_none() {
            check_ttl(spec.ttl_ms)?;
        }
        if spec.wait_ms > MAX_WAIT_MS {
            return Err(CoreError::InvalidWait {
                wait_ms: spec.wait_ms,
                max: MAX_WAIT_MS,
            });
        }
        if spec.lock_delay_ms > MAX_LOCK_DELAY_MS {
            return Err(CoreError::InvalidLockDelay {
                delay_ms: spec.lock_delay_ms,
                max: MAX_LOCK_DELAY_MS,
            });
        }
        if let Mode::Permit { permits } = spec.mode {
            if permits == 0 || permits > MAX_PERMITS {
                return Err(CoreError::InvalidPermits {
                    permits,
                    max: MAX_PERMITS,
                });
            }
        }
        if let Some(s) = spec.session {
            if !self.sessions.contains_key(&s) {
                return Err(CoreError::NoSuchSession(s));
            }
        }
        let kind = LockKind::of(spec.mode);
        for name in &spec.names {
            if let Some(lock) = self.locks.get(name) {
                if lock.kind != kind {
                    return Err(CoreError::WrongKind {
                        name: name.clone(),
                        existing: lock.kind.describe(),
                        requested: kind.describe(),
                    });
                }
            }
        }
        Ok(())
    }
}
