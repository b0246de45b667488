//! The `kv` workload: etcd `Range` (linearizable), `Put` and `Txn` compare-and-set on two keys
//! at a time (rotating every 3 s, as in `register`, so each key's history stays small enough
//! for an exhaustive linearizability search), checked by `checker/linear.rs`.
//!
//! Every value written is unique (`<process>.<n>`), which makes a Txn that compares
//! `mod_revision` the same operation, for the register model, as one that compares the value:
//! the key holds the write made at revision `r` exactly when it holds the value that write
//! wrote (no client deletes). So both kinds of compare-and-set are recorded as `cas` with
//! `[old, new, note]`; the note says which compare was sent. A `cas` first reads the key
//! (an ordinary `get` op in the history) and compares against what it read; on an absent key
//! it puts instead (etcd fails every value compare on a missing key).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};
use tonic::transport::Channel;

use super::pb::kv_client::KvClient;
use super::pb::{self, compare, request_op};
use super::{outcome, req, revision, text};
use crate::client::{ClientError, Recorder, Res};

/// One op (a `cas` is a `get` then the `cas`). `seq` numbers this client's values.
pub(crate) async fn op(
    rec: &mut Recorder,
    rng: &mut StdRng,
    ch: &Channel,
    seq: &mut u64,
    op_timeout: Duration,
) -> Result<(), ClientError> {
    let slot = rec.clock.now() / 3_000_000_000;
    let key = format!("kv{slot}-{}", rng.gen_range(0..2));
    let mut kv = KvClient::new(ch.clone());
    let process = rec.process;
    let mut value = || {
        *seq += 1;
        format!("{process}.{seq}")
    };
    match rng.gen_range(0..8) {
        0..=3 => {
            get(rec, &mut kv, &key, op_timeout).await?;
        }
        4 | 5 => {
            let v = value();
            put(rec, &mut kv, &key, v, op_timeout).await?;
        }
        _ => {
            let v = value();
            let by_revision = rng.gen_bool(0.5);
            match get(rec, &mut kv, &key, op_timeout).await? {
                Some((Some(old), mod_revision)) if !rec.retired => {
                    cas(
                        rec,
                        &mut kv,
                        &key,
                        (old, mod_revision),
                        v,
                        by_revision,
                        op_timeout,
                    )
                    .await?;
                }
                Some((None, _)) if !rec.retired => {
                    put(rec, &mut kv, &key, v, op_timeout).await?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A linearizable `Range` of one key. `Some((value, mod_revision))` when it answered.
async fn get(
    rec: &mut Recorder,
    kv: &mut KvClient<Channel>,
    key: &str,
    t: Duration,
) -> Result<Option<(Option<String>, i64)>, ClientError> {
    let inv = rec.ev("get").key(key);
    rec.invoke(inv.clone())?;
    let r = tokio::time::timeout(
        t,
        kv.range(req(
            pb::RangeRequest {
                key: key.as_bytes().to_vec(),
                ..Default::default()
            },
            t,
        )),
    )
    .await;
    let (res, got) = match outcome(r) {
        Ok(resp) => match resp.kvs.as_slice() {
            [] => (Res::Ok(Some(Value::Null), None), Some((None, 0))),
            [one] if one.key == key.as_bytes() => {
                let v = text(&one.value);
                (
                    Res::Ok(Some(Value::String(v.clone())), None),
                    Some((Some(v), one.mod_revision)),
                )
            }
            more => (
                Res::Info(format!("range of one key answered {} keys", more.len())),
                None,
            ),
        },
        Err(res) => (res, None),
    };
    rec.complete(&inv, &res)?;
    Ok(got)
}

async fn put(
    rec: &mut Recorder,
    kv: &mut KvClient<Channel>,
    key: &str,
    value: String,
    t: Duration,
) -> Result<(), ClientError> {
    let inv = rec.ev("put").key(key).value(json!(value));
    rec.invoke(inv.clone())?;
    let r = tokio::time::timeout(
        t,
        kv.put(req(
            pb::PutRequest {
                key: key.as_bytes().to_vec(),
                value: value.into_bytes(),
                ..Default::default()
            },
            t,
        )),
    )
    .await;
    let res = match outcome(r) {
        Ok(resp) => Res::Ok(
            Some(json!({ "revision": revision(resp.header.as_ref()) })),
            None,
        ),
        Err(res) => res,
    };
    rec.complete(&inv, &res)
}

/// `Txn`: if (value == old | mod_revision == old's) then put `new`.
async fn cas(
    rec: &mut Recorder,
    kv: &mut KvClient<Channel>,
    key: &str,
    (old, mod_revision): (String, i64),
    new: String,
    by_revision: bool,
    t: Duration,
) -> Result<(), ClientError> {
    let (target, union, note) = if by_revision {
        (
            compare::CompareTarget::Mod,
            compare::TargetUnion::ModRevision(mod_revision),
            json!({ "compare": "mod_revision", "mod_revision": mod_revision }),
        )
    } else {
        (
            compare::CompareTarget::Value,
            compare::TargetUnion::Value(old.clone().into_bytes()),
            json!({ "compare": "value" }),
        )
    };
    let inv = rec.ev("cas").key(key).value(json!([old, new, note]));
    rec.invoke(inv.clone())?;
    let txn = pb::TxnRequest {
        compare: vec![pb::Compare {
            result: compare::CompareResult::Equal as i32,
            target: target as i32,
            key: key.as_bytes().to_vec(),
            target_union: Some(union),
            ..Default::default()
        }],
        success: vec![pb::RequestOp {
            request: Some(request_op::Request::RequestPut(pb::PutRequest {
                key: key.as_bytes().to_vec(),
                value: new.into_bytes(),
                ..Default::default()
            })),
        }],
        failure: vec![],
    };
    let r = tokio::time::timeout(t, kv.txn(req(txn, t))).await;
    let res = match outcome(r) {
        Ok(resp) if resp.succeeded => Res::Ok(
            Some(json!({ "revision": revision(resp.header.as_ref()) })),
            None,
        ),
        Ok(_) => Res::Fail("compare failed".into()),
        Err(res) => res,
    };
    rec.complete(&inv, &res)
}
