//! Lua scripting (`EVAL`/`EVALSHA`) inside `apply`, deterministic on every replica.
//!
//! * A fresh Lua 5.1 VM per script run (base, table, string, math; no io/os/debug/package, no
//!   loaders: text chunks only).
//! * `math.random`/`math.randomseed` are a xorshift PRNG seeded from the entry index, so every
//!   replica draws the same numbers.
//! * Budgets are counted, never timed: [`LUA_INSTRUCTION_BUDGET`] VM instructions (checked
//!   every 10 000, in coroutines the script creates too) and [`LUA_MEMORY_LIMIT`] bytes. Once
//!   over budget, neither `pcall`/`xpcall` nor `coroutine.resume` can swallow the error.
//! * `redis.call`/`redis.pcall` run the keyspace interpreter directly, with Redis's RESP2 ↔ Lua
//!   conversions. `TIME` is the entry's log time.
//! * `cjson` (encode/decode/null and lua-cjson's settings) as Redis bundles it, implemented in
//!   Rust (`cjson.rs`). **Object keys are encoded in sorted byte order**, not lua-cjson's
//!   hash-table order, so every replica writes the same bytes; its work is charged to the same
//!   instruction budget and its output is capped at [`LUA_MEMORY_LIMIT`].
//! * **Errors keep earlier writes** (Redis semantics): writes a script made before it failed
//!   stay applied, and the client gets the error. Every replica stops at the same
//!   instruction, so every replica keeps the same writes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use mlua::chunk::ChunkMode;
use mlua::{HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Table, Value as LV, VmState};

use super::exec::{fmt_f64, Ctx};
use super::{Bytes, Reply, LUA_INSTRUCTION_BUDGET, LUA_MEMORY_LIMIT};

/// The instruction budget of one script run: counted by the VM hook, and charged by native
/// helpers (`cjson`) for work done outside the VM.
pub(super) struct Budget {
    spent: AtomicU64,
    over: AtomicBool,
}

impl Budget {
    fn new() -> Budget {
        Budget {
            spent: AtomicU64::new(0),
            over: AtomicBool::new(false),
        }
    }

    /// Spend `n` instructions; past the budget (now or before) this fails, and keeps failing.
    pub(super) fn charge(&self, n: u64) -> mlua::Result<()> {
        let spent = self.spent.fetch_add(n, Ordering::Relaxed).saturating_add(n);
        if spent > LUA_INSTRUCTION_BUDGET || self.over.load(Ordering::Relaxed) {
            self.over.store(true, Ordering::Relaxed);
            return Err(mlua::Error::RuntimeError(format!(
                "script exceeded the budget of {LUA_INSTRUCTION_BUDGET} instructions"
            )));
        }
        Ok(())
    }

    fn is_over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }
}

/// Deepest reply nesting converted between Lua and RESP.
const MAX_DEPTH: usize = 64;
const HOOK_EVERY: u32 = 10_000;

/// Lower-case hex SHA1 (the script cache key, `redis.sha1hex`).
pub fn sha1hex(data: &[u8]) -> String {
    sha1_smol::Sha1::from(data).digest().to_string()
}

/// Check that `src` compiles (for `SCRIPT LOAD`).
pub(crate) fn compile_check(src: &str) -> Result<(), String> {
    let lua = Lua::new_with(StdLib::NONE, LuaOptions::default())
        .map_err(|e| format!("ERR cannot start Lua: {e}"))?;
    lua.set_memory_limit(LUA_MEMORY_LIMIT)
        .map_err(|e| format!("ERR cannot start Lua: {e}"))?;
    lua.load(src)
        .set_name("@user_script")
        .set_mode(ChunkMode::Text)
        .into_function()
        .map(|_| ())
        .map_err(|e| {
            format!(
                "ERR Error compiling script (new function): {}",
                clean(&e.to_string())
            )
        })
}

/// Run a script; any failure becomes an error reply (earlier writes stay).
pub(crate) fn run(
    ctx: &mut Ctx<'_>,
    sha: &str,
    src: &str,
    keys: &[Bytes],
    args: &[Bytes],
) -> Reply {
    let was = ctx.in_script;
    ctx.in_script = true;
    let r = run_inner(ctx, sha, src, keys, args);
    ctx.in_script = was;
    r.unwrap_or_else(Reply::Error)
}

fn clean(msg: &str) -> String {
    // mlua appends a traceback after a newline; Redis replies are one line.
    msg.lines().next().unwrap_or("").replace('\r', " ")
}

