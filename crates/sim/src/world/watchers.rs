//! The tasks that watch a running node: its leader changes into the trace, and its own stop
//! (`Node::fatal`) handled as `fenced serve` exits.

use std::cell::RefCell;
use std::rc::Rc;

use fenced_server::Node;

use super::{Cluster, RESTART_AFTER};
use crate::expiry::Leadership;
use crate::trace::Trace;

/// When node `id` stops itself (`Node::fatal`: a peer knows its member under another
/// incarnation, so it retired; or Raft stopped), stop it as `fenced serve` exits, and leave
/// it down. Expected for a wiped member; an anomaly (`restarts`) for any other.
pub(super) async fn watch_fatal(id: u64, node: Node, cluster: Cluster) {
    let why = node.fatal().await;
    drop(node);
    let why = why.replace(&*cluster.inner.root, "<data>");
    // An I/O error the simulated disk injected (EIO, ENOSPC): the process exits, as it
    // should, and the supervisor starts it again.
    let disk = why.contains("(os error 5)") || why.contains("(os error 28)");
    let what = match disk {
        true => format!("stops on a disk error: {why}; restarted in {RESTART_AFTER:?}"),
        false => format!("STOPPED ITSELF: {why}"),
    };
    cluster.inner.trace.line(&format!("n{id}"), what);
    // Not through `crash`, which aborts this task.
    let running = {
        let mut slots = cluster.inner.slots.borrow_mut();
        let Some(slot) = slots.get_mut(&id) else {
            return;
        };
        slot.fatal = None;
        if let Some(w) = slot.watcher.take() {
            w.abort();
        }
        slot.kill_io();
        slot.life.send_modify(|l| *l += 1);
        if !disk {
            if slot.wiped {
                slot.expected.push(format!("stopped itself: {why}"));
            } else {
                slot.refusals.push(format!("stopped itself: {why}"));
            }
            slot.stopped = Some(why);
        }
        slot.running.take()
    };
    cluster.inner.net.down(id);
    cluster.view_lost(id);
    if let Some(r) = running {
        r.crash().await;
    }
    if disk {
        cluster.lost_power_if_dead(id);
        tokio::time::sleep(RESTART_AFTER).await;
        cluster.start(id).await;
    }
}

/// Write node `id`'s view of the leader into the trace whenever it changes.
pub(super) async fn watch_leader(
    id: u64,
    mut metrics: tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    trace: Trace,
    views: Rc<RefCell<Leadership>>,
) {
    let mut seen = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.current_leader)
        };
        if seen != Some(now) {
            seen = Some(now);
            let (term, leader) = now;
            views
                .borrow_mut()
                .record(trace.now_ns(), id, Some((term, leader)));
            let who = leader.map_or("none".to_owned(), |l| format!("n{l}"));
            trace.line(&format!("n{id}"), format!("term {term}, leader {who}"));
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}
