//! Sessions belong to the user who opened them ([`Command::AsUser`], under
//! [`Semantics::SESSION_OWNERS`]): a session opened in a user's command records the user,
//! and another user's command naming it is refused, unless that user is an administrator.
//! A session opened outside one (before these rules, or by a front end without users)
//! belongs to nobody and is open to every user, as every session was before.

use super::StateMachine;
use crate::{Command, CoreError, Event, RequestId, Response, Semantics, SessionId};

impl StateMachine {
    /// Apply `cmd` as `user` asks it (`admin`: an administrator, who may act on any session).
    pub(super) fn as_user(
        &mut self,
        rid: Option<RequestId>,
        user: &str,
        admin: bool,
        cmd: &Command,
        semantics: Semantics,
        events: &mut Vec<Event>,
    ) -> Response {
        // Never nested by a front end (`Command::as_user`); the innermost command, as the
        // outermost user, if a client built one so.
        let cmd = cmd.inner();
        if !admin {
            if let Command::KeepAliveMany { sessions } = cmd {
                // Each answer on its own: another user's session is "not alive" to this one.
                let alive = sessions
                    .iter()
                    .map(|id| {
                        if self.owned_by_another(*id, user) {
                            None
                        } else {
                            self.keep_alive_life(*id)
                        }
                    })
                    .collect();
                return Response::SessionsAlive { alive };
            }
            if let Some(session) = cmd
                .sessions_named()
                .into_iter()
                .find(|id| self.owned_by_another(*id, user))
            {
                return Response::Rejected(CoreError::NotSessionOwner { session });
            }
        }
        let response = self.execute(rid, cmd, semantics, events);
        if cmd.opens_session() {
            if let Response::SessionOpened { session, .. } = &response {
                self.session_owners.insert(*session, user.to_owned());
            }
        }
        response
    }

    /// Session `id` was opened by a user other than `user`.
    fn owned_by_another(&self, id: SessionId, user: &str) -> bool {
        self.session_owners
            .get(&id)
            .is_some_and(|owner| owner != user)
    }

    /// The user who opened session `id`, if it was opened in a user's command.
    pub fn session_owner(&self, id: SessionId) -> Option<&str> {
        self.session_owners.get(&id).map(String::as_str)
    }

    /// Forget the owner of a session that ended.
    pub(super) fn forget_owner(&mut self, id: SessionId) {
        self.session_owners.remove(&id);
    }
}
