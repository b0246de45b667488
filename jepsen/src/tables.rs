//! Figures that `fenced-jepsen table` sums over a row's runs, per workload.

/// The watch workload's figures over a row's runs (from the watch verdicts).
#[derive(Default)]
pub struct WatchRow {
    /// lost, duplicate, reorder, any other kind.
    kinds: [u64; 4],
    acked: u64,
    delivered: u64,
    resumes: u64,
    compacted: (u64, u64),
    tail: u64,
}

impl WatchRow {
    pub fn add(&mut self, r: &serde_json::Value) {
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        for c in r["checkers"].as_array().into_iter().flatten() {
            if c["checker"] != "watch" {
                continue;
            }
            let st = &c["stats"];
            for (k, v) in st["anomalies_by_kind"].as_object().into_iter().flatten() {
                let i = ["lost", "duplicate", "reorder"]
                    .iter()
                    .position(|x| x == k)
                    .unwrap_or(3);
                self.kinds[i] += n(v);
            }
            self.acked += n(&st["acknowledged_puts_in_range"]);
            self.delivered += n(&st["revisions_delivered"]);
            self.tail += n(&st["tail_undelivered"]);
            for w in st["watchers"]
                .as_object()
                .into_iter()
                .flat_map(|m| m.values())
            {
                self.resumes += n(&w["created"]).saturating_sub(1);
                self.compacted.0 += n(&w["compacted_cancels"]);
            }
            self.compacted.1 += n(&st["compacted_cancels_explained"]);
        }
    }

    pub fn cells(&self) -> String {
        let [l, d, o, x] = self.kinds;
        format!(
            "{l} / {d} / {o} / {x} | {} | {} | {} | {} ({}) | {}",
            self.acked, self.delivered, self.resumes, self.compacted.0, self.compacted.1, self.tail
        )
    }
}
