//! Lua scripting (`EVAL`/`EVALSHA`) inside `apply`, deterministic on every replica.
//!
//! * Lua 5.1 (base, table, string, math, coroutine; no io/os/debug/package, no loaders: text
//!   chunks only; no `collectgarbage`/`gcinfo`, which would show the interpreter's memory).
//! * **One interpreter per script, reused** ([`LuaCache`], beside the keyspace, not replicated):
//!   a script is compiled once into its own VM, which then serves every run of that script.
//!   Every run must behave exactly as in a VM built for it alone, which is what a replica that
//!   just started (or installed a snapshot) has — see *Why reuse is deterministic* below.
//! * `math.random`/`math.randomseed` are a xorshift PRNG seeded from the command's revision at the
//!   start of every run, so every replica draws the same numbers.
//! * Budgets are counted, never timed: [`LUA_STEP_BUDGET`](crate::kv::LUA_STEP_BUDGET) steps
//!   (checked every 10 000, in coroutines the script creates too) and [`LUA_MEMORY_LIMIT`]
//!   bytes on top of the idle VM. Both start from zero at every run. Once over budget,
//!   neither `pcall`/`xpcall` nor `coroutine.resume` can swallow the error. A step is a VM
//!   instruction or, under the bounded rules ([`crate::Semantics::BOUNDED`]), a unit of work
//!   Lua did in C — pattern matching, searching, comparing, converting, building strings, new
//!   strings and tables, C calls: the patched Lua (`third_party/lua-src`, its README has the
//!   rates) charges it to the count hook's counter while `rules::charging::On` is alive,
//!   which is the run's `resume` only — and a `redis.call`, by its arguments and reply
//!   (`rules.rs`). So no script runs for longer than the budget allows (docs/operations.md,
//!   "Scripts", has the pause; hash chains are charged from [`crate::Semantics::LUA_IDS`] on,
//!   and from [`crate::Semantics::CHARGED_HELPERS`] on every Rust helper by its call,
//!   arguments and input — `helpers.rs` — and the interpreter's bulk work). Older entries keep
//!   [`LUA_INSTRUCTION_BUDGET`](crate::kv::LUA_INSTRUCTION_BUDGET) instructions and no charge
//!   for work in C.
//! * `redis.call`/`redis.pcall` run the keyspace interpreter directly, with Redis's RESP2 ↔ Lua
//!   conversions. `TIME` is the entry's log time.
//! * `cjson` (encode/decode/null and lua-cjson's settings) as Redis bundles it, implemented in
//!   Rust (`cjson.rs`). **Object keys are encoded in sorted byte order**, not lua-cjson's
//!   hash-table order, so every replica writes the same bytes; its work is charged to the same
//!   instruction budget and its output is capped at [`LUA_MEMORY_LIMIT`].
//! * **Errors keep earlier writes** (Redis semantics): writes a script made before it failed
//!   stay applied, and the client gets the error. Every replica stops at the same
//!   instruction, so every replica keeps the same writes.
//!
//! # Why reuse is deterministic
//!
//! A VM is built from the script's source alone ([`Vm::build`]): the same allocations in the
//! same order on every replica, then a warm-up run of an empty chunk through the same path
//! and full collections until the heap stops changing. Its `used_memory` then is the
//! *baseline*; the memory limit is set to baseline + [`LUA_MEMORY_LIMIT`]. The claim is that
//! every run starts from a state indistinguishable from that one, so a run's instructions,
//! allocations, collector steps, and therefore its budget failures, replies and writes, are
//! those of a VM built for it alone:
//!
//! * **Nothing a run can reach survives it.** Each run executes in a new coroutine whose
//!   globals are a new table: copies of the base functions and of the `string`, `table`,
//!   `math`, `coroutine`, `redis` and `cjson` tables, and new Lua closures (`pcall`, `xpcall`,
//!   `coroutine.resume`/`running`, `redis.call`/`pcall`, the `cjson` wrappers) whose
//!   environment is that table. The pristine tables are upvalues of the driver, which no
//!   script can reach (no `debug`). The shared objects a script *can* touch are reset after
//!   every run: the environments of the compiled chunk and of the driver (`setfenv(1, …)`,
//!   `getfenv(3)`), the string metatable (`getmetatable('')`, replaced per run), and the Rust
//!   state behind the PRNG, the budget and the `cjson` settings. Everything else a script sees
//!   is immutable (strings, numbers, C functions, `cjson.null`). Setting a global is allowed,
//!   as it always was here, and is gone at the next run.
//! * **The instruction count starts at zero.** The hook is global and a new coroutine starts
//!   with a fresh count, so the checks fall at the same instructions; the main thread runs no
//!   hooked Lua code.
//! * **The heap is back to the baseline.** After a run: two full collections (the second frees
//!   userdata finalized by the first), with `pad .. pad` (64 bytes) between them, which sets the
//!   collector-owned concatenation buffer back to the size it has at the baseline (a
//!   collection shrinks it to at most 64 bytes, never below 32); repeated while memory goes
//!   down. The VM is kept only if `used_memory` is then *exactly* the baseline, and dropped
//!   (rebuilt on next use) otherwise, after a budget failure, or after any error of the
//!   machinery itself. Equality means the heap holds the same objects: every object of the
//!   baseline is still referenced, so what it holds is a superset; the string table never
//!   shrinks below its baseline size (it halves only while under a quarter full, and holds at
//!   least the baseline's strings); mlua's reference stack never shrinks (it is grown to
//!   [`REF_SLOTS`] at build so ordinary runs do not grow it); the concatenation buffer is
//!   reset as above; per-run threads, stacks and tables are garbage. Each of these can only be
//!   larger than at the baseline, so equal totals mean equal parts. Equal heaps then give the
//!   same collector state (a full collection leaves the threshold a function of the live
//!   bytes), so collection steps during the next run fall at the same allocations.
//!
//! Whether a VM is kept never changes a result, only the time the next run takes; so neither
//! does the cache's eviction order.
//!
//! # Nothing a script sees shows an address
//!
//! Lua 5.1 shows memory addresses — which differ between replicas (ASLR, allocation history)
//! — in two places: `tostring` of a table, function, thread or userdata (`table: 0x55d0…`),
//! and the hash slot of such a value used as a table key (the pointer's low bits), hence the
//! order in which `next`/`pairs`/`table.foreach` (and cjson) visit a table with such keys.
//! Strings hash without a seed (`luaS_newlstr` starts from the length), numbers and booleans
//! by value, so tables whose keys are only those iterate in the same order everywhere. Under
//! the entry's deterministic rules ([`crate::Semantics::deterministic`]) a run uses
//! `det_driver` instead of `driver`, which installs, in that run's environment only:
//!
//! * `tostring` that shows an object without `__tostring` as `table: 1`, `function: 2`, …:
//!   a number given at first sight, in a per-run table (every run, on every replica, numbers
//!   from 1). The table holds its objects strongly, until the run ends: entries are only ever
//!   added, so its growth depends only on how many there are. A weak table would lose entries
//!   at collections, and a new key landing on a freed slot or not — by its address — would
//!   change when the table grows, so the heap's size, so when the collector runs.
//! * `next`, `pairs` and `table.foreach` that refuse a table with a table, function, thread
//!   or userdata key, *before* its first key is visited (a scan of all its keys; a partial
//!   iteration would already have acted in address order): a script error. A key of that kind
//!   added during a traversal (which Lua leaves undefined) is refused when `next` meets it.
//!   Only the keys there now are seen: a table that *had* object keys can still iterate its
//!   remaining keys in the order those keys' addresses left; and `#t` of a table with holes
//!   that has or had such keys depends on when it was resized, which their slots decided
//!   (`#t` of a sequence is its one border, whatever the layout). Refusing object keys at
//!   insertion would refuse common, harmless uses (sets of tables) and cannot be done without
//!   patching the VM; keeping object keys in tables of their own avoids both cases.
//! * cjson refuses a table with a key it cannot write before looking at its keys in order,
//!   naming the key type by a fixed precedence (see `cjson.rs`).
//!
//! A returned function, thread or userdata is nil (Redis's conversion), never its `tostring`.
//! Entries stamped before these rules run through the unchanged `driver`, with the same
//! instructions, so replaying an old log gives the old results.
//!
//! # Deterministic at the root: objects hashed by creation id
//!
//! Under [`crate::Semantics::LUA_IDS`] the refusals above are gone: the patched Lua
//! (third_party/README.md, `ltable.c`) places table, function, thread and userdata keys by a
//! creation id instead of their address in every table the run makes, the ids counted from
//! the same start in every run (`rules::ids::On`, turned on before the run's coroutine and
//! `KEYS`/`ARGV` are made). So the order of `next` (from any key), `pairs` and
//! `table.foreach`, `#t` of a table with holes, when a table is resized and the length of
//! its hash chains are functions of the script and its inputs; the chains and resizes are
//! charged to the budget. The run uses `ids_driver`, which only replaces `tostring` (still
//! numbering objects: an id is no address, but printing it would tie results to how many
//! objects the sandbox itself makes). cjson's key checks stay as they are (they were
//! deterministic already). What replicas must still share is the Lua build: struct sizes
//! (the memory limit counts bytes) and libm.
//!
//! Under [`crate::Semantics::WHOLE_MARK`] the collector also marks in one step while the
//! ids switch is on (`rules::ids::On`, the patched `lgc.c`): tables made outside a run (the
//! registry, keyed by mlua's light userdata, the addresses of its statics) still hash by
//! address, and marked a step at a time in their order, what a run's garbage left alive
//! — hence the collector's pace and the string-table chains the budget charges — differed
//! between processes (issue 39). Marking all at once frees exactly what is unreachable.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use mlua::chunk::ChunkMode;
use mlua::{
    Function, HookTriggers, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value as LV,
    VmState,
};

