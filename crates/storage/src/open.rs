//! Opening a data dir ([`crate::open`]): the checks of every stored record, and the upgrades
//! of data dirs written by older layouts (unsealed records, the log in sled, the snapshot in
//! sled, the last purged log id in sled) with the legacy decoding they alone need. sled is
//! opened only to upgrade a data dir that has its files; afterwards they are gone.

use std::path::Path;
use std::sync::{Arc, RwLock};

use fenced_fs::Fs;
use fenced_raft_types::{NodeId, TypeConfig};
use openraft::{Entry, LogId, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::transaction::ConflictableTransactionError;

use crate::purged::Purged;
use crate::state::SmState;
use crate::{
    decode, decode_entry, decode_raw, digests, encode, frame, hardstate, observe, quarantine,
    snapshot, upgrade_entry, wal, Env, EventSink, LegacyTypeConfig, LogStore, Meta,
    StateMachineStore, StoreError, CACHE_CAPACITY, DATA_DIR_FORMAT, KEY_COMMITTED, KEY_FORMAT,
    KEY_LAST_PURGED, KEY_SNAPSHOT_DATA, KEY_SNAPSHOT_META, KEY_VOTE, LAST_SLED_FORMAT,
};

/// How long [`open_sled`] waits for a just-closed handle of the same data dir to let go of
/// its file lock.
const SLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// sled's refusal while another handle holds the data dir's file lock.
fn is_lock_held(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

fn open_sled(dir: &Path) -> Result<sled::Db, StoreError> {
    // sled may panic on some damaged files instead of returning an error.
    let attempt = || {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            sled::Config::new()
                .path(dir)
                .cache_capacity(CACHE_CAPACITY)
                .open()
        }))
        .unwrap_or_else(|_| Err(sled::Error::Corruption { at: None, bt: () }))
    };
    // A handle dropped in this process releases the lock only when sled's background thread
    // has ended: a data dir opened again right after (a restore or `--force-new-cluster`
    // that then starts the node, or a test) waits for it, briefly. Another process that
    // holds the lock still gets the error.
    let give_up = std::time::Instant::now() + SLED_LOCK_WAIT;
    let mut opened = attempt();
    while opened.as_ref().is_err_and(is_lock_held) && std::time::Instant::now() < give_up {
        std::thread::sleep(std::time::Duration::from_millis(20));
        opened = attempt();
    }
    opened.map_err(|e| match e {
        sled::Error::Io(error) => StoreError::File {
            path: dir.to_owned(),
            error,
        },
        e => StoreError::Damaged {
            path: dir.join("db"),
            detail: format!("sled cannot read it ({e})"),
        },
    })
}

/// Whether `dir` holds sled's files: a data dir of layout 1 to 3, or what an upgrade that a
/// crash interrupted left of one.
pub(crate) fn has_sled(fs: &dyn Fs, dir: &Path) -> bool {
    SLED_FILES.iter().any(|f| fs.exists(&dir.join(f)))
}

/// sled's files in a data dir (besides `snap.*` files), `db` last: the one
/// [`remove_sled`] removes last.
const SLED_FILES: [&str; 3] = ["conf", "blobs", "db"];

