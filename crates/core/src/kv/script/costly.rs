//! Scripts that do not stop by themselves (or only after hours) and do their work in Lua's C functions and
//! interpreter rather than in instructions: each ran for seconds to hours, or forever, on
//! every replica before [`crate::Semantics::BOUNDED`]; under it each stops at the budget. The
//! unit tests check that (`bounded_tests.rs`) and `benches/lua.rs` times how long each takes
//! to stop, which is the pause a script can cause (docs/operations.md). The two
//! patterns first.

/// Scripts whose work is in C, each an `EVAL … 1 k`: the cases the bounded rules close.
pub const COSTLY_SCRIPTS: &[&str] = &[
    "local s=string.rep('a',3000) return tostring(s:find(string.rep('a*',30)..'b'))",
    "local s=string.rep('a',20000) return tostring(s:find(('.-'):rep(6)..'b'))",
    // The same patterns again and again, each call short.
    "local s=string.rep('a',25) local n=0 while true do s:find(string.rep('a*',8)..'b') n=n+1 end",
    // gmatch, match and gsub backtrack the same way.
    "local s=string.rep('a',3000) for w in s:gmatch(string.rep('a*',30)..'b') do end",
    "local s=string.rep('a',3000) return s:match(string.rep('a*',30)..'b')",
    "local s=string.rep('a',3000) return (s:gsub(string.rep('a*',30)..'b', 'x'))",
    // A plain search that compares megabytes at every position.
    "local s=string.rep('a',4000000) local p=string.rep('a',2000000)..'b' \
       while true do s:find(p, 1, true) end",
    // Comparing long equal strings, converting long strings to numbers.
    "local a=string.rep('a',8000000) local b=a..'' local n=0 while true do if a<b then n=n+1 end end",
    "local s=string.rep('1',8000000) local n=0 while true do n=n+(s+0) end",
    "local s=string.rep('1',8000000) while true do tonumber(s, 16) end",
    // Copying: a big string over and over (garbage each time).
    "local s=string.rep('x',8000000) while true do local t=s..'y' end",
    "local s=string.rep('x',1000) while true do local t=s:rep(8000) end",
    // An empty string repeated two billion times.
    "local n=0 while true do local t=string.rep('', 2000000000) n=n+1 end",
    // Table functions that walk a whole table inside one call.
    "local t={} for i=1,100000 do t[i]=i end while true do table.insert(t, 1, 0) table.remove(t, 1) end",
    "local t={} for i=1,100000 do t[i]='' end while true do table.concat(t) end",
    "local t={} for i=1,100000 do t[i]=i end while true do table.maxn(t) end",
    "local t={} for i=1,100000 do t[i]=i end while true do table.foreachi(t, type) end",
    "local t={} for i=1,100000 do t[i]=tostring(i) end while true do table.sort(t) end",
    // Balanced matching and a big replacement.
    "local s=string.rep('(',1000000) while true do s:find('%b()') end",
    "local s=string.rep('a',1000) local r=string.rep('%0',100000) while true do s:gsub('a', r) end",
];
