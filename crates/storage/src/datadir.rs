//! Starting from a data dir: bootstrap a new member, resume an existing one, or refuse.
//!
//! The rules (README, "Losing a disk"):
//! * An empty data dir bootstraps only when told to ([`Plan::may_bootstrap`]: the operator's
//!   `--initial-cluster-state new`, or a single-node cluster of itself). It gets a new
//!   [`Identity`] with a fresh random incarnation.
//! * A data dir whose identity says it has state, but whose Raft state is gone, is refused.
//! * A data dir of another member id, or of a retired member, is refused.
//! * Damage inside the Raft state is refused by [`crate::open`].
//!
//! Nothing is created or changed in a data dir that is refused.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use fenced_fs::Fs;
use fenced_raft_types::identity::{self, Identity, IdentityStore, MemberState};
use fenced_raft_types::NodeId;
use sha2::{Digest, Sha256};

use crate::{hardstate, Env, EventSink, LogStore, StateMachineStore, StoreError};

/// What the operator asked for.
#[derive(Clone, Debug)]
pub struct Plan {
    pub member_id: NodeId,
    /// The id of a cluster bootstrapped by this start ([`cluster_id`]).
    pub cluster_id: u64,
    /// An empty data dir may bootstrap a new cluster.
    pub may_bootstrap: bool,
    /// `fenced serve --join`: the running cluster lists this member as a *learner*, and this
    /// is its cluster id. An empty data dir then becomes a learner of that cluster (no
    /// bootstrap), and a learner's data dir that holds no Raft state yet may start again (a
    /// learner's acknowledgements never counted towards a commit).
    pub join: Option<u64>,
}

/// A data dir ready for Raft.
pub struct Opened {
    pub identity: Arc<IdentityStore>,
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    /// Initialize Raft with the initial membership, then mark the identity
    /// [`MemberState::Ready`].
    pub bootstrap: bool,
}

/// The cluster id of a new cluster: a hash of `--initial-cluster-token` and the initial
/// members (as etcd derives its cluster id), so every member bootstrapped with the same flags
/// agrees on it without talking first. Different clusters need different tokens or members.
pub fn cluster_id(token: &str, members: &BTreeMap<NodeId, String>) -> u64 {
    hash_cluster_id(token, members, None)
}

/// The cluster id of a cluster restored from a snapshot (`fenced snapshot restore`,
/// `--force-new-cluster`): never the id of the cluster the snapshot came from, the same on
/// every member restored from the same file with the same flags — and different whenever
/// the members would start from different states. It covers `source` (the snapshot file's
/// SHA-256, or what names a recovery), `--bump-revision`, and the digest of `state`, the
/// prepared state every member starts from ([`fenced_core::StateMachine::digest`]): members
/// restored with different bumps issue different tokens for the same command, so they must
/// refuse each other rather than form one cluster.
pub fn restored_cluster_id(
    token: &str,
    members: &BTreeMap<NodeId, String>,
    source: &[u8],
    bump_revision: u64,
    state: &fenced_core::StateMachine,
) -> u64 {
    let mut salt = source.to_vec();
    salt.extend_from_slice(b"\0bump\0");
    salt.extend_from_slice(&bump_revision.to_be_bytes());
    salt.extend_from_slice(b"\0state\0");
    salt.extend_from_slice(&state.digest().to_be_bytes());
    hash_cluster_id(token, members, Some(&salt))
}

fn hash_cluster_id(token: &str, members: &BTreeMap<NodeId, String>, salt: Option<&[u8]>) -> u64 {
    let mut h = Sha256::new();
    h.update(b"fenced-cluster\0");
    h.update(token.as_bytes());
    for (id, addr) in members {
        h.update(b"\0");
        h.update(id.to_string().as_bytes());
        h.update(b"=");
        h.update(addr.as_bytes());
    }
    if let Some(salt) = salt {
        h.update(b"\0restored\0");
        h.update(salt);
    }
    let digest = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first).max(1)
}

