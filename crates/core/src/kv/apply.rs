//! Applying a [`KvCommand`] to the keyspace (inside the state machine's `apply`) and answering
//! read-only commands.

use super::cmd;
use super::exec::Ctx;
use super::store::Keyspace;
use super::types::{Bytes, KvCommand, KvEvent, KvResponse, Reply};
use crate::{Millis, Revision, Semantics};

impl Keyspace {
    /// Apply `cmd` at log time `now` by the rules of `semantics` (the entry's); `revision` is
    /// the command's revision. A [`KvCommand::Batch`] (a pipeline) is several commands: each
    /// one after the first takes the next revision, and `revision` is left at the last one
    /// used (except in entries from before revisions, where all share it). `MULTI`/`EXEC` and a script
    /// are one command. Events for the front ends (pub/sub messages, list pushes) are
    /// appended to `events`.
    pub fn apply(
        &mut self,
        revision: &mut Revision,
        semantics: Semantics,
        now: Millis,
        cmd: &KvCommand,
        events: &mut Vec<KvEvent>,
    ) -> KvResponse {
        let mut ctx = Ctx {
            ks: self,
            revision: *revision,
            now,
            events,
            in_script: false,
            limits: Vec::new(),
            dispatch: cmd::exec,
            semantics,
        };
        let replies = Self::run(&mut ctx, cmd, !semantics.index_tokens());
        *revision = ctx.revision;
        KvResponse { replies }
    }

    fn run<'a>(ctx: &mut Ctx<'a>, cmd: &'a KvCommand, per_command: bool) -> Vec<Reply> {
        match cmd {
            KvCommand::Batch(cmds) => cmds
                .iter()
                .enumerate()
                .map(|(i, argv)| {
                    if i > 0 && per_command {
                        ctx.revision += 1;
                    }
                    ctx.exec(argv)
                })
                .collect(),
            KvCommand::Multi { watches, cmds } => {
                let intact = watches
                    .iter()
                    .all(|(k, rev)| ctx.ks.mod_revision(k, ctx.now) == *rev);
                if intact {
                    vec![Reply::Array(cmds.iter().map(|a| ctx.exec(a)).collect())]
                } else {
                    vec![Reply::NilArray]
                }
            }
            KvCommand::Restricted { limits, cmd } => {
                ctx.limits.push(limits);
                let replies = Self::run(ctx, cmd, per_command);
                ctx.limits.pop();
                replies
            }
        }
    }

    /// Answer a read-only command at log time `now` (keys expired at `now` are absent).
    /// `None` if `argv` is not a read-only command.
    pub fn read(&self, now: Millis, argv: &[Bytes]) -> Option<Reply> {
        cmd::read(self, now, argv)
    }
}