use super::budget::Budget;
use super::cjson;
use super::convert::{lua_to_reply, reply_to_lua};
use super::helpers;
use super::prelude::{HELPERS_PRELUDE, PRELUDE};
use super::rules::{busy, call_cost, charging, ids, reply_cost, Rules};
use crate::kv::args::fmt_f64;
use crate::kv::error::KvError;
use crate::kv::types::{Bytes, Reply, LUA_CACHE_BYTES, LUA_CACHE_SCRIPTS, LUA_MEMORY_LIMIT};

const HOOK_EVERY: u32 = 10_000;
/// Most cleanup rounds (two full collections each) before a VM is given up on.
const CLEANUP_ROUNDS: usize = 8;
/// Slots of mlua's reference stack made at build, so ordinary runs never grow it.
const REF_SLOTS: usize = 256;
/// Half the concatenation buffer's size at the baseline (`LUA_MINBUFFER`, so the buffer is
/// `2 * LUA_MINBUFFER`: the largest size a collection leaves alone).
const PAD: usize = 32;

/// Lower-case hex SHA1 (the script cache key, `redis.sha1hex`).
pub fn sha1hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

/// Check that `src` compiles (for `SCRIPT LOAD`).
pub(crate) fn compile_check(src: &str) -> Result<(), KvError> {
    let lua = Lua::new_with(StdLib::NONE, LuaOptions::default())
        .map_err(|e| KvError::invalid(format!("cannot start Lua: {e}")))?;
    lua.set_memory_limit(LUA_MEMORY_LIMIT)
        .map_err(|e| KvError::invalid(format!("cannot start Lua: {e}")))?;
    lua.load(src)
        .set_name("@user_script")
        .set_mode(ChunkMode::Text)
        .into_function()
        .map(|_| ())
        .map_err(|e| {
            KvError::invalid(format!(
                "Error compiling script (new function): {}",
                clean(&e.to_string())
            ))
        })
}

