//! What the entry's rules make a script run do: the size of its budget, the switch that
//! charges Lua's work in C to it (the patched Lua, third_party/README.md), what a
//! `redis.call` costs, and the reply of a run its budget stopped. `lua.rs` runs scripts by
//! these.

use crate::kv::types::{Bytes, Reply, LUA_INSTRUCTION_BUDGET, LUA_STEP_BUDGET};

/// The rules a run follows, from the entry's [`crate::Semantics`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rules {
    /// Nothing a script sees shows an address ([`crate::Semantics::deterministic`]).
    pub(crate) deterministic: bool,
    /// Work in C is charged, the budget is [`LUA_STEP_BUDGET`] steps
    /// ([`crate::Semantics::bounded`]); else [`LUA_INSTRUCTION_BUDGET`] instructions.
    pub(crate) bounded: bool,
    /// Objects hash by creation id, hash chains are charged, iteration is not refused
    /// ([`crate::Semantics::lua_ids`]; implies the two above).
    pub(crate) ids: bool,
    /// Every helper charged by its work: Rust helpers by arguments and input, their errors
    /// plain strings, and the patched Lua's charging level 2
    /// ([`crate::Semantics::charged_helpers`]; implies the three above).
    pub(crate) helpers: bool,
    /// The collector marks in one step during the run ([`crate::Semantics::whole_mark`];
    /// implies the four above).
    pub(crate) whole_mark: bool,
}

impl Rules {
    /// The rules of `semantics`.
    pub(crate) fn of(semantics: crate::Semantics) -> Rules {
        Rules {
            deterministic: semantics.deterministic(),
            bounded: semantics.bounded(),
            ids: semantics.lua_ids(),
            helpers: semantics.charged_helpers(),
            whole_mark: semantics.whole_mark(),
        }
    }

    pub(super) fn budget(self) -> u64 {
        if self.bounded {
            LUA_STEP_BUDGET
        } else {
            LUA_INSTRUCTION_BUDGET
        }
    }
}

/// The budget's charge for one `redis.call` under the bounded rules, on top of its reply's
/// ([`reply_cost`]): the command's own run through the keyspace and the conversions (~1 µs
/// for a `SET` or an `INCR` here, about 100 steps' worth; found by the script fuzzer: a loop
/// of `SET` and `INCR` paused 0.17 s at one step per call), plus a step per 64 bytes of
/// arguments. So a script makes at most ~50,000 calls.
const REDIS_CALL_STEPS: u64 = 100;

pub(super) fn call_cost(cmd: &[Bytes]) -> u64 {
    REDIS_CALL_STEPS + cmd.iter().map(|a| a.len() as u64).sum::<u64>() / 64
}

/// Under the helper rules ([`crate::Semantics::CHARGED_HELPERS`]), what any call of a Rust
/// helper costs beyond the instruction that made it: mlua's way in and out (a userdata
/// made for a possible error, the unwinding guard, the conversions), ~0.3–0.6 µs here.
pub(super) const HELPER_CALL_STEPS: u64 = 100;
/// On top of [`HELPER_CALL_STEPS`], what `redis.error_reply`/`status_reply` cost: a table
/// made and set through mlua's protected calls (~3 µs measured on a loaded machine).
pub(super) const HELPER_REPLY_STEPS: u64 = 300;
/// The same, per argument converted into a Rust value (a slot of mlua's reference stack
/// each): a helper may be passed thousands (`f(unpack(t))`).
pub(super) const HELPER_ARG_STEPS: u64 = 8;
/// Bytes a helper reads per step under the helper rules (`redis.sha1hex` hashes ~2 ns a
/// byte here: one step per byte).
pub(super) const HELPER_BYTES_PER_STEP: u64 = 1;

/// The budget's charge for a `redis.call`'s reply under the bounded rules: one step, one per
/// element and one per 64 bytes (what converting it into Lua values costs, and a bound on the
/// work of the command that made it).
pub(super) fn reply_cost(r: &Reply) -> u64 {
    match r {
        Reply::Bulk(b) => 1 + b.len() as u64 / 64,
        Reply::Double(s) | Reply::Status(s) | Reply::Error(s) => 1 + s.len() as u64 / 64,
        Reply::Array(items) => 1 + items.iter().map(reply_cost).sum::<u64>(),
        Reply::Map(pairs) => {
            1 + pairs
                .iter()
                .map(|(k, v)| reply_cost(k) + reply_cost(v))
                .sum::<u64>()
        }
        _ => 1,
    }
}

