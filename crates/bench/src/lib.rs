//! fenced-bench: the same lock workload against fenced, Redis, Redis with AOF, Redlock and
//! etcd. The binary is in `main.rs`; the etcd backend and the measuring loop live here.

pub mod cpu;
pub mod etcd;
pub mod load;
