//! Pub/sub. `PUBLISH` goes through the log so that every node's subscribers see the message;
//! subscriptions are the front end's. Only the server publishes on `fenced:*`
//! ([`RESERVED_PREFIX`]): the front ends refuse a client's `PUBLISH` there before proposing
//! it, and under [`Semantics::REQUEST_DIGESTS`](crate::Semantics::REQUEST_DIGESTS) apply
//! refuses one from a script with the same error (older entries published, and delivery
//! dropped the message).

use super::prelude::*;

/// The channels only the server publishes on (issue 49).
pub const RESERVED_PREFIX: &[u8] = b"fenced:";
/// The refusal of a `PUBLISH` on them, after `ERR ` (the front ends' text too).
pub const RESERVED_REFUSAL: &str =
    "channels starting with 'fenced:' are reserved for the server's own events";

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("PUBLISH", 3, PUBSUB, |ctx, a| {
        if ctx.semantics.request_digests() && a[0].starts_with(RESERVED_PREFIX) {
            return Err(KvError::invalid(RESERVED_REFUSAL));
        }
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
