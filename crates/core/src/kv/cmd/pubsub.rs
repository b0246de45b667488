//! Pub/sub. `PUBLISH` goes through the log so that every node's subscribers see the message;
//! subscriptions are the front end's.

use super::prelude::*;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("PUBLISH", 3, PUBSUB, |ctx, a| {
        ctx.events.push(KvEvent::Published {
            channel: a[0].clone(),
            message: a[1].clone(),
        });
        // The number of receivers is filled in by the node that took the command.
        Ok(Reply::Int(0))
    })
    .keys(KeySpec::None)
    .channels(ChannelSpec::First),
    CommandSpec::other("SUBSCRIBE", -2, PUBSUB, Run::FrontEnd).channels(ChannelSpec::All),
    CommandSpec::other("UNSUBSCRIBE", -1, PUBSUB, Run::FrontEnd),
    CommandSpec::other("PSUBSCRIBE", -2, PUBSUB, Run::FrontEnd).channels(ChannelSpec::Patterns),
    CommandSpec::other("PUNSUBSCRIBE", -1, PUBSUB, Run::FrontEnd),
];
