//! The systems under test, and the one place that knows what each of them is: which servers
//! the harness starts, which port the lock clients talk to, whether grants carry fencing
//! tokens, which nemeses apply.
//!
//! Three of them run against the *same* 3-node fenced cluster (same processes, nemeses and
//! checkers) and differ only in the client:
//!
//! * `fenced`: gRPC (`fenced_backends::FencedGrpc`), any node, the client goes to the leader;
//! * `fenced-resp`: RESP `LOCK.ACQUIRE/RELEASE/RENEW` (`fenced_backends::FencedResp`);
//! * `fenced-setnx`: the unchanged Redis lock pattern — `SET key value NX PX ttl`, Lua
//!   compare-and-delete — pointed at fenced's RESP port, token from `FENCE.TOKEN key value`
//!   (`fenced_backends::RedisLock::fenced_setnx`).
//!
//! A RESP client talks to one node at a time, as Redis clients do (see `client.rs`).
//!
//! The `limiter` workload runs `CL.THROTTLE` (fenced's log-time GCRA) over RESP for `fenced`,
//! and the unchanged token-bucket Lua script (`tests/resp/token_bucket.lua`, "now" from the
//! client's clock) for `redis` and for `fenced-lua` — the same script against fenced's RESP
//! port, on the same cluster and schedules as the other fenced systems. `fenced-lua` runs
//! only that workload.
//!
//! The `rwlock` and `semaphore` workloads (issue 26) run against `fenced` (gRPC, mode in the
//! `Acquire`), `fenced-resp` (`LOCK.READ`/`LOCK.WRITE`/`LOCK.PERMIT`) and `redis`
//! (`fenced_backends::Redisson`: Redisson's read-write lock and permit semaphore scripts).
//!
//! `etcd` is a 3-node etcd cluster (the `etcd` binary on PATH; Debian's `etcd-server`) for the
//! `kv` and `watch` workloads only: the same clients through etcd's own API, for comparison.
//! It takes the partition, kill and pause nemeses (node↔node partitions as for fenced).
//!
//! etcd's server-side lock service `v3lockpb.Lock` (issue 27), for the `lock` and `counter`
//! workloads (`fenced_backends::EtcdLockService`, a lease per client kept alive every
//! TTL/3, token = the lock key's create revision), each client on one node at a time like the
//! RESP clients: `fenced-etcdlock` through fenced's gRPC port (the same fenced cluster and
//! nemeses as `fenced`), `etcd-lock` on the same 3-node etcd cluster as `etcd` (its nemeses).

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum System {
    Fenced,
    FencedResp,
    FencedSetnx,
    FencedLua,
    Redis,
    Redlock,
    Etcd,
    FencedEtcdLock,
    EtcdLock,
    /// Half the lock clients (even indexes) through etcd's client-side Mutex recipe on KV
    /// (`fenced_backends::EtcdLock`), half through the server-side Lock RPC, on one name
    /// space: fenced's etcd API (issue 38: one lock per name, whoever takes it).
    FencedEtcdMix,
    /// The same mix against a real etcd cluster.
    EtcdMix,
}

impl System {
    /// Every system, in the order results tables list them.
    pub const ALL: [System; 11] = [
        System::Fenced,
        System::FencedResp,
        System::FencedSetnx,
        System::FencedLua,
        System::Redis,
        System::Redlock,
        System::Etcd,
        System::FencedEtcdLock,
        System::EtcdLock,
        System::FencedEtcdMix,
        System::EtcdMix,
    ];

    pub fn parse(name: &str) -> Option<System> {
        System::ALL.into_iter().find(|s| s.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            System::Fenced => "fenced",
            System::FencedResp => "fenced-resp",
            System::FencedSetnx => "fenced-setnx",
            System::FencedLua => "fenced-lua",
            System::Redis => "redis",
            System::Redlock => "redlock",
            System::Etcd => "etcd",
            System::FencedEtcdLock => "fenced-etcdlock",
            System::EtcdLock => "etcd-lock",
            System::FencedEtcdMix => "fenced-etcdmix",
            System::EtcdMix => "etcd-mix",
        }
    }

    /// "fenced, fenced-resp, ..." for messages.
    pub fn names() -> String {
        System::ALL.map(System::name).join(", ")
    }

