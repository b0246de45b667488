//! Harness for multi-process cluster tests: three real `fenced serve` processes on loopback.
//!
//! Every cluster gets its own network: node `i` (1..=3) listens on `127.{run}.{k}.{i}`, gRPC
//! port 7380 and RESP port 7379, where `k` counts the clusters of the test process (assigned
//! in [`cluster::free_net`], nothing to pick by hand), so the tests of a binary go in parallel
//! without port clashes. `run` (1..=254) separates concurrent runs of the suite on one
//! machine: `FENCED_TEST_NET` if set, else derived from the process id; if any address of a
//! cluster is taken, the next `run` is tried. Everything stays inside 127.0.0.0/8 (Linux
//! routes all of it to `lo`).
//!
//! Every node's stdout and stderr go to `node-<i>.log` in the cluster's temp dir; when a test
//! panics, the tail of each log is printed. The [`TestCluster`] guard SIGKILLs and reaps every
//! child on drop, and the children get `PR_SET_PDEATHSIG` so that they die with the test even
//! if the test process itself is killed.
//!
//! Every wait in here is bounded and panics with a message saying what it waited for.
//!
//! By concern: [`cluster`] (the processes, addresses, status and catch-up waits), [`wait`]
//! (bounded waiting), [`programs`] (outside programs: required, run with a time limit),
//! [`etcd`] (etcd API calls), [`etcd_cluster`] (a real etcd cluster, to hold fenced to),
//! [`holders`] (the holders' log of a lock recipe), [`resp`] (redis-rs connections), [`raw`]
//! (a blocking RESP client showing replies exactly as sent),
//! [`http`] (GETs of a node's metrics listener), [`pki`] (certificates for TLS tests).
#![allow(dead_code)]

pub mod cluster;
pub mod etcd;
pub mod etcd_cluster;
pub mod holders;
pub mod http;
pub mod pki;
pub mod programs;
pub mod raw;
pub mod resp;
pub mod wait;

// Each test binary uses a different part of these.
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use etcd::*;
#[allow(unused_imports)]
pub use etcd_cluster::*;
#[allow(unused_imports)]
pub use holders::*;
#[allow(unused_imports)]
pub use http::*;
#[allow(unused_imports)]
pub use pki::*;
#[allow(unused_imports)]
pub use programs::*;
#[allow(unused_imports)]
pub use raw::*;
#[allow(unused_imports)]
pub use resp::*;
#[allow(unused_imports)]
pub use wait::*;