pub(crate) fn open_checked(
    dir: &Path,
    events: EventSink,
    env: &Env,
) -> Result<(LogStore, StateMachineStore), StoreError> {
    let (fs, io) = (&env.fs, env.io.clone());
    // The names in the data dir may not be durable: a process whose directory fsync failed
    // (replacing the purged record, say) left them in the cache only, and this one goes on
    // from them (found by fenced-sim, seed 1206996: the purged record's rename was lost in a
    // power loss after the log had gone on past it, and the log had a hole).
    if fs.exists(dir) {
        crate::sync_dir(&**fs, dir)?;
    }
    let mut purged_file = Purged::open_on(fs, dir)?;
    if has_sled(&**fs, dir) {
        match purged_file {
            None => purged_file = Some(upgrade_from_sled(fs, dir)?),
            // Left by an upgrade interrupted after its records had moved out.
            Some(_) => remove_sled(&**fs, dir)?,
        }
    }
    let wal_dir = dir.join(wal::DIR);
    // A new data dir is made in this order: the hard state, the purged record, the log
    // directory. Without the last two, its creation was cut short: nothing was acknowledged.
    let creating = purged_file.is_none() && !fs.exists(&wal_dir);
    let hard = match hardstate::HardState::open_on(&**fs, dir) {
        Ok(found) => found,
        // Its first write torn by a crash (a full disk, a power loss): written again.
        Err(StoreError::Damaged { .. }) if creating => {
            let path = hardstate::HardState::path_in(dir);
            fs.remove_file(&path)
                .map_err(|e| StoreError::file(&path, e))?;
            tracing::warn!(
                "{}: the hard state of a data dir whose creation was cut short is unreadable; \
                 written again",
                path.display()
            );
            None
        }
        Err(e) => return Err(e),
    };
    let mut hard = match hard {
        Some(h) => h,
        None if !creating => {
            return Err(StoreError::Damaged {
                path: hardstate::HardState::path_in(dir),
                detail: "the file is missing (it holds the vote and the last appended log id)"
                    .into(),
            })
        }
        None => hardstate::HardState::create_on(&**fs, dir, hardstate::HardStateValue::default())?,
    };
    let purged_file = match purged_file {
        Some(p) => p,
        // A new data dir (or one whose creation a crash interrupted here): the hard state is
        // written first, then this file, then the log directory.
        None if creating && hard.value() == &hardstate::HardStateValue::default() => {
            Purged::create_on(fs, dir, None)?
        }
        None => {
            return Err(StoreError::Damaged {
                path: Purged::path_in(dir),
                detail: "the file is missing (it holds the last purged log id)".into(),
            })
        }
    };
    // Acted on below (the WAL's tail after `recorded` is cut durably): made durable first.
    hard.rewrite()?;
    let last_purged = purged_file.value();
    let wal = wal::Wal::open_on(fs, dir, &mut hard, last_purged.map(|l| l.index))?;

    let snapshots = snapshot::SnapshotStore::open_on(fs, dir)?;
    let state = match snapshots.current()? {
        Some((_, path)) => {
            let (meta, machine) = snapshot::load(&**fs, &path)?;
            SmState {
                last_applied: meta.last_log_id,
                membership: meta.last_membership,
                machine,
            }
        }
        None => SmState::default(),
    };
    // Entries are purged only once a snapshot covers them.
    if let Some(p) = last_purged {
        if state.last_applied.is_none_or(|l| l.index < p.index) {
            return Err(StoreError::Damaged {
                path: snapshots.current_path(),
                detail: format!(
                    "the log was purged up to index {}, but no snapshot covers it (the \
                     snapshot reaches {:?})",
                    p.index,
                    state.last_applied.map(|l| l.index)
                ),
            });
        }
    }

    let quarantined = quarantine::load_on(&**fs, dir)?;
    if !quarantined.is_empty() {
        tracing::warn!(
            indexes = ?quarantined,
            "the operator quarantined log entries {quarantined:?}: they are applied as \
             no-ops (every member must have the same list)"
        );
    }
    let hook = observe::Hook::default();
    let snapshots = Arc::new(snapshots);
    let log_store = LogStore::new(
        purged_file,
        wal,
        hard,
        hook.clone(),
        io.clone(),
        snapshots.clone(),
    )?;
    let sm_store = StateMachineStore {
        snapshots,
        state: Arc::new(RwLock::new(state)),
        events,
        snapshot_seq: 0,
        hook,
        digester: digests::Digester::new(io.clone()),
        io,
        quarantined,
    };
    Ok((log_store, sm_store))
}

