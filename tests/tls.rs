//! TLS end to end: 3 real `fenced` processes started with `--tls-cert/--tls-key/--tls-ca`
//! (certificates made here with rcgen for the nodes' loopback IPs).
//!
//! * Raft and forwarding run over TLS between the nodes: a leader is elected, a lock taken
//!   through a follower is forwarded, and after a leader SIGKILL the next grant's token is
//!   larger.
//! * Clients must speak TLS and trust the cluster CA: plaintext gRPC, a client trusting
//!   another CA, and plaintext RESP get nothing.
//! * The node-to-node services (Raft, Forward) refuse callers without a CA-signed
//!   certificate, even over TLS: no client can read or change Raft internals.
//! * RESP over TLS with unchanged clients: redis-cli `--tls` and redis-py's `Lock`
//!   (`ssl=True`).
//! * `--tls-require-client-cert --tls-client-ca`: API and RESP clients without a certificate
//!   are refused, with one of the client CA they are served — and that certificate does not
//!   open the node-to-node services.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fenced_client::{Client, ClientOptions, ClientTls};
use fenced_proto::raft::forward_client::ForwardClient;
use fenced_proto::raft::raft_client::RaftClient;
use fenced_proto::raft::{ProposeRequest, RaftRequest};
use support::{follower_of, require, run_bounded, Pki, TestCluster, LEADER_TIMEOUT};

const TTL: Duration = Duration::from_secs(30);

/// Start a TLS cluster: the cluster (node) CA `good-ca.pem`, node certificate `node.pem` for
/// the three IPs, a client certificate `client.pem` of the node CA, a client CA
/// `clients-ca.pem` with its certificate `member.pem`, and an unrelated CA `rogue-ca.pem` with
/// its certificate `rogue.pem`. `mtls`: clients must present a certificate, of the client CA
/// (`--tls-require-client-cert --tls-client-ca`); the harness's clients present `member.pem`.
fn start(test: &str, mtls: bool) -> TestCluster {
    TestCluster::start_with(test, move |dir, ips| {
        let good = Pki::new(dir, "good");
        let (cert, key) = good.issue("node", ips);
        good.issue("client", &["client".to_string()]);
        let clients = Pki::new(dir, "clients");
        clients.issue("member", &["client".to_string()]);
        let rogue = Pki::new(dir, "rogue");
        rogue.issue("rogue", &["client".to_string()]);
        let mut args = vec![
            "--tls-cert".to_string(),
            cert,
            "--tls-key".into(),
            key,
            "--tls-ca".into(),
            good.path("good-ca.pem"),
        ];
        let mut tls = ClientTls::load(Path::new(&good.path("good-ca.pem"))).expect("client CA");
        if mtls {
            args.push("--tls-require-client-cert".into());
            args.push("--tls-client-ca".into());
            args.push(clients.path("clients-ca.pem"));
            tls = tls
                .with_identity(
                    Path::new(&clients.path("member.pem")),
                    Path::new(&clients.path("member.key")),
                )
                .expect("client identity");
        }
        (args, Some(tls))
    })
}

fn file(c: &TestCluster, name: &str) -> String {
    c.dir().join(name).display().to_string()
}

/// A client of node `id` with these TLS settings (None: plaintext), giving up after 2 s.
fn client_with(c: &TestCluster, id: u64, tls: Option<ClientTls>) -> Client {
    Client::connect_with(
        [c.grpc_addr(id)],
        ClientOptions {
            tls,
            retry_for: Duration::from_secs(2),
            ..ClientOptions::default()
        },
    )
    .expect("client")
}

async fn try_acquire(client: &Client, name: &str) -> Result<Option<u64>, String> {
    tokio::time::timeout(
        Duration::from_secs(20),
        client.acquire(name, "tester", TTL, Duration::ZERO, 0),
    )
    .await
    .map_err(|_| "acquire hung".to_string())?
    .map(|g| g.map(|g| g.token))
    .map_err(|e| e.to_string())
}