const REPLACE_HINT: &str = "A member that lost its data must not rejoin under its old identity: \
     it would vote without the entries it acknowledged. Replace it as the README explains \
     ('Losing a disk')";

fn is_fresh(fs: &dyn Fs, dir: &Path) -> Result<bool, StoreError> {
    match fs.read_dir(dir) {
        Ok(entries) => Ok(entries.is_empty()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(error) => Err(StoreError::file(dir, error)),
    }
}

/// Whether `dir` on `fs` holds nothing a member acknowledged from: no identity, no hard
/// state, no sled files of an older layout. `--join`'s lookup asks this, not whether the dir
/// is empty: a start that a full disk cut short while it created the dir leaves files
/// behind, yet nothing Raft acknowledged (fenced-sim, seed 1700938).
pub fn holds_nothing_on(fs: &dyn Fs, dir: &Path) -> bool {
    !fs.exists(&identity::path_in(dir))
        && !fs.exists(&hardstate::HardState::path_in(dir))
        && !crate::open::has_sled(fs, dir)
}

/// Open `dir` under `plan`'s rules (see the module docs), on the real file system, its
/// stores doing their blocking work on threads ([`Env::default`]).
pub fn open(dir: &Path, plan: &Plan, events: EventSink) -> Result<Opened, StoreError> {
    open_with(dir, plan, events, Env::default())
}

/// [`open`], on the file system and with the blocking work placed as `env` says (an
/// [`Io`](crate::Io) alone: on the real file system).
pub fn open_with(
    dir: &Path,
    plan: &Plan,
    events: EventSink,
    env: impl Into<Env>,
) -> Result<Opened, StoreError> {
    let env = env.into();
    let fs = &*env.fs;
    let shown = dir.display();
    if is_fresh(fs, dir)? {
        return bootstrap_empty(dir, plan, events, &env);
    }

    let loaded = identity::load_on(fs, dir).map_err(|e| unusable(dir, e.into()))?;
    let had_hard_state = fs.exists(&hardstate::HardState::path_in(dir));
    // sled's files: a data dir of an older layout (upgraded by `crate::open`). Every data dir
    // that ever held Raft state has the hard-state file or these.
    let has_raft_files = had_hard_state || crate::has_sled(fs, dir);
    // Every file of a store made whole (before the log is opened, which makes them): a
    // learner that has not received anything yet has them, a member that lost its Raft state
    // does not.
    let store_made = had_hard_state
        && fs.exists(&crate::purged::Purged::path_in(dir))
        && fs.exists(&dir.join(crate::wal::DIR));
    if loaded.is_none() && !has_raft_files {
        // Other files only (a mount point's lost+found, say): as good as empty.
        return bootstrap_empty(dir, plan, events, &env);
    }
    if let Some(id) = &loaded {
        if id.member_id != plan.member_id {
            return Err(StoreError::Refused(format!(
                "data dir {shown} belongs to member {} (cluster {}), not to --id {}",
                id.member_id,
                fenced_raft_types::identity::fmt_cluster_id(id.cluster_id),
                plan.member_id
            )));
        }
        if let MemberState::Retired { reason } = &id.state {
            return Err(StoreError::Refused(format!(
                "data dir {shown} belongs to a retired incarnation of member {}: {reason}. \
                 {REPLACE_HINT}.",
                id.member_id
            )));
        }
        if id.state == MemberState::Ready && !has_raft_files && plan.join.is_none() {
            return Err(no_state(dir, id));
        }
    }
    let (log, state_machine) = crate::open_with(dir, events.clone(), env.clone())?;
    let holds_state = log.holds_state();
    let identity = match loaded {
        Some(id) => {
            if id.state == MemberState::Ready && !holds_state {
                match plan.join {
                    Some(cluster) if cluster == id.cluster_id => {
                        tracing::info!("a learner without Raft state yet: joining again")
                    }
                    // Restarted while `--join`'s lookup had no answer (every member down,
                    // say): it acknowledged nothing yet, and waits for the leader's log as
                    // before (found by fenced-sim, seed 1000170).
                    _ if store_made => tracing::info!(
                        "a learner without Raft state yet: waiting for the leader's log"
                    ),
                    _ => return Err(no_state(dir, &id)),
                }
            }
            id
        }
        None if !holds_state => {
            // An empty store and no identity: as good as empty.
            drop((log, state_machine));
            return bootstrap_empty(dir, plan, events, &env);
        }
        None if had_hard_state => {
            return Err(unusable(
                dir,
                StoreError::Damaged {
                    path: identity::path_in(dir),
                    detail: "the file is missing, but the Raft state is there".into(),
                },
            ));
        }
        None => {
            // A data dir from before identities: it keeps its state and gets an identity
            // with a fresh incarnation (peers pin it on first contact).
            let id = Identity::new(plan.cluster_id, plan.member_id, MemberState::Ready);
            identity::store_on(fs, dir, &id)?;
            tracing::info!(
                member = id.member_id,
                incarnation = id.incarnation,
                "gave an identity to a data dir from an older version"
            );
            id
        }
    };
    let bootstrap = identity.state == MemberState::Bootstrapping;
    Ok(Opened {
        identity: Arc::new(IdentityStore::new_on(&env.fs, dir, identity)),
        log,
        state_machine,
        bootstrap,
    })
}

/// An empty data dir: a new member of a new cluster, if the plan allows it.
fn bootstrap_empty(
    dir: &Path,
    plan: &Plan,
    events: EventSink,
    env: &Env,
) -> Result<Opened, StoreError> {
    if let Some(cluster_id) = plan.join {
        // Ready at once: a learner has no bootstrap to wait for; the leader sends it the log.
        crate::create_dir_all_durably(&*env.fs, dir)?;
        return create(
            dir,
            cluster_id,
            plan.member_id,
            MemberState::Ready,
            events,
            env,
        );
    }
    if !plan.may_bootstrap {
        return Err(StoreError::Refused(format!(
            "data dir {} holds no Raft state, and this node is one of several in \
             --initial-cluster with --initial-cluster-state existing (the default), or was \
             started with --join and the cluster has not listed it as a learner yet: it \
             will not bootstrap. For a new cluster, start every member once with \
             --initial-cluster-state new. {REPLACE_HINT}.",
            dir.display()
        )));
    }
    crate::create_dir_all_durably(&*env.fs, dir)?;
    create(
        dir,
        plan.cluster_id,
        plan.member_id,
        MemberState::Bootstrapping,
        events,
        env,
    )
}

/// A new identity in `dir` and an empty store; a `Bootstrapping` member then initializes
/// Raft, a `Ready` one (a joining learner) waits for the leader's log.
fn create(
    dir: &Path,
    cluster_id: u64,
    member_id: NodeId,
    state: MemberState,
    events: EventSink,
    env: &Env,
) -> Result<Opened, StoreError> {
    let bootstrap = state == MemberState::Bootstrapping;
    let id = Identity::new(cluster_id, member_id, state);
    identity::store_on(&*env.fs, dir, &id)?;
    let (log, state_machine) = crate::open_with(dir, events, env.clone())?;
    tracing::info!(
        member = id.member_id,
        cluster = %fenced_raft_types::identity::fmt_cluster_id(id.cluster_id),
        incarnation = id.incarnation,
        bootstrap,
        "new data dir"
    );
    Ok(Opened {
        identity: Arc::new(IdentityStore::new_on(&env.fs, dir, id)),
        log,
        state_machine,
        bootstrap,
    })
}

fn no_state(dir: &Path, id: &Identity) -> StoreError {
    StoreError::Refused(format!(
        "data dir {} belongs to member {} of cluster {} but holds no Raft state (its \
         log, vote and snapshot are gone). {REPLACE_HINT}.",
        dir.display(),
        id.member_id,
        fenced_raft_types::identity::fmt_cluster_id(id.cluster_id)
    ))
}

fn unusable(dir: &Path, e: StoreError) -> StoreError {
    match e {
        e @ StoreError::Unusable { .. } => e,
        e => StoreError::Unusable {
            dir: dir.to_owned(),
            reason: Box::new(e),
        },
    }
}