/// Run script `src` (SHA1 `sha`) as the command of `revision`, in `vm` if the cache had one
/// for it (else in a new interpreter). `call` runs one `redis.call`/`redis.pcall` command.
/// Any failure becomes an error reply (earlier writes stay). The interpreter comes back if it
/// may be kept for the next run. `rules`: the entry's (see the module docs); under older
/// rules the script runs exactly as it did before them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    vm: Option<Vm>,
    sha: &str,
    src: &str,
    revision: u64,
    rules: Rules,
    keys: &[Bytes],
    args: &[Bytes],
    call: impl FnMut(&[Bytes], &dyn Fn(u64) -> bool) -> Reply,
) -> (Reply, Option<Vm>) {
    // A VM is built for the helper rules or for older ones (HELPERS_PRELUDE); one built
    // for the other kind is dropped and rebuilt.
    let vm = match vm.filter(|vm| vm.helpers_driver.is_some() == rules.helpers) {
        Some(vm) => vm,
        None => match Vm::build(src, rules.helpers) {
            Ok(vm) => vm,
            Err(e) => return (Reply::Error(e.to_string()), None),
        },
    };
    let (reply, reusable) = vm.run(&vm.func, sha, revision, rules, keys, args, call);
    (reply, reusable.then_some(vm))
}

