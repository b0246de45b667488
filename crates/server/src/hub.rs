//! Delivers state machine events to the requests waiting for them.
//!
//! A waiting acquire registers its request id *before* it is proposed; every replica applies
//! every entry, so the registration sees the grant (or give-up) whichever node it is on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fenced_core::kv::KvEvent;
use fenced_core::{Event, RequestId};
use tokio::sync::{broadcast, oneshot};

/// Events (keyspace events, ended grants) buffered per subscriber before it counts as lagging
/// (and loses some; a lagging lock-loss watcher tells its client).
const EVENT_BUFFER: usize = 4096;

#[derive(Clone)]
pub struct Hub {
    waiters: Arc<Mutex<HashMap<RequestId, oneshot::Sender<Event>>>>,
    /// Keyspace events (pub/sub messages, list pushes) for the RESP front end of this node.
    kv: broadcast::Sender<KvEvent>,
    /// Ended grants (`Event::LockReleased`), for lock-loss watchers.
    released: broadcast::Sender<Event>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            waiters: Arc::default(),
            kv: broadcast::channel(EVENT_BUFFER).0,
            released: broadcast::channel(EVENT_BUFFER).0,
        }
    }
}

/// Receives the resolution of one queued acquire; unregisters on drop.
pub struct Registration {
    hub: Hub,
    rid: RequestId,
    rx: oneshot::Receiver<Event>,
}

impl Registration {
    /// The event that resolves the wait; `None` if it does not come within `limit`.
    pub async fn wait(&mut self, limit: std::time::Duration) -> Option<Event> {
        tokio::time::timeout(limit, &mut self.rx).await.ok()?.ok()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.lock().remove(&self.rid);
    }
}

impl Hub {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, oneshot::Sender<Event>>> {
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

    pub fn register(&self, rid: RequestId) -> Registration {
        let (tx, rx) = oneshot::channel();
        self.lock().insert(rid, tx);
        Registration {
            hub: self.clone(),
            rid,
            rx,
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
            };
            let tx = self.lock().remove(rid);
            if let Some(tx) = tx {
                let _ = tx.send(e.clone());
            }
        }
    }
}
