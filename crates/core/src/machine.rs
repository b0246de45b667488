//! The lock state machine.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::command::*;
use crate::kv::Keyspace;
use crate::limits::*;
use crate::{CoreError, SnapshotError};

/// A held lock and its FIFO queue.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Lock {
    owner: String,
    token: Token,
    holds: u32,
    session: Option<SessionId>,
    /// Lease end in log time; `None` when the lease is the session's.
    deadline: Option<Millis>,
    waiters: VecDeque<Waiter>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Waiter {
    request: RequestId,
    owner: String,
    session: Option<SessionId>,
    ttl_ms: Millis,
    /// When the wait runs out (log time).
    until: Millis,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct Session {
    ttl_ms: Millis,
    deadline: Millis,
    /// Locks held under this session.
    locks: BTreeSet<String>,
    /// Locks this session waits for.
    waiting: BTreeSet<(String, RequestId)>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct ClientRecord {
    last_seen: Millis,
    /// Responses of the client's most recent requests, by seq (at most `DEDUP_WINDOW`).
    responses: BTreeMap<u64, Response>,
}

/// Something with a deadline; the `deadlines` index orders them by time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    Lease(String),
    Session(SessionId),
    Wait(String, RequestId),
    ClientIdle(u64),
}

/// What a reader sees of a lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub name: String,
    pub owner: String,
    pub token: Token,
    pub holds: u32,
    pub session: Option<SessionId>,
    /// Lease end in log time (the session's deadline for session-bound locks).
    pub deadline_ms: Millis,
    pub waiters: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: SessionId,
    pub ttl_ms: Millis,
    pub deadline_ms: Millis,
    pub locks: Vec<String>,
}

/// The replicated state. Apply entries in log order with [`StateMachine::apply`]; the same
/// entries always produce the same state, responses and events.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct StateMachine {
    now: Millis,
    last_index: Index,
    locks: BTreeMap<String, Lock>,
    sessions: BTreeMap<SessionId, Session>,
    clients: BTreeMap<u64, ClientRecord>,
    deadlines: BTreeSet<(Millis, Due)>,
    /// Locks freed during the entry being applied whose queues are handed on when the entry
    /// is done. Empty between entries.
    #[serde(skip)]
    vacant: BTreeMap<String, VecDeque<Waiter>>,
    /// The RESP keyspace.
    kv: Keyspace,
}

impl StateMachine {
    pub fn new() -> Self {
        Self::default()
    }

    /// Log time of the last applied entry.
    pub fn now(&self) -> Millis {
        self.now
    }

    /// Index of the last applied entry (0 before any).
    pub fn last_index(&self) -> Index {
        self.last_index
    }

