//! The `membership` nemesis at run time: replace one voter of the fenced cluster by a new
//! node, with fenced's own operator commands, while the clients run.
//!
//! A change (`Fault::Membership`) goes the way docs/operations.md ("Replace a node") tells an
//! operator to go:
//!
//! * start: (`dead` only: SIGKILL the old node first — its disk died), `fenced member add ID
//!   ADDR --learner`, start the new node (`fenced serve --id ID --join …` on an empty data
//!   dir, on its own host, which was made before the run), `fenced member promote ID` until
//!   it has caught up. The cluster has one voter more until the end of the window.
//! * end: take the old node out of the published member list (clients stop picking it),
//!   `fenced member remove OLD` — the leader, if it is the one — and stop it for good.
//!
//! The commands run on a host of their own (`m`) against the current members, and are retried
//! on a transient failure ("no leader", a timeout, a learner not caught up yet, a quorum not
//! heard from yet); a retry answered "already a learner/voter" or "not in the cluster" means
//! an earlier attempt went through and its answer was lost. Every step, retry and outcome is a
//! nemesis event in the history (`member-add`, `member-join`, `member-promote`,
//! `member-remove`, `member-stop`, `member-retry`, `member-error`), between the change's
//! `start-membership` and `stop-membership`; every command and its output goes to
//! `logs/member-cli.log`.
//!
//! The clients learn the members from a file (`members`: the indices of the serving nodes in
//! their endpoint lists, which hold every node of the run) that they read whenever they
//! (re)connect — the harness's stand-in for DNS or service discovery.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::env::Env;
use crate::history::{Event, HistoryWriter, Kind, Process, RunClock};
use crate::nemesis::Fault;
use crate::run::{self, Exits, Layout, TestOpts, GRPC_PORT};

/// The host the nemesis runs `fenced member …` from.
pub const ADMIN_HOST: &str = "m";
/// One `fenced member …` call (the CLI itself retries an unavailable cluster for 15 s).
const CALL_LIMIT: Duration = Duration::from_secs(30);
/// How long one step keeps retrying.
const ADD_LIMIT: Duration = Duration::from_secs(60);
const PROMOTE_LIMIT: Duration = Duration::from_secs(90);
const REMOVE_LIMIT: Duration = Duration::from_secs(60);

/// What a membership step needs from the run loop; the watchdog keeps running while a step
/// waits.
pub(crate) struct Cx<'a> {
    pub(crate) env: &'a mut Env,
    pub(crate) nem: &'a mut HistoryWriter,
    pub(crate) clock: &'a RunClock,
    pub(crate) exits: &'a mut Exits,
    pub(crate) nodes: &'a [String],
}

impl Cx<'_> {
    fn tick(&mut self) -> anyhow::Result<()> {
        run::watchdog(self.env, self.nodes, self.nem, self.clock, self.exits)
    }

    fn log(&mut self, f: &str, what: String) -> anyhow::Result<()> {
        self.nem.write(
            &Event::new(Process::nemesis(), Kind::Info, f, self.clock.now()).value(json!(what)),
        )?;
        Ok(())
    }

    /// Sleep `d`, the watchdog running.
    fn wait(&mut self, d: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + d;
        loop {
            if run::interrupted() {
                bail!("interrupted");
            }
            self.tick()?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
    }
}

/// How a `fenced` command ended.
struct CliOut {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// A step that reached its goal.
struct Done {
    attempts: u32,
    /// Refusals that only mean "not yet" (a learner catching up, a quorum not heard from).
    not_yet: u32,
    /// Set when the goal was found already reached after a retry.
    note: String,
    /// The members after the step (`fenced member …`'s output), if it said.
    members: Option<Value>,
}

/// A refusal that says the cluster is not ready yet, not that the change is wrong.
fn not_yet(err: &str) -> bool {
    [
        "behind",
        "has not caught up",
        "answered the leader",
        "undergoing a configuration change",
        "in progress",
    ]
    .iter()
    .any(|m| err.contains(m))
}

/// fenced refused the change itself (`invalid request: …`), as opposed to not answering.
fn refusal(err: &str) -> bool {
    err.contains("invalid request")
}

/// Voter ids in `fenced member …`'s output.
fn voters(members: &Value) -> Vec<u64> {
    members
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["voter"] == true)
        .filter_map(|m| m["id"].as_u64())
        .collect()
}

