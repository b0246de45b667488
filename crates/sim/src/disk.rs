//! Disk faults ([`fenced_fs::SimFs`], one simulated disk per node): power losses (one node's,
//! every node's at once, or one that lands in the middle of a node's writes), `fsync`
//! failures, a full disk, and a rotten byte.
//!
//! What each must leave:
//! * **A power loss** keeps only what each node synced (plus any subset of its dirty pages,
//!   torn or not). Every acknowledged write was synced on a majority first, so none may be
//!   lost — even when every node loses power at once — and no node may refuse its own dir.
//!   With `--disk-io inline` (a write and its sync in one call) a power loss between two
//!   tasks finds nothing unsynced; with the disk as tasks it can fall within a sync's drawn
//!   latency. [`fenced_fs::SimFs::lose_power_at_sync`] lands one between a write and its sync (the node sees `EIO`, exits, and the machine
//!   restarts without what was not synced).
//! * **`fsync` failures and a full disk** stop a node's writes: its Raft stops on the storage
//!   error and the process exits ("fatal"), as `fenced serve` does; the simulated supervisor
//!   restarts it. Linux forgets pages whose `fsync` failed, so the restarted node may read
//!   bytes that a later power loss takes away: nothing it acknowledged may depend on them.
//! * **A rotten byte** in a synced file of a stopped node: the node must either start and
//!   agree with the others (the byte was in space nothing reads, or in a tail it may cut), or
//!   refuse its dir as damaged. A refusal is then expected, and the node stays down (its
//!   re-seeding is an operator's job, outside the run); serving wrong data is what the
//!   agreement and history checkers catch.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::world::Cluster;

/// One disk fault, lasting `lasting` where it lasts.
pub async fn one(cluster: Cluster, mut rng: StdRng, lasting: Duration) {
    let ids = cluster.ids();
    let trace = cluster.trace().clone();
    let id = *ids.choose(&mut rng).unwrap_or(&1);
    match rng.gen_range(0..12) {
        // The power goes at one of the node's next syncs, in the middle of its writes.
        10..=11 => {
            let Some(fs) = cluster.fs(id) else {
                return;
            };
            let n = rng.gen_range(1..=30);
            trace.line(
                "nemesis",
                format!("n{id} loses power at its sync #{n} from now"),
            );
            fs.lose_power_at_sync(n);
        }
        // One node loses power, back after a while.
        0..=3 => {
            if !cluster.is_up(id) {
                return;
            }
            cluster.power_loss(id).await;
            tokio::time::sleep(rng.gen_range(Duration::ZERO..=lasting)).await;
            cluster.start(id).await;
        }
        // Every node loses power at once.
        4 => {
            trace.line("nemesis", "every node loses power");
            for id in ids.iter().copied() {
                if cluster.is_up(id) {
                    cluster.power_loss(id).await;
                }
            }
            tokio::time::sleep(rng.gen_range(Duration::ZERO..=lasting)).await;
            for id in ids {
                cluster.start(id).await;
            }
        }
        // fsync fails, sometimes or always, for a while.
        5..=6 => {
            let Some(fs) = cluster.fs(id) else {
                return;
            };
            let p = *[0.05, 0.3, 1.0].choose(&mut rng).unwrap_or(&1.0);
            trace.line(
                "nemesis",
                format!("n{id} fsync fails with probability {p} for {lasting:?}"),
            );
            fs.change_faults(|f| f.fsync_error = p);
            tokio::time::sleep(lasting).await;
            fs.change_faults(|f| f.fsync_error = 0.0);
            trace.line("nemesis", format!("n{id} fsync works again"));
        }
        // The disk is full for a while.
        7..=8 => {
            let Some(fs) = cluster.fs(id) else {
                return;
            };
            trace.line("nemesis", format!("n{id} disk full for {lasting:?}"));
            fs.change_faults(|f| f.full = true);
            tokio::time::sleep(lasting).await;
            fs.change_faults(|f| f.full = false);
            trace.line("nemesis", format!("n{id} disk has room again"));
        }
        // A byte rots while the node is stopped — in one member at most, none while another
        // lost its data, and none while the operator changes the membership (a cluster of
        // two voters on the way has no member to spare): a node that refuses its rotten dir
        // stays down, and the rest must keep a majority.
        _ => {
            let full = cluster.ids().len() as u64 >= cluster.spec().nodes;
            if !cluster.is_up(id)
                || !cluster.damaged().is_empty()
                || cluster.operator().busy()
                || !full
            {
                return;
            }
            cluster.crash(id).await;
            cluster.rot(id);
            tokio::time::sleep(rng.gen_range(Duration::ZERO..=lasting)).await;
            cluster.start(id).await;
        }
    }
}

/// End the disk faults that last: every disk works and has room; a power loss still due
/// happens now, and one whose disk died is applied.
pub async fn heal(cluster: &Cluster) {
    for id in cluster.all_ids() {
        let Some(fs) = cluster.fs(id) else {
            continue;
        };
        fs.change_faults(|f| {
            f.fsync_error = 0.0;
            f.full = false;
        });
        if fs.is_dead() || fs.power_due() {
            cluster.power_loss(id).await;
        }
    }
}
