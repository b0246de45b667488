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
    /// The run's rules charge helpers ([`crate::Semantics::CHARGED_HELPERS`]).
    helpers: AtomicBool,
}

impl Budget {
    pub(crate) fn new() -> Budget {
        Budget {
            spent: AtomicU64::new(0),
            limit: AtomicU64::new(LUA_INSTRUCTION_BUDGET),
            over: AtomicBool::new(false),
            helpers: AtomicBool::new(false),
        }
    }

    /// A call of a Rust helper with `args` arguments and `bytes` of input it reads, charged
    /// only under the helper rules ([`crate::Semantics::CHARGED_HELPERS`]); under older
    /// rules nothing, as before.
    pub(crate) fn helper(&self, args: usize, bytes: usize) -> mlua::Result<()> {
        if !self.helpers.load(Ordering::Relaxed) {
            return Ok(());
        }
        use super::rules::{HELPER_ARG_STEPS, HELPER_BYTES_PER_STEP, HELPER_CALL_STEPS};
        self.charge(
            HELPER_CALL_STEPS
                .saturating_add((args as u64).saturating_mul(HELPER_ARG_STEPS))
                .saturating_add(bytes as u64 / HELPER_BYTES_PER_STEP),
        )
    }

    /// The run's rules charge helpers.
    pub(crate) fn charges_helpers(&self) -> bool {
        self.helpers.load(Ordering::Relaxed)
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

    /// A new run with a budget of `limit`; `helpers`: its rules charge helpers.
    pub(crate) fn reset(&self, limit: u64, helpers: bool) {
        self.spent.store(0, Ordering::Relaxed);
        self.limit.store(limit, Ordering::Relaxed);
        self.over.store(false, Ordering::Relaxed);
        self.helpers.store(helpers, Ordering::Relaxed);
    }
}