pub(super) fn clean(msg: &str) -> String {
    // mlua appends a traceback after a newline; Redis replies are one line.
    msg.lines().next().unwrap_or("").replace('\r', " ")
}

/// The interpreters of recently run scripts, by SHA1: at most [`LUA_CACHE_SCRIPTS`] of them
/// and [`LUA_CACHE_BYTES`] of idle heap, least recently run evicted first. Not replicated
/// state: skipped by serde, empty in a clone, ignored by `==` (a run's result never depends
/// on it; see the module docs).
#[derive(Default)]
pub(crate) struct LuaCache(Mutex<Vms>);

#[derive(Default)]
struct Vms {
    /// SHA1 → (last run, VM).
    map: BTreeMap<String, (u64, Vm)>,
    tick: u64,
    /// Sum of the cached VMs' baselines.
    bytes: usize,
}

impl LuaCache {
    fn vms(&mut self) -> &mut Vms {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }

    /// Take the VM of `sha` out of the cache, if it is one of `src` (a SHA1 collision gets a
    /// VM of its own source).
    pub(crate) fn take(&mut self, sha: &str, src: &str) -> Option<Vm> {
        let vms = self.vms();
        if vms.map.get(sha).is_none_or(|(_, vm)| vm.src != src) {
            return None;
        }
        let (_, vm) = vms.map.remove(sha)?;
        vms.bytes -= vm.baseline;
        Some(vm)
    }

    /// Put a VM (back), evicting the least recently run ones past the bounds.
    pub(crate) fn put(&mut self, sha: &str, vm: Vm) {
        if vm.baseline > LUA_CACHE_BYTES {
            return;
        }
        let vms = self.vms();
        vms.tick += 1;
        if let Some((_, old)) = vms.map.remove(sha) {
            vms.bytes -= old.baseline;
        }
        while vms.map.len() >= LUA_CACHE_SCRIPTS || vms.bytes + vm.baseline > LUA_CACHE_BYTES {
            let Some(oldest) = vms
                .map
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(sha, _)| sha.clone())
            else {
                break;
            };
            if let Some((_, old)) = vms.map.remove(&oldest) {
                vms.bytes -= old.baseline;
            }
        }
        vms.bytes += vm.baseline;
        let tick = vms.tick;
        vms.map.insert(sha.to_owned(), (tick, vm));
    }

    /// Drop every cached VM (`SCRIPT FLUSH`).
    pub(crate) fn clear(&mut self) {
        *self.vms() = Vms::default();
    }

    /// Cached VMs and the sum of their baselines (bytes).
    #[cfg(test)]
    pub(crate) fn usage(&mut self) -> (usize, usize) {
        let vms = self.vms();
        (vms.map.len(), vms.bytes)
    }

    /// Is a VM of `sha` cached?
    #[cfg(test)]
    pub(crate) fn contains(&mut self, sha: &str) -> bool {
        self.vms().map.contains_key(sha)
    }
}

impl Clone for LuaCache {
    /// Empty: a clone (a snapshot) starts without interpreters, like a restarted replica.
    fn clone(&self) -> LuaCache {
        LuaCache::default()
    }
}

impl PartialEq for LuaCache {
    fn eq(&self, _: &LuaCache) -> bool {
        true
    }
}

impl Eq for LuaCache {}

impl fmt::Debug for LuaCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LuaCache")
    }
}

