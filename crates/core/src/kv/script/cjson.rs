//! `cjson` for scripts: the JSON library Redis bundles (lua-cjson 2.1.0), written in Rust so
//! every replica produces the same bytes and the script budgets bound the work.
//!
//! `cjson.encode`, `cjson.decode`, `cjson.null` (a NULL lightuserdata, as in lua-cjson), and
//! lua-cjson's configuration functions (`encode_sparse_array`, `encode_max_depth`,
//! `decode_max_depth`, `encode_number_precision`, `encode_invalid_numbers`,
//! `decode_invalid_numbers`, `encode_keep_buffer`), which take effect for the rest of the
//! script run (every run starts from the defaults: [`Settings::reset`]). Errors are plain Lua string errors with
//! lua-cjson's wording, so `pcall` returns the message as Redis does.
//!
//! Deviations from lua-cjson:
//! * **Object keys are emitted in sorted byte order** (a number key by its text, before a string
//!   key with the same text), not in hash-table order, so the bytes never depend on a table's
//!   insertion history.
//! * Work is charged to the script's instruction budget ([`VALUE_COST`] instructions per value
//!   or table entry, one per [`BYTES_PER_UNIT`] bytes of string), and the encoder's output and
//!   its copies of object keys are each capped at [`LUA_MEMORY_LIMIT`] bytes.
//! * `encode_max_depth`/`decode_max_depth` accept 1 to 1000 (lua-cjson: up to `INT_MAX`);
//!   `encode_keep_buffer` is accepted and has no effect; there is no `cjson.new`.
//! * Decoding accepts the non-JSON numbers lua-cjson accepts by default (`Infinity`, `NaN`,
//!   hexadecimal integers, a leading `+` or zeros) but not C's hexadecimal fractions.

use std::sync::{Arc, Mutex};

use mlua::{LightUserData, Lua, MultiValue, Table, Value as LV};

use super::budget::Budget;
use crate::kv::types::LUA_MEMORY_LIMIT;

/// lua-cjson's `DEFAULT_ENCODE_MAX_DEPTH`/`DEFAULT_DECODE_MAX_DEPTH`, and our ceiling for both.
const MAX_DEPTH: i64 = 1000;
/// Instructions charged per value encoded or decoded (and per table entry scanned or key
/// sorted): a table access from Rust costs about what a few VM instructions do.
const VALUE_COST: u64 = 4;
/// The same under the bounded rules: a value read or made through mlua costs ~0.1 µs here,
/// about 12 steps (the script fuzzer found encoding and decoding a 100,000-entry table in a
/// loop pausing 0.13 s at 4).
const BOUNDED_VALUE_COST: u64 = 12;
/// Bytes of string (input, output or key copies) per instruction charged.
const BYTES_PER_UNIT: usize = 8;
/// The same under the bounded rules ([`crate::Semantics::BOUNDED`]): escaping and parsing
/// cost ~3 ns a byte here, so a step per 2 (the script fuzzer found an encode/decode loop
/// pausing 0.12 s at one per 8).
const BOUNDED_BYTES_PER_UNIT: usize = 2;
/// Budget units are flushed to the shared counter this often.
const FLUSH_EVERY: u64 = 4096;
/// Bytes charged against the key-copy cap per object key, on top of the key's own bytes.
const KEY_OVERHEAD: usize = 48;

/// `cjson.null`: lua-cjson's NULL lightuserdata.
pub(super) fn null() -> LV {
    LV::LightUserData(LightUserData(std::ptr::null_mut()))
}

/// Per-run configuration, lua-cjson's defaults.
#[derive(Clone, Copy)]
struct Config {
    sparse_convert: bool,
    sparse_ratio: i64,
    sparse_safe: i64,
    encode_max_depth: i64,
    decode_max_depth: i64,
    precision: i64,
    /// 0 = refuse NaN/Inf, 1 = write `nan`/`inf`, 2 = write `null`.
    encode_invalid: i64,
    decode_invalid: bool,
    keep_buffer: bool,
    /// The entry's rules hide memory addresses: a table with a key that is not a string,
    /// number or boolean is refused before its keys are looked at in (address-dependent)
    /// order. Not a lua-cjson setting: set per run from the entry.
    deterministic: bool,
    /// The entry's rules bound every script's work ([`crate::Semantics::BOUNDED`]): values
    /// and bytes are charged at the bounded rates. Set per run from the entry.
    bounded: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            sparse_convert: false,
            sparse_ratio: 2,
            sparse_safe: 10,
            encode_max_depth: MAX_DEPTH,
            decode_max_depth: MAX_DEPTH,
            precision: 14,
            encode_invalid: 0,
            decode_invalid: true,
            keep_buffer: true,
            deterministic: false,
            bounded: false,
        }
    }
}

/// A failure: a script-visible error message, or a Lua error (memory, budget) passed through.
enum Fail {
    User(String),
    Lua(mlua::Error),
}

impl From<mlua::Error> for Fail {
    fn from(e: mlua::Error) -> Fail {
        Fail::Lua(e)
    }
}

type Res<T> = Result<T, Fail>;

