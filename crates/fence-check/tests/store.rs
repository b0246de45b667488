//! The fence store refuses older tokens, atomically, durably.

use fenced_fence_check::{FenceStore, GuardError};

#[test]
fn older_tokens_are_refused_and_data_survives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = FenceStore::open(dir.path()).expect("open");
    s.put("acct", b"100", 33).expect("first write");
    s.put("acct", b"110", 33).expect("same holder writes again");
    s.put("acct", b"120", 34).expect("newer holder");
    match s.put("acct", b"999", 33) {
        Err(GuardError::Stale {
            presented, highest, ..
        }) => assert_eq!((presented, highest), (33, 34)),
        other => panic!("stale write accepted: {other:?}"),
    }
    assert_eq!(s.get("acct").expect("get"), Some((b"120".to_vec(), 34)));
    drop(s);
    let s = FenceStore::open(dir.path()).expect("reopen");
    assert_eq!(s.get("acct").expect("get"), Some((b"120".to_vec(), 34)));
    assert!(matches!(
        s.put("acct", b"x", 20),
        Err(GuardError::Stale { .. })
    ));
}

#[test]
fn check_and_advance_is_monotonic_under_concurrency() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = FenceStore::open(dir.path()).expect("open");
    let accepted = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let s = &s;
            let accepted = &accepted;
            scope.spawn(move || {
                for i in 0..50u64 {
                    let token = (i * 7 + t * 13) % 97 + 1;
                    if let Ok(prev) = s.check_and_advance("r", token) {
                        accepted.lock().expect("lock").push((prev, token));
                    }
                }
            });
        }
    });
    // Every accepted token was at least the mark it replaced.
    for (prev, token) in accepted.into_inner().expect("lock") {
        assert!(
            prev.is_none_or(|p| token >= p),
            "accepted {token} after {prev:?}"
        );
    }
    assert_eq!(s.highest("r").expect("highest"), Some(97));
}