/// One script's interpreter.
pub(crate) struct Vm {
    lua: Lua,
    /// The source, to tell a SHA1 collision apart.
    src: String,
    /// The compiled script.
    func: Function,
    /// The body of every run's coroutine: `driver(f, dispatch, KEYS, ARGV)` → `pcall(f)`.
    driver: Function,
    /// The same under the deterministic rules: `driver` with `tostring`, `next`, `pairs` and
    /// `table.foreach` replaced for the run.
    det_driver: Function,
    /// The same under the rules that hash objects by creation id: `driver` with only
    /// `tostring` replaced.
    ids_driver: Function,
    /// The same under the helper rules: `ids_driver` with the Rust helpers replaced by the
    /// charged ones of `helpers.rs`. Only in a VM built for them (`HELPERS_PRELUDE`).
    helpers_driver: Option<Function>,
    /// `normalize(pad)` concatenates `pad .. pad` (resets the concatenation buffer).
    normalize: Function,
    pad: LuaString,
    /// The environment of `func` and `driver` between runs (never given to a script).
    neutral: Table,
    /// The string metatable between runs.
    string_mt: Table,
    budget: Arc<Budget>,
    rng: Arc<AtomicU64>,
    cjson: cjson::Settings,
    /// `used_memory` of the idle VM.
    baseline: usize,
}

