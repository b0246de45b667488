//! The simulated operator (docs/operations.md), and the faults it answers:
//!
//! * **membership changes** — remove a member (the leader too) with `fenced member remove`,
//!   add a new one under a new id as a learner (`fenced member add --learner`), start it as
//!   `fenced serve --join` starts a joining node (an empty data dir, no `--initial-cluster`,
//!   the cluster's id looked up first: [`join_lookup`]), promote it once caught up. Ids are
//!   never reused ("Replace a node"). Each change goes through whichever member is up
//!   (`Node::admin`, which a follower forwards to the leader), one at a time, and only with
//!   every member up, so a majority of the voters stays up throughout;
//! * **wiped members** — a member's data dir deleted and the node restarted with its old
//!   command line (`--initial-cluster-state new`): an operator's mistake. It must neither
//!   vote nor accept entries until it has heard from every voter, and it retires when a peer
//!   knows its member under its old incarnation (tests/amnesia.rs). Its refusal or retirement
//!   is expected; the operator then replaces it (remove its id, add a new one). Rarely (with
//!   a backup to restore), a *majority* is wiped while the members that remember them are
//!   down: they must not elect a leader among themselves; the cluster stays without a quorum
//!   until the restore at the end of the faults;
//! * **backup and restore** — a backup taken from any member during the faults (`Node::backup`,
//!   what `fenced snapshot save` streams, written with the snapshot file's writer), and at
//!   the end of the faults the disaster procedure: stop every member, restore every member's
//!   data dir from the backup with the documented flags (`--bump-revision` 10^12), start them
//!   as a new cluster. [`check`] judges it (`restore`).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use fenced_fs::Fs;
use std::time::Duration;

use fenced_core::{Command, RequestId, Response};
use fenced_jepsen::checker::{linear, Op, Verdict};
use fenced_jepsen::history::Kind as EventKind;
use fenced_server::admin::{AdminDone, AdminOp};
use fenced_server::backup::{RestoreOptions, DEFAULT_BUMP_REVISION};
use fenced_server::config::DEFAULT_CLUSTER_TOKEN;
use fenced_server::NodeConfig;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Value};

use crate::world::{Cluster, Gone};

/// How long one admin call may take before the operator takes it as unanswered.
const ADMIN_CALL: Duration = Duration::from_secs(6);

/// The operator's state in one run.
pub struct Operator {
    /// A membership change, a wipe or its repair is under way: no other starts.
    busy: Cell<bool>,
    /// The next member id (ids are never reused).
    next_id: Cell<u64>,
    backup: RefCell<Option<Backup>>,
    /// A majority was wiped: only a restore brings the cluster back.
    majority_wiped: Cell<bool>,
}

impl Operator {
    pub fn new(next_id: u64) -> Operator {
        Operator {
            busy: Cell::new(false),
            next_id: Cell::new(next_id),
            backup: RefCell::new(None),
            majority_wiped: Cell::new(false),
        }
    }

    pub fn backup(&self) -> Option<Backup> {
        self.backup.borrow().clone()
    }

    pub fn majority_wiped(&self) -> bool {
        self.majority_wiped.get()
    }

    /// A membership change, a wipe or its repair is under way.
    pub fn busy(&self) -> bool {
        self.busy.get()
    }

    fn claim(&self) -> bool {
        if self.busy.get() || self.majority_wiped.get() {
            return false;
        }
        self.busy.set(true);
        true
    }
}

/// A backup taken during the run: the file, and when the call that took it ran.
#[derive(Clone, Debug)]
pub struct Backup {
    pub file: PathBuf,
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub index: u64,
    pub revision: u64,
}

/// `fenced serve --join`'s lookup (`join_lookup` in the binary), against the members up now:
/// the cluster's id if it lists member `id` as a learner at this address; `None` for a voter
/// restarting from its data dir; `Err` where the binary stops before starting the node.
pub fn join_lookup(cluster: &Cluster, id: u64, cfg: &NodeConfig) -> Result<Option<u64>, String> {
    let fresh = cluster
        .fs(id)
        .is_none_or(|fs| fenced_storage::datadir::holds_nothing_on(&fs, &cfg.data_dir));
    let answer = answering(cluster, id).map(|n| {
        let m = n.raft().metrics().borrow().clone();
        fenced_server::membership::JoinAnswer {
            leader: n.check_leader().is_ok(),
            cluster_id: n.gate().identity().cluster_id(),
            members: fenced_server::membership::members(&m)
                .into_iter()
                .map(|v| (v.id, v.addr, v.voter))
                .collect(),
        }
    });
    fenced_server::membership::join_decision(id, &cfg.grpc_addr, fresh, answer.as_ref())
        .map_err(|e| e.to_string())
}

