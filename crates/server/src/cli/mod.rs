//! Subcommands of `fenced` that are not `serve`, each in its own module, and `serve`'s
//! signal handling (`signals`).

pub mod alarm;
pub mod debug;
pub mod etcd;
pub mod limits;
pub mod lock;
pub mod signals;
pub mod snapshot;
