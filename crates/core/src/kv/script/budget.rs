//! The budget of one script run, shared by the interpreter's hook and the native helpers
//! (cjson, `redis.call`'s replies) that work outside the VM.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::kv::types::LUA_INSTRUCTION_BUDGET;

/// The budget of one script run: counted by the VM hook (instructions, and under the bounded
/// rules the work Lua's C functions charge to it), and charged by native helpers for work
/// done outside the VM. Its size is set at every run, by the entry's rules.
pub(crate) struct Budget {
    spent: AtomicU64,
    limit: AtomicU64,
    over: AtomicBool,
}

impl Budget {
    pub(crate) fn new() -> Budget {
        Budget {
            spent: AtomicU64::new(0),
            limit: AtomicU64::new(LUA_INSTRUCTION_BUDGET),
            over: AtomicBool::new(false),
        }
    }

    /// Spend `n` steps; past the budget (now or before) this fails, and keeps failing.
    pub(crate) fn charge(&self, n: u64) -> mlua::Result<()> {
        // Hash-chain steps the patched Lua counted since its last charge (none unless the
        // run hashes by creation id, `rules::ids`).
        let n = n.saturating_add(super::rules::ids::take());
        let spent = self.spent.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        let limit = self.limit();
        if spent > limit || self.over.load(Ordering::Relaxed) {
            self.over.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError(format!(
                "script exceeded the budget of {limit} {}",
                Budget::unit(limit)
            )));
        }
        Ok(())
    }

    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    /// What a budget of `limit` counts: instructions under the old rules, steps under the
    /// bounded ones.
    pub(crate) fn unit(limit: u64) -> &'static str {
        if limit == LUA_INSTRUCTION_BUDGET {
            "instructions"
        } else {
            "steps"
        }
    }

    /// The size of this run's budget.
    pub(crate) fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// A new run with a budget of `limit`.
    pub(crate) fn reset(&self, limit: u64) {
        self.spent.store(0, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Relaxed);
        self.over.store(false, Ordering::Relaxed);
    }
}