impl Vm {
    /// Build the VM of `src`: compile it, set up the sandbox, settle the heap.
    fn build(src: &str, with_helpers: bool) -> Result<Vm, KvError> {
        let start = |e: mlua::Error| {
            KvError::invalid(format!("cannot start Lua: {}", clean(&e.to_string())))
        };
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::default(),
        )
        .map_err(start)?;
        lua.set_memory_limit(LUA_MEMORY_LIMIT).map_err(start)?;
        let func = lua
            .load(src)
            .set_name("@user_script")
            .set_mode(ChunkMode::Text)
            .into_function()
            .map_err(|e| {
                KvError::invalid(format!(
                    "Error compiling script (new function): {}",
                    clean(&e.to_string())
                ))
            })?;
        let mut vm = setup(lua, src, func, with_helpers).map_err(start)?;
        vm.baseline = vm.settle().map_err(start)?;
        Ok(vm)
    }

    /// Pre-grow the reference stack, warm up with an empty chunk, collect until the heap
    /// stops changing: the baseline.
    fn settle(&self) -> mlua::Result<usize> {
        let held: Vec<Table> = (0..REF_SLOTS).map(|_| self.neutral.clone()).collect();
        drop(held);
        let noop = self
            .lua
            .load("")
            .set_name("=warmup")
            .set_mode(ChunkMode::Text)
            .into_function()?;
        let old = Rules {
            deterministic: false,
            bounded: false,
            ids: false,
            helpers: false,
            whole_mark: false,
        };
        self.invoke(&noop, 0, old, &[], &[], |_, _| Reply::Nil)?;
        drop(noop);
        let mut last = self.cleanup()?;
        for _ in 0..CLEANUP_ROUNDS {
            let used = self.cleanup()?;
            if used == last {
                break;
            }
            last = used;
        }
        Ok(last)
    }

    /// Run `f` (the script, or the warm-up chunk) once; the reply, and whether the VM is
    /// back at its baseline (may be reused).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        f: &Function,
        sha: &str,
        index: u64,
        rules: Rules,
        keys: &[Bytes],
        args: &[Bytes],
        exec: impl FnMut(&[Bytes], &dyn Fn(u64) -> bool) -> Reply,
    ) -> (Reply, bool) {
        let outcome = self.invoke(f, index, rules, keys, args, exec);
        let over = self.budget.is_over();
        let reusable = outcome.is_ok() && !over && self.back_to_baseline().unwrap_or(false);
        let reply = match outcome {
            // Work charged in C and still owed when the script's pcall returned is paid by
            // the driver's next instruction, outside that pcall.
            Err(_) if over && rules.bounded => busy(sha, rules),
            Err(e) => Reply::err(format!("ERR {} script: {sha}", clean(&e.to_string()))),
            Ok((true, reply)) => reply,
            Ok((false, _)) if over => busy(sha, rules),
            // error({err = ...}) / a failed redis.call: pass the error reply through.
            Ok((false, Reply::Error(e))) => Reply::Error(e),
            Ok((false, Reply::Bulk(msg))) => Reply::err(format!(
                "ERR {} script: {sha}, on @user_script.",
                clean(&String::from_utf8_lossy(&msg))
            )),
            Ok((false, other)) => Reply::err(format!("ERR script error: {other:?} script: {sha}")),
        };
        (reply, reusable)
    }

    /// One run in a new coroutine: `(pcall succeeded, value)`. Restores the shared objects a
    /// script can change (see the module docs) whatever the outcome.
    fn invoke(
        &self,
        f: &Function,
        index: u64,
        rules: Rules,
        keys: &[Bytes],
        args: &[Bytes],
        mut exec: impl FnMut(&[Bytes], &dyn Fn(u64) -> bool) -> Reply,
    ) -> mlua::Result<(bool, Reply)> {
        let det = rules.deterministic;
        self.budget.reset(rules.budget(), rules.helpers);
        self.rng.store(seed(index), Ordering::Relaxed);
        self.cjson.reset(det, rules.bounded);
        let budget = &self.budget;
        let lua = &self.lua;
        // The limit holds during the run only: restoring and collecting afterwards must not
        // fail (mlua makes some of those calls unprotected).
        lua.set_memory_limit(self.baseline.saturating_add(LUA_MEMORY_LIMIT))?;
        // Objects made from here on (the run's coroutine, KEYS, ARGV, everything the script
        // makes) are numbered from the same id on every run, and tables hash them by it.
        let hashing = if rules.ids {
            Some(ids::On::new(lua, rules.whole_mark)?)
        } else {
            None
        };
        let outcome = lua.scope(|scope| {
            let dispatch = scope.create_function_mut(|lua, argv: MultiValue| {
                // Under the helper rules, mlua's way in and each argument it converted.
                budget.helper(argv.len(), 0)?;
                let mut cmd: Vec<Bytes> = Vec::with_capacity(argv.len());
                for v in argv.iter() {
                    match v {
                        LV::String(s) => cmd.push(s.as_bytes().to_vec()),
                        LV::Integer(i) => cmd.push(i.to_string().into_bytes()),
                        LV::Number(n) => cmd.push(fmt_f64(*n).into_bytes()),
                        _ => return reply_to_lua(
                            lua,
                            &Reply::err(
                                "ERR Lua redis lib command arguments must be strings or integers",
                            ),
                            0,
                        ),
                    }
                }
                if cmd.is_empty() {
                    return reply_to_lua(
                        lua,
                        &Reply::err(
                            "ERR Please specify at least one argument for this redis lib call",
                        ),
                        0,
                    );
                }
                if rules.bounded {
                    budget.charge(call_cost(&cmd))?;
                }
                // `exec` may pay for the command's own work first (`kv/cmd/cost.rs`): a
                // payment past the budget is the run's end, whatever `exec` answered.
                let reply = exec(&cmd, &|n| budget.charge(n).is_ok());
                if budget.is_over() {
                    budget.charge(0)?;
                }
                if rules.bounded {
                    budget.charge(reply_cost(&reply))?;
                }
                reply_to_lua(lua, &reply, 0)
            })?;
            let driver = if rules.helpers {
                self.helpers_driver
                    .as_ref()
                    .ok_or_else(|| mlua::Error::runtime("a VM built for older rules"))?
            } else if rules.ids {
                &self.ids_driver
            } else if det {
                &self.det_driver
            } else {
                &self.driver
            };
            let thread = lua.create_thread(driver.clone())?;
            let (f, keys, args) = (f.clone(), strings(lua, keys)?, strings(lua, args)?);
            let charging = rules.bounded.then(|| charging::On::new(rules.helpers));
            let resumed = thread.resume::<(bool, LV)>((f, dispatch, keys, args));
            drop(charging);
            let (ok, value) = resumed?;
            Ok((ok, lua_to_reply(&value, 0, det)))
        });
        drop(hashing);
        let unlimited = lua.set_memory_limit(0);
        let restored = self.restore(f);
        let outcome = outcome?;
        unlimited?;
        restored?;
        Ok(outcome)
    }

    /// Give the chunk, the driver and strings their between-runs environment and metatable.
    fn restore(&self, f: &Function) -> mlua::Result<()> {
        f.set_environment(self.neutral.clone())?;
        self.driver.set_environment(self.neutral.clone())?;
        self.det_driver.set_environment(self.neutral.clone())?;
        self.ids_driver.set_environment(self.neutral.clone())?;
        if let Some(d) = &self.helpers_driver {
            d.set_environment(self.neutral.clone())?;
        }
        self.lua
            .set_type_metatable::<LuaString>(Some(self.string_mt.clone()));
        Ok(())
    }

    /// After a run: collect until the heap is at the baseline (`true`) or stops shrinking.
    fn back_to_baseline(&self) -> mlua::Result<bool> {
        let mut last = usize::MAX;
        for _ in 0..CLEANUP_ROUNDS {
            let used = self.cleanup()?;
            if used == self.baseline {
                return Ok(true);
            }
            if used >= last {
                break;
            }
            last = used;
        }
        Ok(false)
    }

    /// Full collection, concatenation buffer back to `2 * PAD` bytes, full collection.
    fn cleanup(&self) -> mlua::Result<usize> {
        self.lua.gc_collect()?;
        self.normalize.call::<()>(&self.pad)?;
        self.lua.gc_collect()?;
        Ok(self.lua.used_memory())
    }
}