fn run_inner(
    ctx: &mut Ctx<'_>,
    sha: &str,
    src: &str,
    keys: &[Bytes],
    args: &[Bytes],
) -> Result<Reply, String> {
    let start = |e: mlua::Error| format!("ERR cannot start Lua: {}", clean(&e.to_string()));
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH,
        LuaOptions::default(),
    )
    .map_err(start)?;
    lua.set_memory_limit(LUA_MEMORY_LIMIT).map_err(start)?;

    let budget = Arc::new(Budget::new());
    {
        let budget = budget.clone();
        // A global hook: coroutines the script creates inherit it (a per-thread hook is
        // dropped by mlua in a thread it did not register, so a loop in a coroutine ran
        // unbudgeted).
        lua.set_global_hook(
            HookTriggers::new().every_nth_instruction(HOOK_EVERY),
            move |_, _| {
                budget.charge(u64::from(HOOK_EVERY))?;
                Ok(VmState::Continue)
            },
        )
        .map_err(start)?;
    }
    setup_env(&lua, ctx.index, keys, args, budget.clone()).map_err(start)?;

    let func = match lua
        .load(src)
        .set_name("@user_script")
        .set_mode(ChunkMode::Text)
        .into_function()
    {
        Ok(f) => f,
        Err(e) => {
            return Err(format!(
                "ERR Error compiling script (new function): {}",
                clean(&e.to_string())
            ))
        }
    };

    lua.scope(|scope| {
        let dispatch = scope.create_function_mut(|lua, argv: MultiValue| {
            let mut cmd: Vec<Bytes> = Vec::with_capacity(argv.len());
            for v in argv.iter() {
                match v {
                    LV::String(s) => cmd.push(s.as_bytes().to_vec()),
                    LV::Integer(i) => cmd.push(i.to_string().into_bytes()),
                    LV::Number(n) => cmd.push(fmt_f64(*n).into_bytes()),
                    _ => {
                        return reply_to_lua(
                            lua,
                            &Reply::err(
                                "ERR Lua redis lib command arguments must be strings or integers",
                            ),
                            0,
                        )
                    }
                }
            }
            if cmd.is_empty() {
                return reply_to_lua(
                    lua,
                    &Reply::err("ERR Please specify at least one argument for this redis lib call"),
                    0,
                );
            }
            let reply = ctx.exec(&cmd);
            reply_to_lua(lua, &reply, 0)
        })?;
        lua.globals().set("__fenced_dispatch", dispatch)?;
        let driver: mlua::Function = lua.globals().get("__fenced_run")?;
        let (ok, value): (bool, LV) = driver.call(func)?;
        Ok((ok, lua_to_reply(&value, 0)))
    })
    .map_err(|e| format!("ERR {} script: {sha}", clean(&e.to_string())))
    .map(|(ok, reply)| {
        if ok {
            return reply;
        }
        if budget.is_over() {
            return Reply::err(format!(
                "BUSY script exceeded the budget of {LUA_INSTRUCTION_BUDGET} instructions and was stopped (earlier writes stay) script: {sha}"
            ));
        }
        match reply {
            // error({err = ...}) / a failed redis.call: pass the error reply through.
            Reply::Error(e) => Reply::Error(e),
            Reply::Bulk(msg) => Reply::err(format!(
                "ERR {} script: {sha}, on @user_script.",
                clean(&String::from_utf8_lossy(&msg))
            )),
            other => Reply::err(format!("ERR script error: {other:?} script: {sha}")),
        }
    })
}