    /// Runs against a fenced cluster (`fenced serve` nodes with Raft between them): node↔node
    /// partitions, the clock nemesis through fenced's test hook, and a node restarted with an
    /// empty disk retires itself (the harness leaves it down).
    pub fn is_fenced_cluster(self) -> bool {
        matches!(
            self,
            System::Fenced
                | System::FencedResp
                | System::FencedSetnx
                | System::FencedLua
                | System::FencedEtcdLock
                | System::FencedEtcdMix
        )
    }

    /// A real etcd cluster (the `etcd` binary), whichever API its clients use.
    pub fn is_etcd_cluster(self) -> bool {
        matches!(self, System::Etcd | System::EtcdLock | System::EtcdMix)
    }

    /// Lock clients use etcd's server-side lock service (`v3lockpb.Lock`), on one node at a
    /// time.
    pub fn is_etcd_lock_service(self) -> bool {
        matches!(
            self,
            System::FencedEtcdLock | System::EtcdLock | System::FencedEtcdMix | System::EtcdMix
        )
    }

    /// Server nodes replicate among themselves (fenced clusters, etcd): partitions cut nodes
    /// from each other rather than clients from servers.
    pub fn has_peers(self) -> bool {
        self.is_fenced_cluster() || self.is_etcd_cluster()
    }

