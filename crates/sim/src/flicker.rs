//! A flickering power supply: one node's machine loses power in the middle of its writes
//! ([`fenced_fs::SimFs::lose_power_at_sync`], at one of its next few syncs), comes back at once
//! or within 300 ms, and loses it again at one of the first syncs after it restarted — two to
//! four times in a row.
//!
//! A single mid-write power loss can leave a log whose last write reached the disk only in
//! part (a later page kept, an earlier one lost). What the restarted node writes next, over
//! that damage, is made durable by its first syncs; another power loss right then leaves the
//! disk as those first writes left it, and the next start reads it. Each power loss is one
//! the disk faults already have; only their spacing is new.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::world::Cluster;

/// One flickering power supply, over about `lasting` and the restarts it causes.
pub async fn one(cluster: Cluster, mut rng: StdRng, lasting: Duration) {
    let ids = cluster.ids();
    // Half the time a node that leads: its own entries, not yet sent to anyone, are what
    // its power loss cuts short.
    let leading = ids.iter().copied().find(|id| {
        cluster
            .node(*id)
            .is_some_and(|n| n.raft().metrics().borrow().current_leader == Some(*id))
    });
    let id = match leading {
        Some(l) if rng.gen_bool(0.5) => l,
        _ => *ids.choose(&mut rng).unwrap_or(&1),
    };
    let Some(fs) = cluster.fs(id) else {
        return;
    };
    if !cluster.is_up(id) || fs.power_due() || fs.is_dead() {
        return;
    }
    let times = rng.gen_range(2..=4);
    cluster
        .trace()
        .line("nemesis", format!("n{id}'s power flickers {times} times"));
    cycles(cluster, rng, id, times, lasting, false).await;
}

/// Node `id`'s power goes `times` times, the node restarted after each; with `armed`, the
/// first loss is already due (`holdback` armed it).
pub async fn cycles(
    cluster: Cluster,
    mut rng: StdRng,
    id: u64,
    times: u32,
    lasting: Duration,
    armed: bool,
) {
    let Some(fs) = cluster.fs(id) else {
        return;
    };
    for i in 0..times {
        // The first loss anywhere in the node's next writes; the later ones among the
        // first syncs after its restart.
        if i > 0 || !armed {
            let n = match i {
                0 => rng.gen_range(1..=30),
                _ => rng.gen_range(1..=6),
            };
            cluster.trace().line(
                "nemesis",
                format!("n{id} loses power at its sync #{n} from now"),
            );
            fs.lose_power_at_sync(n);
        }
        // Until the power went; the machine is back at once or within 300 ms (sooner than
        // the supervisor's restart of a process that exited). If the node stays quiet, the
        // loss stays due, as a disk fault's does.
        let until = tokio::time::Instant::now() + lasting + Duration::from_secs(3);
        loop {
            tokio::time::sleep(Duration::from_millis(1)).await;
            if !fs.power_due() && !fs.is_dead() && !cluster.is_up(id) {
                break;
            }
            if tokio::time::Instant::now() >= until {
                return;
            }
        }
        let back = match rng.gen_bool(0.5) {
            true => Duration::ZERO,
            false => Duration::from_millis(rng.gen_range(1..300)),
        };
        tokio::time::sleep(back).await;
        cluster.start(id).await;
    }
}
