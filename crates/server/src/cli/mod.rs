//! Subcommands of `fenced` that are not `serve`, each in its own module.

pub mod debug;
pub mod etcd;
pub mod snapshot;
