//! How a run's options enter its trace (and so its fingerprint): the knobs added for the
//! WAL search (`--raft-max-payload`, `--uniform-writes`, the `holdback` fault) are left out
//! while they are at their defaults, so every run without them keeps the fingerprint it had
//! before they existed.

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
        let plain = shown(&o);
        assert!(!plain.contains("raft_max_payload") && !plain.contains("uniform_writes"));
        assert!(!plain.contains("holdback"));
        assert!(plain.contains("forward_max_items: None") && plain.ends_with("echo: false }"));
        o.cluster.raft_max_payload = Some(2);
        o.workload.uniform_writes = Some(17);
        o.faults.holdback = true;
        let set = shown(&o);
        assert!(
            set.contains("raft_max_payload: Some(2)") && set.contains("uniform_writes: Some(17)")
        );
        assert!(set.contains("flicker: false, holdback: true, membership"));
    }
}
