//! Who may make an etcd call: fenced's users ([`Users`]), each call standing for commands of
//! the core command table on its keys — `Range` and a txn's compares `GET`, `Put` `SET`,
//! `DeleteRange` `DEL`, a `Txn` each of its ops', `Compact` an administrator; a `Put` or
//! `DeleteRange` asking for `prev_kv` (alone or in a txn) also needs `GET` on what it names,
//! as etcd checks range permission then (the old value is a read). A range is
//! checked by what it names: one key by the key patterns ([`User::permit`]); a prefix by a
//! `prefix*`-style pattern covering it ([`User::permit_prefix`]); any other range needs
//! `allkeys` ([`User::permit_keyspace`]). The table is in docs/operations.md.

use fenced_core::etcd::{
    prefix_end, DeleteRangeRequest, KeyRange, PutRequest, RequestOp, TxnRequest,
};
use fenced_resp::acl::User;
use tonic::Status;

use crate::users::denied;

/// May `user` run `command` on every key `range` names?
pub fn permit_range(user: &User, command: &str, range: &KeyRange) -> Result<(), Status> {
    let r = if range.range_end.is_empty() {
        user.permit(command, &[&range.key])
    } else if range.range_end == prefix_end(&range.key) {
        user.permit_prefix(command, &range.key)
    } else {
        user.permit_keyspace(command)
    };
    r.map_err(denied)
}

/// May `user` put `put.key` — and, with `prev_kv`, read it?
pub fn permit_put(user: &User, put: &PutRequest) -> Result<(), Status> {
    user.permit("SET", &[&put.key]).map_err(denied)?;
    if put.prev_kv {
        user.permit("GET", &[&put.key]).map_err(denied)?;
    }
    Ok(())
}

/// May `user` delete `del.range` — and, with `prev_kv`, read it?
pub fn permit_delete(user: &User, del: &DeleteRangeRequest) -> Result<(), Status> {
    permit_range(user, "DEL", &del.range)?;
    if del.prev_kv {
        permit_range(user, "GET", &del.range)?;
    }
    Ok(())
}

/// May `user` run every part of `txn` (both branches: which one runs is decided later)?
pub fn permit_txn(user: &User, txn: &TxnRequest) -> Result<(), Status> {
    for c in &txn.compare {
        permit_range(user, "GET", &c.range)?;
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(r) => permit_range(user, "GET", &r.range)?,
            RequestOp::Put(p) => permit_put(user, p)?,
            RequestOp::DeleteRange(d) => permit_delete(user, d)?,
            RequestOp::Txn(t) => permit_txn(user, t)?,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_core::etcd::{PutRequest, RangeRequest};
    use fenced_resp::acl::Acl;
    use tonic::Code;

    fn user(name: &str) -> std::sync::Arc<User> {
        let acl = Acl::parse(
            "user app on nopass ~app/* -@all +get +set +del\n\
             user writer on nopass ~app/* -@all +set +del\n",
            "users.acl",
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        acl.user(name).cloned().unwrap_or_else(|| panic!("no user"))
    }

    fn app() -> std::sync::Arc<User> {
        user("app")
    }

    fn code(r: Result<(), Status>) -> Option<Code> {
        r.err().map(|s| s.code())
    }

    #[test]
    fn ranges_are_checked_by_what_they_name() {
        let u = app();
        assert_eq!(code(permit_range(&u, "GET", &KeyRange::key("app/x"))), None);
        assert_eq!(
            code(permit_range(&u, "GET", &KeyRange::prefix("app/"))),
            None
        );
        let denied = Some(Code::PermissionDenied);
        assert_eq!(code(permit_range(&u, "GET", &KeyRange::key("b"))), denied);
        assert_eq!(
            code(permit_range(&u, "GET", &KeyRange::prefix("app"))),
            denied
        );
        assert_eq!(code(permit_range(&u, "GET", &KeyRange::all())), denied);
        // A range inside the pattern but not a prefix still needs allkeys (conservative).
        let inside = KeyRange::new("app/a", "app/c");
        assert_eq!(code(permit_range(&u, "GET", &inside)), denied);
    }

    #[test]
    fn a_txn_needs_both_branches_and_its_compares() {
        let u = app();
        let ok = TxnRequest {
            compare: Vec::new(),
            success: vec![RequestOp::Put(PutRequest::new("app/a", "1"))],
            failure: vec![RequestOp::Range(RangeRequest::new(KeyRange::key("app/b")))],
        };
        assert_eq!(code(permit_txn(&u, &ok)), None);
        let mut bad = ok.clone();
        bad.failure = vec![RequestOp::Put(PutRequest::new("other", "1"))];
        assert_eq!(code(permit_txn(&u, &bad)), Some(Code::PermissionDenied));
        let nested = TxnRequest {
            success: vec![RequestOp::Txn(bad)],
            ..TxnRequest::default()
        };
        assert_eq!(code(permit_txn(&u, &nested)), Some(Code::PermissionDenied));
    }

    #[test]
    fn prev_kv_needs_read_permission_in_put_delete_and_txn() {
        let w = user("writer");
        let denied = Some(Code::PermissionDenied);
        let put = PutRequest::new("app/a", "1");
        let del = DeleteRangeRequest {
            range: KeyRange::prefix("app/"),
            prev_kv: false,
        };
        assert_eq!(code(permit_put(&w, &put)), None);
        assert_eq!(code(permit_delete(&w, &del)), None);
        let put_prev = PutRequest {
            prev_kv: true,
            ..put.clone()
        };
        let del_prev = DeleteRangeRequest {
            prev_kv: true,
            ..del.clone()
        };
        assert_eq!(code(permit_put(&w, &put_prev)), denied);
        assert_eq!(code(permit_delete(&w, &del_prev)), denied);
        let txn = |op: RequestOp| TxnRequest {
            compare: Vec::new(),
            success: Vec::new(),
            failure: vec![op],
        };
        assert_eq!(code(permit_txn(&w, &txn(RequestOp::Put(put)))), None);
        assert_eq!(code(permit_txn(&w, &txn(RequestOp::Put(put_prev)))), denied);
        assert_eq!(
            code(permit_txn(&w, &txn(RequestOp::DeleteRange(del)))),
            None
        );
        assert_eq!(
            code(permit_txn(
                &w,
                &txn(RequestOp::DeleteRange(del_prev.clone()))
            )),
            denied
        );
        // A user who may read gets the old value.
        assert_eq!(code(permit_delete(&app(), &del_prev)), None);
    }
}