    /// Why `nemesis` cannot run against this system, if it cannot (etcd: its clock is Go's,
    /// read through the vDSO, which the LD_PRELOAD shim cannot shift; a wiped or replaced
    /// etcd member needs `etcdctl member remove/add`, which the harness does not do).
    pub fn unsupported_nemesis(self, nemesis: &str) -> Option<&'static str> {
        match (self, nemesis) {
            (System::Etcd | System::EtcdLock | System::EtcdMix, "partition" | "kill" | "pause") => {
                None
            }
            (System::Etcd | System::EtcdLock | System::EtcdMix, _) => {
                Some("etcd runs under partition, kill and pause only")
            }
            (s, "membership") if !s.is_fenced_cluster() => Some("no members to change"),
            _ => None,
        }
    }

    /// Lock clients speak RESP to fenced's RESP front end (one node at a time).
    pub fn is_fenced_resp(self) -> bool {
        matches!(self, System::FencedResp | System::FencedSetnx)
    }

    /// Grants carry fencing tokens (the fencing checker applies).
    pub fn issues_tokens(self) -> bool {
        self.is_fenced_cluster() || matches!(self, System::EtcdLock | System::EtcdMix)
    }

    /// Why `workload` cannot run against this system, if it cannot: `fenced-lua` runs only
    /// the limiter workload, and the limiter workload runs against `fenced` (`CL.THROTTLE`),
    /// `fenced-lua` and `redis` (the Lua script) only.
    pub fn unsupported(self, workload: &str) -> Option<String> {
        match (self, workload) {
            (s, "lock" | "counter" | "counter-unfenced") if s.is_etcd_lock_service() => None,
            (s, w) if s.is_etcd_lock_service() => Some(format!(
                "{s} runs the lock and counter workloads (etcd's Lock service), not {w}"
            )),
            (System::Fenced | System::Etcd, "kv" | "watch") => None,
            (_, "kv" | "watch") => Some(format!(
                "the {workload} workload talks etcd's API: system fenced (its gRPC port) or etcd, \
                 not {self}"
            )),
            (System::Etcd, w) => Some(format!(
                "etcd runs only the kv and watch workloads, not {w}"
            )),
            (System::Fenced | System::FencedLua | System::Redis, "limiter") => None,
            (_, "limiter") => Some(format!(
                "the limiter workload runs against fenced (CL.THROTTLE), fenced-lua or redis \
                 (the token-bucket Lua script), not {self}"
            )),
            (System::FencedLua, w) => Some(format!(
                "fenced-lua runs only the limiter workload, not {w}"
            )),
            (System::Fenced | System::FencedResp | System::Redis, "rwlock" | "semaphore") => None,
            (_, "rwlock" | "semaphore") => Some(format!(
                "the {workload} workload runs against fenced (gRPC), fenced-resp (LOCK.READ/WRITE/\
                 PERMIT) or redis (Redisson-style Lua scripts), not {self}"
            )),
            _ => None,
        }
    }

    /// The limiter workload sends the token-bucket Lua script (with the client's "now")
    /// instead of `CL.THROTTLE`.
    pub fn limiter_uses_lua(self) -> bool {
        matches!(self, System::FencedLua | System::Redis | System::Redlock)
    }

    /// Position in results tables.
    pub fn order(self) -> usize {
        System::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

impl fmt::Display for System {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the system named `name` issues fencing tokens (`false` for unknown names).
pub fn issues_tokens(name: &str) -> bool {
    System::parse(name).is_some_and(System::issues_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_classify() {
        for s in System::ALL {
            assert_eq!(System::parse(s.name()), Some(s));
        }
        assert_eq!(System::parse("etcd"), Some(System::Etcd));
        assert!(System::Etcd.has_peers() && !System::Etcd.is_fenced_cluster());
        assert!(System::Etcd.unsupported("lock").is_some());
        assert!(System::Etcd.unsupported("kv").is_none());
        assert!(System::Etcd.unsupported_nemesis("clock").is_some());
        assert!(System::Etcd.unsupported_nemesis("kill").is_none());
        let cluster: Vec<_> = System::ALL
            .into_iter()
            .filter(|s| s.is_fenced_cluster())
            .map(System::name)
            .collect();
        assert_eq!(
            cluster,
            [
                "fenced",
                "fenced-resp",
                "fenced-setnx",
                "fenced-lua",
                "fenced-etcdlock",
                "fenced-etcdmix"
            ]
        );
        // etcd's Lock service: on fenced's cluster and on etcd's, tokens on both, lock and
        // counter workloads only; etcd's nemeses are etcd's.
        assert!(System::FencedEtcdLock.is_fenced_cluster() && System::EtcdLock.has_peers());
        assert!(System::FencedEtcdMix.is_fenced_cluster() && System::FencedEtcdMix.issues_tokens());
        assert!(System::EtcdMix.is_etcd_cluster() && System::EtcdMix.issues_tokens());
        assert!(
            System::EtcdMix.is_etcd_lock_service() && System::FencedEtcdMix.is_etcd_lock_service()
        );
        assert_eq!(System::parse("fenced-etcdmix"), Some(System::FencedEtcdMix));
        assert!(System::EtcdMix.unsupported_nemesis("clock").is_some());
        assert!(System::EtcdLock.is_etcd_cluster() && !System::EtcdLock.is_fenced_cluster());
        assert!(issues_tokens("etcd-lock") && issues_tokens("fenced-etcdlock"));
        for s in [System::FencedEtcdLock, System::EtcdLock] {
            assert!(s.unsupported("lock").is_none() && s.unsupported("counter").is_none());
            assert!(s.unsupported("kv").is_some() && s.unsupported("rwlock").is_some());
        }
        assert!(System::EtcdLock.unsupported_nemesis("pause").is_none());
        assert!(System::EtcdLock.unsupported_nemesis("clock").is_some());
        assert!(System::FencedEtcdLock
            .unsupported_nemesis("clock")
            .is_none());
        assert!(System::FencedLua.unsupported("lock").is_some());
        assert!(System::FencedLua.unsupported("limiter").is_none());
        assert!(System::Redis.unsupported("limiter").is_none());
        assert!(System::Redlock.unsupported("limiter").is_some());
        assert!(System::FencedSetnx.unsupported("counter").is_none());
        assert!(System::Fenced.unsupported("watch").is_none());
        assert!(System::FencedResp.unsupported("kv").is_some());
        assert!(System::Redis.unsupported("watch").is_some());
        assert!(System::Redis.limiter_uses_lua() && !System::Fenced.limiter_uses_lua());
        assert!(issues_tokens("fenced-setnx") && !issues_tokens("redlock"));
        assert!(System::FencedResp.is_fenced_resp() && !System::Fenced.is_fenced_resp());
        for w in ["rwlock", "semaphore"] {
            assert!(System::FencedResp.unsupported(w).is_none());
            assert!(System::Fenced.unsupported(w).is_none());
            assert!(System::Redis.unsupported(w).is_none());
            assert!(System::FencedSetnx.unsupported(w).is_some());
            assert!(System::Redlock.unsupported(w).is_some());
        }
    }
}
