//! Who may make an etcd call: fenced's users ([`Users`]), each call standing for commands of
//! the core command table on its keys — `Range` and a txn's compares `GET`, `Put` `SET`,
//! `DeleteRange` `DEL`, a `Txn` each of its ops', `Compact` an administrator. A range is
//! checked by what it names: one key by the key patterns ([`User::permit`]); a prefix by a
//! `prefix*`-style pattern covering it ([`User::permit_prefix`]); any other range needs
//! `allkeys` ([`User::permit_keyspace`]). The table is in docs/operations.md.

use fenced_core::etcd::{prefix_end, KeyRange, RequestOp, TxnRequest};
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

/// May `user` run every part of `txn` (both branches: which one runs is decided later)?
pub fn permit_txn(user: &User, txn: &TxnRequest) -> Result<(), Status> {
    for c in &txn.compare {
        permit_range(user, "GET", &c.range)?;
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            RequestOp::Range(r) => permit_range(user, "GET", &r.range)?,
            RequestOp::Put(p) => user.permit("SET", &[&p.key]).map_err(denied)?,
            RequestOp::DeleteRange(d) => permit_range(user, "DEL", &d.range)?,
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

    fn app() -> std::sync::Arc<User> {
        let acl = Acl::parse(
            "user app on nopass ~app/* -@all +get +set +del\n",
            "users.acl",
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        acl.user("app")
            .cloned()
            .unwrap_or_else(|| panic!("no user"))
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
}
