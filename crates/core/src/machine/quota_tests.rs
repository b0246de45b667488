//! etcd's space quota and `NOSPACE` alarm, applied through the log ([`crate::etcd::Quota`]).

use super::etcd_tests::Log;
use super::StateMachine;
use crate::command::*;
use crate::etcd::{
    put_cost, DeleteRangeRequest, EtcdError, KeyRange, PutRequest, RangeRequest, RequestOp,
    TxnRequest, DEFAULT_QUOTA_BYTES, VERSION_OVERHEAD,
};
use crate::CoreError;

impl Log {
    /// A replica under the quota rules.
    fn quota() -> Log {
        Log {
            semantics: Semantics::QUOTA,
            ..Log::new()
        }
    }

    /// A put's response, refused or not.
    fn try_put(&mut self, key: &str, value: &str) -> Response {
        self.etcd(EtcdCommand::Put(PutRequest::new(key, value)))
    }

    fn value(&self, key: &str) -> Option<Vec<u8>> {
        let r = self
            .sm
            .etcd_range(&RangeRequest::new(KeyRange::key(key)))
            .expect("range");
        r.kvs.first().map(|kv| kv.value.clone())
    }
}

fn no_space(r: &Response) -> bool {
    matches!(r, Response::Rejected(CoreError::Etcd(EtcdError::NoSpace)))
}

fn ok(r: &Response) -> bool {
    matches!(r, Response::Etcd { .. })
}

/// Bytes one version of a key of 1 byte and a value of `len` counts for.
fn version(len: usize) -> u64 {
    1 + len as u64 + VERSION_OVERHEAD
}

#[test]
fn a_write_over_the_quota_is_refused_and_raises_the_alarm() {
    let mut log = Log::quota();
    assert_eq!(log.sm.etcd_quota().limit(), DEFAULT_QUOTA_BYTES);
    // Room for exactly three versions of 100-byte values.
    let quota = 3 * version(100);
    assert!(ok(&log.etcd(EtcdCommand::Quota { bytes: quota })));
    assert_eq!(log.sm.etcd_quota().limit(), quota);
    for v in ["1", "2", "3"] {
        assert!(ok(&log.try_put("k", &v.repeat(100))), "{v}");
    }
    assert_eq!(log.sm.etcd().history_bytes(), quota);
    let before = log.sm.revision();
    let r = log.try_put("k", &"4".repeat(100));
    assert!(no_space(&r), "{r:?}");
    assert_eq!(
        r,
        Response::Rejected(CoreError::Etcd(EtcdError::NoSpace)),
        "{r:?}"
    );
    assert_eq!(
        EtcdError::NoSpace.to_string(),
        "etcdserver: mvcc: database space exceeded"
    );
    // Nothing written; the command took its revision all the same; the alarm is raised.
    assert_eq!(log.value("k"), Some("3".repeat(100).into_bytes()));
    assert_eq!(log.sm.etcd().history_bytes(), quota);
    assert_eq!(log.sm.revision(), before + 1);
    assert!(log.sm.etcd_quota().nospace);
    // Under the alarm even a small put is refused.
    assert!(no_space(&log.try_put("x", "")));
}

#[test]
fn under_the_alarm_reads_deletes_and_compactions_are_served() {
    let mut log = Log::quota();
    log.etcd(EtcdCommand::Quota {
        bytes: 4 * version(100),
    });
    for v in ["1", "2", "3", "4"] {
        assert!(ok(&log.try_put(v, &v.repeat(100))));
    }
    assert!(no_space(&log.try_put("5", "5")));
    assert!(log.sm.etcd_quota().nospace);
    // A range.
    assert_eq!(log.value("1"), Some("1".repeat(100).into_bytes()));
    // A txn that may put is refused whichever branch it would take (etcd's rule).
    let txn = |success, failure| {
        EtcdCommand::Txn(TxnRequest {
            compare: vec![],
            success,
            failure,
        })
    };
    let put_op = RequestOp::Put(PutRequest::new("t", "v"));
    let del_op = |k: &str| {
        RequestOp::DeleteRange(DeleteRangeRequest {
            range: KeyRange::key(k),
            prev_kv: false,
        })
    };
    assert!(no_space(&log.etcd(txn(vec![del_op("1")], vec![put_op]))));
    assert_eq!(
        log.value("1"),
        Some("1".repeat(100).into_bytes()),
        "nothing done"
    );
    // A txn of deletes and ranges, and a delete, are served (tombstones grow the history).
    assert!(ok(&log.etcd(txn(
        vec![
            del_op("1"),
            RequestOp::Range(RangeRequest::new(KeyRange::key("2")))
        ],
        vec![]
    ))));
    assert_eq!(log.value("1"), None);
    assert!(ok(&log.etcd(EtcdCommand::DeleteRange(
        DeleteRangeRequest {
            range: KeyRange::key("2"),
            prev_kv: false,
        }
    ))));
    assert_eq!(log.value("2"), None);
    // A compaction.
    let bytes = log.sm.etcd().history_bytes();
    assert!(ok(&log.etcd(EtcdCommand::Compact {
        revision: log.sm.revision()
    })));
    assert!(log.sm.etcd().history_bytes() < bytes);
    // Still alarmed until disarmed.
    assert!(no_space(&log.try_put("5", "5")));
}

