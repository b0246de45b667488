//! RESP connections (redis-rs) to a cluster's nodes.

use std::time::Duration;

use super::cluster::TestCluster;
use super::wait::{wait_for, within};

/// Bound for one RESP connection attempt loop or one command in the RESP tests.
pub const RESP_STEP: Duration = Duration::from_secs(20);

/// A redis-rs connection to node `id`'s RESP port, as `auth` = (user, password) if given.
pub async fn resp_connect_with(
    c: &TestCluster,
    id: u64,
    auth: Option<(&str, &str)>,
) -> redis::aio::MultiplexedConnection {
    let userinfo = auth.map_or(String::new(), |(u, p)| format!("{u}:{p}@"));
    let url = format!("redis://{userinfo}{}/", c.resp_addr(id));
    let client = redis::Client::open(url).expect("redis url");
    // redis-rs gives up on a reply after 500 ms by default; a write during an election, or
    // while 15 test nodes share 2 cores and a disk, can take longer. Hangs are still caught by
    // RESP_STEP.
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(RESP_STEP));
    let who = auth.map_or(String::new(), |(u, _)| format!(" as {u}"));
    wait_for(
        &format!("RESP connection to node {id}{who}"),
        RESP_STEP,
        || async {
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await
}

/// [`resp_connect_with`] as the default user.
pub async fn resp_connect(c: &TestCluster, id: u64) -> redis::aio::MultiplexedConnection {
    resp_connect_with(c, id, None).await
}

/// Run one command (bounded by [`RESP_STEP`]); panics on an error reply.
pub async fn resp_cmd<T: redis::FromRedisValue>(
    con: &mut redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    within(&format!("{args:?}"), RESP_STEP, c.query_async::<T>(con))
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Run one command (bounded by [`RESP_STEP`]) that must fail; its error's text.
pub async fn resp_cmd_err(con: &mut redis::aio::MultiplexedConnection, args: &[&str]) -> String {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    match within(
        &format!("{args:?}"),
        RESP_STEP,
        c.query_async::<redis::Value>(con),
    )
    .await
    {
        Ok(v) => panic!("{args:?}: expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// One command on node `id` as the default user, bounded by [`RESP_STEP`]: its reply (a
/// bulk string or nil), or the error text — for tests that expect refusals too.
pub async fn resp_try(c: &TestCluster, id: u64, args: &[&str]) -> Result<Option<String>, String> {
    let mut con = resp_connect(c, id).await;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    match tokio::time::timeout(RESP_STEP, cmd.query_async::<Option<String>>(&mut con)).await {
        Err(_) => Err(format!("{args:?} on node {id}: no answer in {RESP_STEP:?}")),
        Ok(r) => r.map_err(|e| e.to_string()),
    }
}