pub(super) mod charging {
    //! The switch of the patched Lua's work charging (third_party/README.md): while on, the
    //! work Lua's C code does on this thread is charged to the count hook.
    use std::ffi::c_int;

    extern "C" {
        fn lua_fenced_charging(on: c_int);
    }

    /// Charging is on while this lives (on this thread); off again when dropped, whatever
    /// way the run ends.
    pub(in crate::kv::script) struct On(());

    impl On {
        /// `full`: the helper rules' charges too (charging level 2 of the patched Lua).
        pub(in crate::kv::script) fn new(full: bool) -> On {
            // SAFETY: sets a thread-local int in the patched Lua; no other state touched.
            unsafe { lua_fenced_charging(if full { 2 } else { 1 }) };
            On(())
        }
    }

    impl Drop for On {
        fn drop(&mut self) {
            // SAFETY: as above.
            unsafe { lua_fenced_charging(0) };
        }
    }
}

pub(super) mod ids {
    //! The switch of the patched Lua's hashing by creation id (third_party/README.md,
    //! ltable.c): tables made on this thread while it is on place table, function, thread
    //! and userdata keys by the per-state creation counter, which turning it on resets, and
    //! charge their hash-chain steps; and under [`crate::Semantics::WHOLE_MARK`] the
    //! collector marks in one step while it is on (`lgc.c`), so what it frees is what is
    //! unreachable, not what the order of an address-keyed table left unmarked.
    use std::ffi::{c_int, c_uint};

    use mlua::{ffi::lua_State, Lua};

    extern "C" {
        fn lua_fenced_ids(l: *mut lua_State, on: c_int, base: c_uint);
        fn lua_fenced_take() -> usize;
    }

    /// The first id of a run's objects: far above what building a VM takes (a few
    /// thousand), so a run's ids never repeat the VM's own.
    const RUN_BASE: c_uint = 1 << 24;

    /// Hashing by id is on while this lives (on this thread), with the state's counter
    /// reset to [`RUN_BASE`] (and, if `whole_mark`, marking in one step); off again when
    /// dropped.
    pub(in crate::kv::script) struct On(());

    impl On {
        pub(in crate::kv::script) fn new(lua: &Lua, whole_mark: bool) -> mlua::Result<On> {
            let on: c_int = if whole_mark { 2 } else { 1 };
            // SAFETY: the callback only writes the main thread's id field and a
            // thread-local int in the patched Lua.
            unsafe { lua.exec_raw::<()>((), |state| lua_fenced_ids(state, on, RUN_BASE)) }?;
            Ok(On(()))
        }
    }

    impl Drop for On {
        fn drop(&mut self) {
            // SAFETY: with a null state only the thread-local switch is touched.
            unsafe { lua_fenced_ids(std::ptr::null_mut(), 0, 0) };
        }
    }

    /// Hash-chain steps walked in id-hashed tables and not yet charged (cleared), for
    /// charges made outside the interpreter ([`super::super::budget::Budget::charge`]).
    pub(in crate::kv::script) fn take() -> u64 {
        // SAFETY: reads and clears a thread-local counter in the patched Lua.
        unsafe { lua_fenced_take() as u64 }
    }
}

/// A fingerprint of this build's Lua: what a script's results depend on besides the script,
/// its arguments and the replicated state — the sizes of Lua's structs (the memory limit and
/// the collector count bytes), its configuration numbers and libm's results for fixed inputs
/// (`lua_fenced_layout`, third_party/README.md). Members that differ in it may compute
/// different results for one script, so the leader refuses scripts while they do
/// (docs/operations.md, "Scripts").
pub fn lua_build() -> u64 {
    extern "C" {
        fn lua_fenced_layout() -> u64;
    }
    static BUILD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: a pure C function of constants (sizes, libm of fixed inputs).
    *BUILD.get_or_init(|| unsafe { lua_fenced_layout() })
}

/// The reply of a run stopped by its budget.
pub(super) fn busy(sha: &str, rules: Rules) -> Reply {
    if rules.bounded {
        Reply::err(format!(
            "BUSY script exceeded the budget of {LUA_STEP_BUDGET} steps (Lua instructions and the work of library functions) and was stopped (earlier writes stay) script: {sha}"
        ))
    } else {
        Reply::err(format!(
            "BUSY script exceeded the budget of {LUA_INSTRUCTION_BUDGET} instructions and was stopped (earlier writes stay) script: {sha}"
        ))
    }
}
