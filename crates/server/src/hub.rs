//! Delivers state machine events to the requests waiting for them.
//!
//! A waiting acquire registers its request id *before* it is proposed; every replica applies
//! every entry, so the registration sees the grant (or give-up) whichever node it is on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fenced_core::kv::KvEvent;
use fenced_core::{Event, RequestId};
use tokio::sync::{broadcast, oneshot, watch};

/// Events (keyspace events, ended grants) buffered per subscriber before it counts as lagging
/// (and loses some; a lagging lock-loss watcher tells its client).
const EVENT_BUFFER: usize = 4096;

/// The registrations waiting for one request id's resolution, each under its own key.
type Waiters = HashMap<RequestId, Vec<(u64, oneshot::Sender<Event>)>>;

#[derive(Clone)]
pub struct Hub {
    /// Several registrations may wait for one request id on one node (a client's retry
    /// arrives while its first call still waits): each gets the event, and each drop
    /// removes only its own.
    waiters: Arc<Mutex<(u64, Waiters)>>,
    /// Keyspace events (pub/sub messages, list pushes) for the RESP front end of this node.
    kv: broadcast::Sender<KvEvent>,
    /// Ended grants (`Event::LockReleased`), for lock-loss watchers.
    released: broadcast::Sender<Event>,
    /// The revision of the last etcd keyspace change applied on this node
    /// (`Event::EtcdChanged`): etcd watches wake on it and read the changes from the
    /// keyspace's history, so they never miss one however many wake-ups coalesce.
    etcd: watch::Sender<u64>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            waiters: Arc::default(),
            kv: broadcast::channel(EVENT_BUFFER).0,
            released: broadcast::channel(EVENT_BUFFER).0,
            etcd: watch::Sender::new(0),
        }
    }
}

/// Receives the resolution of one queued acquire; unregisters (itself only) on drop.
pub struct Registration {
    hub: Hub,
    rid: RequestId,
    key: u64,
    rx: oneshot::Receiver<Event>,
    /// The channel completed (a receiver must not be polled again).
    done: bool,
}

impl Registration {
    /// The event that resolves the wait; `None` if it does not come within `limit` (or came
    /// already: a wait is resolved once).
    pub async fn wait(&mut self, limit: std::time::Duration) -> Option<Event> {
        if self.done {
            tokio::time::sleep(limit).await;
            return None;
        }
        let got = tokio::time::timeout(limit, &mut self.rx).await.ok()?;
        self.done = true;
        got.ok()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut guard = self.hub.lock();
        let waiters = &mut guard.1;
        if let Some(regs) = waiters.get_mut(&self.rid) {
            regs.retain(|(key, _)| *key != self.key);
            if regs.is_empty() {
                waiters.remove(&self.rid);
            }
        }
    }
}

impl Hub {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, Waiters)> {
        self.waiters.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keyspace events applied on this node from now on.
    pub fn kv_events(&self) -> broadcast::Receiver<KvEvent> {
        self.kv.subscribe()
    }

    /// Every `Event::LockReleased` applied on this node from now on.
    pub fn watch_released(&self) -> broadcast::Receiver<Event> {
        self.released.subscribe()
    }

    /// Wakes whenever the etcd keyspace changed on this node (its value: the revision of the
    /// last change; a wake-up, not a feed).
    pub fn etcd_changes(&self) -> watch::Receiver<u64> {
        self.etcd.subscribe()
    }

    pub fn register(&self, rid: RequestId) -> Registration {
        let (tx, rx) = oneshot::channel();
        let key = {
            let mut guard = self.lock();
            guard.0 += 1;
            let key = guard.0;
            guard.1.entry(rid).or_default().push((key, tx));
            key
        };
        Registration {
            hub: self.clone(),
            rid,
            key,
            rx,
            done: false,
        }
    }

    /// Called by the state machine after applying an entry.
    pub fn deliver(&self, events: &[Event]) {
        for e in events {
            let rid = match e {
                Event::WaiterGranted { request, .. } | Event::WaiterGaveUp { request, .. } => {
                    request
                }
                Event::Kv(kv) => {
                    // No receiver is fine: nobody subscribed or blocked on this node.
                    let _ = self.kv.send(kv.clone());
                    continue;
                }
                Event::LockReleased { .. } => {
                    // No watcher is fine.
                    let _ = self.released.send(e.clone());
                    continue;
                }
                Event::EtcdChanged { revision } => {
                    self.etcd.send_replace(*revision);
                    continue;
                }
            };
            let regs = self.lock().1.remove(rid).unwrap_or_default();
            for (_, tx) in regs {
                // A registration whose wait ended meanwhile is fine.
                let _ = tx.send(e.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn granted(rid: RequestId) -> Event {
        Event::WaiterGranted {
            name: "l".into(),
            request: rid,
            token: 7,
            deadline_ms: None,
        }
    }

    #[tokio::test]
    async fn two_registrations_of_one_request_id_each_get_the_event() {
        let hub = Hub::new();
        let rid = RequestId {
            client_id: 1,
            seq: 1,
        };
        let first = hub.register(rid);
        let mut second = hub.register(rid);
        // The first wait ends (its caller gave up) before the grant is applied.
        drop(first);
        hub.deliver(&[granted(rid)]);
        assert!(
            second.wait(Duration::from_millis(100)).await.is_some(),
            "the second registration missed the grant after the first one was dropped"
        );
        assert!(
            hub.lock().1.is_empty(),
            "a delivered registration stayed behind"
        );
    }

    #[tokio::test]
    async fn every_registration_of_a_request_id_gets_the_event_and_drops_only_itself() {
        let hub = Hub::new();
        let rid = RequestId {
            client_id: 1,
            seq: 2,
        };
        let other = RequestId {
            client_id: 1,
            seq: 3,
        };
        let mut a = hub.register(rid);
        let mut b = hub.register(rid);
        let c = hub.register(other);
        drop(c);
        assert_eq!(hub.lock().1.get(&rid).map(Vec::len), Some(2));
        assert!(!hub.lock().1.contains_key(&other));
        hub.deliver(&[granted(rid)]);
        assert!(a.wait(Duration::from_millis(100)).await.is_some());
        assert!(b.wait(Duration::from_millis(100)).await.is_some());
        drop((a, b));
        assert!(hub.lock().1.is_empty());
    }
}
