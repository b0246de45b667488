//! A node that lost or damaged its disk must never vote from a short log (issue 10).
//!
//! * The operator's sequence: a follower is paused, a grant is acknowledged by the leader and
//!   the other follower, the leader crashes, the other follower's disk is lost and it is
//!   restarted with its old command line (`--initial-cluster-state new` included), the paused
//!   follower resumes. Before the identity checks the wiped node voted, the paused one won, and
//!   the lock went to a second holder with a smaller token.
//! * Empty, foreign, half-written and bit-flipped data dirs are refused, naming the file.
//!
//! Run: `cargo test -p fenced-server --test amnesia`.

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{wait_for, within, TestCluster, LEADER_TIMEOUT};

const CALL: Duration = Duration::from_secs(30);
const HOLD: Duration = Duration::from_secs(600);

async fn acquire(
    client: &fenced_client::Client,
    name: &str,
    owner: &str,
    ttl: Duration,
) -> Result<Option<fenced_client::Grant>, fenced_client::ClientError> {
    within(
        &format!("acquire {name} for {owner}"),
        CALL,
        client.acquire(name, owner, ttl, Duration::ZERO, 0),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_follower_restarted_with_its_old_flags_never_votes() {
    let c = TestCluster::start("amnesia", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let followers: Vec<u64> = c.ids().filter(|&i| i != leader).collect();
    let (slow, wiped) = (followers[0], followers[1]);
    let client = c.client();

    // Some traffic, and everybody caught up: every member has met (or heard of) every other.
    for i in 0..10 {
        let name = format!("warm-{i}");
        let g = acquire(&client, &name, "w", Duration::from_secs(30))
            .await
            .expect("warm-up acquire")
            .expect("a free lock is granted");
        assert!(client.release(&name, "w", g.token).await.expect("release"));
    }
    c.wait_all_caught_up(leader, LEADER_TIMEOUT).await;

    // The slow follower stops; the grant is acknowledged by the leader and the other one.
    c.pause(slow, true);
    let grant = acquire(&c.client_of(leader), "amnesia", "holder1", HOLD)
        .await
        .expect("acquire with one follower paused")
        .expect("granted");
    eprintln!("amnesia: holder1 granted token {}", grant.token);

    // The leader crashes, the other follower loses its disk and comes back with its old
    // command line; then the slow follower resumes.
    c.kill(leader);
    c.kill(wiped);
    c.wipe(wiped);
    c.restart(wiped);
    c.pause(slow, false);

    // Nobody may hand the lock to a second holder or issue a token at or below holder1's:
    // the slow follower alone has no quorum, and the wiped node must not vote. (Before the
    // identity checks, the two elected a leader within a second or two and granted holder2.)
    let until = Instant::now() + Duration::from_secs(10);
    let slow_client = c.client_of(slow);
    while Instant::now() < until {
        if let Ok(Some(g)) =
            acquire(&slow_client, "amnesia", "holder2", Duration::from_secs(1)).await
        {
            panic!(
                "holder2 was granted the lock (token {}) that holder1 holds with token {}",
                g.token, grant.token
            );
        }
    }

    // The wiped node learnt that the cluster knows its member under another incarnation
    // and retired itself.
    let status = c.wait_exit(wiped, Duration::from_secs(30)).await;
    assert!(!status.success(), "the wiped node exited with {status}");
    let log = c.log_tail(wiped, 40);
    assert!(
        log.contains("retir"),
        "the wiped node exited, but not because it retired:\n{log}"
    );

    // The old leader comes back: with the slow follower it is a majority that remembers.
    c.restart(leader);
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, wiped);
    let info = within(
        "info amnesia",
        CALL,
        c.client_of(new_leader).info("amnesia"),
    )
    .await
    .expect("info")
    .expect("the acknowledged grant was lost");
    assert_eq!(
        (info.owner.as_str(), info.token),
        ("holder1", grant.token),
        "the acknowledged grant changed"
    );
    let refused = acquire(&c.client_of(new_leader), "amnesia", "holder2", HOLD)
        .await
        .expect("acquire");
    assert!(refused.is_none(), "holder2 got a held lock: {refused:?}");
    let next = acquire(&c.client_of(new_leader), "after", "holder3", HOLD)
        .await
        .expect("acquire")
        .expect("granted");
    assert!(
        next.token > grant.token,
        "token went backwards: {} after {}",
        next.token,
        grant.token
    );

    // The retired data dir refuses to start again, saying why.
    let (code, err) = serve_once(&[
        "--id",
        &wiped.to_string(),
        "--data-dir",
        &c.data_dir(wiped).display().to_string(),
        "--grpc-addr",
        &c.grpc_addr(wiped),
        "--resp-addr",
        &c.resp_addr(wiped),
        "--initial-cluster",
        &c.initial_cluster(),
        "--initial-cluster-state",
        "new",
    ]);
    assert_ne!(code, Some(0), "a retired data dir started: {err}");
    assert!(err.contains("retired"), "{err}");
}

/// Two members lose their disks while the third is down, and both come back with their old
/// command line (`--initial-cluster-state new` included). They cannot tell this from a first
/// start — but a new cluster votes only once every member has been heard from, so they wait
/// for the third, which remembers them and refuses them. (Before that rule the two elected a
/// leader and granted the lock again with a smaller token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_majority_waits_for_the_member_that_remembers() {
    let c = TestCluster::start("wiped-majority", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = c.client();
    let mut last = 0;
    for _ in 0..3 {
        let g = acquire(&client, "majority", "o", Duration::from_secs(600))
            .await
            .expect("acquire")
            .expect("granted");
        assert!(client
            .release("majority", "o", g.token)
            .await
            .expect("release"));
        last = g.token;
    }
    let held = acquire(&client, "majority", "holder1", HOLD)
        .await
        .expect("acquire")
        .expect("granted");
    assert!(held.token > last);
    c.wait_all_caught_up(leader, LEADER_TIMEOUT).await;

    for id in c.ids() {
        c.kill(id);
    }
    let (w1, w2) = (1, 2);
    c.wipe(w1);
    c.wipe(w2);
    c.restart(w1);
    c.restart(w2);

    let until = Instant::now() + Duration::from_secs(8);
    let wiped_client =
        fenced_client::Client::connect_with(c.endpoints_of(&[w1, w2]), c.client_options())
            .expect("client");
    while Instant::now() < until {
        if let Ok(Some(g)) =
            acquire(&wiped_client, "majority", "holder2", Duration::from_secs(1)).await
        {
            panic!(
                "two wiped members elected a leader and granted the lock held by holder1 \
                 (token {}) again, with token {}",
                held.token, g.token
            );
        }
    }

    // The member that remembers comes back: both wiped members retire.
    c.restart(3);
    for w in [w1, w2] {
        let status = c.wait_exit(w, Duration::from_secs(30)).await;
        assert!(!status.success(), "wiped member {w} exited with {status}");
        assert!(c.log_tail(w, 40).contains("retir"), "{}", c.log_tail(w, 40));
    }
}

/// `fenced serve ARGS` that is expected to refuse to start: runs it (bounded), returns its
/// exit code and stderr. Panics if it is still running after 20 s (it started).
fn serve_once<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> (Option<i32>, String) {
    let mut child = Command::new(support::bin())
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting fenced");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().expect("waiting for fenced") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
            panic!(
                "fenced serve {} kept running: it should have refused",
                shown.join(" ")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Files and dirs in `dir`, sorted (to show nothing was created or changed).
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A single node on `127.R.k.1`: serve `dir` in the background.
struct Single {
    child: std::process::Child,
    grpc: String,
}

impl Single {
    fn start(net: &str, dir: &Path, log: &Path) -> Single {
        let grpc = format!("{net}.1:{}", support::GRPC_PORT);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log");
        let child = Command::new(support::bin())
            .args(["serve", "--data-dir"])
            .arg(dir)
            .args(["--grpc-addr", &grpc, "--resp-addr"])
            .arg(format!("{net}.1:{}", support::RESP_PORT))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting fenced");
        Single { child, grpc }
    }

    fn client(&self) -> fenced_client::Client {
        fenced_client::Client::connect([self.grpc.clone()]).expect("client")
    }

    /// SIGTERM and wait (bounded).
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.wait();
    }
}

impl Drop for Single {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last log index node `grpc` reports once it serves (a single node commits its whole
/// log on start).
async fn applied(grpc: &str) -> u64 {
    let client = fenced_client::Client::connect([grpc.to_owned()]).expect("client");
    wait_for("the node to serve", Duration::from_secs(30), || async {
        let s = client.status().await.map_err(|e| e.to_string())?;
        if s.leader == 0 {
            return Err("no leader yet".into());
        }
        Ok(s.last_applied)
    })
    .await
}

/// Bad data dirs: clear errors, nothing created or overwritten, never a vote from a short log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_data_dirs_are_refused_naming_the_file() {
    let net = support::free_net("bad-data-dirs");
    let tmp = tempfile::Builder::new()
        .prefix("fenced-bad-data-dirs-")
        .tempdir()
        .expect("tempdir");
    let peers = format!(
        "1={net}.1:{p},2={net}.2:{p},3={net}.3:{p}",
        p = support::GRPC_PORT
    );
    let member = |dir: &Path, id: u64, extra: &[&str]| -> (Option<i32>, String) {
        let d = dir.display().to_string();
        let grpc = format!("{net}.{id}:{}", support::GRPC_PORT);
        let resp = format!("{net}.{id}:{}", support::RESP_PORT);
        let mut args = vec![
            "--id",
            match id {
                1 => "1",
                2 => "2",
                _ => "3",
            },
            "--data-dir",
            &d,
            "--grpc-addr",
            &grpc,
            "--resp-addr",
            &resp,
            "--initial-cluster",
            &peers,
        ];
        args.extend_from_slice(extra);
        serve_once(&args)
    };

    // An empty data dir of a node that names peers, without --initial-cluster-state new.
    // (A mount point's lost+found makes no difference.)
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(empty.join("lost+found")).expect("mkdir");
    let (code, err) = member(&empty, 2, &[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--initial-cluster-state new"), "{err}");
    assert_eq!(listing(&empty), ["lost+found"], "files were created");
    let (code, err) = member(&empty, 2, &["--initial-cluster-state", "existing"]);
    assert_eq!(code, Some(1), "{err}");

    // A single node with data, stopped.
    let dir = tmp.path().join("single");
    let log = tmp.path().join("single.log");
    let node = Single::start(&net, &dir, &log);
    let client = node.client();
    wait_for(
        "the single node to lead",
        Duration::from_secs(30),
        || async { client.status().await.map(|_| ()).map_err(|e| e.to_string()) },
    )
    .await;
    for i in 0..300 {
        let name = format!("l{i}");
        let g = acquire(&client, &name, "o", Duration::from_secs(60))
            .await
            .expect("acquire")
            .expect("granted");
        assert!(g.token > 0);
    }
    let full = applied(&node.grpc).await;
    node.stop();
    assert!(full >= 300, "applied {full}");

    // Another member id on this data dir.
    let (code, err) = serve_once(&[
        "--id",
        "2",
        "--data-dir",
        &dir.display().to_string(),
        "--grpc-addr",
        &format!("{net}.2:{}", support::GRPC_PORT),
        "--resp-addr",
        &format!("{net}.2:{}", support::RESP_PORT),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("belongs to member 1"), "{err}");

    // The same member id at another address than its membership's.
    let (code, err) = serve_once(&[
        "--data-dir",
        &dir.display().to_string(),
        "--grpc-addr",
        &format!("{net}.3:{}", support::GRPC_PORT),
        "--resp-addr",
        &format!("{net}.3:{}", support::RESP_PORT),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("in the cluster's membership"), "{err}");

    // A half-written identity file.
    let copy = copy_dir(&dir, &tmp.path().join("half-identity"));
    let id_file = copy.join("identity");
    let text = std::fs::read(&id_file).expect("identity");
    std::fs::write(&id_file, &text[..text.len() / 2]).expect("truncate");
    let (code, err) = serve_once(&single_args(&net, &copy));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&id_file.display().to_string()), "{err}");
    assert_eq!(
        std::fs::read(&id_file).expect("identity"),
        text[..text.len() / 2],
        "the damaged file was overwritten"
    );

    // The identity file gone, the Raft state still there.
    let copy = copy_dir(&dir, &tmp.path().join("no-identity"));
    std::fs::remove_file(copy.join("identity")).expect("rm");
    let (code, err) = serve_once(&single_args(&net, &copy));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("identity"), "{err}");

    // The Raft state gone, the identity still there: it should have state but has none.
    let copy = copy_dir(&dir, &tmp.path().join("no-state"));
    for f in listing(&copy) {
        if f != "identity" {
            let p = copy.join(&f);
            if p.is_dir() {
                std::fs::remove_dir_all(&p).expect("rm");
            } else {
                std::fs::remove_file(&p).expect("rm");
            }
        }
    }
    let (code, err) = serve_once(&single_args(&net, &copy));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("holds no Raft state"), "{err}");
    assert_eq!(listing(&copy), ["identity"], "files were created");

    // A data dir holds no sled files (sled is only opened to upgrade an older one).
    for sled_file in ["db", "conf", "blobs"] {
        assert!(
            !dir.join(sled_file).exists(),
            "{sled_file} in a new data dir"
        );
    }
    // Flipped bytes at several offsets of the purged file and of the log's segment: refused,
    // naming the data dir — or, where the flips hit nothing that matters, the whole log is
    // there. Never a shorter log.
    let mut targets = Vec::new();
    let wal = dir.join(fenced_storage::wal::DIR);
    let segment = std::fs::read_dir(&wal)
        .expect("wal dir")
        .map(|e| e.expect("entry").path())
        .max()
        .expect("a log segment");
    let purged = dir.join(fenced_storage::purged::FILE_NAME);
    for (file, len) in [
        (
            purged.clone(),
            std::fs::metadata(&purged).expect("stat").len(),
        ),
        (segment.clone(), records_end(&segment)),
    ] {
        let rel = file.strip_prefix(&dir).expect("inside").to_owned();
        for start in [0, len / 5, len / 2, len * 3 / 4, len.saturating_sub(8192)] {
            targets.push((rel.clone(), start));
        }
    }
    let mut refused = 0;
    let mut refused_log = 0;
    for (n, (rel, start)) in targets.iter().enumerate() {
        let copy = copy_dir(&dir, &tmp.path().join(format!("flipped-{n}")));
        flip_every_kib(&copy.join(rel), *start);
        let mut child = Single::start(&net, &copy, &tmp.path().join(format!("flipped-{n}.log")));
        let deadline = Instant::now() + Duration::from_secs(20);
        let outcome = loop {
            if let Some(status) = child.child.try_wait().expect("wait") {
                break Err(status);
            }
            if let Ok(s) = child.client().status().await {
                if s.leader != 0 {
                    break Ok(s.last_applied);
                }
            }
            assert!(
                Instant::now() < deadline,
                "flipped-{n}: neither refused nor serving"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let log = std::fs::read_to_string(tmp.path().join(format!("flipped-{n}.log")))
            .unwrap_or_default();
        match outcome {
            Err(status) => {
                assert!(!status.success());
                assert!(
                    log.contains(&copy.display().to_string()),
                    "flipped-{n}: refused without naming the data dir:\n{log}"
                );
                refused += 1;
                if rel.starts_with(fenced_storage::wal::DIR) {
                    refused_log += 1;
                }
                eprintln!(
                    "flipped-{n} ({}): refused: {}",
                    rel.display(),
                    log.lines().last().unwrap_or_default()
                );
            }
            Ok(last) => {
                let last = applied(&child.grpc).await.max(last);
                assert!(
                    last >= full,
                    "flipped-{n}: started with a shorter log: applied {last} of {full}\n{log}"
                );
            }
        }
        child.stop();
    }
    eprintln!(
        "flipped files: {refused} of {} refused, the rest started with the whole log",
        targets.len()
    );
    // Every acknowledged entry is in the log's segment: any flip there is damage to one.
    assert_eq!(refused_log, 5, "a damaged log segment was not refused");
}

fn single_args(net: &str, dir: &Path) -> Vec<String> {
    vec![
        "--data-dir".into(),
        dir.display().to_string(),
        "--grpc-addr".into(),
        format!("{net}.1:{}", support::GRPC_PORT),
        "--resp-addr".into(),
        format!("{net}.1:{}", support::RESP_PORT),
    ]
}

/// Copy a (stopped) data dir.
fn copy_dir(from: &Path, to: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
    to.to_owned()
}

/// Where the records of a log segment end: its 16-byte header, then length-prefixed records
/// up to a zero length (the zeros a segment grows by) or the end of the file.
fn records_end(segment: &Path) -> u64 {
    let bytes = std::fs::read(segment).expect("read segment");
    let mut at = 16;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        at += 4 + len;
    }
    at as u64
}

/// Flip 8 bytes every ~1 KiB of `file` from `start` on (the damage of the report).
fn flip_every_kib(file: &Path, start: u64) {
    let mut bytes = std::fs::read(file).expect("read");
    let mut at = start as usize;
    while at + 8 <= bytes.len() {
        for b in &mut bytes[at..at + 8] {
            *b ^= 0xa5;
        }
        at += 1024 + 8;
    }
    std::fs::write(file, bytes).expect("write");
}