fn user<T>(msg: impl Into<String>) -> Res<T> {
    Err(Fail::User(msg.into()))
}

/// Counts work in budget units, flushing to the script's shared budget now and then.
struct Meter<'a> {
    budget: &'a Budget,
    pending: u64,
    bounded: bool,
    /// The helper rules: the key scan of `refuse_bad_keys` is charged too.
    helpers: bool,
}

impl Meter<'_> {
    fn tick(&mut self, n: u64) -> mlua::Result<()> {
        self.pending = self.pending.saturating_add(n);
        if self.pending >= FLUSH_EVERY {
            self.flush()?;
        }
        Ok(())
    }

    /// One value encoded or decoded, one table entry scanned or key sorted.
    fn value(&mut self) -> mlua::Result<()> {
        self.tick(if self.bounded {
            BOUNDED_VALUE_COST
        } else {
            VALUE_COST
        })
    }

    fn bytes(&mut self, n: usize) -> mlua::Result<()> {
        let per_unit = if self.bounded {
            BOUNDED_BYTES_PER_UNIT
        } else {
            BYTES_PER_UNIT
        };
        self.tick((n / per_unit) as u64)
    }

    fn flush(&mut self) -> mlua::Result<()> {
        let n = std::mem::take(&mut self.pending);
        if n > 0 {
            self.budget.charge(n)?;
        }
        Ok(())
    }
}

/// The raw `cjson` functions (each returns `ok, ...`), and their settings.
pub(super) fn install(lua: &Lua, budget: Arc<Budget>) -> mlua::Result<(Table, Settings)> {
    let cfg = Arc::new(Mutex::new(Config::default()));
    let raw = lua.create_table()?;
    {
        let (cfg, budget) = (cfg.clone(), budget.clone());
        raw.set(
            "encode",
            lua.create_function(move |lua, args: MultiValue| {
                // Under the helper rules: the call and its arguments (`helpers.rs`).
                budget.helper(args.len(), 0)?;
                let c = current(&cfg);
                let mut meter = Meter {
                    budget: &budget,
                    pending: 0,
                    bounded: c.bounded,
                    helpers: budget.charges_helpers(),
                };
                let r = encode_fn(lua, &c, &mut meter, args);
                meter.flush()?;
                finish(lua, r)
            })?,
        )?;
    }
    {
        let (cfg, budget) = (cfg.clone(), budget.clone());
        raw.set(
            "decode",
            lua.create_function(move |lua, args: MultiValue| {
                // Under the helper rules: the call and its arguments (`helpers.rs`).
                budget.helper(args.len(), 0)?;
                let c = current(&cfg);
                let mut meter = Meter {
                    budget: &budget,
                    pending: 0,
                    bounded: c.bounded,
                    helpers: budget.charges_helpers(),
                };
                let r = decode_fn(lua, &c, &mut meter, args);
                meter.flush()?;
                finish(lua, r)
            })?,
        )?;
    }
    type Setter = fn(&Lua, &mut Config, &[LV], &'static str) -> Res<Vec<LV>>;
    let setters: [(&'static str, Setter); 7] = [
        ("encode_sparse_array", |lua, c, a, n| {
            arg_count(a, 3, n)?;
            Ok(vec![
                bool_option(lua, a, 0, n, &mut c.sparse_convert)?,
                int_option(a, 1, n, &mut c.sparse_ratio, 0, i64::from(i32::MAX))?,
                int_option(a, 2, n, &mut c.sparse_safe, 0, i64::from(i32::MAX))?,
            ])
        }),
        ("encode_max_depth", |_, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![int_option(
                a,
                0,
                n,
                &mut c.encode_max_depth,
                1,
                MAX_DEPTH,
            )?])
        }),
        ("decode_max_depth", |_, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![int_option(
                a,
                0,
                n,
                &mut c.decode_max_depth,
                1,
                MAX_DEPTH,
            )?])
        }),
        ("encode_number_precision", |_, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![int_option(a, 0, n, &mut c.precision, 1, 14)?])
        }),
        ("encode_invalid_numbers", |lua, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![enum_option(
                lua,
                a,
                0,
                n,
                &mut c.encode_invalid,
                &["off", "on", "null"],
            )?])
        }),
        ("decode_invalid_numbers", |lua, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![bool_option(lua, a, 0, n, &mut c.decode_invalid)?])
        }),
        ("encode_keep_buffer", |lua, c, a, n| {
            arg_count(a, 1, n)?;
            Ok(vec![bool_option(lua, a, 0, n, &mut c.keep_buffer)?])
        }),
    ];
    for (name, setter) in setters {
        let (cfg, budget) = (cfg.clone(), budget.clone());
        raw.set(
            name,
            lua.create_function(move |lua, args: MultiValue| {
                budget.helper(args.len(), 0)?;
                let args: Vec<LV> = args.into_iter().collect();
                let mut c = current(&cfg);
                let r = setter(lua, &mut c, &args, name);
                if r.is_ok() {
                    *cfg.lock().unwrap_or_else(|p| p.into_inner()) = c;
                }
                finish(lua, r.map(MultiValue::from_vec))
            })?,
        )?;
    }

    // The Rust functions return `ok, ...`; the script's `cjson` table wraps each one in Lua
    // (built per run by `lua.rs`) to raise the message as a plain string error, as
    // lua-cjson's luaL_error does (no position prefix).
    Ok((raw, Settings(cfg)))
}

