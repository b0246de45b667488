//! The Rust helpers a script calls under the helper rules
//! ([`crate::Semantics::CHARGED_HELPERS`]): `redis.sha1hex`, `redis.error_reply`,
//! `redis.status_reply`, `redis.log`, `redis.setresp`, `redis.set_repl`,
//! `redis.replicate_commands`, `math.random` and `math.randomseed`, each taking its
//! arguments as they come and answering `ok, values…` for a Lua wrapper the run's driver
//! installs (`prelude.rs`, `helpers_driver`), which raises `(false, message)` as a plain Lua
//! string error.
//!
//! Why not the functions older rules run (`lua.rs`, `setup`): an error a Rust callback
//! returns goes through mlua, which builds a traceback for it — `luaL_traceback`, whose
//! search for each frame's function name walks the run's globals and every table in them —
//! none of it charged: `pcall(redis.sha1hex)` in a loop paused 578 ms at its budget (issue
//! 49; the script fuzzer's seed 14953). And nothing charged what these cost per call and
//! per argument (mlua's way in, each argument a slot of its reference stack) or per byte
//! hashed (`redis.sha1hex` of 30 MB took 60 ms as one step). Here each call is charged
//! [`Budget::helper`] before its work: the call, its arguments and the bytes it reads.
//! Older entries keep the old functions, errors and charges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mlua::{Lua, MultiValue, Table, Value as LV};

use super::budget::Budget;
use super::cjson::type_name as lua_type;
use super::lua::{random_draw, seed, sha1hex};

/// `ok, values…`: `values` after a leading `true`.
fn ok(lua: &Lua, values: Vec<LV>) -> mlua::Result<MultiValue> {
    let _ = lua;
    let mut out = MultiValue::from_vec(values);
    out.push_front(LV::Boolean(true));
    Ok(out)
}

/// `false, message`: the wrapper raises `message` as a Lua string error.
fn fail(lua: &Lua, message: &str) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_vec(vec![
        LV::Boolean(false),
        LV::String(lua.create_string(message)?),
    ]))
}

/// A string argument, or a number as Lua would convert it (Redis's `lua_isstring`).
fn string_arg(lua: &Lua, v: &LV) -> mlua::Result<Option<mlua::LuaString>> {
    Ok(match v {
        LV::String(s) => Some(s.clone()),
        LV::Integer(_) | LV::Number(_) => lua.coerce_string(v.clone())?,
        _ => None,
    })
}

/// A number argument (`nil`: none), or a string Lua converts to one; `Err(())`: neither.
fn number_arg(lua: &Lua, v: Option<&LV>) -> mlua::Result<Result<Option<f64>, ()>> {
    Ok(match v {
        None | Some(LV::Nil) => Ok(None),
        Some(LV::Integer(i)) => Ok(Some(*i as f64)),
        Some(LV::Number(n)) => Ok(Some(*n)),
        Some(s @ LV::String(_)) => match lua.coerce_number(s.clone())? {
            Some(n) => Ok(Some(n)),
            None => Err(()),
        },
        Some(_) => Err(()),
    })
}

/// Bytes of string among `args` (what a helper may read).
fn string_bytes(args: &MultiValue) -> usize {
    args.iter()
        .map(|v| match v {
            LV::String(s) => s.as_bytes().len(),
            _ => 0,
        })
        .sum()
}

/// The helpers' table, by the names the wrappers replace (`prelude.rs`).
pub(super) fn install(lua: &Lua, budget: Arc<Budget>, rng: Arc<AtomicU64>) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    {
        let budget = budget.clone();
        t.set(
            "sha1hex",
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), string_bytes(&args))?;
                if args.len() != 1 {
                    return fail(lua, "wrong number of arguments");
                }
                let Some(s) = string_arg(lua, &args[0])? else {
                    return fail(
                        lua,
                        &format!(
                            "bad argument #1 to 'sha1hex' (string expected, got {})",
                            lua_type(&args[0])
                        ),
                    );
                };
                let hex = sha1hex(&s.as_bytes());
                ok(lua, vec![LV::String(lua.create_string(hex)?)])
            })?,
        )?;
    }
    for (name, field) in [("error_reply", "err"), ("status_reply", "ok")] {
        let budget = budget.clone();
        t.set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), 0)?;
                if budget.charges_helpers() {
                    budget.charge(super::rules::HELPER_REPLY_STEPS)?;
                }
                let s = match args.len() {
                    1 => string_arg(lua, &args[0])?,
                    _ => None,
                };
                let Some(s) = s else {
                    return fail(lua, "wrong number or type of arguments");
                };
                let reply = lua.create_table()?;
                reply.set(field, s)?;
                ok(lua, vec![LV::Table(reply)])
            })?,
        )?;
    }
    for (name, answer) in [
        ("log", None),
        ("setresp", None),
        ("set_repl", None),
        ("replicate_commands", Some(true)),
    ] {
        let budget = budget.clone();
        t.set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), string_bytes(&args))?;
                ok(lua, answer.map(LV::Boolean).into_iter().collect())
            })?,
        )?;
    }
    {
        let (budget, state) = (budget.clone(), rng.clone());
        t.set(
            "random",
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), 0)?;
                let mut bounds = [None, None];
                for (i, bound) in bounds.iter_mut().enumerate() {
                    match number_arg(lua, args.get(i))? {
                        Ok(n) => *bound = n,
                        Err(()) => {
                            return fail(
                                lua,
                                &format!(
                                    "bad argument #{} to 'random' (number expected, got {})",
                                    i + 1,
                                    lua_type(&args[i])
                                ),
                            )
                        }
                    }
                }
                match random_draw(&state, bounds[0], bounds[1]) {
                    Some(r) => ok(lua, vec![LV::Number(r)]),
                    None => fail(lua, "bad argument to 'random' (interval is empty)"),
                }
            })?,
        )?;
    }
    {
        let state = rng;
        t.set(
            "randomseed",
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), 0)?;
                match number_arg(lua, args.front())? {
                    Ok(Some(s)) => {
                        state.store(seed(s as i64 as u64), Ordering::Relaxed);
                        ok(lua, vec![])
                    }
                    _ => fail(
                        lua,
                        &format!(
                            "bad argument #1 to 'randomseed' (number expected, got {})",
                            args.front().map_or("no value", lua_type)
                        ),
                    ),
                }
            })?,
        )?;
    }
    Ok(t)
}
