//! Documented limits. Requests outside them are rejected with a [`crate::CoreError`].

/// Longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = 512;
/// Longest owner identifier, in bytes.
pub const MAX_OWNER_LEN: usize = 256;
/// Longest lease or session TTL: one day.
pub const MAX_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Longest server-side wait for a lock: one hour.
pub const MAX_WAIT_MS: u64 = 60 * 60 * 1000;
/// Most queued waiters per lock.
pub const MAX_WAITERS_PER_LOCK: usize = 10_000;
/// Most queued waiters in the cluster (all locks together): a waiter costs memory on every
/// node until its wait ends (at most [`MAX_WAIT_MS`]).
pub const MAX_WAITERS: usize = 1_000_000;
/// Most names in one atomic multi-lock.
pub const MAX_MULTI_LOCK: usize = 64;
/// Most permits of a semaphore.
pub const MAX_PERMITS: u32 = 65_536;
/// Most simultaneous holders of one lock (readers, permits).
pub const MAX_HOLDERS_PER_LOCK: usize = 65_536;
/// Longest lock-delay: one hour.
pub const MAX_LOCK_DELAY_MS: u64 = 60 * 60 * 1000;
/// Most reentrant holds of one grant.
pub const MAX_HOLDS: u32 = 1_000_000;
/// Most live locks (held or with waiters) in the cluster. A held lock costs a node ~0.8 KB
/// of memory (`bench/million.sh`: 1 M held locks, ~880 MB per node).
pub const MAX_LOCKS: usize = 2_000_000;
/// Most live sessions.
pub const MAX_SESSIONS: usize = 1_000_000;
/// Responses remembered per client: a retry of a request this far behind the client's newest
/// one is refused with `RequestTooOld` instead of being executed again. A queued acquire is
/// remembered until its outcome is known, however far behind it falls.
pub const DEDUP_WINDOW: u64 = 128;
/// A client that sent nothing for this long (log time) is forgotten by the dedup table.
pub const CLIENT_IDLE_MS: u64 = 60 * 60 * 1000;