/// Globals: `KEYS`, `ARGV`, `redis.*`, `cjson`, deterministic `math.random`, budget-aware
/// `pcall`/`xpcall`/`coroutine.resume`.
fn setup_env(
    lua: &Lua,
    index: u64,
    keys: &[Bytes],
    args: &[Bytes],
    budget: Arc<Budget>,
) -> mlua::Result<()> {
    let g = lua.globals();
    for name in [
        "dofile",
        "loadfile",
        "load",
        "loadstring",
        "print",
        "newproxy",
        "gcinfo",
    ] {
        g.set(name, LV::Nil)?;
    }
    let string: Table = g.get("string")?;
    string.set("dump", LV::Nil)?;

    let mk = |items: &[Bytes]| -> mlua::Result<Table> {
        let t = lua.create_table_with_capacity(items.len(), 0)?;
        for (i, v) in items.iter().enumerate() {
            t.raw_set(i + 1, lua.create_string(v)?)?;
        }
        Ok(t)
    };
    g.set("KEYS", mk(keys)?)?;
    g.set("ARGV", mk(args)?)?;

    // xorshift64*, seeded from the entry index: the same draws on every replica.
    let state = Arc::new(AtomicU64::new(seed(index)));
    let math: Table = g.get("math")?;
    {
        let state = state.clone();
        math.set(
            "random",
            lua.create_function(move |_, (m, n): (Option<f64>, Option<f64>)| {
                let mut x = state.load(Ordering::Relaxed);
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                state.store(x, Ordering::Relaxed);
                let r = (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
                match (m, n) {
                    (None, _) => Ok(r),
                    (Some(m), None) if m >= 1.0 => Ok((r * m.floor()).floor() + 1.0),
                    (Some(m), Some(n)) if m <= n => Ok((r * (n - m + 1.0).floor()).floor() + m),
                    _ => Err(mlua::Error::RuntimeError(
                        "bad argument to 'random' (interval is empty)".into(),
                    )),
                }
            })?,
        )?;
    }
    math.set(
        "randomseed",
        lua.create_function(move |_, s: f64| {
            state.store(seed(s as i64 as u64), Ordering::Relaxed);
            Ok(())
        })?,
    )?;

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
    g.set(
        "__fenced_over_budget",
        lua.create_function({
            let budget = budget.clone();
            move |_, ()| Ok(budget.is_over())
        })?,
    )?;
    super::cjson::install(lua, budget)?;

    lua.load(
        r#"
local raw_pcall, raw_xpcall, raw_error, dispatch_name = pcall, xpcall, error, "__fenced_dispatch"
local over = __fenced_over_budget
local function reraise(ok, ...)
  if over() then raw_error("script exceeded its instruction budget", 0) end
  return ok, ...
end
pcall = function(...) return reraise(raw_pcall(...)) end
xpcall = function(...) return reraise(raw_xpcall(...)) end
local raw_resume = coroutine.resume
coroutine.resume = function(...) return reraise(raw_resume(...)) end
redis.call = function(...)
  local r = _G[dispatch_name](...)
  if type(r) == "table" and rawget(r, "err") ~= nil then raw_error(r, 0) end
  return r
end
redis.pcall = function(...) return _G[dispatch_name](...) end
__fenced_run = function(f) return raw_pcall(f) end
"#,
    )
    .set_name("=fenced_prelude")
    .exec()?;
    Ok(())
}

fn seed(x: u64) -> u64 {
    // splitmix64 of the input, never zero (xorshift's fixed point).
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

/// RESP → Lua, Redis's RESP2 rules.
fn reply_to_lua(lua: &Lua, r: &Reply, depth: usize) -> mlua::Result<LV> {
    if depth > MAX_DEPTH {
        return Ok(LV::Boolean(false));
    }
    Ok(match r {
        Reply::Int(i) => LV::Number(*i as f64),
        Reply::Bulk(b) => LV::String(lua.create_string(b)?),
        Reply::Double(s) => LV::String(lua.create_string(s)?),
        Reply::Nil | Reply::NilArray => LV::Boolean(false),
        Reply::Status(s) => {
            let t = lua.create_table()?;
            t.set("ok", s.as_str())?;
            LV::Table(t)
        }
        Reply::Error(e) => {
            let t = lua.create_table()?;
            t.set("err", e.as_str())?;
            LV::Table(t)
        }
        Reply::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, it) in items.iter().enumerate() {
                t.raw_set(i + 1, reply_to_lua(lua, it, depth + 1)?)?;
            }
            LV::Table(t)
        }
        Reply::Map(pairs) => {
            let t = lua.create_table_with_capacity(pairs.len() * 2, 0)?;
            for (i, (k, v)) in pairs.iter().enumerate() {
                t.raw_set(2 * i + 1, reply_to_lua(lua, k, depth + 1)?)?;
                t.raw_set(2 * i + 2, reply_to_lua(lua, v, depth + 1)?)?;
            }
            LV::Table(t)
        }
    })
}

/// Lua → RESP, Redis's rules: numbers truncate to integers, `true` → 1, `false`/`nil` → nil,
/// `{err=…}`/`{ok=…}` → error/status, other tables → arrays up to the first nil.
fn lua_to_reply(v: &LV, depth: usize) -> Reply {
    match v {
        LV::Nil => Reply::Nil,
        LV::Boolean(true) => Reply::Int(1),
        LV::Boolean(false) => Reply::Nil,
        LV::Integer(i) => Reply::Int(*i),
        LV::Number(n) => Reply::Int(if n.is_finite() { *n as i64 } else { 0 }),
        LV::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        LV::Table(t) => {
            if let Ok(LV::String(e)) = t.raw_get::<LV>("err") {
                return Reply::Error(String::from_utf8_lossy(&e.as_bytes()).into_owned());
            }
            if let Ok(LV::String(s)) = t.raw_get::<LV>("ok") {
                return Reply::Status(String::from_utf8_lossy(&s.as_bytes()).into_owned());
            }
            if depth >= MAX_DEPTH {
                return Reply::err("ERR reached the nesting limit converting a Lua table");
            }
            let mut out = Vec::new();
            let mut i = 1usize;
            loop {
                match t.raw_get::<LV>(i) {
                    Ok(LV::Nil) | Err(_) => break,
                    Ok(item) => out.push(lua_to_reply(&item, depth + 1)),
                }
                i += 1;
            }
            Reply::Array(out)
        }
        // Errors raised as non-tables (strings, budget failures) arrive as these.
        LV::Error(e) => Reply::Bulk(clean(&e.to_string()).into_bytes()),
        other => Reply::Bulk(
            other
                .to_string()
                .unwrap_or_else(|_| other.type_name().to_string())
                .into_bytes(),
        ),
    }
}