    /// The earliest pending deadline (lease, session, wait or dedup eviction), if any. The
    /// leader proposes a [`Command::Tick`] once its log clock passes it.
    pub fn next_deadline(&self) -> Option<Millis> {
        let locks = self.deadlines.first().map(|(t, _)| *t);
        match (locks, self.kv.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The keyspace, for reads.
    pub fn kv(&self) -> &Keyspace {
        &self.kv
    }

    pub fn lock_info(&self, name: &str) -> Option<LockInfo> {
        let lock = self.locks.get(name)?;
        Some(LockInfo {
            name: name.to_owned(),
            owner: lock.owner.clone(),
            token: lock.token,
            holds: lock.holds,
            session: lock.session,
            deadline_ms: self.lease_end(lock),
            waiters: lock.waiters.len(),
        })
    }

    pub fn session_info(&self, id: SessionId) -> Option<SessionInfo> {
        let s = self.sessions.get(&id)?;
        Some(SessionInfo {
            id,
            ttl_ms: s.ttl_ms,
            deadline_ms: s.deadline,
            locks: s.locks.iter().cloned().collect(),
        })
    }

    /// Every held lock, in name order.
    pub fn locks(&self) -> impl Iterator<Item = LockInfo> + '_ {
        self.locks.keys().filter_map(|n| self.lock_info(n))
    }

    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    fn lease_end(&self, lock: &Lock) -> Millis {
        match (lock.deadline, lock.session) {
            (Some(d), _) => d,
            (None, Some(s)) => self.sessions.get(&s).map_or(self.now, |s| s.deadline),
            (None, None) => self.now,
        }
    }

    /// Serialize the whole state (for Raft snapshots).
    pub fn to_bytes(&self) -> Vec<u8> {
        // Serializing plain maps and integers into a Vec cannot fail.
        bincode::serialize(self).unwrap_or_default()
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SnapshotError> {
        Ok(bincode::deserialize(bytes)?)
    }

    /// Apply the entry at `index`. Time first advances to the entry's time, expiring whatever
    /// is due (and handing freed locks to their first waiters); then the command runs, unless
    /// its request id was seen before, in which case the first outcome is returned again.
    pub fn apply(&mut self, index: Index, req: &Request) -> Applied {
        let mut events = Vec::new();
        self.last_index = self.last_index.max(index);
        self.now = self.now.max(req.time_ms);
        self.expire_due(&mut events);
        self.kv.expire_due(self.now);

        let response = match req.client {
            None => self.execute(index, None, &req.cmd, &mut events),
            Some(rid) => match self.dedup_lookup(rid) {
                Some(previous) => previous,
                None => {
                    let response = self.execute(index, Some(rid), &req.cmd, &mut events);
                    self.dedup_store(rid, response.clone());
                    response
                }
            },
        };
        self.hand_over(index, &mut events);
        Applied { response, events }
    }

    /// Give every lock freed in this entry to the first waiter of its queue, with token
    /// `index`. Running last means a grant made here is never ended in the same entry, so two
    /// grants of a lock never share a token. Waiters of sessions that ended in this entry were
    /// already withdrawn.
    fn hand_over(&mut self, index: Index, events: &mut Vec<Event>) {
        for (name, mut waiters) in std::mem::take(&mut self.vacant) {
            let Some(w) = waiters.pop_front() else {
                continue;
            };
            self.deadlines
                .remove(&(w.until, Due::Wait(name.clone(), w.request)));
            if let Some(s) = w.session.and_then(|s| self.sessions.get_mut(&s)) {
                s.waiting.remove(&(name.clone(), w.request));
            }
            let deadline = self.install_grant(index, &name, &w.owner, w.session, w.ttl_ms, waiters);
            let granted = Response::Granted {
                token: index,
                holds: 1,
                deadline_ms: deadline,
            };
            self.dedup_resolve(w.request, granted);
            events.push(Event::WaiterGranted {
                request: w.request,
                name,
                token: index,
                deadline_ms: deadline,
            });
        }
    }

    fn dedup_lookup(&self, rid: RequestId) -> Option<Response> {
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

    fn dedup_store(&mut self, rid: RequestId, response: Response) {
        let now = self.now;
        let rec = self
            .clients
            .entry(rid.client_id)
            .or_insert_with(|| ClientRecord {
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
        // retry always learns the outcome.
        if rec.responses.len() as u64 > DEDUP_WINDOW {
            rec.responses
                .retain(|seq, r| seq + DEDUP_WINDOW > newest || *r == Response::Pending);
        }
        self.deadlines.remove(&old_due);
        self.deadlines
            .insert((now + CLIENT_IDLE_MS, Due::ClientIdle(rid.client_id)));
    }

    /// Replace the remembered response of a request that was answered `Pending`.
    fn dedup_resolve(&mut self, rid: RequestId, response: Response) {
        if let Some(rec) = self.clients.get_mut(&rid.client_id) {
            if let Some(slot) = rec.responses.get_mut(&rid.seq) {
                *slot = response;
            }
        }
    }

    fn execute(
        &mut self,
        index: Index,
        rid: Option<RequestId>,
        cmd: &Command,
        events: &mut Vec<Event>,
    ) -> Response {
        let result = match cmd {
            Command::Acquire {
                name,
                owner,
                ttl_ms,
                session,
                wait_ms,
            } => self.acquire(index, rid, name, owner, *ttl_ms, *session, *wait_ms),
            Command::Release { name, owner, token } => {
                Ok(self.release(name, owner, *token, events))
            }
            Command::Renew {
                name,
                owner,
                token,
                ttl_ms,
            } => self.renew(name, owner, *token, *ttl_ms),
            Command::OpenSession { ttl_ms } => self.open_session(index, *ttl_ms),
            Command::KeepAlive { session } => Ok(self.keep_alive(*session)),
            Command::CloseSession { session } => {
                Ok(self.close_session(*session, ReleaseReason::SessionClosed, events))
            }
            Command::Tick => Ok(Response::Ticked),
            Command::Kv(cmd) => Ok(Response::Kv(self.kv.apply(index, self.now, cmd, events))),
        };
        result.unwrap_or_else(Response::Rejected)
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        index: Index,
        rid: Option<RequestId>,
        name: &str,
        owner: &str,
        ttl_ms: Millis,
        session: Option<SessionId>,
        wait_ms: Millis,
    ) -> Result<Response, CoreError> {
        check_name(name)?;
        check_owner(owner)?;
        if session.is_none() {
            check_ttl(ttl_ms)?;
        }
        if wait_ms > MAX_WAIT_MS {
            return Err(CoreError::InvalidWait {
                wait_ms,
                max: MAX_WAIT_MS,
            });
        }
        if let Some(s) = session {
            if !self.sessions.contains_key(&s) {
                return Err(CoreError::NoSuchSession(s));
            }
        }
        let now = self.now;
        if let Some(queue) = self.vacant.get_mut(name) {
            // Freed in this entry and promised to its first waiter: queue behind.
            return Self::enqueue(
                queue,
                &mut self.deadlines,
                &mut self.sessions,
                rid,
                name,
                owner,
                ttl_ms,
                session,
                wait_ms,
                now,
            );
        }
        match self.locks.get_mut(name) {
            None => {
                if self.locks.len() >= MAX_LOCKS {
                    return Err(CoreError::LimitReached {
                        what: "locks".into(),
                        max: MAX_LOCKS,
                    });
                }
                let lock = self.grant_new(index, name, owner, session, ttl_ms);
                Ok(lock)
            }
            Some(lock) if lock.owner == owner && lock.session == session => {
                if lock.holds >= MAX_HOLDS {
                    return Err(CoreError::TooManyHolds {
                        name: name.to_owned(),
                        max: MAX_HOLDS,
                    });
                }
                lock.holds += 1;
                if let Some(old) = lock.deadline {
                    let new = old.max(now + ttl_ms);
                    lock.deadline = Some(new);
                    self.deadlines.remove(&(old, Due::Lease(name.to_owned())));
                    self.deadlines.insert((new, Due::Lease(name.to_owned())));
                }
                Ok(Response::Granted {
                    token: lock.token,
                    holds: lock.holds,
                    deadline_ms: lock.deadline,
                })
            }
            Some(lock) => Self::enqueue(
                &mut lock.waiters,
                &mut self.deadlines,
                &mut self.sessions,
                rid,
                name,
                owner,
                ttl_ms,
                session,
                wait_ms,
                now,
            ),
        }
    }

    /// Queue an acquire behind the holder (or answer `NotGranted` if it does not wait).
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        queue: &mut VecDeque<Waiter>,
        deadlines: &mut BTreeSet<(Millis, Due)>,
        sessions: &mut BTreeMap<SessionId, Session>,
        rid: Option<RequestId>,
        name: &str,
        owner: &str,
        ttl_ms: Millis,
        session: Option<SessionId>,
        wait_ms: Millis,
        now: Millis,
    ) -> Result<Response, CoreError> {
        if wait_ms == 0 {
            return Ok(Response::NotGranted);
        }
        let Some(request) = rid else {
            return Err(CoreError::WaitNeedsRequestId);
        };
        if queue.len() >= MAX_WAITERS_PER_LOCK {
            return Err(CoreError::TooManyWaiters {
                name: name.to_owned(),
                max: MAX_WAITERS_PER_LOCK,
            });
        }
        let until = now + wait_ms;
        queue.push_back(Waiter {
            request,
            owner: owner.to_owned(),
            session,
            ttl_ms,
            until,
        });
        deadlines.insert((until, Due::Wait(name.to_owned(), request)));
        if let Some(s) = session.and_then(|s| sessions.get_mut(&s)) {
            s.waiting.insert((name.to_owned(), request));
        }
        Ok(Response::Pending)
    }

    /// Grant a free lock (not in `self.locks`) and return the `Granted` response.
    fn grant_new(
        &mut self,
        index: Index,
        name: &str,
        owner: &str,
        session: Option<SessionId>,
        ttl_ms: Millis,
    ) -> Response {
        let deadline = self.install_grant(index, name, owner, session, ttl_ms, VecDeque::new());
        Response::Granted {
            token: index,
            holds: 1,
            deadline_ms: deadline,
        }
    }

    fn install_grant(
        &mut self,
        index: Index,
        name: &str,
        owner: &str,
        session: Option<SessionId>,
        ttl_ms: Millis,
        waiters: VecDeque<Waiter>,
    ) -> Option<Millis> {
        let deadline = match session {
            Some(s) => {
                if let Some(sess) = self.sessions.get_mut(&s) {
                    sess.locks.insert(name.to_owned());
                }
                None
            }
            None => {
                let d = self.now + ttl_ms;
                self.deadlines.insert((d, Due::Lease(name.to_owned())));
                Some(d)
            }
        };
        self.locks.insert(
            name.to_owned(),
            Lock {
                owner: owner.to_owned(),
                token: index,
                holds: 1,
                session,
                deadline,
                waiters,
            },
        );
        deadline
    }

    fn release(
        &mut self,
        name: &str,
        owner: &str,
        token: Token,
        events: &mut Vec<Event>,
    ) -> Response {
        let Some(lock) = self.locks.get_mut(name) else {
            return Response::NotHeld;
        };
        if lock.owner != owner || lock.token != token {
            return Response::NotHeld;
        }
        lock.holds -= 1;
        if lock.holds > 0 {
            return Response::Released { holds: lock.holds };
        }
        self.end_grant(name, ReleaseReason::Released, events);
        Response::Released { holds: 0 }
    }

    fn renew(
        &mut self,
        name: &str,
        owner: &str,
        token: Token,
        ttl_ms: Millis,
    ) -> Result<Response, CoreError> {
        check_ttl(ttl_ms)?;
        let now = self.now;
        let Some(lock) = self.locks.get_mut(name) else {
            return Ok(Response::NotHeld);
        };
        if lock.owner != owner || lock.token != token {
            return Ok(Response::NotHeld);
        }
        let Some(old) = lock.deadline else {
            return Err(CoreError::LockBoundToSession(name.to_owned()));
        };
        let new = old.max(now + ttl_ms);
        lock.deadline = Some(new);
        self.deadlines.remove(&(old, Due::Lease(name.to_owned())));
        self.deadlines.insert((new, Due::Lease(name.to_owned())));
        Ok(Response::Renewed { deadline_ms: new })
    }

    fn open_session(&mut self, index: Index, ttl_ms: Millis) -> Result<Response, CoreError> {
        check_ttl(ttl_ms)?;
        if self.sessions.len() >= MAX_SESSIONS {
            return Err(CoreError::LimitReached {
                what: "sessions".into(),
                max: MAX_SESSIONS,
            });
        }
        let deadline = self.now + ttl_ms;
        self.sessions.insert(
            index,
            Session {
                ttl_ms,
                deadline,
                locks: BTreeSet::new(),
                waiting: BTreeSet::new(),
            },
        );
        self.deadlines.insert((deadline, Due::Session(index)));
        Ok(Response::SessionOpened {
            session: index,
            deadline_ms: deadline,
        })
    }

    fn keep_alive(&mut self, id: SessionId) -> Response {
        let now = self.now;
        let Some(s) = self.sessions.get_mut(&id) else {
            return Response::NoSuchSession;
        };
        let old = s.deadline;
        s.deadline = old.max(now + s.ttl_ms);
        let new = s.deadline;
        self.deadlines.remove(&(old, Due::Session(id)));
        self.deadlines.insert((new, Due::Session(id)));
        Response::SessionAlive { deadline_ms: new }
    }

    fn close_session(
        &mut self,
        id: SessionId,
        reason: ReleaseReason,
        events: &mut Vec<Event>,
    ) -> Response {
        let Some(s) = self.sessions.remove(&id) else {
            return Response::NoSuchSession;
        };
        self.deadlines.remove(&(s.deadline, Due::Session(id)));
        // Withdraw its waiters first, so that the locks released below are not handed to
        // them.
        for (name, rid) in &s.waiting {
            self.remove_waiter(name, *rid, events);
        }
        for name in &s.locks {
            self.end_grant(name, reason, events);
        }
        Response::SessionClosed
    }

    /// Remove a queued acquire and resolve it as `NotGranted`.
    fn remove_waiter(&mut self, name: &str, rid: RequestId, events: &mut Vec<Event>) {
        let queue = match self.locks.get_mut(name) {
            Some(lock) => &mut lock.waiters,
            None => match self.vacant.get_mut(name) {
                Some(queue) => queue,
                None => return,
            },
        };
        let Some(pos) = queue.iter().position(|w| w.request == rid) else {
            return;
        };
        if let Some(w) = queue.remove(pos) {
            self.deadlines
                .remove(&(w.until, Due::Wait(name.to_owned(), rid)));
            if let Some(s) = w.session.and_then(|s| self.sessions.get_mut(&s)) {
                s.waiting.remove(&(name.to_owned(), rid));
            }
        }
        self.dedup_resolve(rid, Response::NotGranted);
        events.push(Event::WaiterGaveUp {
            request: rid,
            name: name.to_owned(),
        });
    }

    /// End the current grant of `name`; its queue is handed on when the entry is done.
    fn end_grant(&mut self, name: &str, reason: ReleaseReason, events: &mut Vec<Event>) {
        let Some(lock) = self.locks.remove(name) else {
            return;
        };
        if let Some(d) = lock.deadline {
            self.deadlines.remove(&(d, Due::Lease(name.to_owned())));
        }
        if let Some(s) = lock.session.and_then(|s| self.sessions.get_mut(&s)) {
            s.locks.remove(name);
        }
        events.push(Event::LockReleased {
            name: name.to_owned(),
            owner: lock.owner,
            token: lock.token,
            reason,
        });
        if !lock.waiters.is_empty() {
            self.vacant.insert(name.to_owned(), lock.waiters);
        }
    }

    /// Expire everything whose deadline is at or before `now`, oldest first.
    fn expire_due(&mut self, events: &mut Vec<Event>) {
        while let Some((t, due)) = self.deadlines.first().cloned() {
            if t > self.now {
                break;
            }
            self.deadlines.remove(&(t, due.clone()));
            match due {
                Due::Lease(name) => {
                    if self.locks.get(&name).and_then(|l| l.deadline) == Some(t) {
                        self.end_grant(&name, ReleaseReason::Expired, events);
                    }
                }
                Due::Session(id) => {
                    self.close_session(id, ReleaseReason::SessionExpired, events);
                }
                Due::Wait(name, rid) => self.remove_waiter(&name, rid, events),
                Due::ClientIdle(id) => {
                    if self
                        .clients
                        .get(&id)
                        .is_some_and(|c| c.last_seen + CLIENT_IDLE_MS == t)
                    {
                        self.clients.remove(&id);
                    }
                }
            }
        }
    }

    /// Check the internal indexes agree with the data. For tests; O(n).
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<(), String> {
        if !self.vacant.is_empty() {
            return Err("vacant locks left between entries".into());
        }
        let mut expected = BTreeSet::new();
        for (name, lock) in &self.locks {
            if lock.holds == 0 {
                return Err(format!("{name}: held zero times"));
            }
            if lock.token > self.last_index {
                return Err(format!("{name}: token from the future"));
            }
            match (lock.deadline, lock.session) {
                (Some(d), None) => {
                    expected.insert((d, Due::Lease(name.clone())));
                }
                (None, Some(s)) => {
                    let sess = self
                        .sessions
                        .get(&s)
                        .ok_or(format!("{name}: held by dead session {s}"))?;
                    if !sess.locks.contains(name) {
                        return Err(format!("{name}: session {s} does not list it"));
                    }
                }
                other => return Err(format!("{name}: bad lease {other:?}")),
            }
            for w in &lock.waiters {
                expected.insert((w.until, Due::Wait(name.clone(), w.request)));
                if let Some(s) = w.session {
                    let sess = self
                        .sessions
                        .get(&s)
                        .ok_or(format!("{name}: waiter of dead session {s}"))?;
                    if !sess.waiting.contains(&(name.clone(), w.request)) {
                        return Err(format!("{name}: session {s} does not list its waiter"));
                    }
                }
            }
        }
        for (id, s) in &self.sessions {
            expected.insert((s.deadline, Due::Session(*id)));
            for name in &s.locks {
                if self.locks.get(name).and_then(|l| l.session) != Some(*id) {
                    return Err(format!("session {id} lists {name} it does not hold"));
                }
            }
        }
        for (id, c) in &self.clients {
            expected.insert((c.last_seen + CLIENT_IDLE_MS, Due::ClientIdle(*id)));
        }
        if expected != self.deadlines {
            return Err(format!(
                "deadline index out of sync: expected {expected:?}, have {:?}",
                self.deadlines
            ));
        }
        Ok(())
    }
}

fn check_name(name: &str) -> Result<(), CoreError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(CoreError::InvalidName {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

fn check_owner(owner: &str) -> Result<(), CoreError> {
    if owner.is_empty() || owner.len() > MAX_OWNER_LEN {
        return Err(CoreError::InvalidOwner {
            len: owner.len(),
            max: MAX_OWNER_LEN,
        });
    }
    Ok(())
}

fn check_ttl(ttl_ms: Millis) -> Result<(), CoreError> {
    if ttl_ms == 0 || ttl_ms > MAX_TTL_MS {
        return Err(CoreError::InvalidTtl {
            ttl_ms,
            max: MAX_TTL_MS,
        });
    }
    Ok(())
}