/// The settings of a VM's `cjson` functions; [`Settings::reset`] before every run.
pub(super) struct Settings(Arc<Mutex<Config>>);

impl Settings {
    /// lua-cjson's defaults, under the entry's rules (`deterministic`, `bounded`).
    pub(super) fn reset(&self, deterministic: bool, bounded: bool) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Config {
            deterministic,
            bounded,
            ..Config::default()
        };
    }
}

fn current(cfg: &Mutex<Config>) -> Config {
    *cfg.lock().unwrap_or_else(|p| p.into_inner())
}

/// `ok, values...` for the Lua wrapper, or a Lua error passed through.
fn finish(lua: &Lua, r: Res<MultiValue>) -> mlua::Result<MultiValue> {
    match r {
        Ok(mut v) => {
            v.push_front(LV::Boolean(true));
            Ok(v)
        }
        Err(Fail::User(msg)) => Ok(MultiValue::from_vec(vec![
            LV::Boolean(false),
            LV::String(lua.create_string(msg)?),
        ])),
        Err(Fail::Lua(e)) => Err(e),
    }
}

/// `lua_typename` of a value (light userdata is plain "userdata" in Lua 5.1; mlua's names
/// differ for light userdata and integers).
pub(super) fn type_name(v: &LV) -> &'static str {
    match v {
        LV::Nil => "nil",
        LV::Boolean(_) => "boolean",
        LV::Integer(_) | LV::Number(_) => "number",
        LV::String(_) => "string",
        LV::Table(_) => "table",
        LV::Function(_) => "function",
        LV::Thread(_) => "thread",
        _ => "userdata",
    }
}

fn bad_arg<T>(pos: usize, name: &str, msg: &str) -> Res<T> {
    user(format!("bad argument #{pos} to '{name}' ({msg})"))
}

fn arg_count(args: &[LV], max: usize, name: &str) -> Res<()> {
    if args.len() > max {
        return bad_arg(max + 1, name, "found too many arguments");
    }
    Ok(())
}

/// lua-cjson's integer option: nil keeps the setting; returns the (new) setting.
fn int_option(args: &[LV], i: usize, name: &str, setting: &mut i64, min: i64, max: i64) -> Res<LV> {
    let v = match args.get(i) {
        None | Some(LV::Nil) => None,
        Some(LV::Integer(v)) => Some(*v),
        Some(LV::Number(v)) if v.is_finite() => Some(v.trunc() as i64),
        Some(other) => {
            return bad_arg(
                i + 1,
                name,
                &format!("number expected, got {}", type_name(other)),
            )
        }
    };
    if let Some(v) = v {
        if v < min || v > max {
            return bad_arg(
                i + 1,
                name,
                &format!("expected integer between {min} and {max}"),
            );
        }
        *setting = v;
    }
    Ok(LV::Integer(*setting))
}

fn bool_option(lua: &Lua, args: &[LV], i: usize, name: &str, setting: &mut bool) -> Res<LV> {
    let mut s = i64::from(*setting);
    let r = enum_option(lua, args, i, name, &mut s, &["off", "on"])?;
    *setting = s != 0;
    Ok(r)
}

