//! Three real `fenced serve` processes on loopback, their addresses, and waiting on them.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use fenced_client::{Client, ClientOptions, ClientTls};
use fenced_proto::v1 as pb;
use fenced_proto::v1::cluster_client::ClusterClient;
use fenced_proto::v1::lock_client::LockClient;
use tonic::transport::Channel;

use super::wait::wait_for;

pub const GRPC_PORT: u16 = 7380;
pub const RESP_PORT: u16 = 7379;
/// Node ids of every cluster.
pub const IDS: [u64; 3] = [1, 2, 3];
/// Generous bound for an election on a slow, shared machine (the election timeout is
/// 300–450 ms; startup, fsyncs and a split vote or two come on top).
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound for a restarted node to catch up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines of each node's log printed when a test fails.
const LOG_TAIL_LINES: usize = 60;

/// The process `cmd` starts gets SIGKILL when the thread that started it (the test) ends, even
/// if the test is killed before its clean-up runs.
pub fn die_with_this_test(cmd: &mut Command) {
    // SAFETY: prctl(2) is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_fenced")
}

/// The second octet to try first for this run of the suite (1..=254).
fn first_run_octet() -> u32 {
    std::env::var("FENCED_TEST_NET")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| (1..=254).contains(n))
        .unwrap_or_else(|| 1 + std::process::id() % 254)
}

/// The next network number `k` of this test process (1..=254): every cluster started here
/// gets its own, so no test file keeps a list of numbers.
fn next_k() -> u8 {
    static NEXT: AtomicU8 = AtomicU8::new(1);
    let k = NEXT.fetch_add(1, Ordering::Relaxed);
    assert!(
        (1..=254).contains(&k),
        "more than 254 networks in one test process"
    );
    k
}

/// Whether every address of the cluster of test `k` in run `run` is free to listen on.
fn addresses_free(run: u32, k: u8) -> bool {
    IDS.iter().all(|id| {
        [GRPC_PORT, RESP_PORT]
            .iter()
            .all(|port| TcpListener::bind((format!("127.{run}.{k}.{id}").as_str(), *port)).is_ok())
    })
}

/// A fresh `127.R.k` such that `127.R.k.1`–`.3` are free on the gRPC and RESP ports: `k` is
/// this process's next network number, `R` separates concurrent runs of the suite.
pub fn free_net(test: &str) -> String {
    let k = next_k();
    let first = first_run_octet();
    let run = (0..16)
        .map(|i| (first - 1 + i) % 254 + 1)
        .find(|run| addresses_free(*run, k))
        .unwrap_or_else(|| {
            panic!(
                "{test}: no free addresses 127.R.{k}.1-3 (ports {GRPC_PORT}, {RESP_PORT}) \
                 for R in {first}..+16; set FENCED_TEST_NET to another 1..=254"
            )
        });
    format!("127.{run}.{k}")
}

struct Proc {
    id: u64,
    child: Option<Child>,
    data_dir: PathBuf,
    log: PathBuf,
    starts: u32,
    /// Started with `--join` (a member added after the cluster was made), not
    /// `--initial-cluster`.
    joins: bool,
}

/// Ids a test may add with [`TestCluster::spawn_joiner`] (addresses `{net}.4`, `{net}.5`).
pub const JOINER_IDS: [u64; 2] = [4, 5];

/// Three `fenced serve` processes. Dropping it SIGKILLs and reaps them all.
pub struct TestCluster {
    test: String,
    /// Addresses are `{net}.{id}`, e.g. `127.23.4`.
    net: String,
    extra_args: Vec<String>,
    /// How the harness's own clients connect (TLS clusters).
    tls: Option<ClientTls>,
    procs: Mutex<Vec<Proc>>,
    grpc: Vec<Channel>,
    // Declared last: removed after the children are dead.
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Start a 3-node cluster on a network of its own, with extra `fenced serve` flags.
    pub fn start(test: &str, extra_args: &[&str]) -> TestCluster {
        let args = extra_args.iter().map(|s| s.to_string()).collect();
        Self::start_with(test, |_, _| (args, None))
    }

