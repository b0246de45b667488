//! The cluster-wide `CORRUPT` alarm in the replicated state ([`Semantics::CLUSTER_ALARM`],
//! issue 39 item 3): raised and cleared by a logged command, the first raise kept, refused
//! in older entries, carried by snapshot body 6 (and older bodies still load).

use super::etcd_tests::Log;
use super::StateMachine;
use crate::command::*;
use crate::CoreError;

fn alarm(index: u64) -> CorruptAlarm {
    CorruptAlarm {
        index,
        raised_by: 1,
        detail: format!("no majority at {index}"),
    }
}

fn one(log: &mut Log, cmd: Command) -> Response {
    log.apply(None, cmd).responses.pop().expect("one response")
}

#[test]
fn the_alarm_is_raised_once_kept_across_a_snapshot_and_cleared() {
    let mut log = Log::new();
    log.semantics = Semantics::CLUSTER_ALARM;
    one(&mut log, Command::OpenSession { ttl_ms: 60_000 });
    let plain = log.sm.body_version();
    assert!(plain < 6, "no alarm: the body earlier builds wrote");
    let raise = |i| Command::ClusterAlarm {
        raise: Some(alarm(i)),
    };
    assert_eq!(
        one(&mut log, raise(10)),
        Response::ClusterAlarm {
            before: None,
            after: Some(alarm(10)),
        }
    );
    // A second raise keeps the first.
    one(&mut log, raise(20));
    assert_eq!(log.sm.cluster_alarm(), Some(&alarm(10)));
    assert_eq!(log.sm.body_version(), 6);
    let back = StateMachine::from_bytes(&log.sm.to_bytes()).expect("decodes");
    assert_eq!(back, log.sm);
    assert_eq!(back.digest(), log.sm.digest());
    let mut body = Vec::new();
    log.sm
        .write_body(super::body::options(), &mut body)
        .expect("encodes");
    let read = StateMachine::read_body(6, super::body::options(), body.as_slice()).expect("v6");
    assert_eq!(read.cluster_alarm(), Some(&alarm(10)));
    // Disarmed: the body goes back to what it was.
    assert_eq!(
        one(&mut log, Command::ClusterAlarm { raise: None }),
        Response::ClusterAlarm {
            before: Some(alarm(10)),
            after: None,
        }
    );
    assert_eq!(log.sm.cluster_alarm(), None);
    assert_eq!(log.sm.body_version(), plain);
    log.sm.check_invariants().expect("invariants");
}

#[test]
fn older_entries_refuse_the_alarm() {
    let mut log = Log::new();
    log.semantics = Semantics::LUA_IDS;
    assert!(matches!(
        one(
            &mut log,
            Command::ClusterAlarm {
                raise: Some(alarm(1))
            }
        ),
        Response::Rejected(CoreError::NotUpgraded { needs: 10, .. })
    ));
    assert_eq!(log.sm.cluster_alarm(), None);
    assert_eq!(
        Semantics::needed_by(&Command::ClusterAlarm { raise: None }),
        Semantics::CLUSTER_ALARM
    );
}
