//! The lock and election operations of the differential test (issue 38 items 1–2): etcd's
//! server-side `Lock` / `Unlock` and `Campaign` / `Proclaim` / `Leader` / `Resign`, a KV
//! delete of the holder's key (the operator's `etcdctl del` of a stuck holder), and a range
//! over a lock's keys. A call that would wait (the name is held by another lease) is given a
//! short deadline: both sides must answer "timed out" and must leave no waiter key behind.

use std::time::{Duration, Instant};

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::v3electionpb as elpb;
use fenced_proto::etcd::v3lockpb as lpb;

use super::{Shown, Side};

/// How long a lock or campaign call may wait before it is abandoned.
const WAIT: Duration = Duration::from_millis(400);
/// How long an abandoned call's waiter key may take to go.
const WITHDRAWN_WITHIN: Duration = Duration::from_secs(3);

/// Lock and election names (2 of each), outside the `k/` keys the other ops use.
pub(super) fn lock_name(i: usize) -> String {
    format!("lk{i}")
}

pub(super) fn election_name(i: usize) -> String {
    format!("el{i}")
}

/// A lock operation of the generator.
#[derive(Clone, Debug)]
pub(super) enum LockOp {
    Lock {
        name: usize,
        lease: usize,
    },
    Unlock {
        name: usize,
        lease: usize,
    },
    /// A KV delete of the key with the lowest create revision under the lock's prefix.
    DeleteHolder {
        name: usize,
    },
    /// A range over the lock's prefix, keys shown by lease slot.
    Keys {
        name: usize,
    },
    Campaign {
        name: usize,
        lease: usize,
        value: u64,
    },
    Proclaim {
        name: usize,
        lease: usize,
        value: u64,
    },
    Leader {
        name: usize,
    },
    Resign {
        name: usize,
        lease: usize,
    },
}

pub(super) fn gen_lock(pick: u64, a: u64, b: u64, c: u64) -> LockOp {
    let name = (a % 2) as usize;
    let lease = (b % 4) as usize;
    match pick % 10 {
        0..=2 => LockOp::Lock { name, lease },
        3 => LockOp::Unlock { name, lease },
        4 => LockOp::DeleteHolder { name },
        5 => LockOp::Keys { name },
        6 => LockOp::Campaign {
            name,
            lease,
            value: c % 100,
        },
        7 => LockOp::Proclaim {
            name,
            lease,
            value: c % 100,
        },
        8 => LockOp::Leader { name },
        _ => LockOp::Resign { name, lease },
    }
}