/// lua-cjson's enum option: nil keeps the setting, a boolean sets 0 or 1, a string picks one
/// of `options` by name. Returns a boolean for settings 0 and 1, else the option's name.
fn enum_option(
    lua: &Lua,
    args: &[LV],
    i: usize,
    name: &str,
    setting: &mut i64,
    options: &[&str],
) -> Res<LV> {
    match args.get(i) {
        None | Some(LV::Nil) => {}
        Some(LV::Boolean(b)) => *setting = i64::from(*b),
        Some(LV::String(s)) => {
            let s = s.as_bytes();
            match options.iter().position(|o| o.as_bytes() == &s[..]) {
                Some(p) => *setting = p as i64,
                None => {
                    return bad_arg(
                        i + 1,
                        name,
                        &format!("invalid option '{}'", String::from_utf8_lossy(&s)),
                    )
                }
            }
        }
        Some(other) => {
            return bad_arg(
                i + 1,
                name,
                &format!("string expected, got {}", type_name(other)),
            )
        }
    }
    Ok(match *setting {
        0 => LV::Boolean(false),
        1 => LV::Boolean(true),
        s => match usize::try_from(s).ok().and_then(|s| options.get(s)) {
            Some(o) => LV::String(lua.create_string(o)?),
            None => LV::Nil,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Encoding

fn encode_fn(lua: &Lua, cfg: &Config, meter: &mut Meter<'_>, args: MultiValue) -> Res<MultiValue> {
    if args.len() != 1 {
        return bad_arg(1, "encode", "expected 1 argument");
    }
    let value = args.into_iter().next().unwrap_or(LV::Nil);
    let mut enc = Encoder {
        lua,
        cfg,
        meter,
        out: Vec::new(),
        held: 0,
    };
    enc.run(value)?;
    let s = lua.create_string(&enc.out)?;
    Ok(MultiValue::from_vec(vec![LV::String(s)]))
}

/// One object key: its JSON text (a string key's raw bytes, or a number key's number text)
/// and, for a number key, the number itself (to look the value up again).
struct Key {
    text: Vec<u8>,
    num: Option<f64>,
}

/// A table being written.
enum Frame {
    /// Elements `next..=len` remain.
    Array { t: Table, next: u64, len: u64 },
    /// `keys[next..]` remain; `held` bytes of key copies are charged to the cap.
    Object {
        t: Table,
        keys: Vec<Key>,
        next: usize,
        held: usize,
    },
}

struct Encoder<'a, 'b> {
    lua: &'a Lua,
    cfg: &'a Config,
    meter: &'a mut Meter<'b>,
    out: Vec<u8>,
    /// Bytes of object keys copied out of Lua and not yet released (an error ends the whole
    /// encode, so only completed objects release theirs).
    held: usize,
}

impl Encoder<'_, '_> {
    /// Iterative (an explicit stack of tables), so deep nesting costs no Rust stack and holds
    /// one Lua reference per level.
    fn run(&mut self, value: LV) -> Res<()> {
        let mut stack: Vec<Frame> = Vec::new();
        let mut pending = Some(value);
        loop {
            if let Some(v) = pending.take() {
                self.meter.value()?;
                match v {
                    LV::Table(t) => {
                        let depth = stack.len() + 1;
                        if depth as i64 > self.cfg.encode_max_depth {
                            return user(format!("Cannot serialise, excessive nesting ({depth})"));
                        }
                        let frame = self.open(t)?;
                        stack.push(frame);
                    }
                    other => self.scalar(&other)?,
                }
            }
            let Some(top) = stack.last_mut() else {
                return Ok(());
            };
            match top {
                Frame::Array { t, next, len } => {
                    if *next > *len {
                        self.put(b"]")?;
                        stack.pop();
                        continue;
                    }
                    if *next > 1 {
                        self.put(b",")?;
                    }
                    pending = Some(t.raw_get::<LV>(*next as f64)?);
                    *next += 1;
                }
                Frame::Object {
                    t,
                    keys,
                    next,
                    held,
                } => {
                    let Some(key) = keys.get(*next) else {
                        self.put(b"}")?;
                        self.held -= *held;
                        stack.pop();
                        continue;
                    };
                    if *next > 0 {
                        self.put(b",")?;
                    }
                    let value = match key.num {
                        Some(n) => {
                            self.put(b"\"")?;
                            self.put(&key.text)?;
                            self.put(b"\":")?;
                            t.raw_get::<LV>(n)?
                        }
                        None => {
                            self.string(&key.text)?;
                            self.put(b":")?;
                            t.raw_get::<LV>(self.lua.create_string(&key.text)?)?
                        }
                    };
                    pending = Some(value);
                    *next += 1;
                }
            }
        }
    }

    /// Classify a table (lua-cjson's rules) and write its opening bracket.
    fn open(&mut self, t: Table) -> Res<Frame> {
        if self.cfg.deterministic {
            refuse_bad_keys(&t, self.meter)?;
        }
        // An array: only integer keys >= 1, and not excessively sparse.
        let (mut max, mut items, mut array) = (0.0f64, 0u64, true);
        for pair in t.pairs::<LV, LV>() {
            let (k, _) = pair?;
            self.meter.value()?;
            let k = match k {
                LV::Integer(i) => i as f64,
                LV::Number(n) => n,
                _ => f64::NAN,
            };
            if k >= 1.0 && k.floor() == k {
                max = max.max(k);
                items += 1;
            } else {
                array = false;
                break;
            }
        }
        let c = self.cfg;
        if array
            && c.sparse_ratio > 0
            && max > items as f64 * c.sparse_ratio as f64
            && max > c.sparse_safe as f64
        {
            if !c.sparse_convert {
                return user("Cannot serialise table: excessively sparse array");
            }
            array = false;
        }
        if array && max > 0.0 {
            self.put(b"[")?;
            // `as` saturates (an infinite key with sparse checks off hits the output cap).
            return Ok(Frame::Array {
                t,
                next: 1,
                len: max as u64,
            });
        }

        // An object: string or number keys, written in sorted order.
        let mut keys = Vec::new();
        let mut held = 0usize;
        for pair in t.pairs::<LV, LV>() {
            let (k, _) = pair?;
            self.meter.value()?;
            let key = match k {
                LV::String(s) => {
                    let b = s.as_bytes();
                    self.meter.bytes(b.len())?;
                    Key {
                        text: b.to_vec(),
                        num: None,
                    }
                }
                LV::Integer(i) => Key {
                    text: self.number_text(i as f64)?,
                    num: Some(i as f64),
                },
                LV::Number(n) => Key {
                    text: self.number_text(n)?,
                    num: Some(n),
                },
                other => {
                    return user(format!(
                        "Cannot serialise {}: table key must be a number or string",
                        type_name(&other)
                    ));
                }
            };
            let cost = key.text.len() + KEY_OVERHEAD;
            held += cost;
            self.held += cost;
            if self.held > LUA_MEMORY_LIMIT {
                return user(format!(
                    "Cannot serialise table: keys exceed the script memory limit of {LUA_MEMORY_LIMIT} bytes"
                ));
            }
            keys.push(key);
        }
        // The sort: n log n comparisons.
        let n = keys.len() as u64;
        self.meter
            .tick(n.saturating_mul(u64::from(64 - n.leading_zeros())))?;
        keys.sort_by(|a, b| {
            a.text
                .cmp(&b.text)
                .then_with(|| b.num.is_some().cmp(&a.num.is_some()))
                .then_with(|| match (a.num, b.num) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    _ => std::cmp::Ordering::Equal,
                })
        });
        self.put(b"{")?;
        Ok(Frame::Object {
            t,
            keys,
            next: 0,
            held,
        })
    }

    fn scalar(&mut self, v: &LV) -> Res<()> {
        match v {
            LV::Nil => self.put(b"null"),
            LV::Boolean(true) => self.put(b"true"),
            LV::Boolean(false) => self.put(b"false"),
            LV::Integer(i) => {
                let text = self.number_text(*i as f64)?;
                self.put(&text)
            }
            LV::Number(n) => {
                let text = self.number_text(*n)?;
                self.put(&text)
            }
            LV::String(s) => {
                let b = s.as_bytes();
                self.string(&b)
            }
            LV::LightUserData(p) if p.0.is_null() => self.put(b"null"),
            other => user(format!(
                "Cannot serialise {}: type not supported",
                type_name(other)
            )),
        }
    }

    /// A number's JSON text: `%.14g` (the configured precision), or the configured treatment of
    /// NaN and infinities.
    fn number_text(&self, x: f64) -> Res<Vec<u8>> {
        if !x.is_finite() {
            match self.cfg.encode_invalid {
                0 => return user("Cannot serialise number: must not be NaN or Inf"),
                2 => return Ok(b"null".to_vec()),
                _ => {}
            }
        }
        Ok(fmt_g(x, self.cfg.precision.clamp(1, 14) as usize).into_bytes())
    }

    /// Append `b`, refusing to grow the output past the memory limit.
    fn put(&mut self, b: &[u8]) -> Res<()> {
        self.room(b.len())?;
        self.out.extend_from_slice(b);
        Ok(())
    }

    fn room(&self, n: usize) -> Res<()> {
        if self.out.len().saturating_add(n) > LUA_MEMORY_LIMIT {
            return user(format!(
                "Cannot serialise: output exceeds the script memory limit of {LUA_MEMORY_LIMIT} bytes"
            ));
        }
        Ok(())
    }

    /// A JSON string, escaped as lua-cjson does; other bytes (UTF-8 or not) pass unchanged.
    fn string(&mut self, s: &[u8]) -> Res<()> {
        let extra: usize = s
            .iter()
            .map(|&b| escape(b).map_or(0, |e| e.len() - 1))
            .sum();
        let len = s.len().saturating_add(extra).saturating_add(2);
        self.meter.bytes(len)?;
        self.room(len)?;
        self.out.push(b'"');
        let mut run = 0;
        for (i, &b) in s.iter().enumerate() {
            if let Some(e) = escape(b) {
                self.out.extend_from_slice(&s[run..i]);
                self.out.extend_from_slice(e);
                run = i + 1;
            }
        }
        self.out.extend_from_slice(&s[run..]);
        self.out.push(b'"');
        Ok(())
    }
}

/// Under the deterministic rules, before anything else: refuse a table with a key lua-cjson
/// cannot write (not a string or number), naming the first of boolean, userdata, table,
/// function, thread that occurs — not the first in iteration order, which for table,
/// function, thread and userdata keys depends on memory addresses. Under older rules nothing
/// is charged; under the helper rules ([`crate::Semantics::CHARGED_HELPERS`]) every key
/// scanned is (the scan visits all of them whatever it finds, so the charge does not depend
/// on where the bad key came: `pcall(cjson.encode, t)` of a table with object keys in a
/// loop paused 462 ms uncharged, issue 49). A table that passes is then written exactly as
/// before, its order being deterministic.
fn refuse_bad_keys(t: &Table, meter: &mut Meter<'_>) -> Res<()> {
    const ORDER: [&str; 5] = ["boolean", "userdata", "table", "function", "thread"];
    let mut worst: Option<usize> = None;
    for pair in t.pairs::<LV, LV>() {
        let (k, _) = pair?;
        if meter.helpers {
            meter.value()?;
        }
        let rank = match k {
            LV::String(_) | LV::Integer(_) | LV::Number(_) => continue,
            other => ORDER
                .iter()
                .position(|n| *n == type_name(&other))
                .unwrap_or(ORDER.len() - 1),
        };
        worst = Some(worst.map_or(rank, |w| w.min(rank)));
    }
    match worst {
        Some(rank) => user(format!(
            "Cannot serialise {}: table key must be a number or string",
            ORDER[rank]
        )),
        None => Ok(()),
    }
}

/// lua-cjson's `char2escape`.
fn escape(b: u8) -> Option<&'static [u8]> {
    const CTRL: [&[u8]; 32] = [
        b"\\u0000", b"\\u0001", b"\\u0002", b"\\u0003", b"\\u0004", b"\\u0005", b"\\u0006",
        b"\\u0007", b"\\b", b"\\t", b"\\n", b"\\u000b", b"\\f", b"\\r", b"\\u000e", b"\\u000f",
        b"\\u0010", b"\\u0011", b"\\u0012", b"\\u0013", b"\\u0014", b"\\u0015", b"\\u0016",
        b"\\u0017", b"\\u0018", b"\\u0019", b"\\u001a", b"\\u001b", b"\\u001c", b"\\u001d",
        b"\\u001e", b"\\u001f",
    ];
    match b {
        0..=0x1f => Some(CTRL[b as usize]),
        b'"' => Some(b"\\\""),
        b'\\' => Some(b"\\\\"),
        b'/' => Some(b"\\/"),
        0x7f => Some(b"\\u007f"),
        _ => None,
    }
}

/// C's `%.{prec}g` (glibc spelling: `inf`, `-inf`, `nan`, two-digit exponents at least).
pub(super) fn fmt_g(x: f64, prec: usize) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let p = prec.max(1);
    let sci = format!("{:.*e}", p - 1, x);
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m, e.parse::<i64>().unwrap_or(0)),
        None => (sci.as_str(), 0),
    };
    if exp < -4 || exp >= p as i64 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mantissa), exp.abs())
    } else {
        let decimals = (p as i64 - 1 - exp).max(0) as usize;
        trim_zeros(&format!("{x:.decimals$}")).to_string()
    }
}