    /// [`TestCluster::start`] whose flags and client TLS are made once the addresses are known:
    /// `setup(temp dir, node IPs)` returns the extra `fenced serve` flags and the TLS the
    /// harness's clients use (e.g. to issue certificates for the nodes' IPs).
    pub fn start_with(
        test: &str,
        setup: impl FnOnce(&Path, &[String]) -> (Vec<String>, Option<ClientTls>),
    ) -> TestCluster {
        let net = free_net(test);
        let dir = tempfile::Builder::new()
            .prefix(&format!("fenced-{test}-"))
            .tempdir()
            .expect("creating the temp dir");
        let ips: Vec<String> = IDS.iter().map(|id| format!("{net}.{id}")).collect();
        let (extra_args, tls) = setup(dir.path(), &ips);
        let grpc_tls = tls.as_ref().map(ClientTls::grpc);
        let mut procs = Vec::new();
        let mut grpc = Vec::new();
        for id in IDS {
            let data_dir = dir.path().join(format!("node-{id}"));
            procs.push(Proc {
                id,
                child: None,
                data_dir,
                log: dir.path().join(format!("node-{id}.log")),
                starts: 0,
                joins: false,
            });
        }
        for id in IDS.into_iter().chain(JOINER_IDS) {
            let ep = fenced_tls::endpoint(&format!("{net}.{id}:{GRPC_PORT}"), grpc_tls.as_ref())
                .expect("endpoint")
                .connect_timeout(Duration::from_millis(500))
                .timeout(Duration::from_secs(2));
            grpc.push(ep.connect_lazy());
        }
        let cluster = TestCluster {
            test: test.to_owned(),
            net,
            extra_args,
            tls,
            procs: Mutex::new(procs),
            grpc,
            dir,
        };
        for id in IDS {
            cluster.spawn(id);
        }
        cluster
    }