/// What a call that ended unanswered shows: both sides' ways of saying it.
fn timed_out(e: &tonic::Status) -> bool {
    matches!(
        e.code(),
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}

impl Side {
    /// `key` with a lease id in hex after its last `/` shown as that lease's slot.
    pub(super) fn key_shown(&self, key: &[u8]) -> String {
        let k = String::from_utf8_lossy(key);
        if let Some((prefix, hex)) = k.rsplit_once('/') {
            if let Ok(id) = i64::from_str_radix(hex, 16) {
                return format!("{prefix}/{}", self.lease_slot(id));
            }
        }
        k.into_owned()
    }

    fn lock_kv(&self, kv: &fenced_proto::etcd::mvccpb::KeyValue) -> String {
        format!(
            "{}={} c{} m{} l{}",
            self.key_shown(&kv.key),
            String::from_utf8_lossy(&kv.value),
            self.ord(kv.create_revision),
            self.ord(kv.mod_revision),
            self.lease_slot(kv.lease),
        )
    }

    /// The keys under `prefix/`, in create-revision order.
    async fn keys_under(&mut self, prefix: &str) -> Vec<fenced_proto::etcd::mvccpb::KeyValue> {
        let mut end = format!("{prefix}/").into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let r = self
            .kv
            .range(epb::RangeRequest {
                key: format!("{prefix}/").into_bytes(),
                range_end: end,
                sort_order: epb::range_request::SortOrder::Ascend as i32,
                sort_target: epb::range_request::SortTarget::Create as i32,
                ..Default::default()
            })
            .await;
        r.map(|r| r.into_inner().kvs).unwrap_or_default()
    }

    /// After an abandoned call of lease `id` on `prefix`: wait for its waiter key to go.
    async fn withdrawn(&mut self, prefix: &str, id: i64, held_before: bool) -> &'static str {
        let deadline = Instant::now() + WITHDRAWN_WITHIN;
        loop {
            let keys = self.keys_under(prefix).await;
            let mine = keys.iter().any(|kv| kv.lease == id);
            if !mine || held_before {
                return "withdrawn";
            }
            if Instant::now() >= deadline {
                return "its waiter key stayed";
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) async fn run_lock(&mut self, op: &LockOp) -> Shown {
        match op.clone() {
            LockOp::Lock { name, lease } => {
                let Some(&id) = self.leases.get(lease) else {
                    return "no lease".into();
                };
                let name = lock_name(name);
                let held_before = self.keys_under(&name).await.iter().any(|kv| kv.lease == id);
                let call = self.lock.lock(lpb::LockRequest {
                    name: name.clone().into_bytes(),
                    lease: id,
                });
                match tokio::time::timeout(WAIT, call).await {
                    Ok(Ok(r)) => {
                        let r = r.into_inner();
                        self.note(r.header.as_ref(), !held_before);
                        self.held.insert((name.clone(), lease), r.key.clone());
                        format!("locked {}", self.key_shown(&r.key))
                    }
                    Ok(Err(e)) if !timed_out(&e) => Self::err(&e),
                    _ => format!(
                        "lock timed out, {}",
                        self.withdrawn(&name, id, held_before).await
                    ),
                }
            }
            LockOp::Unlock { name, lease } => {
                let name = lock_name(name);
                let Some(key) = self.held.remove(&(name, lease)) else {
                    return "not locked here".into();
                };
                let before = self.count_under(&key).await;
                match self
                    .lock
                    .unlock(lpb::UnlockRequest { key: key.clone() })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        let after = self.count_under(&key).await;
                        self.note(r.header.as_ref(), after < before);
                        format!("unlocked {}", before - after)
                    }
                    Err(e) => Self::err(&e),
                }
            }
            LockOp::DeleteHolder { name } => {
                let name = lock_name(name);
                let Some(first) = self.keys_under(&name).await.into_iter().next() else {
                    return "no holder".into();
                };
                match self
                    .kv
                    .delete_range(epb::DeleteRangeRequest {
                        key: first.key.clone(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        self.note(r.header.as_ref(), r.deleted > 0);
                        format!("deleted holder {}", self.key_shown(&first.key))
                    }
                    Err(e) => Self::err(&e),
                }
            }
            LockOp::Keys { name } => {
                let keys = self.keys_under(&lock_name(name)).await;
                let shown: Vec<String> = keys.iter().map(|kv| self.lock_kv(kv)).collect();
                format!("keys {shown:?}")
            }
            LockOp::Campaign { name, lease, value } => {
                let Some(&id) = self.leases.get(lease) else {
                    return "no lease".into();
                };
                let name = election_name(name);
                let value = format!("v{value}").into_bytes();
                let mine = self
                    .keys_under(&name)
                    .await
                    .into_iter()
                    .find(|kv| kv.lease == id)
                    .map(|kv| kv.value);
                let held_before = mine.is_some();
                let call = self.election.campaign(elpb::CampaignRequest {
                    name: name.clone().into_bytes(),
                    lease: id,
                    value: value.clone(),
                });
                match tokio::time::timeout(WAIT, call).await {
                    Ok(Ok(r)) => {
                        let r = r.into_inner();
                        // A first campaign puts its key; campaigning again with another value
                        // proclaims it (etcd answers with the header from before that write,
                        // so the write is noted at the store's revision now).
                        let wrote = mine.as_ref() != Some(&value);
                        let now = self.current().await;
                        self.note(
                            Some(&epb::ResponseHeader {
                                revision: now,
                                ..Default::default()
                            }),
                            wrote,
                        );
                        let shown = r
                            .leader
                            .as_ref()
                            .map(|l| format!("{} c{}", self.key_shown(&l.key), self.ord(l.rev)));
                        if let Some(l) = r.leader {
                            self.leaders.insert((name, lease), l);
                        }
                        format!("leading {shown:?}")
                    }
                    Ok(Err(e)) if !timed_out(&e) => Self::err(&e),
                    _ => format!(
                        "campaign timed out, {}",
                        self.withdrawn(&name, id, held_before).await
                    ),
                }
            }
            LockOp::Proclaim { name, lease, value } => {
                let name = election_name(name);
                let Some(leader) = self.leaders.get(&(name, lease)).cloned() else {
                    return "not leading here".into();
                };
                match self
                    .election
                    .proclaim(elpb::ProclaimRequest {
                        leader: Some(leader),
                        value: format!("p{value}").into_bytes(),
                    })
                    .await
                {
                    Ok(r) => {
                        self.note(r.into_inner().header.as_ref(), true);
                        "proclaimed".into()
                    }
                    Err(e) => Self::err(&e),
                }
            }
            LockOp::Leader { name } => {
                match self
                    .election
                    .leader(elpb::LeaderRequest {
                        name: election_name(name).into_bytes(),
                    })
                    .await
                {
                    Ok(r) => {
                        let r = r.into_inner();
                        format!("leader {:?}", r.kv.as_ref().map(|kv| self.lock_kv(kv)))
                    }
                    Err(e) => Self::err(&e),
                }
            }
            LockOp::Resign { name, lease } => {
                let name = election_name(name);
                let Some(leader) = self.leaders.remove(&(name, lease)) else {
                    return "not leading here".into();
                };
                let before = self.count_under(&leader.key).await;
                match self
                    .election
                    .resign(elpb::ResignRequest {
                        leader: Some(leader.clone()),
                    })
                    .await
                {
                    Ok(r) => {
                        let after = self.count_under(&leader.key).await;
                        self.note(r.into_inner().header.as_ref(), after < before);
                        format!("resigned {}", before - after)
                    }
                    Err(e) => Self::err(&e),
                }
            }
        }
    }

    /// 1 if `key` exists, else 0.
    async fn count_under(&mut self, key: &[u8]) -> i64 {
        self.kv
            .range(epb::RangeRequest {
                key: key.to_vec(),
                count_only: true,
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner().count)
            .unwrap_or(-1)
    }
}