/// One change in progress: how far its start got.
struct Change {
    join: String,
    id: u64,
    remove: String,
    dead: bool,
    added: bool,
    started: bool,
    promoted: bool,
    rec: serde_json::Map<String, Value>,
}

/// The members as the nemesis changed them, and what every change did.
pub(crate) struct Members {
    fenced: PathBuf,
    /// Every node of the run (`Layout::nodes`): member id = index + 1.
    names: Vec<String>,
    grpc: Vec<String>,
    /// The nodes serving now, in the order they joined.
    live: Vec<String>,
    /// A live voter being removed: no longer published to the clients, but still one of the
    /// endpoints of `fenced member …` — it may be the leader, and a follower does not forward
    /// membership calls (nor does the client follow a leader hint outside its endpoints).
    leaving: Option<String>,
    file: PathBuf,
    cli_log: PathBuf,
    out_dir: PathBuf,
    change: Option<Change>,
    records: Vec<Value>,
    completed: usize,
}

impl Members {
    pub(crate) fn new(
        o: &TestOpts,
        l: &Layout,
        env: &Env,
        file: PathBuf,
    ) -> anyhow::Result<Members> {
        let grpc = l
            .nodes
            .iter()
            .map(|n| env.host(n).map(|h| format!("{}:{GRPC_PORT}", h.ip)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Members {
            fenced: run::find_program("fenced", &o.bin_dir)?,
            names: l.nodes.clone(),
            grpc,
            live: l.nodes[..l.initial].to_vec(),
            leaving: None,
            file,
            cli_log: o.out.join("logs").join("member-cli.log"),
            out_dir: o.out.clone(),
            change: None,
            records: vec![],
            completed: 0,
        })
    }

    pub(crate) fn file(&self) -> &Path {
        &self.file
    }

    pub(crate) fn live(&self) -> &[String] {
        &self.live
    }

    pub(crate) fn records(&self) -> &[Value] {
        &self.records
    }

    /// Changes that went through to the end (old voter removed).
    pub(crate) fn completed(&self) -> usize {
        self.completed
    }

    fn index(&self, name: &str) -> anyhow::Result<usize> {
        self.names
            .iter()
            .position(|n| n == name)
            .with_context(|| format!("no node {name}"))
    }

    fn name_of(&self, id: u64) -> String {
        self.names
            .get((id as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or_else(|| format!("id {id}"))
    }

    /// Write the serving nodes' indices for the clients (atomically: write, then rename).
    pub(crate) fn publish(&self) -> anyhow::Result<()> {
        let idx: Vec<String> = self
            .live
            .iter()
            .filter_map(|n| self.index(n).ok())
            .map(|i| i.to_string())
            .collect();
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, format!("{}\n", idx.join(" ")))
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.file).with_context(|| format!("renaming {}", tmp.display()))?;
        Ok(())
    }

    /// The members' gRPC endpoints for `fenced member …`: the serving ones and the one
    /// leaving.
    fn endpoints(&self) -> String {
        self.live
            .iter()
            .chain(&self.leaving)
            .filter_map(|n| self.index(n).ok())
            .map(|i| self.grpc[i].clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Run `fenced ARGS --endpoints <members>` on the admin host, bounded by [`CALL_LIMIT`],
    /// the watchdog running meanwhile. The command and its output go to the CLI log.
    fn cli(&self, cx: &mut Cx, args: &[String]) -> anyhow::Result<CliOut> {
        let eps = self.endpoints();
        let out_path = self.out_dir.join("logs").join("member-cli.stdout");
        let err_path = self.out_dir.join("logs").join("member-cli.stderr");
        let stdout = std::fs::File::create(&out_path)?;
        let stderr = std::fs::File::create(&err_path)?;
        let mut cmd = cx.env.command(ADMIN_HOST, &self.fenced)?;
        cmd.args(args)
            .arg("--endpoints")
            .arg(&eps)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let t0 = cx.clock.now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting fenced {}", args.join(" ")))?;
        let until = Instant::now() + CALL_LIMIT;
        let status = loop {
            if let Some(st) = child.try_wait()? {
                break Some(st);
            }
            if Instant::now() >= until || run::interrupted() {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            cx.tick()?;
            std::thread::sleep(Duration::from_millis(20));
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let mut stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        if status.is_none() {
            stderr.push_str(&format!(
                "(no answer within {CALL_LIMIT:?}: killed by the harness)"
            ));
        }
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.cli_log)?;
        let _ = writeln!(
            log,
            "[{:.3} s → {:.3} s] fenced {} --endpoints {eps}: {}\n{}{}",
            t0 as f64 / 1e9,
            cx.clock.now() as f64 / 1e9,
            args.join(" "),
            status.map_or("timed out".to_owned(), |s| s.to_string()),
            stdout,
            stderr
        );
        Ok(CliOut {
            ok: status.is_some_and(|s| s.success()),
            stdout: stdout.trim().to_owned(),
            stderr: stderr.trim().to_owned(),
        })
    }

    /// Run a membership command until it goes through, or its refusal shows the goal already
    /// reached (`reached`, given the error and the attempt number), or `limit` passes.
    /// "Not yet" refusals are retried quietly (counted); other failures (no leader, timeouts)
    /// are retried and logged as `member-retry`; any other refusal ends the step.
    fn until_done(
        &self,
        cx: &mut Cx,
        args: &[String],
        limit: Duration,
        reached: fn(&str, u32) -> bool,
    ) -> anyhow::Result<Result<Done, String>> {
        let give_up = Instant::now() + limit;
        let mut attempts = 0;
        let mut quiet = 0;
        loop {
            attempts += 1;
            let r = self.cli(cx, args)?;
            if r.ok {
                return Ok(Ok(Done {
                    attempts,
                    not_yet: quiet,
                    note: String::new(),
                    members: serde_json::from_str(&r.stdout).ok(),
                }));
            }
            let err = r.stderr.lines().last().unwrap_or("").to_owned();
            if reached(&err, attempts) {
                return Ok(Ok(Done {
                    attempts,
                    not_yet: quiet,
                    note: format!(" (attempt {attempts} answered {err:?})"),
                    members: None,
                }));
            }
            let what = format!("fenced {}", args.join(" "));
            if refusal(&err) && !not_yet(&err) {
                return Ok(Err(format!("{what}: refused: {err}")));
            }
            if Instant::now() >= give_up {
                return Ok(Err(format!(
                    "{what}: gave up after {attempts} attempts over {limit:?}: {err}"
                )));
            }
            if not_yet(&err) {
                quiet += 1;
                cx.wait(Duration::from_millis(250))?;
            } else {
                cx.log(
                    "member-retry",
                    format!("{what} (attempt {attempts}) failed: {err}; retrying"),
                )?;
                cx.wait(Duration::from_millis(500))?;
            }
        }
    }

    /// The leader's id as `fenced status` tells it (`None`: no answer or no leader).
    fn leader(&self, cx: &mut Cx) -> anyhow::Result<Option<u64>> {
        let r = self.cli(cx, &["status".into()])?;
        Ok(serde_json::from_str::<Value>(&r.stdout)
            .ok()
            .and_then(|v| v["leader"].as_u64()))
    }

    fn voter_names(&self, members: &Option<Value>) -> String {
        match members {
            Some(m) => {
                let v: Vec<String> = voters(m).into_iter().map(|id| self.name_of(id)).collect();
                format!("[{}]", v.join(", "))
            }
            None => "?".into(),
        }
    }

    /// Start a change: (dead: kill the old node), add the new node as a learner, start it,
    /// promote it once it has caught up.
    pub(crate) fn start(
        &mut self,
        cx: &mut Cx,
        o: &TestOpts,
        l: &Layout,
        fault: &Fault,
    ) -> anyhow::Result<()> {
        let Fault::Membership {
            join,
            id,
            remove,
            dead,
        } = fault
        else {
            bail!("not a membership change: {fault:?}");
        };
        let mut ch = Change {
            join: join.clone(),
            id: *id,
            remove: remove.clone(),
            dead: *dead,
            added: false,
            started: false,
            promoted: false,
            rec: serde_json::Map::new(),
        };
        ch.rec.insert("join".into(), json!(join));
        ch.rec.insert("id".into(), json!(id));
        ch.rec.insert("remove".into(), json!(remove));
        ch.rec.insert("dead".into(), json!(dead));
        ch.rec.insert("start_s".into(), json!(secs(cx.clock.now())));
        let r = self.start_steps(cx, o, l, &mut ch);
        if let Err(e) = &r {
            ch.rec.insert("error".into(), json!(format!("{e:#}")));
        }
        self.change = Some(ch);
        r
    }

    fn start_steps(
        &mut self,
        cx: &mut Cx,
        o: &TestOpts,
        l: &Layout,
        ch: &mut Change,
    ) -> anyhow::Result<()> {
        if ch.dead {
            cx.exits.removed.push(ch.remove.clone());
            cx.env.kill(&ch.remove)?;
            self.live.retain(|n| *n != ch.remove);
            self.publish()?;
            cx.log(
                "member-stop",
                format!("{} SIGKILLed: its disk died, it stays down", ch.remove),
            )?;
        }
        let i = self.index(&ch.join)?;
        let addr = self.grpc[i].clone();
        let args = vec![
            "member".into(),
            "add".into(),
            ch.id.to_string(),
            addr.clone(),
            "--learner".into(),
        ];
        let done = self.until_done(cx, &args, ADD_LIMIT, |e, _| e.contains("already a learner"))?;
        let d = match done {
            Ok(d) => d,
            Err(e) => {
                cx.log("member-error", e.clone())?;
                bail!("{e}");
            }
        };
        ch.added = true;
        ch.rec.insert("add_attempts".into(), json!(d.attempts));
        cx.log(
            "member-add",
            format!(
                "{} (id {}, {addr}) added as a learner{}",
                ch.join, ch.id, d.note
            ),
        )?;
        let join_eps: Vec<String> = self.endpoints().split(',').map(str::to_owned).collect();
        let spec = run::node_spec(o, l, cx.env, i, &join_eps)?;
        cx.env.spawn(&ch.join, spec)?;
        ch.started = true;
        cx.log(
            "member-join",
            format!(
                "{} started: empty data dir, --join {}",
                ch.join,
                join_eps.join(",")
            ),
        )?;
        let t0 = Instant::now();
        let args = vec!["member".into(), "promote".into(), ch.id.to_string()];
        let done = self.until_done(cx, &args, PROMOTE_LIMIT, |e, _| {
            e.contains("already a voter")
        })?;
        let d = match done {
            Ok(d) => d,
            Err(e) => {
                cx.log("member-error", e.clone())?;
                bail!("{e}");
            }
        };
        ch.promoted = true;
        let took = t0.elapsed().as_secs_f64();
        ch.rec.insert("promote_after_s".into(), json!(round3(took)));
        ch.rec.insert("promote_not_yet".into(), json!(d.not_yet));
        self.live.push(ch.join.clone());
        self.publish()?;
        cx.log(
            "member-promote",
            format!(
                "{} promoted to voter {took:.1} s after it started ({} \"not caught up yet\" \
                 refusals){}; voters now {}",
                ch.join,
                d.not_yet,
                d.note,
                self.voter_names(&d.members)
            ),
        )?;
        Ok(())
    }

    /// End the change: remove the old voter and stop it for good. A change whose start did
    /// not get through is undone instead (the learner removed, a killed old node restarted).
    pub(crate) fn stop(&mut self, cx: &mut Cx) -> anyhow::Result<()> {
        let Some(mut ch) = self.change.take() else {
            return Ok(());
        };
        let r = if ch.promoted {
            self.finish(cx, &mut ch)
        } else {
            self.undo(cx, &mut ch)
        };
        if let Err(e) = &r {
            ch.rec
                .entry("error")
                .or_insert_with(|| json!(format!("{e:#}")));
        }
        ch.rec.insert("end_s".into(), json!(secs(cx.clock.now())));
        self.records.push(Value::Object(ch.rec));
        r
    }

    fn finish(&mut self, cx: &mut Cx, ch: &mut Change) -> anyhow::Result<()> {
        if !ch.dead {
            // Drain: clients that reconnect go elsewhere from now on.
            self.live.retain(|n| *n != ch.remove);
            self.leaving = Some(ch.remove.clone());
            self.publish()?;
        }
        let old = self.index(&ch.remove)? as u64 + 1;
        let leader = self.leader(cx)?;
        let was_leader = leader == Some(old);
        ch.rec.insert("removed_leader".into(), json!(was_leader));
        if !cx.exits.removed.contains(&ch.remove) {
            cx.exits.removed.push(ch.remove.clone());
        }
        let args = vec!["member".into(), "remove".into(), old.to_string()];
        let done = self.until_done(cx, &args, REMOVE_LIMIT, |e, attempt| {
            attempt > 1 && e.contains("is not in the cluster")
        })?;
        let result = match done {
            Ok(d) => {
                let after = self.voter_names(&d.members);
                ch.rec.insert("voters_after".into(), json!(after));
                ch.rec.insert("remove_attempts".into(), json!(d.attempts));
                cx.log(
                    "member-remove",
                    format!(
                        "{} (id {old}{}) removed{}; voters now {after}",
                        ch.remove,
                        if was_leader { ", the leader" } else { "" },
                        d.note
                    ),
                )?;
                self.completed += 1;
                ch.rec.insert("completed".into(), json!(true));
                Ok(())
            }
            Err(e) => {
                cx.log("member-error", e.clone())?;
                Err(anyhow::anyhow!("{e}"))
            }
        };
        self.leaving = None;
        if !ch.dead {
            cx.env.kill(&ch.remove)?;
            cx.log(
                "member-stop",
                format!("{} stopped for good (SIGKILL)", ch.remove),
            )?;
        }
        result
    }

    fn undo(&mut self, cx: &mut Cx, ch: &mut Change) -> anyhow::Result<()> {
        ch.rec.insert("completed".into(), json!(false));
        let mut first_err = None;
        if ch.added {
            let args = vec!["member".into(), "remove".into(), ch.id.to_string()];
            match self.until_done(cx, &args, REMOVE_LIMIT, |e, attempt| {
                attempt > 1 && e.contains("is not in the cluster")
            })? {
                Ok(_) => cx.log(
                    "member-remove",
                    format!("{} removed again: it never became a voter", ch.join),
                )?,
                Err(e) => {
                    cx.log("member-error", e.clone())?;
                    first_err = Some(anyhow::anyhow!("{e}"));
                }
            }
        }
        if ch.started {
            cx.exits.removed.push(ch.join.clone());
            cx.env.kill(&ch.join)?;
            cx.log("member-stop", format!("{} stopped for good", ch.join))?;
        }
        if ch.dead {
            // Its data is intact: a restart, like the kill nemesis'.
            cx.exits.removed.retain(|n| *n != ch.remove);
            if cx.env.pid(&ch.remove).is_none() {
                cx.env.start(&ch.remove)?;
            }
            self.live.push(ch.remove.clone());
            self.publish()?;
            cx.log(
                "member-restart",
                format!(
                    "{} restarted from its data dir: the change was undone",
                    ch.remove
                ),
            )?;
        }
        first_err.map_or(Ok(()), Err)
    }
}

fn secs(ns: u64) -> f64 {
    round3(ns as f64 / 1e9)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_refusals() {
        let behind = "fenced: Client specified an invalid argument: invalid request: learner 4 \
                      is 812 entries behind the leader; promote it once it has caught up";
        assert!(refusal(behind) && not_yet(behind));
        let quorum = "fenced: invalid request: the voters would be {1, 2, 4}, which need 2 \
                      reachable to commit, but only [1] answered the leader in the last 2s";
        assert!(not_yet(quorum));
        let again = "fenced: invalid request: member 4 is already a learner at 10.213.0.14:7380";
        assert!(refusal(again) && !not_yet(again));
        let down =
            "fenced: cluster unavailable: 10.213.0.11:7380: not the leader (leader: unknown)";
        assert!(!refusal(down) && !not_yet(down));
        let m: Value = serde_json::from_str(
            r#"[{"id":1,"voter":true},{"id":4,"voter":false},{"id":5,"voter":true}]"#,
        )
        .expect("json");
        assert_eq!(voters(&m), [1, 5]);
    }
}
