//! Replies between RESP and Lua values, by Redis's RESP2 rules (`redis.call`'s reply into
//! Lua, a script's result out of it).

use mlua::{Lua, Value as LV};

use super::lua::clean;
use crate::kv::types::Reply;

/// Deepest reply nesting converted between Lua and RESP.
const MAX_DEPTH: usize = 64;

/// RESP → Lua, Redis's RESP2 rules.
pub(super) fn reply_to_lua(lua: &Lua, r: &Reply, depth: usize) -> mlua::Result<LV> {
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
/// `{err=…}`/`{ok=…}` → error/status, other tables → arrays up to the first nil; functions,
/// threads and userdata → nil under the deterministic rules (`det`), else (before those rules)
/// their `tostring` text, which shows an address.
pub(super) fn lua_to_reply(v: &LV, depth: usize, det: bool) -> Reply {
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
                    Ok(item) => out.push(lua_to_reply(&item, depth + 1, det)),
                }
                i += 1;
            }
            Reply::Array(out)
        }
        // Errors raised as non-tables (strings, budget failures) arrive as these.
        LV::Error(e) => Reply::Bulk(clean(&e.to_string()).into_bytes()),
        _ if det => Reply::Nil,
        other => Reply::Bulk(
            other
                .to_string()
                .unwrap_or_else(|_| other.type_name().to_string())
                .into_bytes(),
        ),
    }
}