    fn procs(&self) -> std::sync::MutexGuard<'_, Vec<Proc>> {
        self.procs.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> {
        IDS.into_iter()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn ip(&self, id: u64) -> String {
        format!("{}.{id}", self.net)
    }

    pub fn grpc_addr(&self, id: u64) -> String {
        format!("{}:{GRPC_PORT}", self.ip(id))
    }

    pub fn resp_addr(&self, id: u64) -> String {
        format!("{}:{RESP_PORT}", self.ip(id))
    }

    /// Every node's gRPC address.
    pub fn endpoints(&self) -> Vec<String> {
        self.ids().map(|i| self.grpc_addr(i)).collect()
    }

    /// The gRPC addresses of the given nodes.
    pub fn endpoints_of(&self, ids: &[u64]) -> Vec<String> {
        ids.iter().map(|i| self.grpc_addr(*i)).collect()
    }

    pub fn initial_cluster(&self) -> String {
        self.ids()
            .map(|i| format!("{i}={}", self.grpc_addr(i)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A client of the whole cluster.
    pub fn client(&self) -> Client {
        Client::connect_with(self.endpoints(), self.client_options()).expect("client")
    }

    /// A client that talks to node `id` only.
    pub fn client_of(&self, id: u64) -> Client {
        Client::connect_with([self.grpc_addr(id)], self.client_options()).expect("client")
    }

    /// Default client options, with the cluster's TLS.
    pub fn client_options(&self) -> ClientOptions {
        ClientOptions {
            tls: self.tls.clone(),
            ..ClientOptions::default()
        }
    }

    /// The raw generated Lock client of node `id` (per-call timeout `timeout`).
    /// The harness's gRPC channel to node `id` (any service).
    pub fn raw_channel(&self, id: u64) -> Channel {
        self.grpc[(id - 1) as usize].clone()
    }

    pub fn raw_lock_client(&self, id: u64, timeout: Duration) -> LockClient<Channel> {
        let tls = self.tls.as_ref().map(ClientTls::grpc);
        let ep = fenced_tls::endpoint(&self.grpc_addr(id), tls.as_ref())
            .expect("endpoint")
            .connect_timeout(Duration::from_millis(500))
            .timeout(timeout);
        LockClient::new(ep.connect_lazy())
    }

    fn spawn(&self, id: u64) {
        self.spawn_with(id, &[]);
    }

    /// Start node `id` with `more` flags after the usual ones (this start only).
    fn spawn_with(&self, id: u64, more: &[&str]) {
        let mut procs = self.procs();
        let p = &mut procs[(id - 1) as usize];
        assert!(p.child.is_none(), "node {id} is already running");
        p.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p.log)
            .expect("opening the node log");
        writeln!(
            log,
            "===== test harness: start #{} of node {id} =====",
            p.starts
        )
        .expect("writing the node log");
        let mut cmd = Command::new(bin());
        cmd.arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--data-dir")
            .arg(&p.data_dir)
            .arg("--grpc-addr")
            .arg(self.grpc_addr(id))
            .arg("--resp-addr")
            .arg(self.resp_addr(id));
        if p.joins {
            cmd.arg("--join").arg(self.endpoints().join(","));
        } else {
            cmd.arg("--initial-cluster")
                .arg(self.initial_cluster())
                // Every start, as an operator who keeps one command line would: a data dir
                // with state ignores it, and a wiped one must still not vote (see
                // tests/amnesia.rs).
                .arg("--initial-cluster-state")
                .arg("new");
        }
        // `{ip}` in an extra flag is this node's address (per-node listeners).
        let ip = self.ip(id);
        cmd.args(self.extra_args.iter().map(|a| a.replace("{ip}", &ip)))
            .args(more)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log);
        // A group id of its own, so that [`TestCluster::partition`] can tell this node's
        // packets from its peers' (every node's outgoing connections leave from 127.0.0.1).
        // Only root may take any group id; nothing else changes (the uid stays).
        if is_root() {
            cmd.gid(self.gid(id));
        }
        cmd.env("NO_COLOR", "1");
        if std::env::var_os("FENCED_LOG").is_none() {
            cmd.env("FENCED_LOG", "info,openraft=warn,sled=warn");
        }
        die_with_this_test(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting node {id} ({}): {e}", bin()));
        p.child = Some(child);
    }

    /// The group id node `id` runs as (when the tests run as root): unique to this cluster.
    pub fn gid(&self, id: u64) -> u32 {
        let mut octets = self
            .net
            .split('.')
            .skip(1)
            .map(|o| o.parse::<u32>().unwrap_or(0));
        let (run, k) = (octets.next().unwrap_or(0), octets.next().unwrap_or(0));
        0x4000_0000 | run << 16 | k << 8 | id as u32
    }

    /// Cut nodes `side` off from the other members of the cluster (both ways, Raft traffic
    /// included) until the returned guard is dropped. Clients — the test process, etcdctl,
    /// node — still reach every node: a client talking to a node of the minority keeps
    /// talking to it, as one on the wrong side of a real partition would. Needs root and
    /// iptables (its `owner` match): the nodes run as group ids of their own, and each rule
    /// drops the packets one side's processes send to the other side's addresses.
    pub fn partition(&self, side: &[u64]) -> Partition {
        assert!(
            is_root(),
            "{}: partitions need root (iptables); run the tests as root (CI does)",
            self.test
        );
        super::programs::require("iptables", &["-V"]);
        let others: Vec<u64> = self.ids().filter(|i| !side.contains(i)).collect();
        let mut rules = Vec::new();
        for a in side {
            for b in &others {
                for (from, to) in [(*a, *b), (*b, *a)] {
                    rules.push(vec![
                        "OUTPUT".to_string(),
                        "-d".into(),
                        self.ip(to),
                        "-m".into(),
                        "owner".into(),
                        "--gid-owner".into(),
                        self.gid(from).to_string(),
                        "-m".into(),
                        "comment".into(),
                        "--comment".into(),
                        format!("fenced-test-{}", self.test),
                        "-j".into(),
                        "DROP".into(),
                    ]);
                }
            }
        }
        let mut p = Partition { rules: Vec::new() };
        for r in rules {
            iptables("-I", &r);
            p.rules.push(r);
        }
        p
    }

    /// Start node `id` (one of [`JOINER_IDS`]) with `--join` the initial members: the learner
    /// a `fenced member add` announced. Later calls of `kill`/`restart`/`status` take it like
    /// the others.
    pub fn spawn_joiner(&self, id: u64) {
        assert!(JOINER_IDS.contains(&id), "joiners are {JOINER_IDS:?}");
        {
            let mut procs = self.procs();
            while procs.len() < id as usize {
                let n = procs.len() as u64 + 1;
                procs.push(Proc {
                    id: n,
                    child: None,
                    data_dir: self.dir.path().join(format!("node-{n}")),
                    log: self.dir.path().join(format!("node-{n}.log")),
                    starts: 0,
                    joins: true,
                });
            }
        }
        self.spawn(id);
    }

    pub fn is_running(&self, id: u64) -> bool {
        self.procs()[(id - 1) as usize].child.is_some()
    }

    /// The process id of node `id` (`None` if the harness has not started it or reaped it).
    /// Someone else may signal it (tests/python_client.rs hands the pids to pytest): the
    /// harness reaps it at [`TestCluster::kill`] or on drop either way.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.procs()[(id - 1) as usize]
            .child
            .as_ref()
            .map(|c| c.id())
    }

    /// Ids of the nodes the harness believes are running.
    pub fn running(&self) -> Vec<u64> {
        self.procs()
            .iter()
            .filter(|p| p.child.is_some())
            .map(|p| p.id)
            .collect()
    }

    /// SIGKILL node `id` and reap it.
    pub fn kill(&self, id: u64) {
        let mut procs = self.procs();
        let p = &mut procs[(id - 1) as usize];
        let mut child = p
            .child
            .take()
            .unwrap_or_else(|| panic!("kill({id}): node {id} is not running"));
        // SIGKILL; an error means it already exited, which `wait` then reports.
        let _ = child.kill();
        let status = child.wait().expect("reaping a killed node");
        if let Ok(mut log) = OpenOptions::new().append(true).open(&p.log) {
            let _ = writeln!(
                log,
                "===== test harness: SIGKILLed node {id} ({status}) ====="
            );
        }
    }

    /// Start node `id` again from its data dir.
    pub fn restart(&self, id: u64) {
        self.spawn(id);
    }

    /// Start node `id` again with `more` flags for this start only.
    pub fn restart_with(&self, id: u64, more: &[&str]) {
        self.spawn_with(id, more);
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`) node `id`: a process pause.
    pub fn pause(&self, id: u64, stop: bool) {
        let procs = self.procs();
        let child = procs[(id - 1) as usize]
            .child
            .as_ref()
            .unwrap_or_else(|| panic!("pause({id}): node {id} is not running"));
        let sig = if stop { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(child.id() as i32, sig) };
        assert_eq!(rc, 0, "signalling node {id}");
    }

    /// Node `id`'s data dir.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.procs()[(id - 1) as usize].data_dir.clone()
    }

    /// Delete node `id`'s data dir (the node must be stopped): a lost disk.
    pub fn wipe(&self, id: u64) {
        assert!(!self.is_running(id), "wipe({id}): node {id} is running");
        let dir = self.data_dir(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("wiping the data dir");
        }
        std::fs::create_dir_all(&dir).expect("recreating the empty data dir");
    }

    /// SIGTERM node `id` (a clean stop: a leader hands off first) and wait, bounded, for it
    /// to exit; returns its exit status.
    pub async fn terminate(&self, id: u64, timeout: Duration) -> std::process::ExitStatus {
        {
            let procs = self.procs();
            let child = procs[(id - 1) as usize]
                .child
                .as_ref()
                .unwrap_or_else(|| panic!("terminate({id}): node {id} is not running"));
            // SAFETY: kill(2) on our own child's pid.
            let rc = unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            assert_eq!(rc, 0, "signalling node {id}");
        }
        self.wait_exit(id, timeout).await
    }

    /// Wait (bounded) for node `id` to exit on its own; reap it and return its status.
    pub async fn wait_exit(&self, id: u64, timeout: Duration) -> std::process::ExitStatus {
        let status = wait_for(
            &format!("{}: node {id} to exit on its own", self.test),
            timeout,
            || async {
                let mut procs = self.procs();
                let p = &mut procs[(id - 1) as usize];
                let child = p.child.as_mut().ok_or_else(|| "not running".to_string())?;
                match child.try_wait() {
                    Ok(Some(st)) => {
                        p.child = None;
                        Ok(st)
                    }
                    Ok(None) => Err("still running".to_string()),
                    Err(e) => Err(e.to_string()),
                }
            },
        )
        .await;
        status
    }

    /// Panic if a node the harness started has exited on its own.
    pub fn assert_alive(&self) {
        let mut procs = self.procs();
        for p in procs.iter_mut() {
            if let Some(child) = p.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    p.child = None;
                    panic!(
                        "{}: node {} ({}.{}) exited on its own with {status}; see its log below",
                        self.test, p.id, self.net, p.id
                    );
                }
            }
        }
    }

    /// Node `id`'s own Status (answered locally, not forwarded). Bounded by 2 s.
    pub async fn status(&self, id: u64) -> Result<pb::StatusResponse, String> {
        let mut c = ClusterClient::new(self.grpc[(id - 1) as usize].clone());
        match tokio::time::timeout(Duration::from_secs(3), c.status(pb::StatusRequest {})).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) => Err(format!("node {id}: {:?}: {}", s.code(), s.message())),
            Err(_) => Err(format!("node {id}: status timed out")),
        }
    }

    /// Status of node `id`, panicking if it does not answer.
    pub async fn status_ok(&self, id: u64) -> pb::StatusResponse {
        self.status(id)
            .await
            .unwrap_or_else(|e| panic!("{}: status of node {id}: {e}", self.test))
    }

    /// Wait until a node says it is the leader and a majority of the cluster (counting it)
    /// agrees on it in the same term. Returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        wait_for(&format!("{}: a leader", self.test), timeout, || async {
            self.assert_alive();
            let mut seen = Vec::new();
            for id in self.ids() {
                seen.push((id, self.status(id).await));
            }
            for (id, s) in &seen {
                let Ok(s) = s else { continue };
                if s.state != "leader" || s.leader != *id {
                    continue;
                }
                let agree = seen
                    .iter()
                    .filter(|(_, o)| {
                        o.as_ref()
                            .is_ok_and(|o| o.leader == *id && o.term == s.term)
                    })
                    .count();
                if agree >= 2 {
                    return Ok(*id);
                }
            }
            Err(describe(&seen))
        })
        .await
    }

    /// Wait until node `leader` stamps apply rules `at_least` or newer on its entries (it does
    /// once its first check round has heard every member run them, `node/alarm.rs`).
    pub async fn wait_for_stamp(&self, leader: u64, at_least: u32) {
        super::wait::wait_for(
            &format!("node {leader} stamping apply rules {at_least}"),
            LEADER_TIMEOUT,
            || async move {
                let s = self.status_ok(leader).await;
                if s.semantics >= at_least {
                    Ok(())
                } else {
                    Err(format!("stamps {}", s.semantics))
                }
            },
        )
        .await;
    }

    /// Wait until a leader other than `old` is agreed on (by a majority, in one term): after
    /// `old` was cut off, the other side has elected one of its own. Returns its id.
    pub async fn wait_for_leader_other_than(&self, old: u64, timeout: Duration) -> u64 {
        wait_for(
            &format!("{}: a leader other than node {old}", self.test),
            timeout,
            || async {
                let mut seen = Vec::new();
                for id in self.ids().filter(|i| *i != old) {
                    seen.push((id, self.status(id).await));
                }
                let leaders: Vec<(u64, u64)> = seen
                    .iter()
                    .filter_map(|(_, s)| s.as_ref().ok().map(|s| (s.leader, s.term)))
                    .collect();
                match leaders.as_slice() {
                    [(a, t), (b, u)] if a == b && t == u && *a != old && *a != 0 => Ok(*a),
                    _ => Err(describe(&seen)),
                }
            },
        )
        .await
    }

    /// Wait until node `id` has applied at least `index`; returns its status then.
    pub async fn wait_applied(&self, id: u64, index: u64, timeout: Duration) -> pb::StatusResponse {
        wait_for(
            &format!("{}: node {id} to apply index {index}", self.test),
            timeout,
            || async {
                self.assert_alive();
                let s = self.status(id).await?;
                if s.last_applied >= index {
                    Ok(s)
                } else {
                    Err(format!(
                        "last_applied {} snapshot_index {} state {}",
                        s.last_applied, s.snapshot_index, s.state
                    ))
                }
            },
        )
        .await
    }

    /// Wait until every running node has applied what `leader` has applied now.
    pub async fn wait_all_caught_up(&self, leader: u64, timeout: Duration) -> u64 {
        let target = self.status_ok(leader).await.last_applied;
        for id in self.running() {
            self.wait_applied(id, target, timeout).await;
        }
        target
    }

    /// The last `lines` lines of node `id`'s log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let path = self.procs()[(id - 1) as usize].log.clone();
        tail(&path, lines)
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn iptables(op: &str, rule: &[String]) {
    let out = Command::new("iptables")
        .arg("-w")
        .arg(op)
        .args(rule)
        .output()
        .unwrap_or_else(|e| panic!("running iptables (apt-get install -y iptables): {e}"));
    assert!(
        out.status.success(),
        "iptables {op} {}: {}",
        rule.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A partition made by [`TestCluster::partition`]: dropping it heals it (deletes its
/// iptables rules, even when the test panics).
pub struct Partition {
    rules: Vec<Vec<String>>,
}

impl Partition {
    /// Heal now.
    pub fn heal(self) {}
}

impl Drop for Partition {
    fn drop(&mut self) {
        for r in self.rules.drain(..) {
            let _ = Command::new("iptables")
                .arg("-w")
                .arg("-D")
                .args(&r)
                .status();
        }
    }
}

fn describe(seen: &[(u64, Result<pb::StatusResponse, String>)]) -> String {
    seen.iter()
        .map(|(id, s)| match s {
            Ok(s) => format!(
                "node {id}: state {} leader {} term {} applied {}",
                s.state, s.leader, s.term, s.last_applied
            ),
            Err(e) => e.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    // The last 64 KiB is plenty for the last few dozen lines.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let mut procs = self.procs();
        for p in procs.iter_mut() {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if panicking {
            eprintln!(
                "\n===== {}: test failed; node logs in {} (removed at exit) =====",
                self.test,
                self.dir.path().display()
            );
            for p in procs.iter() {
                eprintln!(
                    "----- node {} ({}), last {LOG_TAIL_LINES} lines -----\n{}",
                    p.id,
                    p.log.display(),
                    tail(&p.log, LOG_TAIL_LINES)
                );
            }
        }
    }
}

/// The other node to use when a test wants a follower (any node but `leader`).
pub fn follower_of(leader: u64) -> u64 {
    if leader == 1 {
        2
    } else {
        1
    }
}
