//! The Lua sandbox scripts run in (`lua`), its JSON library (`cjson`) and the instruction and
//! memory budget both count against (`budget`). Knows nothing of the command table: a
//! script's `redis.call` is a closure the `EVAL` command passes in.

mod budget;
mod cjson;
mod convert;
mod costly;
mod helpers;
mod lua;
mod prelude;
mod rules;

pub use costly::COSTLY_SCRIPTS;
pub use rules::lua_build;

pub(crate) use lua::{compile_check, run, sha1hex, LuaCache};
pub(crate) use rules::Rules;

#[cfg(test)]
mod bounded_tests;
#[cfg(test)]
mod commands_tests;
#[cfg(test)]
mod helpers_tests;
#[cfg(test)]
mod ids_tests;
#[cfg(test)]
mod tests;
