//! The Lua half of the sandbox (`lua.rs`): the chunk every new VM runs once, which makes
//! the per-run drivers — the copies of the libraries a run gets, the wrappers of `pcall`,
//! `coroutine.resume`, `redis.call` and `cjson`, and the rules that hide addresses.

/// Run once per VM with the set-up globals; returns the per-run drivers and `normalize`.
pub(super) const PRELUDE: &str = r#"
local G, over, set_string_mt, cjson_raw, null, shows_address = ...
local raw_pcall, raw_xpcall, raw_error = pcall, xpcall, error
local raw_resume, raw_running = coroutine.resume, coroutine.running
local next, type, rawget, setfenv, getfenv = next, type, rawget, setfenv, getfenv
local is_lib = { string = true, table = true, math = true, coroutine = true, redis = true }
local base, libs = {}, {}
for k, v in next, G do
  if is_lib[k] then libs[k] = v elseif k ~= "_G" then base[k] = v end
end
local function copy(t)
  local c = {}
  for k, v in next, t do c[k] = v end
  return c
end
local function reraise(ok, ...)
  if over() then raw_error("script exceeded its instruction budget", 0) end
  return ok, ...
end
local function check(ok, ...)
  if ok then return ... end
  raw_error((...), 0)
end
local function driver(f, dispatch, keys, argv)
  local env = copy(base)
  -- Closures made below get `env` as their environment, and so does this frame (getfenv(3)).
  setfenv(1, env)
  for name, lib in next, libs do env[name] = copy(lib) end
  env._G, env.KEYS, env.ARGV = env, keys, argv
  env.pcall = function(...) return reraise(raw_pcall(...)) end
  env.xpcall = function(...) return reraise(raw_xpcall(...)) end
  local co, me = env.coroutine, raw_running()
  co.resume = function(...) return reraise(raw_resume(...)) end
  co.running = function()
    local c = raw_running()
    if c == me then return nil end
    return c
  end
  local redis = env.redis
  redis.call = function(...)
    local r = dispatch(...)
    if type(r) == "table" and rawget(r, "err") ~= nil then raw_error(r, 0) end
    return r
  end
  redis.pcall = function(...) return dispatch(...) end
  local cjson = { null = null, _NAME = "cjson", _VERSION = "2.1.0" }
  for name, fn in next, cjson_raw do
    cjson[name] = function(...) return check(fn(...)) end
  end
  env.cjson = cjson
  set_string_mt({ __index = env.string })
  setfenv(0, env)
  setfenv(f, env)
  return raw_pcall(f)
end
-- The deterministic rules (Semantics::DETERMINISTIC). Locals are named after the functions
-- they hold, so Lua's argument errors name them as before.
local tostring, foreach = G.tostring, G.table.foreach
local object = { table = true, ["function"] = true, thread = true, userdata = true }
local REFUSED = "cannot iterate over a table with table, function, thread or userdata keys "
  .. "(their order depends on memory addresses, which differ between replicas)"
local select = G.select
local function pass(...) return ... end
-- Lua's argument error, raised at the caller of the function that checks (so the message,
-- position included, is the one the C function gave when the script called it directly).
local function typename(n, ...)
  if select('#', ...) < n then return "no value" end
  return type((select(n, ...)))
end
local function expect(n, want, fname, ...)
  if typename(n, ...) ~= want then
    raw_error("bad argument #" .. n .. " to '" .. fname .. "' (" .. want .. " expected, got "
      .. typename(n, ...) .. ")", 3)
  end
end
-- Refuse a table with an object key, before its first key is seen. Scans every key whatever
-- it finds, so the instructions it costs do not depend on the order.
local function scan(t)
  local found = false
  for k in next, t do
    if object[type(k)] then found = true end
  end
  if found then raw_error(REFUSED, 3) end
end
local function checked_next(...)
  local t, k = ...
  if type(t) ~= "table" then expect(1, "table", "next", ...) end
  if k == nil and next(t) ~= nil then scan(t) end
  local nk, v = next(t, k)
  -- An object key added during the traversal (object["nil"] is nil).
  if object[type(nk)] then raw_error(REFUSED, 2) end
  return nk, v
end
local function checked_pairs(...)
  local t = ...
  if type(t) ~= "table" then expect(1, "table", "pairs", ...) end
  return checked_next, t, nil
end
local function checked_foreach(...)
  expect(1, "table", "foreach", ...)
  expect(2, "function", "foreach", ...)
  local t, f = ...
  if next(t) ~= nil then scan(t) end
  return pass(foreach(t, f))
end
-- `tostring` numbering objects in the order the run first shows them: `table: 1`.
local function numbering()
  local ids, n = nil, 0
  return function(...)
    if select('#', ...) == 0 then
      raw_error("bad argument #1 to 'tostring' (value expected)", 2)
    end
    local v = ...
    if object[type(v)] and shows_address(v) then
      if ids == nil then ids = {} end
      local id = ids[v]
      if id == nil then
        n = n + 1
        id = n
        ids[v] = id
      end
      return type(v) .. ": " .. id
    end
    return pass(tostring(...))
  end
end
local function det_driver(f, dispatch, keys, argv)
  -- `driver` gives this closure the run's environment; it installs the rules there and
  -- tail-calls the script (so no frame of its own stays on the stack).
  return driver(function()
    local env = getfenv(1)
    env.tostring = numbering()
    env.next, env.pairs, env.table.foreach = checked_next, checked_pairs, checked_foreach
    setfenv(f, env)
    return f()
  end, dispatch, keys, argv)
end
-- The rules that hash objects by creation id (Semantics::LUA_IDS): a table's order is a
-- function of the script, so only `tostring`, which would print an address, is replaced.
local function ids_driver(f, dispatch, keys, argv)
  return driver(function()
    local env = getfenv(1)
    env.tostring = numbering()
    setfenv(f, env)
    return f()
  end, dispatch, keys, argv)
end
local function normalize(pad)
  local s = pad .. pad
end
return driver, det_driver, ids_driver, normalize
"#;

/// Run once more, after [`PRELUDE`], by a VM built for the helper rules
/// ([`crate::Semantics::CHARGED_HELPERS`]) only — so that a VM built for older rules holds
/// exactly the objects it held before these rules (its baseline heap, hence its collector's
/// pace, unchanged). Takes `ids_driver`, the charged helpers (`helpers.rs`) and `error`;
/// returns `helpers_driver`: `ids_driver` with `redis.sha1hex`, `error_reply`,
/// `status_reply`, `log`, `setresp`, `set_repl`, `replicate_commands`, `math.random` and
/// `math.randomseed` replaced in the run's environment by wrappers that raise a helper's
/// failure as a plain string error.
pub(super) const HELPERS_PRELUDE: &str = r#"
local ids_driver, safe, raw_error = ...
local next, getfenv, setfenv = next, getfenv, setfenv
local function check(ok, ...)
  if ok then return ... end
  raw_error((...), 0)
end
local function wrap(fn)
  return function(...) return check(fn(...)) end
end
local REDIS = { "sha1hex", "error_reply", "status_reply", "log", "setresp", "set_repl",
  "replicate_commands" }
return function(f, dispatch, keys, argv)
  return ids_driver(function()
    local env = getfenv(1)
    local redis, math = env.redis, env.math
    for _, name in next, REDIS do redis[name] = wrap(safe[name]) end
    math.random, math.randomseed = wrap(safe.random), wrap(safe.randomseed)
    setfenv(f, env)
    return f()
  end, dispatch, keys, argv)
end
"#;
