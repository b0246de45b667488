//! What every command module uses.

pub(super) use crate::kv::args::{
    abs_expiry, check_len, fmt_f64, is, parse_f64, parse_i64, range, rel_expiry, upper, Bound,
};
pub(super) use crate::kv::error::{KvError, KvResult};
pub(super) use crate::kv::exec::Ctx;
pub(super) use crate::kv::glob::glob_match;
pub(super) use crate::kv::spec::cat::*;
pub(super) use crate::kv::spec::{ChannelSpec, CommandSpec, KeySpec, Run};
pub(super) use crate::kv::store::{Entry, Hash, Keyspace, List, Score, Value, ZSet};
pub(super) use crate::kv::types::{Bytes, KvEvent, Reply};
pub(super) use crate::Millis;

/// A bulk string, or nil.
pub(super) fn bulk_or_nil(v: Option<&Bytes>) -> Reply {
    v.map_or(Reply::Nil, |b| Reply::Bulk(b.clone()))
}