/// `%g` drops trailing zeros of the fraction, and the point if nothing is left after it.
fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

fn decode_fn(lua: &Lua, cfg: &Config, meter: &mut Meter<'_>, args: MultiValue) -> Res<MultiValue> {
    if args.len() != 1 {
        return bad_arg(1, "decode", "expected 1 argument");
    }
    let text = match args.into_iter().next() {
        Some(LV::String(s)) => s,
        // luaL_checklstring converts numbers, as Lua's tostring does.
        Some(LV::Integer(i)) => lua.create_string(fmt_g(i as f64, 14))?,
        Some(LV::Number(n)) => lua.create_string(fmt_g(n, 14))?,
        other => {
            let got = other.as_ref().map_or("no value", type_name);
            return bad_arg(1, "decode", &format!("string expected, got {got}"));
        }
    };
    let data = text.as_bytes();
    if data.len() >= 2 && (data[0] == 0 || data[1] == 0) {
        return user("JSON parser does not support UTF-16 or UTF-32");
    }
    meter.bytes(data.len())?;
    let mut p = Parser {
        data: &data[..],
        pos: 0,
        buf: Vec::new(),
        invalid_numbers: cfg.decode_invalid,
    };
    let v = decode(lua, cfg, meter, &mut p)?;
    Ok(MultiValue::from_vec(vec![v]))
}