/// Upgrade a data dir of layout 1 to 3 (sled's `db` and `conf` files are there, the
/// `purged` file is not): seal its records (layout 0), create its hard state (before the
/// hard-state file), move its log into the write-ahead log (1 and 2) and its snapshot into a
/// file, fold the committed log id it kept into the hard state, then write the `purged` file
/// — from that moment sled holds nothing needed — mark sled's layout
/// [`DATA_DIR_FORMAT`] (an older build opening what is left refuses it as written by another
/// version) and remove sled's files. Each step is durable before the next starts; a crash
/// before the `purged` file leaves the old layout (the upgrade runs again), one after it
/// leaves sled's files to remove ([`open_checked`] does).
fn upgrade_from_sled(fs: &Arc<dyn Fs>, dir: &Path) -> Result<Purged, StoreError> {
    let db = open_sled(dir)?;
    let sled_log = db.open_tree("log")?;
    let meta = db.open_tree("meta")?;
    let snapshot = db.open_tree("snapshot")?;

    let format = match meta.get(KEY_FORMAT)? {
        None => None,
        Some(v) if v.len() == 1 && (1..=LAST_SLED_FORMAT).contains(&v[0]) => Some(v[0]),
        Some(v) if v.len() == 1 && v[0] == DATA_DIR_FORMAT => {
            return Err(StoreError::Damaged {
                path: Purged::path_in(dir),
                detail: "the file is missing (it holds the last purged log id), sled's \
                         files say it was written"
                    .into(),
            })
        }
        Some(v) => {
            return Err(StoreError::UnknownFormat {
                what: "data dir",
                found: v.first().copied().map_or(0, u32::from),
                supported: u32::from(DATA_DIR_FORMAT),
            })
        }
    };
    let legacy_vote = match format {
        None => upgrade_unsealed(&db, &sled_log, &meta, &snapshot)?,
        Some(_) => None,
    };
    let last_purged: Option<LogId<NodeId>> = match meta.get(KEY_LAST_PURGED)? {
        Some(v) => Some(decode("last purged log id", &v)?),
        None => None,
    };
    let mut hard = match hardstate::HardState::open_on(&**fs, dir)? {
        Some(h) => h,
        None if format.is_some() => {
            return Err(StoreError::Damaged {
                path: hardstate::HardState::path_in(dir),
                detail: "the file is missing (it holds the vote and the last appended log id)"
                    .into(),
            })
        }
        None => {
            let last_in_log = check_log(&sled_log)?;
            hardstate::HardState::create_on(
                &**fs,
                dir,
                hardstate::HardStateValue {
                    vote: legacy_vote,
                    last_log_id: last_in_log.max(last_purged),
                    committed: None,
                },
            )?
        }
    };
    hard.rewrite()?;
    let recorded = hard.value().last_log_id;
    if format.is_none_or(|f| f < LAST_SLED_FORMAT) {
        move_log_out_of_sled(fs, dir, &db, &sled_log, &meta, last_purged, recorded)?;
    } else if !sled_log.is_empty() {
        // A copy left by an upgrade interrupted after the log had moved.
        sled_log.clear()?;
        db.flush()?;
    }
    // Layouts 1 and 2 kept the committed log id in sled; the hard state holds it now.
    let legacy_committed = match meta.get(KEY_COMMITTED)? {
        Some(v) => decode::<Option<LogId<NodeId>>>("committed log id", &v)?,
        None => None,
    };
    if hard.value().committed.is_none() && legacy_committed.is_some() {
        let mut value = hard.value().clone();
        let committed = std::sync::Mutex::new(legacy_committed);
        wal::note_committed(&mut value, &committed);
        hard.write(value)?;
    }
    drop(hard);
    let snapshots = snapshot::SnapshotStore::open_on(fs, dir)?;
    move_snapshot_out_of_sled(&db, &snapshot, &snapshots)?;

    let purged = Purged::create_on(fs, dir, last_purged)?;
    meta.insert(KEY_FORMAT, &[DATA_DIR_FORMAT])?;
    db.flush()?;
    drop((sled_log, meta, snapshot, db));
    remove_sled(&**fs, dir)?;
    tracing::info!(
        dir = %dir.display(),
        "moved the last records out of sled (last purged log id: the purged file) and removed \
         sled's files"
    );
    Ok(purged)
}

