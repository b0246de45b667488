//! fenced-bench: the same lock workload against fenced, Redis, Redis with AOF, Redlock and
//! etcd (the backends are in `fenced-backends`). The binary is in `main.rs`; the measuring loop
//! and the CPU accounting live here.

pub mod cpu;
pub mod kv;
pub mod kvbench;
pub mod leases;
pub mod load;
pub mod memory;
pub mod watch;
