//! How each process of a run is started: the fenced and Redis server nodes, the clients,
//! the probe and final-read helpers (moved out of `run.rs`, unchanged).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{
    interrupted, Layout, TestOpts, ETCD_PEER_PORT, ETCD_PORT, GRPC_PORT, REDIS_PORT, RESP_PORT,
};
use crate::client::ClientSpec;
use crate::env::{Env, Spec};

/// The wall-clock shim for redis-server (see `shim/clockshim.c` for why not libfaketime),
/// compiled with the system C compiler into `out`. `None` if there is no compiler.
pub(super) fn clock_shim(out: &Path) -> Option<PathBuf> {
    let src = out.join("clockshim.c");
    let lib = out.join("clockshim.so");
    std::fs::write(&src, include_str!("../shim/clockshim.c")).ok()?;
    let ok = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .stdin(std::process::Stdio::null())
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    ok.then_some(lib)
}

/// `name` in `bin_dir`, else on PATH.
pub fn find_program(name: &str, bin_dir: &Path) -> anyhow::Result<PathBuf> {
    let p = bin_dir.join(name);
    if p.exists() {
        return Ok(p);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&paths) {
            let c = d.join(name);
            if c.exists() {
                return Ok(c);
            }
        }
    }
    bail!(
        "{name} not found in {} or PATH (build it: cargo build -p fenced-server -p fenced-fence-check)",
        bin_dir.display()
    )
}

/// `fenced serve` for member `id` at `ip` (the harness's ports) of `cluster`
/// (`ID=IP:PORT` each), with `--initial-cluster-state new` — also on restarts (restart-empty
/// included): a wiped node must still not vote.
pub fn fenced_serve_args(id: usize, data_dir: &Path, ip: &str, cluster: &[String]) -> Vec<String> {
    let mut args = fenced_node_args(id, data_dir, ip);
    args.extend([
        "--initial-cluster".into(),
        cluster.join(","),
        "--initial-cluster-state".into(),
        "new".into(),
    ]);
    args
}

