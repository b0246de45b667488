//! Token validation at storage: the half of fencing that has to live where the data is.
//!
//! A storage service that accepts writes from lock holders keeps, per resource, the highest
//! fencing token it has accepted, and refuses any write carrying a lower one. A paused or
//! partitioned former holder then cannot overwrite the work of the holder that replaced it:
//! its token is older than the one the new holder already wrote with.
//!
//! [`FenceStore`] is that check for services that embed it: a persisted high-water mark per
//! resource with an atomic check-and-advance, and a small fenced key-value store where the
//! check and the write are one transaction. For SQL databases, the same rule is a condition in
//! the write statement itself — see `docs/fence-check.md` and the SQLite test in `tests/sqlite.rs`.

use std::path::Path;

/// Why a write was refused.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The presented token is older than one already accepted for this resource.
    #[error("stale token for {resource}: presented {presented}, highest accepted {highest}")]
    Stale {
        resource: String,
        presented: u64,
        highest: u64,
    },
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    #[error("corrupt record for {0}")]
    Corrupt(String),
}

/// A durable store of fence high-water marks and fenced values.
#[derive(Clone)]
pub struct FenceStore {
    db: sled::Db,
    fences: sled::Tree,
    data: sled::Tree,
}

fn decode_u64(what: &str, bytes: &[u8]) -> Result<u64, GuardError> {
    let arr: [u8; 8] = bytes
        .try_into()
        .map_err(|_| GuardError::Corrupt(what.to_owned()))?;
    Ok(u64::from_be_bytes(arr))
}

/// Stale unless `token` ≥ the current high-water mark (equal tokens are the same holder).
fn check(resource: &str, current: Option<u64>, token: u64) -> Result<(), GuardError> {
    match current {
        Some(highest) if token < highest => Err(GuardError::Stale {
            resource: resource.to_owned(),
            presented: token,
            highest,
        }),
        _ => Ok(()),
    }
}

impl FenceStore {
    /// Open (or create) a store in `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, GuardError> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(16 * 1024 * 1024)
            .open()?;
        let fences = db.open_tree("fences")?;
        let data = db.open_tree("data")?;
        Ok(FenceStore { db, fences, data })
    }

    /// The highest token accepted for `resource`, if any.
    pub fn highest(&self, resource: &str) -> Result<Option<u64>, GuardError> {
        self.fences
            .get(resource)?
            .map(|v| decode_u64(resource, &v))
            .transpose()
    }

    /// Atomically check `token` against `resource`'s high-water mark and raise the mark to
    /// it. Durable when it returns `Ok`. Returns the previous mark.
    pub fn check_and_advance(&self, resource: &str, token: u64) -> Result<Option<u64>, GuardError> {
        loop {
            let current = self.fences.get(resource)?;
            let highest = current
                .as_ref()
                .map(|v| decode_u64(resource, v))
                .transpose()?;
            check(resource, highest, token)?;
            if highest == Some(token) {
                return Ok(highest);
            }
            let swapped = self.fences.compare_and_swap(
                resource,
                current,
                Some(token.to_be_bytes().to_vec()),
            )?;
            if swapped.is_ok() {
                self.db.flush()?;
                return Ok(highest);
            }
            // Someone else advanced it meanwhile: check again.
        }
    }

    /// Write `value` under `key` if `token` is at least every token used to write `key`;
    /// the check, the new mark and the value are one transaction, durable on `Ok`.
    pub fn put(&self, key: &str, value: &[u8], token: u64) -> Result<(), GuardError> {
        use sled::transaction::{ConflictableTransactionError, TransactionError};
        use sled::Transactional;
        let result = (&self.fences, &self.data).transaction(|(fences, data)| {
            let highest = match fences.get(key)? {
                Some(v) => Some(decode_u64(key, &v).map_err(ConflictableTransactionError::Abort)?),
                None => None,
            };
            check(key, highest, token).map_err(ConflictableTransactionError::Abort)?;
            fences.insert(key, &token.to_be_bytes())?;
            data.insert(key, value)?;
            Ok(())
        });
        match result {
            Ok(()) => {
                self.db.flush()?;
                Ok(())
            }
            Err(TransactionError::Abort(e)) => Err(e),
            Err(TransactionError::Storage(e)) => Err(GuardError::Storage(e)),
        }
    }

    /// The value of `key` and the highest token accepted for it.
    pub fn get(&self, key: &str) -> Result<Option<(Vec<u8>, u64)>, GuardError> {
        let Some(value) = self.data.get(key)? else {
            return Ok(None);
        };
        let token = self.highest(key)?.unwrap_or(0);
        Ok(Some((value.to_vec(), token)))
    }

    /// Write without any token check — what storage does when nobody validates tokens.
    /// Exists for the comparison workloads; do not use it to protect data.
    pub fn put_unfenced(&self, key: &str, value: &[u8]) -> Result<(), GuardError> {
        self.data.insert(key, value)?;
        self.db.flush()?;
        Ok(())
    }
}
