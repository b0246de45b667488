//! The apply-rules gate at the leader's door: whether a command may be proposed now.
//!
//! A command that only newer rules know ([`Semantics::needed_by`], today the etcd calls of
//! [`Semantics::ETCD`]) is a log format older nodes cannot decode. The leader stamps every
//! entry with the newest rules *every* member runs (`fenced_server::node::alarm`); while that
//! stamp is older than the command needs, the leader refuses the command with
//! [`CoreError::NotUpgraded`] naming a member that holds the cluster back, instead of
//! proposing it. (Should one slip into an entry stamped older anyway — the stamp fell between
//! this check and the entry — apply refuses it by the same error: replicas still agree.)

use crate::{Command, CoreError, Semantics};

/// What the leader knows of one member's rules: `None` until it answered a check.
pub type MemberRules = (u64, Option<Semantics>);

/// `Ok` if `cmd` may be proposed in an entry stamped `stamp`; else why not, naming the first
/// member of `members` (in their order) that runs older rules than `cmd` needs, or has not
/// told yet. The one decision the server makes before proposing.
pub fn admit(cmd: &Command, stamp: Semantics, members: &[MemberRules]) -> Result<(), CoreError> {
    let needs = Semantics::needed_by(cmd);
    if stamp.0 >= needs.0 {
        return Ok(());
    }
    let behind = members.iter().find_map(|(id, rules)| match rules {
        None => Some(format!("member {id} has not reported its apply rules yet")),
        Some(s) if s.0 < needs.0 => Some(format!(
            "member {id} runs older apply rules ({}; {} needs {})",
            s.0,
            cmd.kind(),
            needs.0
        )),
        Some(_) => None,
    });
    Err(CoreError::NotUpgraded {
        needs: needs.0,
        detail: behind.unwrap_or_else(|| {
            format!(
                "new entries are applied by rules {} until the leader has heard from every \
                 member; {} needs {}",
                stamp.0,
                cmd.kind(),
                needs.0
            )
        }),
    })
}

/// Apply's side: `cmd` in an entry stamped `stamp` it is too new for.
pub(crate) fn refused_by_entry(cmd: &Command, stamp: Semantics) -> Option<CoreError> {
    let needs = Semantics::defined_by(cmd);
    (stamp.0 < needs.0).then(|| CoreError::NotUpgraded {
        needs: needs.0,
        detail: format!(
            "the entry is applied by rules {}; {} needs {}",
            stamp.0,
            cmd.kind(),
            needs.0
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::PutRequest;
    use crate::EtcdCommand;

    #[test]
    fn etcd_writes_wait_for_every_member_and_name_the_one_behind() {
        let put = Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v")));
        let all_new = [(1, Some(Semantics::ETCD)), (2, Some(Semantics::ETCD))];
        assert_eq!(admit(&put, Semantics::ETCD, &all_new), Ok(()));
        // Member 2 runs the previous release.
        let behind = [
            (1, Some(Semantics::ETCD)),
            (2, Some(Semantics::DETERMINISTIC)),
        ];
        let e = admit(&put, Semantics::DETERMINISTIC, &behind).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "cluster not upgraded: member 2 runs older apply rules (2; etcd_put needs 3)"
        );
        assert!(matches!(e, CoreError::NotUpgraded { needs: 3, .. }));
        // Member 3 has not answered.
        let silent = [(1, Some(Semantics::ETCD)), (3, None)];
        let e = admit(&put, Semantics::DETERMINISTIC, &silent).expect_err("refused");
        assert!(e.to_string().contains("member 3 has not reported"), "{e}");
        // Every member new, but the stamp not moved yet (no round since): still refused.
        let e = admit(&put, Semantics::DETERMINISTIC, &all_new).expect_err("refused");
        assert!(e.to_string().contains("until the leader has heard"), "{e}");
        // Older commands are never held back.
        let tick = Command::Tick;
        assert_eq!(admit(&tick, Semantics::REVISIONS, &behind), Ok(()));
    }

    #[test]
    fn apply_refuses_an_etcd_command_in_an_older_entry() {
        let put = Command::Etcd(EtcdCommand::Put(PutRequest::new("k", "v")));
        assert!(refused_by_entry(&put, Semantics::DETERMINISTIC).is_some());
        assert!(refused_by_entry(&put, Semantics::INDEX_TOKENS).is_some());
        assert!(refused_by_entry(&put, Semantics::ETCD).is_none());
        assert!(refused_by_entry(&Command::Tick, Semantics::REVISIONS).is_none());
        assert!(refused_by_entry(&Command::Tick, Semantics::INDEX_TOKENS).is_none());
    }
}
