//! A real 3-node etcd cluster on loopback (Debian's `etcd`), to run one test body against
//! etcd and against fenced: node `i` listens on `{net}.{i}` (a network of its own from
//! [`super::cluster::free_net`]), clients on port 23790, peers on 23800. Dropping it
//! SIGKILLs and reaps every member.

use std::process::{Child, Command, Stdio};

use super::cluster::{die_with_this_test, free_net};

pub const ETCD_CLIENT_PORT: u16 = 23790;
pub const ETCD_PEER_PORT: u16 = 23800;

pub struct EtcdCluster {
    net: String,
    children: Vec<Child>,
    // Declared last: removed after the members are dead.
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Start three `etcd` members; they elect a leader on their own (wait for it with a
    /// client request that retries).
    pub fn start(test: &str) -> EtcdCluster {
        super::programs::require("etcd", &["--version"]);
        let net = free_net(test);
        let dir = tempfile::Builder::new()
            .prefix(&format!("etcd-{test}-"))
            .tempdir()
            .expect("creating the temp dir");
        let peer = |i: u64| format!("http://{net}.{i}:{ETCD_PEER_PORT}");
        let initial: Vec<String> = (1..=3).map(|i| format!("e{i}={}", peer(i))).collect();
        let mut children = Vec::new();
        for i in 1..=3u64 {
            let client = format!("http://{net}.{i}:{ETCD_CLIENT_PORT}");
            let log = std::fs::File::create(dir.path().join(format!("etcd-{i}.log")))
                .expect("etcd log file");
            let mut cmd = Command::new("etcd");
            cmd.arg("--name")
                .arg(format!("e{i}"))
                .arg("--data-dir")
                .arg(dir.path().join(format!("e{i}")))
                .arg("--listen-client-urls")
                .arg(&client)
                .arg("--advertise-client-urls")
                .arg(&client)
                .arg("--listen-peer-urls")
                .arg(peer(i))
                .arg("--initial-advertise-peer-urls")
                .arg(peer(i))
                .arg("--initial-cluster")
                .arg(initial.join(","))
                .arg("--initial-cluster-state")
                .arg("new")
                .arg("--initial-cluster-token")
                .arg(test)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log handle"))
                .stderr(log);
            die_with_this_test(&mut cmd);
            children.push(
                cmd.spawn().unwrap_or_else(|e| {
                    panic!("starting etcd (apt-get install -y etcd-server): {e}")
                }),
            );
        }
        EtcdCluster { net, children, dir }
    }

    /// Every member's client address (`host:port`).
    pub fn endpoints(&self) -> Vec<String> {
        (1..=3)
            .map(|i| format!("{}.{i}:{ETCD_CLIENT_PORT}", self.net))
            .collect()
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
