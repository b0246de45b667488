//! The nemesis's hand on a running test: applying and undoing a fault, and the watchdog
//! that restarts servers the nemesis did not stop (moved out of `run.rs`, unchanged).

use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::{Exits, Layout};
use crate::env::Env;
use crate::history::{Event, HistoryWriter, Kind, Process, RunClock};
use crate::nemesis::Fault;
use crate::proxy::Proxies;

/// Both fenced's test hook and the Redis shim read a signed integer of milliseconds.
pub(super) fn write_clock(dir: &Path, node: &str, offset_ms: i64) -> anyhow::Result<()> {
    let text = format!("{offset_ms}\n");
    let p = dir.join(node);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
}

/// `retired`: fenced nodes that left for good; kill and restart nemeses leave them alone.
/// Membership changes are not applied here (see `membership.rs`).
pub(super) fn apply(
    env: &mut Env,
    proxies: Option<&Proxies>,
    l: &Layout,
    f: &Fault,
    start: bool,
    retired: &[String],
) -> anyhow::Result<()> {
    match f {
        Fault::Partition { grudge, .. } => match proxies {
            Some(p) => {
                if start {
                    for (victim, from) in grudge {
                        for f in from {
                            p.set_cut(victim, f, true);
                        }
                    }
                } else {
                    p.heal_all();
                }
            }
            None => {
                if start {
                    for (victim, from) in grudge {
                        env.drop_from(victim, from)?;
                    }
                } else {
                    env.heal()?;
                }
            }
        },
        Fault::Kill { targets } | Fault::RestartEmpty { targets, .. } => {
            for t in targets.iter().filter(|t| !retired.contains(t)) {
                if start {
                    env.kill(t)?;
                } else {
                    if matches!(f, Fault::RestartEmpty { .. }) {
                        // Redis keeps nothing on disk here; make sure of it.
                        let d = l.data_dir.join(t);
                        let _ = std::fs::remove_dir_all(&d);
                        std::fs::create_dir_all(&d)?;
                    }
                    if env.pid(t).is_none() {
                        env.start(t)?;
                    }
                }
            }
        }
        Fault::Pause { targets } => {
            for t in targets {
                if start {
                    env.pause(t)?;
                } else {
                    env.resume(t)?;
                }
            }
        }
        Fault::Clock { targets, offset_ms } => {
            for t in targets {
                write_clock(&l.clock_dir, t, if start { *offset_ms } else { 0 })?;
            }
        }
        Fault::Membership { .. } => {}
    }
    Ok(())
}

/// A server process that exited without the nemesis killing it (a crash — or something
/// outside the harness killing it) is logged in the history and restarted. Except a fenced
/// node that the nemesis restarted with an empty data dir (`wiped`) and that exits with
/// status 1: its peers refused its new incarnation and it retired itself, as it must; it is
/// logged once (`retired`) and stays down.
pub(crate) fn watchdog(
    env: &mut Env,
    nodes: &[String],
    nem: &mut HistoryWriter,
    clock: &RunClock,
    exits: &mut Exits,
) -> anyhow::Result<()> {
    for n in nodes {
        if let Some(st) = env.exited(n) {
            if exits.removed.contains(n) {
                let what = format!("{n} exited ({st}) after its removal from the members");
                nem.write(
                    &Event::new(Process::nemesis(), Kind::Info, "member-exit", clock.now())
                        .value(json!(what)),
                )?;
                continue;
            }
            if exits.wiped.contains(n) && st.code() == Some(1) {
                let what = format!(
                    "{n} exited ({st}) after a restart with an empty data dir: it refused to \
                     rejoin under a new incarnation (retired); not restarted"
                );
                nem.write(
                    &Event::new(Process::nemesis(), Kind::Info, "retired", clock.now())
                        .value(json!(what)),
                )?;
                exits.retired.push(n.clone());
                continue;
            }
            let what = format!("{n} exited unexpectedly ({st}); restarted");
            nem.write(
                &Event::new(
                    Process::nemesis(),
                    Kind::Info,
                    "unexpected-exit",
                    clock.now(),
                )
                .value(json!(what)),
            )?;
            exits
                .unexpected
                .push(format!("{:.1} s: {what}", clock.now() as f64 / 1e9));
            env.start(n)?;
        }
    }
    Ok(())
}