/// `fenced serve` flags every node gets: its id, data dir and addresses.
fn fenced_node_args(id: usize, data_dir: &Path, ip: &str) -> Vec<String> {
    vec![
        "serve".into(),
        "--id".into(),
        id.to_string(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--grpc-addr".into(),
        format!("{ip}:{GRPC_PORT}"),
        "--resp-addr".into(),
        format!("{ip}:{RESP_PORT}"),
    ]
}

/// `fenced serve` for a member added while the cluster runs (membership nemesis): an empty
/// data dir and `--join` through the `join` gRPC endpoints, no `--initial-cluster`.
pub fn fenced_join_args(id: usize, data_dir: &Path, ip: &str, join: &[String]) -> Vec<String> {
    let mut args = fenced_node_args(id, data_dir, ip);
    args.extend(["--join".into(), join.join(",")]);
    args
}

/// How to start server `l.nodes[i]`. For a fenced node beyond the initial members, `join`
/// names the members it joins through.
pub(crate) fn node_spec(
    o: &TestOpts,
    l: &Layout,
    env: &Env,
    i: usize,
    join: &[String],
) -> anyhow::Result<Spec> {
    let name = &l.nodes[i];
    let ip = env.host(name)?.ip.clone();
    let clock = l.clock_dir.join(name).display().to_string();
    Ok(match o.system {
        s if s.is_fenced_cluster() && i >= l.initial => Spec {
            host: name.clone(),
            program: find_program("fenced", &o.bin_dir)?,
            args: fenced_join_args(i + 1, &l.data_dir.join(name), &ip, join),
            env: vec![("FENCED_TEST_CLOCK_OFFSET_FILE".into(), clock)],
        },
        s if s.is_fenced_cluster() => {
            let cluster: Vec<String> = l.nodes[..l.initial]
                .iter()
                .enumerate()
                .map(|(j, n)| {
                    let ip = env.host(n).map(|h| h.ip.clone()).unwrap_or_default();
                    format!("{}={ip}:{GRPC_PORT}", j + 1)
                })
                .collect();
            Spec {
                host: name.clone(),
                program: find_program("fenced", &o.bin_dir)?,
                args: fenced_serve_args(i + 1, &l.data_dir.join(name), &ip, &cluster),
                env: vec![("FENCED_TEST_CLOCK_OFFSET_FILE".into(), clock)],
            }
        }
        s if s.is_etcd_cluster() => {
            // A restart (kill nemesis) reuses the data dir, where etcd ignores the
            // --initial-cluster flags.
            let cluster: Vec<String> = l.nodes[..l.initial]
                .iter()
                .map(|n| {
                    let ip = env.host(n).map(|h| h.ip.clone()).unwrap_or_default();
                    format!("{n}=http://{ip}:{ETCD_PEER_PORT}")
                })
                .collect();
            let client = format!("http://{ip}:{ETCD_PORT}");
            let peer = format!("http://{ip}:{ETCD_PEER_PORT}");
            Spec {
                host: name.clone(),
                program: find_program("etcd", &o.bin_dir)?,
                args: vec![
                    "--name".into(),
                    name.clone(),
                    "--data-dir".into(),
                    l.data_dir.join(name).display().to_string(),
                    "--listen-client-urls".into(),
                    client.clone(),
                    "--advertise-client-urls".into(),
                    client,
                    "--listen-peer-urls".into(),
                    peer.clone(),
                    "--initial-advertise-peer-urls".into(),
                    peer,
                    "--initial-cluster".into(),
                    cluster.join(","),
                    "--initial-cluster-state".into(),
                    "new".into(),
                    "--initial-cluster-token".into(),
                    "fenced-jepsen".into(),
                ],
                env: vec![],
            }
        }
        _ => {
            let mut env_vars = vec![];
            if let Some(lib) = &l.shim {
                env_vars = vec![
                    ("LD_PRELOAD".into(), lib.display().to_string()),
                    ("JEPSEN_CLOCK_FILE".into(), clock),
                ];
            }
            let dir = l.data_dir.join(name);
            std::fs::create_dir_all(&dir)?;
            Spec {
                host: name.clone(),
                program: find_program("redis-server", &o.bin_dir)?,
                args: vec![
                    "--bind".into(),
                    ip,
                    "--port".into(),
                    REDIS_PORT.to_string(),
                    "--save".into(),
                    String::new(),
                    "--appendonly".into(),
                    "no".into(),
                    "--protected-mode".into(),
                    "no".into(),
                    "--dir".into(),
                    dir.display().to_string(),
                ],
                env: env_vars,
            }
        }
    })
}

pub(super) fn client_spec(
    o: &TestOpts,
    l: &Layout,
    run_start: u64,
    k: u64,
    workload: &str,
) -> ClientSpec {
    ClientSpec {
        system: o.system.name().to_owned(),
        workload: workload.to_owned(),
        index: k,
        stride: o.clients,
        run_start,
        deadline: o.time_limit_s * 1_000_000_000,
        history: o.out.join("hist").join(format!("c{k}.jsonl")),
        lock_endpoints: l.lock_endpoints.clone(),
        resp_endpoints: l.resp_endpoints.clone(),
        guard: if workload.starts_with("counter") || workload == "final-read" {
            l.guard.clone()
        } else {
            String::new()
        },
        ttl_ms: o.ttl_ms,
        wait_ms: o.wait_ms,
        hold_ms: o.hold_ms,
        op_timeout_ms: o.op_timeout_ms,
        seed: o.seed,
        members_file: None,
        // The limiter's Lua clients add this file's offset to their "now" (clock nemesis).
        clock_file: Some(l.clock_dir.join(format!("c{k}"))),
    }
}

/// This run's private copy of the harness binary.
pub(super) fn o_bin(out: &Path) -> PathBuf {
    out.join("bin").join("fenced-jepsen")
}

/// Run `fenced-jepsen <sub> --spec FILE` on host `host` and wait (bounded) for it to exit.
pub(super) fn run_helper(
    env: &mut Env,
    name: &str,
    host: &str,
    sub: &str,
    spec: &ClientSpec,
    out: &Path,
    limit: Duration,
) -> anyhow::Result<bool> {
    let path = out.join(format!("{name}.spec.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(spec)?)?;
    env.spawn(
        name,
        Spec {
            host: host.to_owned(),
            program: o_bin(out),
            args: vec![sub.into(), "--spec".into(), path.display().to_string()],
            env: vec![],
        },
    )?;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && !interrupted() {
        if let Some(st) = env.exited(name) {
            return Ok(st.success());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    env.kill(name)?;
    Ok(false)
}
