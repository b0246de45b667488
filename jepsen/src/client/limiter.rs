//! The limiter workload's op: `CL.THROTTLE` (fenced) or the token-bucket Lua script with the
//! client's clock (Lua systems); see docs/jepsen.md, "limiter". Moved out of `client.rs`.

use std::time::Duration;

use serde_json::{json, Value};

use super::{redis_res, ClientError, ClientSpec, Recorder, Res};
use crate::system::System;

/// The limiter workload's policy, in redis-cell's terms: `max_burst` 5, 20 per 2 s (one every
/// 100 ms, bursts of up to 6). The Lua token bucket gets the same policy: capacity
/// `max_burst + 1`, refilled at `count / period`.
pub const LIMIT_KEY: &str = "rl";
pub const LIMIT_MAX_BURST: u64 = 5;
pub const LIMIT_COUNT: u64 = 20;
pub const LIMIT_PERIOD_S: u64 = 2;

/// The unchanged Spring Cloud Gateway token-bucket script (tests/resp/token_bucket.lua).
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../../tests/resp/token_bucket.lua");

/// This client's clock offset (ms) from its clock file (0 without one).
fn clock_offset_ms(spec: &ClientSpec) -> i64 {
    spec.clock_file
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

/// Wall-clock milliseconds since the Unix epoch (what a deployed client passes as "now").
pub(super) fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// How a limiter call ended. For fenced every transport error is `info` (the node forwards
/// and retries inside the cluster), as are `-TIMEOUT`/`-TRYAGAIN`; for Redis a refused
/// connection is a `fail` (the command never left). Other error replies (`ERR unknown
/// command`, `WRONGTYPE`, a script error) are definite: `fail`.
fn limiter_res<T>(
    system: System,
    r: Result<Result<T, redis::RedisError>, tokio::time::error::Elapsed>,
) -> Result<T, Res> {
    match r {
        Ok(Err(e))
            if system.is_fenced_cluster()
                && (e.is_connection_refusal()
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_timeout()) =>
        {
            Err(Res::Info(e.to_string()))
        }
        r => redis_res(r),
    }
}

/// One `throttle`: `CL.THROTTLE rl 5 20 2 1` (fenced), or the token-bucket script with
/// `now` = this client's wall clock + its nemesis offset, in ms (Lua systems). The script
/// takes "now" in whatever unit `rate` is per: ms here, rate = count / period per ms,
/// capacity = max_burst + 1. (Spring passes whole seconds; a bucket that refills in
/// one-second steps lets `rate` tokens through at each second boundary on top of the
/// capacity, an over-admission of its own that would drown what the faults do.)
pub(super) async fn limiter_op(
    spec: &ClientSpec,
    system: System,
    rec: &mut Recorder,
    c: &mut redis::aio::ConnectionManager,
    op_timeout: Duration,
) -> Result<(), ClientError> {
    let mut policy = json!({
        "max_burst": LIMIT_MAX_BURST,
        "count": LIMIT_COUNT,
        "period_s": LIMIT_PERIOD_S,
        "quantity": 1,
    });
    let res = if system.limiter_uses_lua() {
        let offset = clock_offset_ms(spec);
        // Stamp the invoke first: the client's "now" is read inside the op's interval.
        let mut inv = rec.ev("throttle").key(LIMIT_KEY);
        let now = wall_ms().saturating_add(offset);
        let rate = LIMIT_COUNT as f64 / (LIMIT_PERIOD_S * 1000) as f64;
        policy["now_ms"] = json!(now);
        policy["clock_offset_ms"] = json!(offset);
        inv.value = Some(policy);
        rec.invoke(inv.clone())?;
        let script = redis::Script::new(TOKEN_BUCKET_LUA);
        let r = tokio::time::timeout(
            op_timeout,
            script
                .key(format!("{LIMIT_KEY}.tokens"))
                .key(format!("{LIMIT_KEY}.ts"))
                .arg(rate.to_string())
                .arg(LIMIT_MAX_BURST + 1)
                .arg(now)
                .arg(1)
                .invoke_async::<Vec<i64>>(c),
        )
        .await;
        let res = match limiter_res(system, r) {
            Ok(v) if v.len() == 2 => Res::Ok(Some(json!(v)), None),
            Ok(v) => Res::Info(format!("unexpected reply {v:?}")),
            Err(r) => r,
        };
        (inv, res)
    } else {
        let inv = rec.ev("throttle").key(LIMIT_KEY).value(policy);
        rec.invoke(inv.clone())?;
        let r = tokio::time::timeout(
            op_timeout,
            redis::cmd("CL.THROTTLE")
                .arg(LIMIT_KEY)
                .arg(LIMIT_MAX_BURST)
                .arg(LIMIT_COUNT)
                .arg(LIMIT_PERIOD_S)
                .arg(1)
                .query_async::<Vec<i64>>(c),
        )
        .await;
        let res = match limiter_res(system, r) {
            Ok(v) if v.len() == 5 => Res::Ok(Some(json!(v)), None),
            Ok(v) => Res::Info(format!("unexpected reply {v:?}")),
            Err(r) => r,
        };
        (inv, res)
    };
    let (inv, res) = res;
    // Admitted: CL.THROTTLE's `limited` is 0; the script's `allowed_num` is 1.
    let admitted = match &res {
        Res::Ok(Some(Value::Array(v)), _) => {
            let first = v.first().and_then(Value::as_i64);
            Some(if system.limiter_uses_lua() {
                first == Some(1)
            } else {
                first == Some(0)
            })
        }
        _ => None,
    };
    rec.complete_admitted(&inv, &res, admitted)
}