#[test]
fn a_disarm_after_compaction_lets_writes_in_and_a_disarm_without_one_does_not_last() {
    let mut log = Log::quota();
    log.etcd(EtcdCommand::Quota {
        bytes: 3 * version(100),
    });
    for v in ["1", "2", "3"] {
        log.try_put("k", &v.repeat(100));
    }
    assert!(no_space(&log.try_put("k", &"4".repeat(100))));
    // Disarmed without freeing anything: the next write over the quota raises it again.
    match log.etcd(EtcdCommand::Alarm { activate: false }) {
        Response::Etcd {
            reply: EtcdReply::Quota { before, after },
            ..
        } => {
            assert!(before.nospace);
            assert!(!after.nospace);
        }
        other => panic!("{other:?}"),
    }
    assert!(no_space(&log.try_put("k", &"4".repeat(100))));
    assert!(log.sm.etcd_quota().nospace);
    // Compact away the two superseded versions, then disarm: writes are served again.
    assert!(ok(&log.etcd(EtcdCommand::Compact {
        revision: log.sm.revision()
    })));
    assert_eq!(log.sm.etcd().history_bytes(), version(100));
    assert!(no_space(&log.try_put("k", "small")), "still alarmed");
    log.etcd(EtcdCommand::Alarm { activate: false });
    assert!(ok(&log.try_put("k", &"4".repeat(100))));
    assert_eq!(log.value("k"), Some("4".repeat(100).into_bytes()));
    // An administrator may raise it by hand too.
    log.etcd(EtcdCommand::Alarm { activate: true });
    assert!(no_space(&log.try_put("j", "1")));
}

#[test]
fn a_txn_costs_its_larger_branch() {
    let mut log = Log::quota();
    let big = PutRequest::new("a", "x".repeat(200));
    let small = PutRequest::new("b", "y");
    // Room for the small branch only.
    log.etcd(EtcdCommand::Quota {
        bytes: put_cost(&small) + 10,
    });
    let txn = EtcdCommand::Txn(TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Put(small.clone())],
        failure: vec![RequestOp::Txn(TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Put(big)],
            failure: vec![],
        })],
    });
    // The success branch would fit, but the failure branch's nested put would not.
    assert!(no_space(&log.etcd(txn)));
    log.etcd(EtcdCommand::Alarm { activate: false });
    assert!(ok(&log.etcd(EtcdCommand::Put(small))));
}

#[test]
fn entries_of_older_rules_are_not_judged_by_the_quota_and_know_no_quota_commands() {
    let mut log = Log::quota();
    log.semantics = Semantics::ETCD;
    let r = log.etcd(EtcdCommand::Quota { bytes: 10 });
    assert!(
        matches!(
            r,
            Response::Rejected(CoreError::NotUpgraded { needs: 4, .. })
        ),
        "{r:?}"
    );
    assert!(log.sm.etcd_quota().is_default());
    // Under rules 4 a quota of 10 bytes refuses every put; an entry of rules 3 (written
    // before the quota existed) applies as it did then.
    log.semantics = Semantics::QUOTA;
    log.etcd(EtcdCommand::Quota { bytes: 10 });
    assert!(no_space(&log.try_put("k", "v")));
    log.semantics = Semantics::ETCD;
    assert!(ok(&log.try_put("k", "v")));
    assert_eq!(log.value("k"), Some(b"v".to_vec()));
    assert_eq!(
        Semantics::needed_by(&Command::Etcd(EtcdCommand::Alarm { activate: false })),
        Semantics::QUOTA
    );
    assert_eq!(
        Semantics::needed_by(&Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v")))),
        Semantics::ETCD
    );
}

#[test]
fn two_replicas_refuse_the_same_writes_and_agree_byte_for_byte() {
    let mut a = Log::quota();
    let mut b = Log::quota();
    let mut script = vec![EtcdCommand::Quota { bytes: 2_000 }];
    for i in 0..40 {
        script.push(EtcdCommand::Put(PutRequest::new(
            format!("k{}", i % 5),
            "v".repeat(30 + i),
        )));
        if i == 25 {
            script.push(EtcdCommand::Compact { revision: 20 });
            script.push(EtcdCommand::Alarm { activate: false });
        }
    }
    let mut refused = 0;
    for cmd in script {
        let ra = a.etcd(cmd.clone());
        let rb = b.etcd(cmd);
        assert_eq!(ra, rb);
        refused += usize::from(no_space(&ra));
    }
    assert!(refused > 0, "the quota refused some");
    assert!(refused < 40, "and let some through after the disarm");
    assert_eq!(a.sm.to_bytes(), b.sm.to_bytes());
    assert_eq!(a.sm.digest(), b.sm.digest());
    assert_eq!(a.sm.body_version(), 3);
    // A replica that installs a snapshot agrees too.
    let restored = StateMachine::from_bytes(&a.sm.to_bytes()).expect("decodes");
    assert_eq!(restored, a.sm);
    assert_eq!(restored.etcd_quota(), a.sm.etcd_quota());
}

#[test]
fn the_default_quota_writes_no_body_3() {
    let mut log = Log::quota();
    log.try_put("k", "v");
    assert_eq!(log.sm.body_version(), 2);
    // Setting etcd's default explicitly is the default.
    log.etcd(EtcdCommand::Quota {
        bytes: DEFAULT_QUOTA_BYTES,
    });
    assert!(log.sm.etcd_quota().is_default());
    assert_eq!(log.sm.body_version(), 2);
    log.etcd(EtcdCommand::Quota { bytes: 1 << 20 });
    assert_eq!(log.sm.body_version(), 3);
    log.etcd(EtcdCommand::Quota { bytes: 0 });
    assert_eq!(log.sm.body_version(), 2);
}
