//! How a run's options enter its trace (and so its fingerprint): the knobs added for the
//! WAL search (`--raft-max-payload`, `--uniform-writes`, the `holdback` fault) are left out
//! while they are at their defaults, and the disk mode while it is the one every earlier
//! seed ran in (`--disk-io inline`), so every run without them keeps the fingerprint it had
//! before they existed.

use crate::world::DiskIo;
use crate::Options;

/// `opts` as the trace's first line shows them.
pub fn shown(opts: &Options) -> String {
    let mut s = format!("{opts:?}");
    if opts.cluster.raft_max_payload.is_none() {
        s = s.replacen(", raft_max_payload: None", "", 1);
    }
    if opts.workload.uniform_writes.is_none() {
        s = s.replacen(", uniform_writes: None", "", 1);
    }
    if opts.cluster.disk_io == DiskIo::Inline {
        s = s.replacen(", disk_io: Inline", "", 1);
    }
    if !opts.faults.holdback {
        s = s.replacen(", holdback: false", "", 1);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_knobs_are_not_shown_and_set_ones_are() {
        let mut o = Options::default();
        o.cluster.disk_io = DiskIo::Inline;
        let plain = shown(&o);
        assert!(!plain.contains("raft_max_payload") && !plain.contains("uniform_writes"));
        assert!(!plain.contains("holdback") && !plain.contains("disk_io"));
        assert!(plain.contains("forward_max_items: None") && plain.ends_with("echo: false }"));
        o.cluster.raft_max_payload = Some(2);
        o.workload.uniform_writes = Some(17);
        o.faults.holdback = true;
        o.cluster.disk_io = DiskIo::Tasks;
        let set = shown(&o);
        assert!(set.contains("raft_max_payload: Some(2), disk_io: Tasks }"));
        assert!(
            set.contains("raft_max_payload: Some(2)") && set.contains("uniform_writes: Some(17)")
        );
        assert!(set.contains("flicker: false, holdback: true, membership"));
    }
}
