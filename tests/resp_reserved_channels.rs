//! Issue 49, "lock-loss events can be forged": only the server publishes on `fenced:*`
//! channels. On a 3-node cluster with an ACL file, `PUBLISH fenced:lost:owner:x …` is refused
//! for an administrator and for a user allowed every channel, directly and inside `MULTI`; a
//! script's `redis.call('PUBLISH', 'fenced:…')` reaches no subscriber; `SUBSCRIBE` and
//! `PSUBSCRIBE` on those channels still work, and subscribers on both nodes receive nothing
//! but the ordinary message sent after the forgeries.

mod support;

use support::{follower_of, Raw, TestCluster, LEADER_TIMEOUT, R};

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
user pub on >pubpw allkeys allchannels -@all +@pubsub +@connection +@transaction +eval
";

const RESERVED: &str =
    "ERR channels starting with 'fenced:' are reserved for the server's own events";

const FORGED: &str = r#"{"name":"lock:a","owner":"x","token":1,"session":0,"reason":"expired"}"#;

/// Subscribe `raw` to the owner channel by name, to `fenced:*` by pattern and to `news`.
fn subscribe(raw: &mut Raw) {
    raw.write(&["SUBSCRIBE", "fenced:lost:owner:x", "news"]);
    assert_eq!(
        raw.read(),
        R::Array(Some(vec![
            R::bulk("subscribe"),
            R::bulk("fenced:lost:owner:x"),
            R::Int(1)
        ]))
    );
    assert_eq!(
        raw.read(),
        R::Array(Some(vec![R::bulk("subscribe"), R::bulk("news"), R::Int(2)]))
    );
    assert_eq!(
        raw.send(&["PSUBSCRIBE", "fenced:*"]),
        R::Array(Some(vec![
            R::bulk("psubscribe"),
            R::bulk("fenced:*"),
            R::Int(3)
        ]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_lock_loss_events_are_refused() {
    let c = TestCluster::start_with("resp_reserved", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        (vec!["--acl-file".into(), path.display().to_string()], None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let (addr, leader_addr) = (c.resp_addr(node), c.resp_addr(leader));

    let mut near = Raw::login(&addr, "admin", "adminpw");
    subscribe(&mut near);
    let mut far = Raw::login(&leader_addr, "pub", "pubpw");
    subscribe(&mut far);

    let mut admin = Raw::login(&addr, "admin", "adminpw");
    let mut user = Raw::login(&addr, "pub", "pubpw");
    for (who, raw) in [("admin", &mut admin), ("pub", &mut user)] {
        for channel in [
            "fenced:lost:owner:x",
            "fenced:lost:session:68",
            "fenced:lost:lagged",
            "fenced:",
        ] {
            assert_eq!(
                raw.send(&["PUBLISH", channel, FORGED]),
                R::err(RESERVED),
                "{who}: PUBLISH {channel}"
            );
        }
        // Inside a transaction the refusal is at queue time, and EXEC aborts.
        assert_eq!(raw.send(&["MULTI"]), R::ok(), "{who}");
        assert_eq!(
            raw.send(&["PUBLISH", "fenced:lost:owner:x", FORGED]),
            R::err(RESERVED),
            "{who}: PUBLISH in MULTI"
        );
        assert_eq!(
            raw.send(&["EXEC"]),
            R::err("EXECABORT Transaction discarded because of previous errors."),
            "{who}"
        );
        // A script's PUBLISH is refused with the same error under Semantics::REQUEST_DIGESTS
        // (12); a cluster still stamping older rules applies it (Int), and no subscriber is
        // sent it either way.
        let r = raw.send(&[
            "EVAL",
            "return redis.call('PUBLISH', ARGV[1], ARGV[2])",
            "0",
            "fenced:lost:owner:x",
            FORGED,
        ]);
        assert!(
            matches!(&r, R::Int(_))
                || matches!(&r, R::Err(e) if e.contains("are reserved for the server's own events")),
            "{who}: EVAL: {r:?}"
        );
    }
    // Names that only look alike are ordinary channels.
    assert_eq!(
        admin.send(&["PUBLISH", "FENCED:lost:owner:x", "m"]),
        R::Int(0)
    );
    assert_eq!(admin.send(&["PUBLISH", "fenced", "m"]), R::Int(0));

    // The first message either subscriber gets is the one sent after every forgery (each
    // node delivers in log order).
    assert_eq!(admin.send(&["PUBLISH", "news", "after"]), R::Int(1));
    for (at, sub) in [("follower", &mut near), ("leader", &mut far)] {
        assert_eq!(
            sub.read(),
            R::push(&["message", "news", "after"]),
            "the subscriber on the {at} got something before the ordinary message"
        );
        assert_eq!(sub.send(&["PING"]), R::push(&["pong", ""]), "{at}");
    }
}
