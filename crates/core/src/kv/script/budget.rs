//! The instruction budget of one script run, shared by the interpreter's hook and the native
//! helpers (cjson) that work outside the VM.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::kv::types::LUA_INSTRUCTION_BUDGET;

/// The instruction budget of one script run: counted by the VM hook, and charged by native
/// helpers (`cjson`) for work done outside the VM.
pub(crate) struct Budget {
    spent: AtomicU64,
    over: AtomicBool,
}

impl Budget {
    pub(crate) fn new() -> Budget {
        Budget {
            spent: AtomicU64::new(0),
            over: AtomicBool::new(false),
        }
    }

    /// Spend `n` instructions; past the budget (now or before) this fails, and keeps failing.
    pub(crate) fn charge(&self, n: u64) -> mlua::Result<()> {
        let spent = self.spent.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if spent > LUA_INSTRUCTION_BUDGET || self.over.load(Ordering::Relaxed) {
            self.over.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError(format!(
                "script exceeded the budget of {LUA_INSTRUCTION_BUDGET} instructions"
            )));
        }
        Ok(())
    }

    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }

    pub(crate) fn reset(&self) {
        self.spent.store(0, Ordering::Relaxed);
        self.over.store(false, Ordering::Relaxed);
    }
}