/// Remove sled's files from `dir` (`db` last), durably. Missing ones are fine.
fn remove_sled(fs: &dyn Fs, dir: &Path) -> Result<(), StoreError> {
    let listing = fs.read_dir(dir).map_err(|e| StoreError::file(dir, e))?;
    let mut snaps = Vec::new();
    for item in listing {
        if item.name.starts_with("snap.") {
            snaps.push(dir.join(&item.name));
        }
    }
    for path in snaps
        .into_iter()
        .chain(SLED_FILES.iter().map(|f| dir.join(f)))
    {
        let removed = if fs.is_dir(&path).unwrap_or(false) {
            fs.remove_dir_all(&path)
        } else {
            fs.remove_file(&path)
        };
        match removed {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::file(&path, e)),
        }
    }
    crate::sync_dir(fs, dir)
}

/// Upgrade a data dir that keeps its Raft log in sled (layouts 1 and 2): check the log as
/// [`wal::Wal::open`] would (every record, no hole, no shorter than `recorded`), write it into
/// the write-ahead log, durably, then mark the layout and drop sled's copy. A crash at any
/// point leaves either the old layout (the upgrade runs again) or the new one.
fn move_log_out_of_sled(
    fs: &Arc<dyn Fs>,
    dir: &Path,
    db: &sled::Db,
    sled_log: &sled::Tree,
    meta: &sled::Tree,
    last_purged: Option<LogId<NodeId>>,
    recorded: Option<LogId<NodeId>>,
) -> Result<(), StoreError> {
    let last_in_log = check_log(sled_log)?;
    let last_index = last_in_log
        .map(|l| l.index)
        .max(last_purged.map(|l| l.index));
    if let Some(r) = recorded {
        if last_index.is_none_or(|i| i < r.index) {
            return Err(StoreError::LogEndsEarly {
                found: last_index,
                recorded: r.index,
            });
        }
    }
    let mut entries = Vec::new();
    for record in sled_log.iter() {
        let (k, v) = record?;
        entries.push(decode_log_record(&k, &v)?);
    }
    let moved = entries.len();
    wal::Wal::create_from_on(fs, dir, entries, last_purged.map(|l| l.index))?;
    meta.insert(KEY_FORMAT, &[LAST_SLED_FORMAT])?;
    meta.remove(KEY_VOTE)?;
    db.flush()?;
    sled_log.clear()?;
    db.flush()?;
    if moved > 0 {
        tracing::info!(
            entries = moved,
            "moved the Raft log out of sled into the write-ahead log"
        );
    }
    Ok(())
}

/// Read every record of a sled-kept log (layouts 1 and 2) once: each must pass its checksum,
/// sit under its own index, and follow the previous one without a gap. Returns the last
/// stored log id.
fn check_log(log: &sled::Tree) -> Result<Option<LogId<NodeId>>, StoreError> {
    let mut last: Option<LogId<NodeId>> = None;
    for record in log.iter() {
        let (k, v) = record?;
        let entry = decode_log_record(&k, &v)?;
        if let Some(prev) = last {
            if entry.log_id.index != prev.index + 1 {
                return Err(StoreError::LogHole {
                    after: prev.index,
                    next: entry.log_id.index,
                });
            }
        }
        last = Some(entry.log_id);
    }
    Ok(last)
}

