//! The probe: waits until the system (and the guard, the RESP endpoints, the limiter or the
//! etcd API, as the workload needs) answers before a run starts. Moved out of `client.rs`.

use std::time::Duration;

use super::limiter::{LIMIT_COUNT, LIMIT_KEY, LIMIT_MAX_BURST, LIMIT_PERIOD_S, TOKEN_BUCKET_LUA};
use super::{make_lock, system_of, wall_ms, ClientError, ClientSpec, Guard};
use crate::history::RunClock;
use crate::system::System;

/// Wait (bounded by `spec.deadline`, run time from `spec.run_start`) until the system, the
/// guard and (for `register`) the RESP endpoints answer. `Err` says what never came up.
pub async fn probe(spec: ClientSpec) -> Result<(), ClientError> {
    let clock = RunClock {
        start: spec.run_start,
    };
    let t = Duration::from_millis(spec.op_timeout_ms);
    let mut last = String::from("nothing checked yet");
    for _ in 0..100_000u32 {
        if clock.now() >= spec.deadline {
            return Err(ClientError::Other(format!("not ready: {last}")));
        }
        match probe_once(&spec, t).await {
            Ok(()) => return Ok(()),
            // No point waiting for a command this build does not have.
            Err(e) if e.contains("unknown command") || e.contains("not served here") => {
                return Err(ClientError::Other(format!("not ready: {e}")))
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(ClientError::Other(format!("not ready: {last}")))
}

async fn ping(addr: &str, t: Duration) -> Result<(), String> {
    let mut c = fenced_backends::redis::connect(addr, Some(t), t).map_err(|e| e.to_string())?;
    tokio::time::timeout(t, redis::cmd("PING").query_async::<String>(&mut c))
        .await
        .map_err(|_| format!("{addr}: PING timed out"))?
        .map_err(|e| format!("{addr}: {e}"))
        .map(|_| ())
}

async fn probe_once(spec: &ClientSpec, t: Duration) -> Result<(), String> {
    if !spec.guard.is_empty() {
        let mut g = Guard {
            addr: spec.guard.clone(),
            conn: None,
            timeout: t,
        };
        match g.request("PING").await {
            Ok(r) if r == "PONG" => {}
            Ok(r) => return Err(format!("guard answered {r:?}")),
            Err(e) => return Err(format!("guard: {e}")),
        }
    }
    let system = system_of(spec).map_err(|e| e.to_string())?;
    match system {
        System::Fenced | System::FencedEtcdLock | System::FencedEtcdMix => {
            // Every node up and agreeing on a leader.
            for ep in &spec.lock_endpoints {
                let c = fenced_client::Client::connect([ep]).map_err(|e| e.to_string())?;
                let s = tokio::time::timeout(t, c.status())
                    .await
                    .map_err(|_| format!("{ep}: status timed out"))?
                    .map_err(|e| format!("{ep}: {e}"))?;
                if s.leader == 0 {
                    return Err(format!("{ep}: no leader yet"));
                }
            }
            // And a write going through.
            let c =
                fenced_client::Client::connect(&spec.lock_endpoints).map_err(|e| e.to_string())?;
            tokio::time::timeout(
                t,
                c.acquire(
                    "probe",
                    "probe",
                    Duration::from_millis(1),
                    Duration::ZERO,
                    0,
                ),
            )
            .await
            .map_err(|_| "probe acquire timed out".to_owned())?
            .map_err(|e| format!("probe acquire: {e}"))?;
        }
        // Checked below, through etcd's API (kv and watch workloads).
        System::Etcd => {}
        System::EtcdLock | System::EtcdMix => {}
        s if s.is_fenced_resp() => {
            // Every node answers PING and takes a lock write (forwarded to the leader), with
            // the run's own client: RESP up, a leader known everywhere.
            for (i, ep) in spec.lock_endpoints.iter().enumerate() {
                ping(ep, t).await?;
                let l = make_lock(spec, i).map_err(|e| e.to_string())?;
                let key = format!("probe-{i}");
                tokio::time::timeout(t, l.acquire(&key, Duration::from_secs(1), Duration::ZERO))
                    .await
                    .map_err(|_| format!("{ep}: probe lock timed out"))?
                    .map_err(|e| format!("{ep}: probe lock: {e}"))?;
                if matches!(spec.workload.as_str(), "rwlock" | "semaphore") {
                    // A build without the lock family answers `unknown command`.
                    let mode = fenced_backends::LockMode::Read;
                    let key = format!("probe-read-{i}");
                    tokio::time::timeout(
                        t,
                        l.acquire_mode(&key, mode, Duration::from_secs(1), Duration::ZERO),
                    )
                    .await
                    .map_err(|_| format!("{ep}: probe read lock timed out"))?
                    .map_err(|e| format!("{ep}: probe read lock: {e}"))?;
                }
            }
        }
        _ => {
            for ep in &spec.lock_endpoints {
                ping(ep, t).await?;
            }
        }
    }
    if system.is_etcd_lock_service() {
        // Every node grants a lock through the Lock service (a build of fenced without it
        // answers UNIMPLEMENTED: "not served here").
        for (i, ep) in spec.lock_endpoints.iter().enumerate() {
            let l = make_lock(spec, i).map_err(|e| e.to_string())?;
            let key = format!("probe-{i}");
            let g =
                // A wait, not a try: the probe's lock is free, but a try's deadline (the
                // 200 ms grace) is shorter than a write on a loaded machine.
                tokio::time::timeout(t, l.acquire(&key, Duration::from_secs(2), Duration::from_secs(2)))
                    .await
                    .map_err(|_| format!("{ep}: probe Lock timed out"))?
                    .map_err(|e| format!("{ep}: probe Lock: {e}"))?
                    .ok_or_else(|| format!("{ep}: probe Lock not granted"))?;
            tokio::time::timeout(t, l.release(&g))
                .await
                .map_err(|_| format!("{ep}: probe Unlock timed out"))?
                .map_err(|e| format!("{ep}: probe Unlock: {e}"))?;
        }
    }
    if spec.workload == "kv" || spec.workload == "watch" {
        for ep in &spec.lock_endpoints {
            crate::etcd::probe(ep, spec.workload == "watch", t).await?;
        }
    }
    if spec.workload == "register" {
        for ep in &spec.resp_endpoints {
            ping(ep, t).await.map_err(|e| format!("RESP {e}"))?;
        }
    }
    if spec.workload == "limiter" {
        // Every node takes a limiter call (a write, forwarded to the leader) on a key of its
        // own: CL.THROTTLE exists, or the script runs.
        for (i, ep) in spec.resp_endpoints.iter().enumerate() {
            let mut c =
                fenced_backends::redis::connect(ep, Some(t), t).map_err(|e| e.to_string())?;
            let key = format!("probe-{LIMIT_KEY}-{i}");
            let r = if system.limiter_uses_lua() {
                tokio::time::timeout(
                    t,
                    redis::Script::new(TOKEN_BUCKET_LUA)
                        .key(format!("{key}.tokens"))
                        .key(format!("{key}.ts"))
                        .arg(1)
                        .arg(1)
                        .arg(wall_ms())
                        .arg(1)
                        .invoke_async::<Vec<i64>>(&mut c),
                )
                .await
            } else {
                tokio::time::timeout(
                    t,
                    redis::cmd("CL.THROTTLE")
                        .arg(&key)
                        .arg(LIMIT_MAX_BURST)
                        .arg(LIMIT_COUNT)
                        .arg(LIMIT_PERIOD_S)
                        .arg(1)
                        .query_async::<Vec<i64>>(&mut c),
                )
                .await
            };
            match r {
                Err(_) => return Err(format!("{ep}: limiter probe timed out")),
                Ok(Err(e)) => return Err(format!("{ep}: limiter probe: {e}")),
                Ok(Ok(v)) if v.len() == 5 || (v.len() == 2 && system.limiter_uses_lua()) => {}
                Ok(Ok(v)) => return Err(format!("{ep}: limiter probe: unexpected reply {v:?}")),
            }
        }
    }
    Ok(())
}