#[derive(Clone, Copy, PartialEq)]
enum Tok {
    ObjBegin,
    ObjEnd,
    ArrBegin,
    ArrEnd,
    /// The decoded bytes are in `Parser::buf`.
    Str,
    Num(f64),
    Bool(bool),
    Null,
    Colon,
    Comma,
    End,
    Error(&'static str),
}

impl Tok {
    fn name(self) -> &'static str {
        match self {
            Tok::ObjBegin => "T_OBJ_BEGIN",
            Tok::ObjEnd => "T_OBJ_END",
            Tok::ArrBegin => "T_ARR_BEGIN",
            Tok::ArrEnd => "T_ARR_END",
            Tok::Str => "T_STRING",
            Tok::Num(_) => "T_NUMBER",
            Tok::Bool(_) => "T_BOOLEAN",
            Tok::Null => "T_NULL",
            Tok::Colon => "T_COLON",
            Tok::Comma => "T_COMMA",
            Tok::End => "T_END",
            Tok::Error(msg) => msg,
        }
    }
}

/// A token and its 0-based position.
struct Token {
    tok: Tok,
    at: usize,
}

/// lua-cjson's error: "Expected <what> but found <token> at character <1-based index>".
fn expected<T>(what: &str, t: &Token) -> Res<T> {
    user(format!(
        "Expected {what} but found {} at character {}",
        t.tok.name(),
        t.at + 1
    ))
}

/// lua-cjson's tokenizer over a byte string; a NUL byte (or the end) is `T_END`.
struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    buf: Vec<u8>,
    invalid_numbers: bool,
}