/// Seal the values of a data dir written before records carried a checksum (idempotent: a
/// value that already unseals is left alone). Returns the vote stored there, which moves to
/// the hard-state file.
fn upgrade_unsealed(
    db: &sled::Db,
    log: &sled::Tree,
    meta: &sled::Tree,
    snapshot: &sled::Tree,
) -> Result<Option<Vote<NodeId>>, StoreError> {
    fn reseal<T: Serialize + DeserializeOwned>(
        tree: &sled::Tree,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        let Some(v) = tree.get(key)? else {
            return Ok(None);
        };
        if let Ok(value) = decode::<T>(what, &v) {
            return Ok(Some(value));
        }
        let value: T = decode_raw(what, &v)?;
        tree.insert(key, encode(what, &value)?)?;
        Ok(Some(value))
    }
    let mut upgraded = 0usize;
    for item in log.iter() {
        let (key, value) = item?;
        if decode_entry(&value).is_err() {
            // Unsealed entries predate revisions: one request, token = log index.
            let old: Entry<LegacyTypeConfig> = decode_raw("log entry", &value)?;
            log.insert(key, encode("log entry", &upgrade_entry(old))?)?;
        }
        upgraded += 1;
    }
    reseal::<LogId<NodeId>>(meta, KEY_LAST_PURGED, "last purged log id")?;
    reseal::<Option<LogId<NodeId>>>(meta, KEY_COMMITTED, "committed log id")?;
    reseal::<Meta>(snapshot, KEY_SNAPSHOT_META, "snapshot meta")?;
    if let Some(v) = snapshot.get(KEY_SNAPSHOT_DATA)? {
        if decode_machine("state machine snapshot", &v).is_err() {
            let machine = fenced_core::StateMachine::from_legacy_bytes(&v).map_err(
                |fenced_core::SnapshotError::Decode(source)| StoreError::Corrupt {
                    what: "state machine snapshot",
                    source,
                },
            )?;
            snapshot.insert(KEY_SNAPSHOT_DATA, encode("state machine", &machine)?)?;
        }
    }
    let vote = reseal::<Vote<NodeId>>(meta, KEY_VOTE, "vote")?;
    if upgraded > 0 || vote.is_some() {
        tracing::info!(
            entries = upgraded,
            "sealed the records of a data dir from an older format"
        );
    }
    db.flush()?;
    Ok(vote)
}

/// Move a snapshot kept in sled (before snapshots were files) into the snapshot directory,
/// then drop sled's copy. A crash in between leaves both, and the move runs again.
fn move_snapshot_out_of_sled(
    db: &sled::Db,
    tree: &sled::Tree,
    snapshots: &snapshot::SnapshotStore,
) -> Result<(), StoreError> {
    let Some((meta, data)) = read_snapshot(tree)? else {
        return Ok(());
    };
    if snapshots
        .current()?
        .is_none_or(|(have, _)| have.last_log_id < meta.last_log_id)
    {
        let machine = decode_machine("state machine snapshot", &data)?;
        let path = snapshots.write(&meta, &machine)?;
        snapshots.install(&path, &meta)?;
        tracing::info!(id = %meta.snapshot_id, "moved the snapshot out of sled into a file");
    }
    tree.clear()?;
    db.flush()?;
    Ok(())
}

/// Read the snapshot a data dir of an older layout kept in sled (meta and data).
fn read_snapshot(tree: &sled::Tree) -> Result<Option<(Meta, Vec<u8>)>, StoreError> {
    let pair = tree.transaction(|tx| {
        let meta = tx.get(KEY_SNAPSHOT_META)?;
        let data = tx.get(KEY_SNAPSHOT_DATA)?;
        Ok::<_, ConflictableTransactionError<StoreError>>((meta, data))
    })?;
    match pair {
        (Some(meta), Some(data)) => Ok(Some((decode("snapshot meta", &meta)?, data.to_vec()))),
        (None, None) => Ok(None),
        (Some(_), None) | (None, Some(_)) => Err(StoreError::Corrupt {
            what: "snapshot",
            source: Box::new(bincode::ErrorKind::Custom(
                "snapshot meta and data are not both present".into(),
            )),
        }),
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// Decode one `log` tree record, checking that the key matches the entry's index.
fn decode_log_record(key: &[u8], value: &[u8]) -> Result<Entry<TypeConfig>, StoreError> {
    let entry = decode_entry(value)?;
    if key != index_key(entry.log_id.index) {
        return Err(StoreError::LogKeyMismatch {
            key: key.to_vec(),
            index: entry.log_id.index,
        });
    }
    Ok(entry)
}

/// Decode a sealed state machine snapshot of any format this build reads.
fn decode_machine(
    what: &'static str,
    bytes: &[u8],
) -> Result<fenced_core::StateMachine, StoreError> {
    let (version, payload) = frame::unseal_versioned(what, bytes)?;
    let decoded = if version == 1 {
        fenced_core::StateMachine::from_legacy_bytes(payload)
    } else {
        fenced_core::StateMachine::from_bytes(payload)
    };
    decoded
        .map_err(|fenced_core::SnapshotError::Decode(source)| StoreError::Corrupt { what, source })
}
