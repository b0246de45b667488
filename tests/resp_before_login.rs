//! Issue 49, "memory exhausted before login" (Redis's CVE-2021-32675): on a 3-node cluster
//! with an ACL file, 40 connections that never authenticate each send the header of a
//! 16 MB bulk (`*4\r\n$16000000\r\n`), a few KB of it, and then keep sending up to 8 MB
//! more. Each is answered `Protocol error: unauthenticated bulk length` and closed as soon
//! as the header is read, the node's RSS stays within [`GROWTH`] of what it was, and an
//! authenticated client is served all along. A request of 11 arguments before `AUTH` is
//! refused the same way; `AUTH` pipelined with a large `SET` still works. Then 32
//! authenticated connections leave unfinished 16 MB requests (8 MB of each sent, 256 MB
//! in all): the node-wide cap on unparsed input (`--resp-query-buffer-total`, 32 MiB here)
//! closes the ones past it and the RSS bound holds again (the allocator keeps some of what
//! the closed connections' buffers freed, so RSS grows by more than the cap).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{follower_of, Raw, TestCluster, LEADER_TIMEOUT, R};

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
";

/// The node-wide cap the cluster runs with.
const TOTAL_CAP: usize = 32 * 1024 * 1024;
/// How much the node's RSS may grow under each attack (the unauthenticated part needs a
/// few MB at most; the authenticated part is bounded by [`TOTAL_CAP`], a 64 KiB read per
/// connection past it, and what the allocator keeps of freed buffers: ~110 MB measured).
const GROWTH: u64 = 200 * 1024 * 1024;
/// The start of the error a connection closed by the node-wide cap reads.
const OVER_TOTAL: &str = "-ERR Protocol error: the node's unparsed input";
/// How much of its body each attacking connection tries to send after the header.
const BODY: usize = 8 * 1024 * 1024;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// What one attacking connection saw: the bytes of body it got to send, whether a write
/// failed (the node closed it), and what the node answered.
struct Seen {
    sent: usize,
    cut: bool,
    answer: String,
}

/// One attacking connection: `head`; then (if `wait`) whatever the node answers within 2 s;
/// then up to [`BODY`] bytes in 64 KiB writes, stopping at the first failed one; then
/// whatever the node answers until it closes (or 10 s pass).
fn attack(addr: String, head: Vec<u8>, wait: bool) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).expect("connect");
        s.set_write_timeout(Some(Duration::from_secs(10)))
            .expect("write timeout");
        let mut answer = Vec::new();
        let mut cut = s.write_all(&head).is_err();
        if wait && !cut {
            s.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("read timeout");
            let _ = s.read_to_end(&mut answer);
        }
        let mut sent = 0;
        let chunk = vec![b'a'; 64 * 1024];
        while !cut && sent < BODY {
            cut = s.write_all(&chunk).is_err();
            sent += chunk.len();
        }
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let _ = s.read_to_end(&mut answer);
        Seen {
            sent,
            cut,
            answer: String::from_utf8_lossy(&answer).into_owned(),
        }
    })
}