/// A Lua array of byte strings (`KEYS`, `ARGV`).
fn strings(lua: &Lua, items: &[Bytes]) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(items.len(), 0)?;
    for (i, v) in items.iter().enumerate() {
        t.raw_set(i + 1, lua.create_string(v)?)?;
    }
    Ok(t)
}

/// The sandbox of a new VM: what every run copies, and the driver that runs it.
fn setup(lua: Lua, src: &str, func: Function, with_helpers: bool) -> mlua::Result<Vm> {
    let g = lua.globals();
    for name in [
        "dofile",
        "loadfile",
        "load",
        "loadstring",
        "print",
        "newproxy",
        "gcinfo",
        "collectgarbage",
    ] {
        g.set(name, LV::Nil)?;
    }
    let string: Table = g.get("string")?;
    string.set("dump", LV::Nil)?;

    // xorshift64*, seeded from the command's revision at every run: the same draws on every replica.
    let rng = Arc::new(AtomicU64::new(seed(0)));
    let math: Table = g.get("math")?;
    {
        let state = rng.clone();
        math.set(
            "random",
            lua.create_function(move |_, (m, n): (Option<f64>, Option<f64>)| {
                random_draw(&state, m, n).ok_or_else(|| {
                    mlua::Error::RuntimeError("bad argument to 'random' (interval is empty)".into())
                })
            })?,
        )?;
    }
    {
        let state = rng.clone();
        math.set(
            "randomseed",
            lua.create_function(move |_, s: f64| {
                state.store(seed(s as i64 as u64), Ordering::Relaxed);
                Ok(())
            })?,
        )?;
    }

    let redis = lua.create_table()?;
    redis.set(
        "sha1hex",
        lua.create_function(|_, s: mlua::LuaString| Ok(sha1hex(&s.as_bytes())))?,
    )?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, s: mlua::LuaString| {
            let t = lua.create_table()?;
            t.set("err", s)?;
            Ok(t)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, s: mlua::LuaString| {
            let t = lua.create_table()?;
            t.set("ok", s)?;
            Ok(t)
        })?,
    )?;
    redis.set("log", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.set("setresp", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.set("set_repl", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.set(
        "replicate_commands",
        lua.create_function(|_, _: MultiValue| Ok(true))?,
    )?;
    for (i, name) in ["LOG_DEBUG", "LOG_VERBOSE", "LOG_NOTICE", "LOG_WARNING"]
        .iter()
        .enumerate()
    {
        redis.set(*name, i)?;
    }
    redis.set("REPL_ALL", 3)?;
    redis.set("REPL_NONE", 0)?;
    redis.set("REPL_AOF", 1)?;
    redis.set("REPL_SLAVE", 2)?;
    redis.set("REPL_REPLICA", 2)?;
    g.set("redis", redis)?;

    let budget = Arc::new(Budget::new());
    {
        let budget = budget.clone();
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| {
                budget.charge(u64::from(HOOK_EVERY))?;
                Ok(VmState::Continue)
            },
        )?;
    }
    // Threads mlua creates (every run's coroutine) get the global hook, and coroutines inherit
    // it; the main thread runs only the cleanup, unhooked.
    lua.remove_hook();
    let over = lua.create_function({
        let budget = budget.clone();
        move |_, ()| {
            // Every pcall asks (a Rust call): charged under the helper rules; a charge past
            // the budget makes the answer true.
            let _ = budget.helper(0, 0);
            Ok(budget.is_over())
        }
    })?;
    let set_string_mt = lua.create_function(|lua, mt: Table| {
        lua.set_type_metatable::<LuaString>(Some(mt));
        Ok(())
    })?;
    let (cjson_raw, cjson) = cjson::install(&lua, budget.clone())?;
    // Would Lua's `tostring` show this value's address (no `__tostring` in its metatable)?
    let shows_address = lua.create_function({
        let budget = budget.clone();
        move |_, v: LV| {
            budget.helper(1, 0)?;
            Ok(match v {
                LV::Table(t) => match t.metatable() {
                    Some(mt) => mt.raw_get::<LV>("__tostring")?.is_nil(),
                    None => true,
                },
                LV::Function(_) | LV::Thread(_) | LV::UserData(_) => true,
                LV::LightUserData(p) => !p.0.is_null(),
                // Errors raised by Rust helpers are userdata whose `__tostring` is the message.
                _ => false,
            })
        }
    })?;

    // Only a VM built for the helper rules makes anything for them (see HELPERS_PRELUDE).
    let error: Option<Function> = if with_helpers {
        Some(g.get("error")?)
    } else {
        None
    };
    let (driver, det_driver, ids_driver, normalize): (Function, Function, Function, Function) = lua
        .load(PRELUDE)
        .set_name("=fenced_prelude")
        .set_mode(ChunkMode::Text)
        .call((
            g,
            over,
            set_string_mt,
            cjson_raw,
            cjson::null(),
            shows_address,
        ))?;
    let helpers_driver = match error {
        Some(error) => {
            let safe = helpers::install(&lua, budget.clone(), rng.clone())?;
            let d: Function = lua
                .load(HELPERS_PRELUDE)
                .set_name("=fenced_helpers")
                .set_mode(ChunkMode::Text)
                .call((ids_driver.clone(), safe, error))?;
            Some(d)
        }
        None => None,
    };
    let neutral = lua.create_table()?;
    driver.set_environment(neutral.clone())?;
    det_driver.set_environment(neutral.clone())?;
    ids_driver.set_environment(neutral.clone())?;
    if let Some(d) = &helpers_driver {
        d.set_environment(neutral.clone())?;
    }
    func.set_environment(neutral.clone())?;
    let string_mt = lua
        .type_metatable::<LuaString>()
        .ok_or_else(|| mlua::Error::runtime("strings have no metatable"))?;
    let pad = lua.create_string([b' '; PAD])?;
    Ok(Vm {
        lua,
        src: src.to_owned(),
        func,
        driver,
        det_driver,
        ids_driver,
        helpers_driver,
        normalize,
        pad,
        neutral,
        string_mt,
        budget,
        rng,
        cjson,
        baseline: 0,
    })
}

/// The next draw of the xorshift64* state (advanced whatever the bounds), as `math.random`
/// scales it: `None` for an empty interval.
pub(super) fn random_draw(state: &AtomicU64, m: Option<f64>, n: Option<f64>) -> Option<f64> {
    let mut x = state.load(Ordering::Relaxed);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    state.store(x, Ordering::Relaxed);
    let r = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
    match (m, n) {
        (None, _) => Some(r),
        (Some(m), None) if m >= 1.0 => Some((r * m.floor()).floor() + 1.0),
        (Some(m), Some(n)) if m <= n => Some((r * (n - m + 1.0).floor()).floor() + m),
        _ => None,
    }
}

pub(super) fn seed(x: u64) -> u64 {
    // splitmix64 of the input, never zero (xorshift's fixed point).
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}
