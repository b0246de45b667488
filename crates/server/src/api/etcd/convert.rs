//! etcd's protobuf messages ↔ the keyspace's types ([`fenced_core::etcd`]). Responses carry
//! no header here; the handlers add it.

use fenced_core::etcd as core;
use fenced_proto::etcd::etcdserverpb as epb;
use fenced_proto::etcd::mvccpb;
use tonic::Status;

use super::{rev_in, rev_out};

pub fn range_of(key: Vec<u8>, range_end: Vec<u8>) -> core::KeyRange {
    core::KeyRange { key, range_end }
}

pub fn range_request(r: epb::RangeRequest) -> Result<core::RangeRequest, Status> {
    use epb::range_request::{SortOrder, SortTarget};
    let sort_order = match SortOrder::try_from(r.sort_order) {
        Ok(SortOrder::None) => core::SortOrder::None,
        Ok(SortOrder::Ascend) => core::SortOrder::Ascend,
        Ok(SortOrder::Descend) => core::SortOrder::Descend,
        Err(_) => return Err(Status::invalid_argument("etcdserver: invalid sort option")),
    };
    let sort_target = match SortTarget::try_from(r.sort_target) {
        Ok(SortTarget::Key) => core::SortTarget::Key,
        Ok(SortTarget::Version) => core::SortTarget::Version,
        Ok(SortTarget::Create) => core::SortTarget::Create,
        Ok(SortTarget::Mod) => core::SortTarget::Mod,
        Ok(SortTarget::Value) => core::SortTarget::Value,
        Err(_) => return Err(Status::invalid_argument("etcdserver: invalid sort option")),
    };
    Ok(core::RangeRequest {
        range: range_of(r.key, r.range_end),
        limit: rev_in(r.limit),
        revision: rev_in(r.revision),
        sort_order,
        sort_target,
        keys_only: r.keys_only,
        count_only: r.count_only,
        min_mod_revision: rev_in(r.min_mod_revision),
        max_mod_revision: rev_in(r.max_mod_revision),
        min_create_revision: rev_in(r.min_create_revision),
        max_create_revision: rev_in(r.max_create_revision),
    })
}

pub fn put_request(r: epb::PutRequest) -> core::PutRequest {
    core::PutRequest {
        key: r.key,
        value: r.value,
        lease: r.lease,
        prev_kv: r.prev_kv,
        ignore_value: r.ignore_value,
        ignore_lease: r.ignore_lease,
    }
}

pub fn delete_request(r: epb::DeleteRangeRequest) -> core::DeleteRangeRequest {
    core::DeleteRangeRequest {
        range: range_of(r.key, r.range_end),
        prev_kv: r.prev_kv,
    }
}