/// Run `conns`, sampling the node's RSS and checking that `good` is served meanwhile;
/// the answers and the highest RSS seen.
fn under_attack(
    pid: u32,
    good: &mut Raw,
    conns: Vec<std::thread::JoinHandle<Seen>>,
) -> (Vec<Seen>, u64) {
    let mut peak = rss(pid);
    let mut i = 0;
    while !conns.iter().all(|h| h.is_finished()) {
        peak = peak.max(rss(pid));
        let key = format!("k{i}");
        assert_eq!(good.send(&["SET", &key, "v"]), R::ok(), "SET under attack");
        assert_eq!(good.send(&["GET", &key]), R::bulk("v"), "GET under attack");
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    peak = peak.max(rss(pid));
    let answers = conns
        .into_iter()
        .map(|h| h.join().expect("attacking thread"))
        .collect();
    (answers, peak)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_requests_are_small_and_input_is_capped() {
    let c = TestCluster::start_with("resp_before_login", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        let args = [
            "--acl-file".to_string(),
            path.display().to_string(),
            "--resp-query-buffer-total".into(),
            TOTAL_CAP.to_string(),
        ];
        (args.to_vec(), None)
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let addr = c.resp_addr(node);
    let pid = c.pid(node).expect("the node's pid");

    let mut good = Raw::login(&addr, "admin", "adminpw");
    assert_eq!(good.send(&["PING"]), R::Status("PONG".into()));
    let before = rss(pid);

    let started = Instant::now();
    let mut head = b"*4\r\n$16000000\r\n".to_vec();
    head.extend(std::iter::repeat_n(b'a', 4096));
    let conns = (0..40)
        .map(|_| attack(addr.clone(), head.clone(), true))
        .collect();
    let (answers, peak) = under_attack(pid, &mut good, conns);
    let refused = answers
        .iter()
        .filter(|s| s.answer == "-ERR Protocol error: unauthenticated bulk length\r\n")
        .count();
    eprintln!(
        "unauthenticated: RSS {} MB, peak {} MB, {refused} of {} refused",
        before >> 20,
        peak >> 20,
        answers.len()
    );
    assert!(
        peak.saturating_sub(before) < GROWTH && refused == answers.len(),
        "40 unauthenticated 16 MB requests: RSS {} MB -> peak {} MB (bound: +{} MB); \
         {refused} of {} refused; body sent, answer: {:?} (after {:?})",
        before >> 20,
        peak >> 20,
        GROWTH >> 20,
        answers.len(),
        answers
            .iter()
            .take(3)
            .map(|s| (s.sent, &s.answer))
            .collect::<Vec<_>>(),
        started.elapsed()
    );

    // Before AUTH: 11 arguments, or a bulk over 16 384 bytes, are refused at the header.
    let mut eleven = Raw::connect(&addr);
    eleven.write(&["PING"; 11]);
    assert_eq!(
        eleven.read(),
        R::err("ERR Protocol error: unauthenticated multibulk length")
    );
    let mut ten = Raw::connect(&addr);
    ten.write(&["PING"; 10]);
    assert_eq!(ten.read(), R::err("NOAUTH Authentication required."));
    // AUTH pipelined with a request too large for an unauthenticated connection.
    let mut piped = Raw::connect(&addr);
    let big = "b".repeat(20_000);
    piped.write(&["AUTH", "admin", "adminpw"]);
    piped.write(&["SET", "big", &big]);
    assert_eq!(piped.read(), R::ok(), "AUTH");
    assert_eq!(piped.read(), R::ok(), "SET of 20000 bytes after AUTH");

    // Authenticated connections: the node-wide cap closes the ones past it.
    let before = rss(pid);
    let mut auth_head = b"*3\r\n$4\r\nAUTH\r\n$5\r\nadmin\r\n$7\r\nadminpw\r\n".to_vec();
    auth_head.extend_from_slice(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16000000\r\n");
    let conns = (0..32)
        .map(|_| attack(addr.clone(), auth_head.clone(), false))
        .collect();
    let (answers, peak) = under_attack(pid, &mut good, conns);
    // The node writes its error before closing, but a client still writing may get a reset
    // instead of reading it: a failed write counts too.
    let capped = answers
        .iter()
        .filter(|s| s.cut || s.answer.contains(OVER_TOTAL))
        .count();
    eprintln!(
        "authenticated: RSS {} MB, peak {} MB, {capped} of {} closed by the cap",
        before >> 20,
        peak >> 20,
        answers.len()
    );
    assert!(
        peak.saturating_sub(before) < GROWTH && capped > 0,
        "32 authenticated unfinished 16 MB requests: RSS {} MB -> peak {} MB (bound: +{} MB); \
         {capped} closed by the node-wide cap; answers: {:?}",
        before >> 20,
        peak >> 20,
        GROWTH >> 20,
        answers
            .iter()
            .map(|s| (s.sent, s.cut, &s.answer[..s.answer.len().min(160)]))
            .collect::<Vec<_>>(),
    );
    assert_eq!(good.send(&["PING"]), R::Status("PONG".into()));
}