impl Parser<'_> {
    fn byte(&self, i: usize) -> u8 {
        self.data.get(i).copied().unwrap_or(0)
    }

    fn rest(&self, i: usize) -> &[u8] {
        self.data.get(i..).unwrap_or(&[])
    }

    fn starts_ci(&self, i: usize, word: &str) -> bool {
        let r = self.rest(i);
        r.len() >= word.len() && r[..word.len()].eq_ignore_ascii_case(word.as_bytes())
    }

    fn next(&mut self) -> Token {
        while matches!(self.byte(self.pos), b' ' | b'\t' | b'\n' | b'\r') {
            self.pos += 1;
        }
        let at = self.pos;
        let single = |p: &mut Self, tok| {
            p.pos += 1;
            Token { tok, at }
        };
        match self.byte(at) {
            0 => Token { tok: Tok::End, at },
            b'{' => single(self, Tok::ObjBegin),
            b'}' => single(self, Tok::ObjEnd),
            b'[' => single(self, Tok::ArrBegin),
            b']' => single(self, Tok::ArrEnd),
            b':' => single(self, Tok::Colon),
            b',' => single(self, Tok::Comma),
            b'"' => self.string(),
            b'-' | b'0'..=b'9' => self.number(),
            _ if self.rest(at).starts_with(b"true") => {
                self.pos += 4;
                Token {
                    tok: Tok::Bool(true),
                    at,
                }
            }
            _ if self.rest(at).starts_with(b"false") => {
                self.pos += 5;
                Token {
                    tok: Tok::Bool(false),
                    at,
                }
            }
            _ if self.rest(at).starts_with(b"null") => {
                self.pos += 4;
                Token { tok: Tok::Null, at }
            }
            b'+' | b'i' | b'I' | b'n' | b'N'
                if self.invalid_numbers
                    && (self.byte(at) == b'+'
                        || self.starts_ci(at, "inf")
                        || self.starts_ci(at, "nan")) =>
            {
                self.number()
            }
            _ => Token {
                tok: Tok::Error("invalid token"),
                at,
            },
        }
    }

    fn string(&mut self) -> Token {
        let at = self.pos;
        self.pos += 1;
        self.buf.clear();
        let data = self.data;
        loop {
            let rest = data.get(self.pos..).unwrap_or(&[]);
            let run = rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b == 0)
                .unwrap_or(rest.len());
            self.buf.extend_from_slice(&rest[..run]);
            self.pos += run;
            let err = |p: &Self, msg| Token {
                tok: Tok::Error(msg),
                at: p.pos,
            };
            match self.byte(self.pos) {
                b'"' => {
                    self.pos += 1;
                    return Token { tok: Tok::Str, at };
                }
                0 => return err(self, "unexpected end of string"),
                _ => {
                    let c = match self.byte(self.pos + 1) {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 8,
                        b't' => b'\t',
                        b'n' => b'\n',
                        b'f' => 12,
                        b'r' => b'\r',
                        b'u' => {
                            if self.unicode_escape() {
                                continue;
                            }
                            return err(self, "invalid unicode escape code");
                        }
                        _ => return err(self, "invalid escape code"),
                    };
                    self.buf.push(c);
                    self.pos += 2;
                }
            }
        }
    }

    fn hex4(&self, i: usize) -> Option<u32> {
        let h = self.data.get(i..i + 4)?;
        let s = std::str::from_utf8(h).ok()?;
        if !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u32::from_str_radix(s, 16).ok()
    }

    /// `\uXXXX` (or a surrogate pair) at `pos` → UTF-8 in `buf`.
    fn unicode_escape(&mut self) -> bool {
        let Some(mut cp) = self.hex4(self.pos + 2) else {
            return false;
        };
        let mut len = 6;
        if cp & 0xF800 == 0xD800 {
            if cp & 0x400 != 0 || self.rest(self.pos + 6).get(..2) != Some(b"\\u") {
                return false;
            }
            let Some(low) = self.hex4(self.pos + 8) else {
                return false;
            };
            if low & 0xFC00 != 0xDC00 {
                return false;
            }
            cp = (((cp & 0x3FF) << 10) | (low & 0x3FF)) + 0x10000;
            len = 12;
        }
        let Some(ch) = char::from_u32(cp) else {
            return false;
        };
        let mut utf8 = [0u8; 4];
        self.buf
            .extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
        self.pos += len;
        true
    }

    /// A number the way strtod reads it (lua-cjson with `decode_invalid_numbers` on): an
    /// optional sign, then `inf`/`infinity`/`nan`, a hexadecimal integer, or a decimal.
    fn number(&mut self) -> Token {
        let at = self.pos;
        let mut i = at;
        let neg = self.byte(i) == b'-';
        if matches!(self.byte(i), b'+' | b'-') {
            i += 1;
        }
        let invalid = |p: &Self| Token {
            tok: Tok::Error("invalid number"),
            at: p.pos,
        };
        let strict = !self.invalid_numbers;
        let (end, value) = if self.starts_ci(i, "inf") || self.starts_ci(i, "nan") {
            if strict {
                return invalid(self);
            }
            if self.starts_ci(i, "infinity") {
                (i + 8, f64::INFINITY)
            } else if self.starts_ci(i, "inf") {
                (i + 3, f64::INFINITY)
            } else {
                let mut end = i + 3;
                // strtod also takes "nan(chars)".
                if self.byte(end) == b'(' {
                    let inner = self.rest(end + 1);
                    if let Some(close) = inner
                        .iter()
                        .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                    {
                        if inner.get(close) == Some(&b')') {
                            end += close + 2;
                        }
                    }
                }
                (end, f64::NAN)
            }
        } else if self.byte(i) == b'0'
            && self.byte(i + 1) | 0x20 == b'x'
            && self.byte(i + 2).is_ascii_hexdigit()
        {
            if strict {
                return invalid(self);
            }
            let digits = self.rest(i + 2);
            let n = digits
                .iter()
                .position(|b| !b.is_ascii_hexdigit())
                .unwrap_or(digits.len());
            let v = digits[..n].iter().fold(0.0f64, |acc, b| {
                acc * 16.0 + f64::from((*b as char).to_digit(16).unwrap_or(0))
            });
            (i + 2 + n, v)
        } else {
            if strict
                && (self.byte(at) == b'+'
                    || (self.byte(i) == b'0' && self.byte(i + 1).is_ascii_digit()))
            {
                return invalid(self);
            }
            let digits = |p: &Self, from: usize| {
                p.rest(from)
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .unwrap_or(p.rest(from).len())
            };
            let int = digits(self, i);
            let mut end = i + int;
            let mut frac = 0;
            if self.byte(end) == b'.' {
                frac = digits(self, end + 1);
                end += 1 + frac;
            }
            if int + frac == 0 {
                return invalid(self);
            }
            if self.byte(end) | 0x20 == b'e' {
                let mut j = end + 1;
                if matches!(self.byte(j), b'+' | b'-') {
                    j += 1;
                }
                let exp = digits(self, j);
                if exp > 0 {
                    end = j + exp;
                }
            }
            let text = self.data.get(i..end).unwrap_or(&[]);
            match std::str::from_utf8(text)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
            {
                Some(v) => (end, v),
                None => return invalid(self),
            }
        };
        self.pos = end;
        Token {
            tok: Tok::Num(if neg { -value } else { value }),
            at,
        }
    }
}

