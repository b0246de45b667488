//! `--uniform-writes [BYTES]`: clients that only write registers, each write a
//! `SET k<i> <value>` of one size — a one-digit key and a value of `BYTES` bytes — so that
//! every client entry of one request has the same length in the log (a request's other
//! fields, its log time and request id, are fixed-width integers in the log's encoding).
//!
//! This is for the WAL's zero-length recovery bug (fixed in ffb7a18, docs/simulation.md
//! "Through the disk"): records that reached the disk after a lost one came back once a new
//! leader's entries, written over the lost ones, ended exactly where one of the stale records
//! began. With entries of one size, a new leader's entries line up with the lost ones byte
//! for byte; with large values, a follower's append of a few entries spans pages, the state
//! a power loss must leave (an earlier page lost, a later one kept). The writes are still
//! `put`s of the history (`linearizability` judges them).

use serde_json::json;

use super::Client;

/// A uniform write's value starts `<process>-<seq>`, zero-padded to this many digits each.
const PROCESS_DIGITS: usize = 6;
const SEQ_DIGITS: usize = 10;
/// The shortest value: the two numbers and their dash.
pub const MIN_VALUE_BYTES: usize = PROCESS_DIGITS + 1 + SEQ_DIGITS;

/// The value a uniform write of `process`'s request `seq` writes: `bytes` long (at least
/// [`MIN_VALUE_BYTES`]), unique per process and request.
pub fn value(process: u64, seq: u64, bytes: usize) -> String {
    let mut v = format!("{process:0PROCESS_DIGITS$}-{seq:0SEQ_DIGITS$}");
    let pad = bytes.saturating_sub(v.len());
    v.extend(std::iter::repeat_n('.', pad));
    v
}

impl Client {
    /// One `SET` of a register, as long as every other.
    pub(super) async fn uniform_put(&mut self, bytes: usize) {
        use rand::Rng;
        // One digit: at most 10 keys.
        let key = format!(
            "k{}",
            self.rng.gen_range(0..self.shared.spec.keys.clamp(1, 10))
        );
        let value = value(self.process, self.seq + 1, bytes);
        let argv = vec![
            b"SET".to_vec(),
            key.clone().into_bytes(),
            value.clone().into_bytes(),
        ];
        self.write("put", &key, json!(value), argv).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::kv::KvCommand;
    use fenced_core::{Command, Request, RequestId};

    /// A request of a uniform write as the log encodes it (bincode, as the storage does).
    fn encoded(process: u64, seq: u64, key: u64, time_ms: u64, bytes: usize) -> usize {
        let argv = vec![
            b"SET".to_vec(),
            format!("k{key}").into_bytes(),
            value(process, seq, bytes).into_bytes(),
        ];
        let req = Request {
            time_ms,
            client: Some(RequestId {
                client_id: 1_000_000 + process,
                seq,
            }),
            cmd: Command::Kv(KvCommand::Batch(vec![argv])),
        };
        bincode::serialize(&req).expect("encode").len()
    }

    #[test]
    fn every_uniform_write_encodes_to_one_length() {
        for bytes in [MIN_VALUE_BYTES, 700] {
            let lens: Vec<usize> = [
                (0, 1, 0, 0),
                (7, 99, 2, 1_700_000_000_000),
                (123_456, 9_999_999_999, 9, u64::MAX),
            ]
            .iter()
            .map(|(p, s, k, t)| encoded(*p, *s, *k, *t, bytes))
            .collect();
            assert!(lens.iter().all(|l| *l == lens[0]), "{lens:?}");
        }
        assert_eq!(value(3, 12, 0), "000003-0000000012");
        assert_eq!(value(3, 12, 20), "000003-0000000012...");
    }
}