/// How an admin command ended.
enum Admin {
    Done,
    /// Refused with this message (or no answer): nothing changed, or maybe it did.
    Not(String),
}

/// `fenced member …` through a random member that is up; "already …"/"not in the cluster"
/// (a repeat of a command that went through) counts as done, as the docs say.
async fn admin(cluster: &Cluster, rng: &mut StdRng, op: AdminOp, done_if: &str) -> Admin {
    let up: Vec<u64> = cluster
        .ids()
        .into_iter()
        .filter(|i| cluster.is_up(*i))
        .collect();
    let Some(&via) = up.choose(rng) else {
        return Admin::Not("no member is up".into());
    };
    let call = cluster.call(via, move |n| async move {
        tokio::time::timeout(ADMIN_CALL, n.admin(op)).await
    });
    match call.await {
        Ok(Ok(Ok(AdminDone::Members(_) | AdminDone::HandedOff { .. }))) => Admin::Done,
        Ok(Ok(Err(e))) if e.to_string().contains(done_if) => {
            cluster
                .trace()
                .line("operator", format!("n{via} answered: {e}"));
            Admin::Done
        }
        Ok(Ok(Err(e))) => Admin::Not(format!("n{via}: {e}")),
        Ok(Err(_)) => Admin::Not(format!("n{via}: no answer within {ADMIN_CALL:?}")),
        Err(Gone::Down) => Admin::Not(format!("n{via} is down")),
        Err(Gone::Lost) => Admin::Not(format!("n{via} crashed during the call")),
    }
}

