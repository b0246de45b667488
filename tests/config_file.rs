//! `fenced serve --config FILE`: a node started from a TOML file (flags on the command line
//! win), and a file with a typo refused before anything starts.
//!
//! Run: `cargo test -p fenced-server --test config_file`.

#[path = "support/mod.rs"]
mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fenced_client::Client;
use support::{bin, free_net, wait_for};

/// Kills the node when the test ends, passing or failing.
struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_runs_from_a_config_file_and_flags_win() {
    let net = free_net("config_file");
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("from-config");
    let grpc = format!("{net}.1:7380");
    let config = dir.path().join("fenced.toml");
    std::fs::write(
        &config,
        format!(
            "data-dir = {data:?}\ngrpc-addr = \"{grpc}\"\nresp-addr = \"{net}.1:7379\"\n\
             heartbeat-ms = 5000\n"
        ),
    )
    .expect("write config");
    // heartbeat-ms 5000 in the file is invalid with the default election timeout; the flag
    // on the command line wins, so the node starts.
    let log = std::fs::File::create(dir.path().join("node.log")).expect("log");
    let mut cmd = Command::new(bin());
    cmd.args(["serve", "--heartbeat-ms", "50", "--config"])
        .arg(&config)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .stdin(Stdio::null());
    support::die_with_this_test(&mut cmd);
    let child = cmd.spawn().expect("start fenced");
    let _node = Node(child);
    let client = Client::connect([grpc.as_str()]).expect("client");
    let status = wait_for(
        "the node from the config file",
        Duration::from_secs(30),
        || async {
            client
                .status()
                .await
                .map_err(|e| e.to_string())
                .and_then(|s| {
                    if s.leader == 1 {
                        Ok(s)
                    } else {
                        Err(format!("{s:?}"))
                    }
                })
        },
    )
    .await;
    assert_eq!(status.id, 1);
    assert!(
        data.join("identity").exists(),
        "data dir from the config file"
    );
}

#[test]
fn a_typo_in_the_config_file_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().expect("tmp");
    let data = dir.path().join("data");
    let config = dir.path().join("fenced.toml");
    std::fs::write(&config, format!("data-dir = {data:?}\nhearbeat-ms = 50\n")).expect("write");
    let out = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .expect("run fenced");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("unknown key 'hearbeat-ms'") && err.contains("did you mean 'heartbeat-ms'"),
        "{err}"
    );
    assert!(!data.exists(), "a refused config created the data dir");
}

/// The example in packaging/ names only real flags (checked by the parser; `--id 0` then stops
/// the node before it starts anything).
#[test]
fn the_example_config_file_is_valid() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../packaging/fenced.toml");
    let out = Command::new(bin())
        .args(["serve", "--id", "0", "--config", example])
        .output()
        .expect("run fenced");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--id must be at least 1"), "{err}");
}
