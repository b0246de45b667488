//! Issue 39, item 1: determinism needs every member to run the same Lua build (struct sizes,
//! which the memory limit and the collector count; libm). Each member advertises its Lua
//! build fingerprint in the leader's check rounds; while one differs from the leader's, the
//! leader refuses scripts (everything else is served), and takes them again once the member
//! runs the same build. A 3-node cluster of real processes; the other build is the test hook
//! `--unsafe-test-advertise-lua-build` (needs `FENCED_UNSAFE_TEST_HOOKS=1`).

mod support;

use std::time::Duration;

use support::{follower_of, resp_try, wait_for, TestCluster, LEADER_TIMEOUT};

const READY: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_refused_while_a_member_runs_another_lua_build() {
    std::env::set_var("FENCED_UNSAFE_TEST_HOOKS", "1");
    let c = TestCluster::start("lua_build", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let f = follower_of(leader);
    let s = c.status_ok(leader).await;
    assert_ne!(s.lua_build, 0, "the leader advertises its Lua build");
    assert_eq!(c.status_ok(f).await.lua_build, s.lua_build, "one build");
    wait_for("a script runs", READY, || async {
        match resp_try(&c, leader, &["EVAL", "return 'ran'", "0"]).await {
            Ok(Some(v)) if v == "ran" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The follower comes back advertising another build.
    c.kill(f);
    c.restart_with(f, &["--unsafe-test-advertise-lua-build", "1"]);
    wait_for("the leader to see the other build", READY, || async {
        let s = c.status(leader).await?;
        if s.lua_build_differs == vec![f] {
            Ok(())
        } else {
            Err(format!("differs: {:?}", s.lua_build_differs))
        }
    })
    .await;
    for node in [leader, f] {
        let e = resp_try(&c, node, &["EVAL", "return 'ran'", "0"])
            .await
            .expect_err("a script is refused");
        assert!(
            e.contains("different Lua builds") && e.contains(&format!("member {f}")),
            "node {node}: {e}"
        );
    }
    // Everything else is served.
    assert_eq!(
        resp_try(&c, leader, &["SET", "k", "v"]).await,
        Ok(Some("OK".into()))
    );

    // The same build again: scripts run again.
    c.kill(f);
    c.restart(f);
    wait_for("scripts accepted again", READY, || async {
        match resp_try(&c, leader, &["EVAL", "return 'ran'", "0"]).await {
            Ok(Some(v)) if v == "ran" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(c.status_ok(leader).await.lua_build_differs.is_empty());
}