fn compare(c: epb::Compare) -> Result<core::Compare, Status> {
    use epb::compare::{CompareResult, CompareTarget, TargetUnion};
    let result = match CompareResult::try_from(c.result) {
        Ok(CompareResult::Equal) => core::CompareResult::Equal,
        Ok(CompareResult::Greater) => core::CompareResult::Greater,
        Ok(CompareResult::Less) => core::CompareResult::Less,
        Ok(CompareResult::NotEqual) => core::CompareResult::NotEqual,
        Err(_) => {
            return Err(Status::invalid_argument(
                "etcdserver: invalid compare result",
            ))
        }
    };
    // etcd reads the union member the target names; an absent one is its zero value.
    let target = match CompareTarget::try_from(c.target) {
        Ok(CompareTarget::Version) => core::CompareTarget::Version(match c.target_union {
            Some(TargetUnion::Version(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Create) => core::CompareTarget::CreateRevision(match c.target_union {
            Some(TargetUnion::CreateRevision(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Mod) => core::CompareTarget::ModRevision(match c.target_union {
            Some(TargetUnion::ModRevision(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Value) => core::CompareTarget::Value(match c.target_union {
            Some(TargetUnion::Value(v)) => v,
            _ => Vec::new(),
        }),
        Ok(CompareTarget::Lease) => core::CompareTarget::Lease(match c.target_union {
            Some(TargetUnion::Lease(v)) => v,
            _ => 0,
        }),
        Err(_) => {
            return Err(Status::invalid_argument(
                "etcdserver: invalid compare target",
            ))
        }
    };
    Ok(core::Compare {
        range: range_of(c.key, c.range_end),
        result,
        target,
    })
}

fn request_op(op: epb::RequestOp) -> Result<core::RequestOp, Status> {
    use epb::request_op::Request;
    Ok(match op.request {
        Some(Request::RequestRange(r)) => core::RequestOp::Range(range_request(r)?),
        Some(Request::RequestPut(r)) => core::RequestOp::Put(put_request(r)),
        Some(Request::RequestDeleteRange(r)) => core::RequestOp::DeleteRange(delete_request(r)),
        Some(Request::RequestTxn(r)) => core::RequestOp::Txn(txn_request(r)?),
        // etcd's checkRequestOp lets an empty op through and answers it with an empty
        // response; the keyspace has no such op, so it is refused.
        None => {
            return Err(Status::invalid_argument(
                "etcdserver: empty request op in txn",
            ))
        }
    })
}

pub fn txn_request(r: epb::TxnRequest) -> Result<core::TxnRequest, Status> {
    let ops = |ops: Vec<epb::RequestOp>| -> Result<Vec<core::RequestOp>, Status> {
        ops.into_iter().map(request_op).collect()
    };
    Ok(core::TxnRequest {
        compare: r
            .compare
            .into_iter()
            .map(compare)
            .collect::<Result<_, _>>()?,
        success: ops(r.success)?,
        failure: ops(r.failure)?,
    })
}

/// Whether every range of a txn (nested ones included) asks for a serializable read; a txn
/// without ranges is not (etcd's `isTxnSerializable`).
pub fn txn_serializable(r: &epb::TxnRequest) -> bool {
    use epb::request_op::Request;
    let mut any = false;
    let mut all = true;
    let mut stack: Vec<&epb::TxnRequest> = vec![r];
    while let Some(t) = stack.pop() {
        for op in t.success.iter().chain(&t.failure) {
            match &op.request {
                Some(Request::RequestRange(r)) => {
                    any = true;
                    all &= r.serializable;
                }
                Some(Request::RequestTxn(t)) => stack.push(t),
                _ => {}
            }
        }
    }
    any && all
}

pub fn kv(kv: core::KeyValue) -> mvccpb::KeyValue {
    mvccpb::KeyValue {
        key: kv.key,
        create_revision: rev_out(kv.create_revision),
        mod_revision: rev_out(kv.mod_revision),
        version: kv.version,
        value: kv.value,
        lease: kv.lease,
    }
}

pub fn range_response(
    r: core::RangeResponse,
    header: Option<epb::ResponseHeader>,
) -> epb::RangeResponse {
    epb::RangeResponse {
        header,
        kvs: r.kvs.into_iter().map(kv).collect(),
        more: r.more,
        count: i64::try_from(r.count).unwrap_or(i64::MAX),
    }
}

pub fn put_response(r: core::PutResponse, header: Option<epb::ResponseHeader>) -> epb::PutResponse {
    epb::PutResponse {
        header,
        prev_kv: r.prev_kv.map(kv),
    }
}

pub fn delete_response(
    r: core::DeleteRangeResponse,
    header: Option<epb::ResponseHeader>,
) -> epb::DeleteRangeResponse {
    epb::DeleteRangeResponse {
        header,
        deleted: i64::try_from(r.deleted).unwrap_or(i64::MAX),
        prev_kvs: r.prev_kvs.into_iter().map(kv).collect(),
    }
}

/// A txn's answer; its nested responses carry the same header (etcd gives them one too).
pub fn txn_response(r: core::TxnResponse, header: Option<epb::ResponseHeader>) -> epb::TxnResponse {
    use epb::response_op::Response;
    let responses = r
        .responses
        .into_iter()
        .map(|op| epb::ResponseOp {
            response: Some(match op {
                core::ResponseOp::Range(r) => Response::ResponseRange(range_response(r, header)),
                core::ResponseOp::Put(r) => Response::ResponsePut(put_response(r, header)),
                core::ResponseOp::DeleteRange(r) => {
                    Response::ResponseDeleteRange(delete_response(r, header))
                }
                core::ResponseOp::Txn(r) => Response::ResponseTxn(txn_response(r, header)),
            }),
        })
        .collect();
    epb::TxnResponse {
        header,
        succeeded: r.succeeded,
        responses,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_read_the_union_member_their_target_names() {
        use epb::compare::{CompareResult, CompareTarget, TargetUnion};
        let c = epb::Compare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Mod as i32,
            key: b"k".to_vec(),
            range_end: Vec::new(),
            target_union: Some(TargetUnion::ModRevision(7)),
        };
        let got = compare(c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.target, core::CompareTarget::ModRevision(7));
        assert_eq!(got.result, core::CompareResult::Greater);
        // A value compare without a value compares against the empty value.
        let c = epb::Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: b"k".to_vec(),
            range_end: Vec::new(),
            target_union: None,
        };
        let got = compare(c).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.target, core::CompareTarget::Value(Vec::new()));
    }

    #[test]
    fn a_txn_is_serializable_when_every_range_in_it_is() {
        use epb::request_op::Request;
        let range = |serializable| epb::RequestOp {
            request: Some(Request::RequestRange(epb::RangeRequest {
                key: b"k".to_vec(),
                serializable,
                ..Default::default()
            })),
        };
        let txn = |ops: Vec<epb::RequestOp>| epb::TxnRequest {
            compare: Vec::new(),
            success: ops,
            failure: Vec::new(),
        };
        assert!(!txn_serializable(&txn(vec![])));
        assert!(txn_serializable(&txn(vec![range(true)])));
        assert!(!txn_serializable(&txn(vec![range(true), range(false)])));
        let nested = epb::RequestOp {
            request: Some(Request::RequestTxn(txn(vec![range(false)]))),
        };
        assert!(!txn_serializable(&txn(vec![range(true), nested])));
    }
}