/// A raw channel to node `id`'s gRPC port over TLS trusting `ca`, presenting `identity`.
fn raw_channel(
    c: &TestCluster,
    id: u64,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> tonic::transport::Channel {
    let mut tls = ClientTls::load(Path::new(ca)).expect("CA");
    if let Some((cert, key)) = identity {
        tls = tls
            .with_identity(Path::new(cert), Path::new(key))
            .expect("identity");
    }
    fenced_tls::endpoint(&c.grpc_addr(id), Some(&tls.grpc()))
        .expect("endpoint")
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_end_to_end() {
    let c = start("tls", false);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = follower_of(leader);

    // A lock through a follower: forwarded to the leader over TLS.
    let first = try_acquire(&c.client_of(follower), "tls-a")
        .await
        .expect("acquire over TLS")
        .expect("free lock granted");

    // Plaintext and a wrong CA get nothing.
    let plain = try_acquire(&client_with(&c, leader, None), "tls-b").await;
    assert!(plain.is_err(), "plaintext gRPC was served: {plain:?}");
    let rogue_ca = ClientTls::load(Path::new(&file(&c, "rogue-ca.pem"))).expect("rogue CA");
    let wrong = try_acquire(&client_with(&c, leader, Some(rogue_ca)), "tls-b").await;
    assert!(
        wrong.is_err(),
        "a client trusting another CA connected: {wrong:?}"
    );

    // Node-to-node services: refused without a certificate, and with a foreign one.
    let good_ca = file(&c, "good-ca.pem");
    let vote = RaftRequest::default();
    let no_cert = RaftClient::new(raw_channel(&c, leader, &good_ca, None))
        .vote(vote.clone())
        .await
        .expect_err("Raft vote without a node certificate");
    assert_eq!(no_cert.code(), tonic::Code::PermissionDenied, "{no_cert:?}");
    let fwd = ForwardClient::new(raw_channel(&c, leader, &good_ca, None))
        .propose(ProposeRequest::default())
        .await
        .expect_err("Forward without a node certificate");
    assert_eq!(fwd.code(), tonic::Code::PermissionDenied, "{fwd:?}");
    let (rogue_cert, rogue_key) = (file(&c, "rogue.pem"), file(&c, "rogue.key"));
    let foreign = RaftClient::new(raw_channel(
        &c,
        leader,
        &good_ca,
        Some((&rogue_cert, &rogue_key)),
    ))
    .vote(vote)
    .await
    .expect_err("Raft vote with a certificate of another CA");
    assert_ne!(foreign.code(), tonic::Code::Ok);

    // HTTP/1.1 over TLS on the client port: fenced offers ALPN `http/1.1` beside `h2`
    // (tonic's own TLS offered only `h2`, and an HTTP/1.1-only client failed the handshake).
    let url = format!("https://{}/no-such-path", c.grpc_addr(follower));
    let (code, body) = curl(&["--http1.1", "--cacert", &good_ca, &url]);
    assert_eq!(code, "404", "HTTP/1.1 over TLS: {body}");
    assert_eq!(body, "404 page not found\n");
    let (code, _) = curl(&["--http2", "--cacert", &good_ca, &url]);
    assert_eq!(code, "404", "HTTP/2 over TLS");
    let (code, _) = curl(&[&format!("http://{}/no-such-path", c.grpc_addr(follower))]);
    assert_eq!(code, "000", "plaintext HTTP was served");

    // RESP over TLS with unchanged clients.
    require("redis-cli", &["--version"]);
    {
        let mut cli = Command::new("redis-cli");
        cli.args([
            "--tls",
            "--cacert",
            &good_ca,
            "-h",
            &c.ip(follower),
            "-p",
            "7379",
        ]);
        let script = "SET tls-key v1\nGET tls-key\nLOCK.ACQUIRE tls-resp alice 30000\n";
        let (ok, out, err) = run_bounded(cli, script, Duration::from_secs(60));
        assert!(ok, "redis-cli --tls: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.first().copied(), Some("OK"), "{out}");
        assert_eq!(lines.get(1).copied(), Some("v1"), "{out}");
        let token: u64 = lines
            .get(2)
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("LOCK.ACQUIRE token: {out}"));
        assert!(token > first, "RESP grant {token} after gRPC grant {first}");

        let mut plain = Command::new("redis-cli");
        plain.args(["-h", &c.ip(follower), "-p", "7379", "GET", "tls-key"]);
        let (_, out, _) = run_bounded(plain, "", Duration::from_secs(30));
        assert!(!out.contains("v1"), "plaintext RESP was served: {out}");
    }
    require("python3", &["-c", "import redis"]);
    {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/resp/redis_py_lock.py"
        );
        let mut py = Command::new("python3");
        py.args([script, &c.ip(leader), "7379", "3", &good_ca]);
        let (ok, out, err) = run_bounded(py, "", Duration::from_secs(120));
        assert!(ok, "redis-py Lock over TLS:\n{out}\n{err}");
        assert!(out.contains("redis-py lock ok"), "{out}");
    }

    // Failover: the surviving nodes elect a leader over TLS; tokens keep increasing.
    c.kill(leader);
    let next = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(next, leader);
    let after = try_acquire(&c.client(), "tls-c")
        .await
        .expect("acquire after failover")
        .expect("free lock granted");
    assert!(
        after > first,
        "token {after} after failover, {first} before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_require_client_cert() {
    let c = start("tls_mtls", true);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let good_ca = file(&c, "good-ca.pem");

    let anonymous = ClientTls::load(Path::new(&good_ca)).expect("CA");
    let refused = try_acquire(&client_with(&c, leader, Some(anonymous)), "m").await;
    assert!(
        refused.is_err(),
        "client without a certificate served: {refused:?}"
    );
    let token = try_acquire(&c.client(), "m")
        .await
        .expect("acquire with a client certificate");
    assert!(token.is_some());

    // A client certificate (of the client CA) is not a node certificate.
    let (member, member_key) = (file(&c, "member.pem"), file(&c, "member.key"));
    let denied = RaftClient::new(raw_channel(
        &c,
        leader,
        &good_ca,
        Some((&member, &member_key)),
    ))
    .vote(RaftRequest::default())
    .await
    .expect_err("Raft vote with a client certificate");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    // Node-CA certificates still reach the API (nodes forward to each other through it).
    let (node_ca_client, node_ca_key) = (file(&c, "client.pem"), file(&c, "client.key"));
    let other = ClientTls::load(Path::new(&good_ca))
        .and_then(|t| t.with_identity(Path::new(&node_ca_client), Path::new(&node_ca_key)))
        .expect("identity");
    let accepted = try_acquire(&client_with(&c, leader, Some(other)), "m2").await;
    assert!(
        accepted.is_ok(),
        "a node-CA certificate at the API: {accepted:?}"
    );

    // HTTP over TLS: without a client certificate refused, with one served.
    let url = format!("https://{}/no-such-path", c.grpc_addr(leader));
    let (code, _) = curl(&["--http1.1", "--cacert", &good_ca, &url]);
    assert_eq!(code, "000", "HTTP/1.1 without a client certificate served");
    let (code, body) = curl(&[
        "--http1.1",
        "--cacert",
        &good_ca,
        "--cert",
        &member,
        "--key",
        &member_key,
        &url,
    ]);
    assert_eq!(code, "404", "HTTP/1.1 with a client certificate: {body}");

    require("redis-cli", &["--version"]);
    {
        let (cert, key) = (member.clone(), member_key.clone());
        let base = ["--tls", "--cacert", good_ca.as_str(), "-h"];
        let mut with = Command::new("redis-cli");
        with.args(base)
            .arg(c.ip(leader))
            .args(["-p", "7379", "--cert", &cert, "--key", &key, "PING"]);
        let (_, out, err) = run_bounded(with, "", Duration::from_secs(30));
        assert_eq!(
            out.trim(),
            "PONG",
            "redis-cli with a client certificate: {err}"
        );
        let mut without = Command::new("redis-cli");
        without
            .args(base)
            .arg(c.ip(leader))
            .args(["-p", "7379", "PING"]);
        let (_, out, _) = run_bounded(without, "", Duration::from_secs(30));
        assert!(
            !out.contains("PONG"),
            "redis-cli without a certificate served: {out}"
        );
    }
}

/// `curl -s ARGS` with a 20 s limit: (HTTP status code, "000" when no response; body).
fn curl(args: &[&str]) -> (String, String) {
    require("curl", &["--version"]);
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args);
    let (_, out, _) = run_bounded(cmd, "", Duration::from_secs(30));
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", out.as_str()));
    (code.trim().to_owned(), body.to_owned())
}

/// Bad TLS flags stop `fenced serve` at once with a message naming the problem.
#[test]
fn bad_tls_flags_are_clear_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path().display().to_string();
    let run = |args: &[&str]| {
        let mut cmd = Command::new(support::bin());
        cmd.arg("serve")
            .args(["--data-dir", &format!("{d}/data")])
            .args(["--grpc-addr", "127.0.0.1:0", "--resp-addr", "127.0.0.1:0"])
            .args(args);
        let (ok, out, err) = run_bounded(cmd, "", Duration::from_secs(30));
        assert!(!ok, "fenced serve {args:?} started: {out}");
        err
    };
    let err = run(&["--tls-cert", "/nonexistent/node.pem"]);
    assert!(err.contains("--tls-key") || err.contains("tls-ca"), "{err}");
    let missing = format!("{d}/missing.pem");
    let err = run(&[
        "--tls-cert",
        &missing,
        "--tls-key",
        &missing,
        "--tls-ca",
        &missing,
    ]);
    assert!(
        err.contains("cannot read certificate") && err.contains("missing.pem"),
        "{err}"
    );
    let junk = format!("{d}/junk.pem");
    std::fs::write(&junk, "not a certificate").expect("writing junk");
    let err = run(&["--tls-cert", &junk, "--tls-key", &junk, "--tls-ca", &junk]);
    assert!(err.contains("no PEM certificate"), "{err}");
}