/// A table being filled.
enum Open {
    Array {
        t: Table,
        next: usize,
    },
    Object {
        t: Table,
        key: Option<mlua::LuaString>,
    },
}

/// Decode one JSON text. Iterative (an explicit stack), one Lua reference per open table.
fn decode(lua: &Lua, cfg: &Config, meter: &mut Meter<'_>, p: &mut Parser<'_>) -> Res<LV> {
    let mut stack: Vec<Open> = Vec::new();
    let mut tok = p.next();
    loop {
        meter.value()?;
        // `tok` starts a value.
        let mut value = match tok.tok {
            Tok::Str => LV::String(lua.create_string(&p.buf)?),
            Tok::Num(n) => LV::Number(n),
            Tok::Bool(b) => LV::Boolean(b),
            Tok::Null => null(),
            Tok::ObjBegin | Tok::ArrBegin => {
                let depth = stack.len() + 1;
                if depth as i64 > cfg.decode_max_depth {
                    return user(format!(
                        "Found too many nested data structures ({depth}) at character {}",
                        p.pos
                    ));
                }
                let t = lua.create_table()?;
                let next = p.next();
                if tok.tok == Tok::ObjBegin {
                    if next.tok == Tok::ObjEnd {
                        LV::Table(t)
                    } else {
                        let key = object_key(lua, p, next)?;
                        stack.push(Open::Object { t, key: Some(key) });
                        tok = p.next();
                        continue;
                    }
                } else if next.tok == Tok::ArrEnd {
                    LV::Table(t)
                } else {
                    stack.push(Open::Array { t, next: 1 });
                    tok = next;
                    continue;
                }
            }
            _ => return expected("value", &tok),
        };
        // A complete value: store it in the innermost open table, closing tables as they end.
        loop {
            let closed = match stack.last_mut() {
                None => {
                    let end = p.next();
                    if end.tok != Tok::End {
                        return expected("the end", &end);
                    }
                    return Ok(value);
                }
                Some(Open::Array { t, next }) => {
                    t.raw_set(*next, value)?;
                    *next += 1;
                    let after = p.next();
                    match after.tok {
                        Tok::ArrEnd => true,
                        Tok::Comma => {
                            tok = p.next();
                            false
                        }
                        _ => return expected("comma or array end", &after),
                    }
                }
                Some(Open::Object { t, key }) => {
                    t.raw_set(key.take(), value)?;
                    let after = p.next();
                    match after.tok {
                        Tok::ObjEnd => true,
                        Tok::Comma => {
                            let next = p.next();
                            *key = Some(object_key(lua, p, next)?);
                            tok = p.next();
                            false
                        }
                        _ => return expected("comma or object end", &after),
                    }
                }
            };
            if !closed {
                break;
            }
            value = match stack.pop() {
                Some(Open::Array { t, .. }) | Some(Open::Object { t, .. }) => LV::Table(t),
                None => LV::Nil,
            };
        }
    }
}

/// `"key" :` after `{` or `,`.
fn object_key(lua: &Lua, p: &mut Parser<'_>, t: Token) -> Res<mlua::LuaString> {
    if t.tok != Tok::Str {
        return expected("object key string", &t);
    }
    let key = lua.create_string(&p.buf)?;
    let colon = p.next();
    if colon.tok != Tok::Colon {
        return expected("colon", &colon);
    }
    Ok(key)
}
