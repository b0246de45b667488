//! A disk write failure stops the node loudly instead of acknowledging, and loses nothing that
//! was acknowledged: run a single node on a tiny tmpfs, take locks until the disk is full, check
//! the process exited with an error, grow the filesystem, restart, and find every acknowledged
//! grant. Needs root (mount); skipped otherwise.
//!
//! The write that found the disk full may be in the log (a new leader could commit it): its
//! caller hears "outcome unknown" — gRPC `UNAVAILABLE` (the Rust client's `Unavailable`), RESP
//! `-TIMEOUT` — never a refusal (`INTERNAL`, `-TRYAGAIN`), which says nothing was applied.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fenced_client::{Client, ClientError};

const GRPC: &str = "127.0.250.1:7380";
const RESP: &str = "127.0.250.1:7379";
/// The RESP test's node.
const GRPC_2: &str = "127.0.250.2:7380";
const RESP_2: &str = "127.0.250.2:7379";

/// Unmounts (and kills the node) on drop, even when the test fails.
struct Mounted {
    dir: PathBuf,
    node: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.node.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

fn start(data: &Path, log: &Path) -> Child {
    start_on(data, log, GRPC, RESP)
}

fn start_on(data: &Path, log: &Path, grpc: &str, resp: &str) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_fenced"))
        .args([
            "serve",
            "--grpc-addr",
            grpc,
            "--resp-addr",
            resp,
            "--data-dir",
        ])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start fenced")
}

/// A tmpfs of `size` mounted in a new temp dir (unmounted on drop).
fn mount_tmpfs(size: &str) -> Mounted {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).expect("mkdir");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(&dir)
        .status()
        .expect("mount");
    assert!(ok.success(), "mount tmpfs failed");
    Mounted {
        dir,
        node: None,
        _tmp: tmp,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp_write_lost_to_a_full_disk_is_unknown_not_tryagain() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let mut m = mount_tmpfs("2200k");
    let log = m._tmp.path().join("node.log");
    m.node = Some(start_on(&m.dir.join("data"), &log, GRPC_2, RESP_2));
    let client = redis::Client::open(format!("redis://{RESP_2}/")).expect("redis url");
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut con = loop {
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Ok(c) => break c,
            Err(e) if Instant::now() < give_up => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("no RESP connection: {e}"),
        }
    };
    let filler = "x".repeat(2000);
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut written = 0;
    let error = loop {
        assert!(Instant::now() < give_up, "the disk never filled up");
        assert!(written < 5_000, "the disk never filled up");
        let set = redis::cmd("SET")
            .arg(format!("k{written}"))
            .arg(&filler)
            .query_async::<String>(&mut con)
            .await;
        match set {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
    };
    assert!(written > 10, "the disk filled too early to tell anything");
    // The node exits right after: the connection may close before the answer is written,
    // which tells the client nothing either way. An answer must say "outcome unknown".
    let text = error.to_string();
    if error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error() {
        eprintln!("the node exited before answering: {text}");
        assert!(!text.to_ascii_uppercase().contains("TRYAGAIN"), "{text}");
    } else {
        eprintln!("the SET lost to the full disk was answered: {text}");
        assert!(
            text.contains("TIMEOUT") && text.contains("outcome unknown"),
            "the SET lost to the full disk was not answered \"outcome unknown\": {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_stops_the_node_and_loses_no_acknowledged_grant() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).expect("mkdir");
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2200k", "tmpfs"])
        .arg(&dir)
        .status()
        .expect("mount");
    assert!(ok.success(), "mount tmpfs failed");
    let log = tmp.path().join("node.log");
    let mut m = Mounted {
        dir: dir.clone(),
        node: None,
        _tmp: tmp,
    };
    let data = dir.join("data");
    m.node = Some(start(&data, &log));

    let client = Client::connect([GRPC]).expect("client");
    let filler = "x".repeat(500);
    let mut acked: Vec<(String, u64)> = Vec::new();
    let give_up = Instant::now() + Duration::from_secs(120);
    let mut failed = false;
    for i in 0..5_000 {
        assert!(Instant::now() < give_up, "the disk never filled up");
        let name = format!("l{i}-{filler}");
        match client
            .acquire(&name, "o", Duration::from_secs(3600), Duration::ZERO, 0)
            .await
        {
            Ok(Some(g)) => acked.push((name, g.token)),
            Ok(None) => panic!("{name} refused while free"),
            Err(e) => {
                assert!(
                    matches!(e, ClientError::Unavailable(_)),
                    "the acquire lost to the full disk was answered as refused: {e:?}"
                );
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "no write ever failed");
    assert!(
        acked.len() > 10,
        "the disk filled too early to tell anything"
    );

    // The node stops by itself, with an error status.
    let mut node = m.node.take().expect("node");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = node.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = node.kill();
            panic!("the node kept running after a failed disk write");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "the node exited successfully after a disk failure"
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("fatal"), "no loud error in the log:\n{text}");

    // Room again: everything acknowledged is still there.
    let grown = Command::new("mount")
        .args(["-o", "remount,size=64m"])
        .arg(&dir)
        .status()
        .expect("remount");
    assert!(grown.success());
    m.node = Some(start(&data, &log));
    let client = Client::connect([GRPC]).expect("client");
    for (name, token) in &acked {
        let info = client
            .info(name)
            .await
            .expect("info")
            .unwrap_or_else(|| panic!("acknowledged grant lost: {}", &name[..8]));
        assert_eq!(info.token, *token, "token of {} changed", &name[..8]);
    }
    let last = acked.iter().map(|(_, t)| *t).max().unwrap_or(0);
    let next = client
        .acquire("after", "o", Duration::from_secs(60), Duration::ZERO, 0)
        .await
        .expect("acquire")
        .expect("granted");
    assert!(next.token > last, "token went backwards after the restart");
}