/// Run `op` until it is done or `within` passes (a repeat is safe: see [`admin`]).
async fn admin_until(
    cluster: &Cluster,
    rng: &mut StdRng,
    op: AdminOp,
    done_if: &str,
    within: Duration,
) -> bool {
    let until = tokio::time::Instant::now() + within;
    loop {
        match admin(cluster, rng, op.clone(), done_if).await {
            Admin::Done => {
                cluster.trace().line("operator", format!("done: {op:?}"));
                return true;
            }
            Admin::Not(why) => {
                cluster
                    .trace()
                    .line("operator", format!("not yet: {op:?}: {why}"));
                if tokio::time::Instant::now() >= until {
                    cluster
                        .trace()
                        .line("operator", format!("gave up on {op:?}: {why}"));
                    return false;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(200..600))).await;
    }
}

/// `fenced member remove ID`, then stop the removed node for good.
async fn remove(cluster: &Cluster, rng: &mut StdRng, id: u64) -> bool {
    cluster
        .trace()
        .line("operator", format!("member remove {id}"));
    let op = AdminOp::MemberRemove { id };
    if !admin_until(
        cluster,
        rng,
        op,
        "not in the cluster",
        Duration::from_secs(15),
    )
    .await
    {
        // No answer is not a no: the change may have been made. The operator looks, as
        // docs/operations.md says (`fenced member list`).
        if listed(cluster, id) != Some(false) {
            return false;
        }
        cluster.trace().line(
            "operator",
            format!("member list: n{id} is not a member any more"),
        );
    }
    cluster.crash(id).await;
    cluster.set_gone(id);
    cluster
        .trace()
        .line("operator", format!("n{id} removed and stopped"));
    true
}

/// The member an operator's command about member `id` gets its answer from: the leader if
/// one is up, else the first other member up.
fn answering(cluster: &Cluster, id: u64) -> Option<fenced_server::node::Node> {
    let mut nodes: Vec<_> = cluster
        .ids()
        .into_iter()
        .filter(|i| *i != id)
        .filter_map(|i| cluster.node(i))
        .filter(|n| n.health().is_ok())
        .collect();
    let at = nodes
        .iter()
        .position(|n| n.check_leader().is_ok())
        .unwrap_or(0);
    (at < nodes.len()).then(|| nodes.swap_remove(at))
}

/// Whether member `id` is in the membership as a member that is up sees it (the leader's
/// view if one leads; `None` if no member is up).
fn listed(cluster: &Cluster, id: u64) -> Option<bool> {
    let m = answering(cluster, id)?.raft().metrics().borrow().clone();
    Some(
        fenced_server::membership::members(&m)
            .iter()
            .any(|v| v.id == id),
    )
}

/// `fenced member add ID ADDR --learner`, `fenced serve --join` on an empty data dir, and
/// `fenced member promote ID` once it has caught up.
async fn add(cluster: &Cluster, rng: &mut StdRng) -> Option<u64> {
    let op = cluster.operator();
    let id = op.next_id.get();
    op.next_id.set(id + 1);
    let addr = cluster.add_joining(id);
    cluster
        .trace()
        .line("operator", format!("member add {id} {addr} --learner"));
    let add = AdminOp::MemberAdd {
        id,
        addr,
        learner: true,
        wait_ms: 0,
    };
    if !admin_until(cluster, rng, add, "already a", Duration::from_secs(15)).await {
        // It may have been added after all: take it out again, or leave it out.
        let op = AdminOp::MemberRemove { id };
        admin_until(
            cluster,
            rng,
            op,
            "not in the cluster",
            Duration::from_secs(15),
        )
        .await;
        cluster.set_gone(id);
        return None;
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cluster.is_up(id) && tokio::time::Instant::now() < until {
        cluster.start(id).await;
        if !cluster.is_up(id) {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    cluster
        .trace()
        .line("operator", format!("member promote {id}"));
    let promote = AdminOp::MemberPromote { id };
    admin_until(
        cluster,
        rng,
        promote,
        "already a voter",
        Duration::from_secs(20),
    )
    .await;
    Some(id)
}

/// The membership fault: replace a member (maybe the leader) by a new one, when every member
/// is up and no other change is under way.
pub async fn change(cluster: Cluster, mut rng: StdRng) {
    let op = cluster.operator();
    if !op.claim() {
        return;
    }
    let ids = cluster.ids();
    if ids.iter().all(|i| cluster.is_up(*i)) {
        let leader = cluster.leader();
        let victim = match leader {
            Some(l) if rng.gen_bool(0.4) => l,
            _ => *ids.choose(&mut rng).unwrap_or(&1),
        };
        if ids.len() as u64 >= cluster.spec().nodes {
            remove(&cluster, &mut rng, victim).await;
        }
        let pause = Duration::from_millis(rng.gen_range(0..2_000));
        tokio::time::sleep(pause).await;
    }
    if (cluster.ids().len() as u64) < cluster.spec().nodes {
        add(&cluster, &mut rng).await;
    }
    op.busy.set(false);
}

/// The wipe fault: a member loses its data dir and restarts with its old command line. The
/// operator notices (it refuses or retires, or has not come back in 10 s) and replaces it.
/// With `majority`, and a backup to restore, a majority is wiped while the others are down.
pub async fn wipe(cluster: Cluster, mut rng: StdRng, majority: bool) {
    let op = cluster.operator();
    if !op.claim() {
        return;
    }
    let mut ids = cluster.ids();
    if !ids.iter().all(|i| cluster.is_up(*i)) {
        op.busy.set(false);
        return;
    }
    ids.shuffle(&mut rng);
    if majority && op.backup().is_some() {
        let (wiped, others) = ids.split_at(ids.len() / 2 + 1);
        cluster.trace().line(
            "nemesis",
            format!("wipe a majority {wiped:?} while {others:?} are down"),
        );
        op.majority_wiped.set(true);
        for id in others.iter().chain(wiped) {
            cluster.crash(*id).await;
        }
        for id in wiped {
            cluster.wipe(*id);
            cluster.start(*id).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(500..3_000))).await;
        for id in others {
            cluster.start(*id).await;
        }
        // Busy for good: the restore brings the cluster back.
        return;
    }
    let id = ids[0];
    cluster
        .trace()
        .line("nemesis", format!("wipe n{id} and restart it unchanged"));
    cluster.crash(id).await;
    cluster.wipe(id);
    tokio::time::sleep(Duration::from_millis(rng.gen_range(0..500))).await;
    cluster.start(id).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    while cluster.is_up(id) && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    repair(&cluster, &mut rng, id).await;
    op.busy.set(false);
}

/// Replace wiped member `id`: stop it, remove its id, add a new member.
async fn repair(cluster: &Cluster, rng: &mut StdRng, id: u64) {
    cluster
        .trace()
        .line("operator", format!("n{id} lost its data: replace it"));
    cluster.crash(id).await;
    if remove(cluster, rng, id).await {
        add(cluster, rng).await;
    }
}

/// At the end of the faults: let a change under way finish, and replace the wiped members
/// not replaced yet (unless a majority was wiped: the restore follows).
pub async fn finish(cluster: &Cluster, rng: &mut StdRng) {
    let op = cluster.operator();
    if op.majority_wiped() {
        return;
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    while op.busy.get() && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in cluster.ids() {
        if cluster.is_wiped(id) || cluster.stopped(id).is_some() {
            repair(cluster, rng, id).await;
        }
    }
}

/// Take a backup at `at` from a random member that is up, as `fenced snapshot save` does
/// (the node's `Node::backup`: a linearizable read barrier, then its state), written to a
/// snapshot file in the run's dir. Tries again for a while if no node can.
pub async fn take_backup(cluster: Cluster, mut rng: StdRng, at: tokio::time::Instant) {
    tokio::time::sleep_until(at).await;
    for _ in 0..20 {
        let up: Vec<u64> = cluster
            .ids()
            .into_iter()
            .filter(|i| cluster.is_up(*i))
            .collect();
        if let Some(&id) = up.choose(&mut rng) {
            let invoke_ns = cluster.trace().now_ns();
            let r = cluster
                .call(id, |n| async move {
                    tokio::time::timeout(Duration::from_secs(5), n.backup()).await
                })
                .await;
            if let Ok(Ok(Ok((meta, machine)))) = r {
                let complete_ns = cluster.trace().now_ns();
                let file = cluster.root().join("backup.snap");
                let written = std::fs::File::create(&file).and_then(|f| {
                    let mut w = std::io::BufWriter::new(f);
                    fenced_storage::snapshot::write_to(&mut w, &meta, &machine)
                        .map_err(std::io::Error::other)?;
                    w.flush()?;
                    w.into_inner().map_err(|e| e.into_error())?.sync_all()
                });
                if let Err(e) = written {
                    cluster
                        .trace()
                        .line("operator", format!("backup not written: {e}"));
                    return;
                }
                let b = Backup {
                    file,
                    invoke_ns,
                    complete_ns,
                    index: meta.last_log_id.map_or(0, |l| l.index),
                    revision: machine.revision(),
                };
                cluster.trace().line(
                    "operator",
                    format!(
                        "snapshot save from n{id}: index {}, revision {}",
                        b.index, b.revision
                    ),
                );
                *cluster.operator().backup.borrow_mut() = Some(b);
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1_000))).await;
    }
    cluster.trace().line("operator", "no backup could be taken");
}

/// What the restored cluster answered: register values, and grants of every lock.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    /// Register key, value read after the restore (`None`: nil), or why no read succeeded.
    pub reads: Vec<(String, Result<Option<String>, String>)>,
    /// Lock, token granted after the restore, or why no grant.
    pub grants: Vec<(String, Result<u64, String>)>,
}

/// The disaster procedure: stop every member, restore each one's data dir from `backup`
/// (`fenced snapshot restore FILE --data-dir D --id I --initial-cluster C`, default
/// `--bump-revision`), start them as a new cluster. Returns what went wrong, if anything.
pub async fn restore(cluster: &Cluster, backup: &Backup) -> Vec<String> {
    let members: BTreeMap<u64, String> = cluster
        .ids()
        .into_iter()
        .filter_map(|id| cluster.addr(id).map(|a| (id, a)))
        .collect();
    cluster.trace().line(
        "operator",
        format!(
            "restore every member {:?} from the backup (index {})",
            members.keys().collect::<Vec<_>>(),
            backup.index
        ),
    );
    cluster.stop_all().await;
    let mut errors = Vec::new();
    for id in members.keys() {
        let Some(dir) = cluster.dir(*id) else {
            continue;
        };
        // The old dir is moved away (here: deleted); restore wants none or an empty one.
        let Some(fs) = cluster.fs(*id) else {
            continue;
        };
        let _ = fs.remove_dir_all(&dir);
        let env = fenced_storage::Env::new(std::sync::Arc::new(fs), fenced_storage::Io::Inline);
        let opts = RestoreOptions {
            snapshot: backup.file.clone(),
            data_dir: dir,
            member_id: *id,
            members: members.clone(),
            cluster_token: DEFAULT_CLUSTER_TOKEN.to_owned(),
            bump_revision: DEFAULT_BUMP_REVISION,
        };
        match fenced_server::backup::restore_on(&env, &opts) {
            Ok(r) => cluster.trace().line(
                "operator",
                format!(
                    "n{id} restored: revision {} -> {}, {} locks and {} sessions dropped",
                    r.revision_before, r.revision_after, r.locks_dropped, r.sessions_dropped
                ),
            ),
            Err(e) => errors.push(format!("restoring n{id}: {e}")),
        }
    }
    cluster.restored(&members);
    for id in members.keys() {
        cluster.start(*id).await;
    }
    errors
}

/// Read every register and take every lock on the restored cluster (retrying for a while).
pub async fn probe(cluster: &Cluster, rng: &mut StdRng, keys: usize, locks: usize) -> Probe {
    let mut p = Probe::default();
    for k in 0..keys {
        let key = format!("k{k}");
        let last = on_any_member(cluster, rng, "no read", |id, _| {
            let kb = key.clone().into_bytes();
            async move {
                let r = cluster
                    .call(id, move |n| async move {
                        n.read_clone_timed(move |sm, now| {
                            sm.kv().read(now, &[b"GET".to_vec(), kb.clone()])
                        })
                        .await
                    })
                    .await;
                match r {
                    Ok(Ok(Some(fenced_core::kv::Reply::Bulk(v)))) => {
                        Ok(Some(String::from_utf8_lossy(&v).into_owned()))
                    }
                    Ok(Ok(Some(fenced_core::kv::Reply::Nil) | None)) => Ok(None),
                    Ok(Ok(other)) => Err(format!("{other:?}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(g) => Err(format!("n{id}: {g:?}")),
                }
            }
        })
        .await;
        p.reads.push((key, last));
    }
    for l in 0..locks {
        let lock = format!("L{l}");
        let last = on_any_member(cluster, rng, "no grant", |id, seq| {
            let rid = RequestId {
                client_id: 900_000 + l as u64,
                seq,
            };
            let cmd = Command::Acquire {
                name: lock.clone(),
                owner: "after-restore".into(),
                ttl_ms: 1_000,
                session: None,
                wait_ms: 0,
            };
            async move {
                let r = cluster
                    .call(id, move |n| async move { n.propose(Some(rid), cmd).await })
                    .await;
                match r {
                    Ok(Ok(Response::Granted { token, .. })) => Ok(token),
                    Ok(Ok(other)) => Err(format!("{other:?}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(g) => Err(format!("n{id}: {g:?}")),
                }
            }
        })
        .await;
        p.grants.push((lock, last));
    }
    p
}

/// `attempt(node, try)` through a random member, tries 1 to 40 250 ms apart, until one
/// succeeds: its answer, or the last error (`none` if no member was there to try).
async fn on_any_member<T, F, Fut>(
    cluster: &Cluster,
    rng: &mut StdRng,
    none: &str,
    mut attempt: F,
) -> Result<T, String>
where
    F: FnMut(u64, u64) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let mut last = Err(none.to_owned());
    for tried in 1..=40 {
        let ids = cluster.ids();
        let Some(&id) = ids.choose(rng) else { break };
        last = attempt(id, tried).await;
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    last
}

/// The `restore` checker. With `ops` the history before the restore (the clients stopped
/// before it), `backup` the backup's call and `probe` what the restored cluster answered:
///
/// * the restored cluster serves: every register read and every lock grant succeeded;
/// * fencing never goes backwards: every token granted after the restore exceeds every token
///   the history shows before it (granted, or presented to the storage);
/// * the registers hold the backup's point: each value read after the restore is one the
///   register could have had while the backup call ran — checked by adding, for each key, a
///   `get` of that value spanning the backup call to the register history and requiring it
///   to stay linearizable. Writes acknowledged after the backup are lost by design (the
///   docs say so) and are not required.
pub fn check(ops: &[Op], backup: &Backup, probe: &Probe) -> Verdict {
    let mut examples = Vec::new();
    let before = ops.iter().filter_map(|o| o.token).max().unwrap_or(0);
    for (lock, g) in &probe.grants {
        match g {
            Ok(t) if *t <= before => examples.push(format!(
                "{lock}: token {t} granted after the restore, not above {before} granted before it"
            )),
            Ok(_) => {}
            Err(e) => examples.push(format!("{lock}: no grant after the restore: {e}")),
        }
    }
    let mut registers: Vec<Op> = ops
        .iter()
        .filter(|o| matches!(o.f.as_str(), "get" | "put" | "cas"))
        .cloned()
        .collect();
    for (i, (key, r)) in probe.reads.iter().enumerate() {
        match r {
            Ok(v) => registers.push(Op {
                process: u64::MAX - i as u64,
                f: "get".into(),
                key: Some(key.clone()),
                kind: EventKind::Ok,
                invoke: backup.invoke_ns,
                complete: Some(backup.complete_ns),
                value_in: None,
                value_out: Some(v.as_ref().map_or(Value::Null, |s| json!(s))),
                token: None,
                ttl_ms: None,
                error: None,
                admitted: None,
                mode: None,
                permits: None,
            }),
            Err(e) => examples.push(format!("{key}: no read after the restore: {e}")),
        }
    }
    let linear = linear::check(&registers, linear::DEFAULT_BUDGET);
    if linear.valid == Some(false) {
        for e in linear.examples.iter().take(3) {
            examples.push(format!(
                "the registers read after the restore are not the backup's point: {e}"
            ));
        }
    }
    Verdict::new(
        "restore",
        examples.len() as u64,
        examples,
        json!({ "tokens_before_max": before, "backup_index": backup.index }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(process: u64, f: &str, key: &str, invoke: u64, complete: u64) -> Op {
        Op {
            process,
            f: f.into(),
            key: Some(key.into()),
            kind: EventKind::Ok,
            invoke,
            complete: Some(complete),
            value_in: None,
            value_out: None,
            token: None,
            ttl_ms: None,
            error: None,
            admitted: None,
            mode: None,
            permits: None,
        }
    }

    fn history() -> Vec<Op> {
        let mut a = op(1, "put", "k0", 10, 20);
        a.value_in = Some(json!("a"));
        // Written after the backup (at 30..40): lost by the restore, as documented.
        let mut b = op(1, "put", "k0", 50, 60);
        b.value_in = Some(json!("b"));
        let mut g = op(2, "acquire", "L0", 10, 20);
        g.token = Some(7);
        vec![a, b, g]
    }

    fn backup() -> Backup {
        Backup {
            file: PathBuf::new(),
            invoke_ns: 30,
            complete_ns: 40,
            index: 5,
            revision: 7,
        }
    }

    fn probe(value: Option<&str>, token: u64) -> Probe {
        Probe {
            reads: vec![("k0".into(), Ok(value.map(str::to_owned)))],
            grants: vec![("L0".into(), Ok(token))],
        }
    }

    #[test]
    fn the_backups_point_and_higher_tokens_pass() {
        let v = check(&history(), &backup(), &probe(Some("a"), 1_000_000_000_008));
        assert_eq!(v.valid, Some(true), "{v:?}");
    }

    #[test]
    fn a_token_that_goes_backwards_fails() {
        let v = check(&history(), &backup(), &probe(Some("a"), 3));
        assert_eq!(v.valid, Some(false), "{v:?}");
        assert!(v.examples[0].contains("not above 7"), "{v:?}");
    }

    #[test]
    fn a_register_not_at_the_backups_point_fails() {
        // "b" was written after the backup: a restore cannot hold it; nil lost "a".
        for wrong in [Some("b"), None] {
            let v = check(&history(), &backup(), &probe(wrong, 1_000_000_000_008));
            assert_eq!(v.valid, Some(false), "{wrong:?}: {v:?}");
        }
    }

    #[test]
    fn a_cluster_that_does_not_serve_after_the_restore_fails() {
        let mut p = probe(Some("a"), 1_000_000_000_008);
        p.grants[0].1 = Err("not the leader".into());
        let v = check(&history(), &backup(), &p);
        assert_eq!(v.valid, Some(false), "{v:?}");
    }
}
