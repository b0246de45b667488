//! The change feed: every change after a revision, in order, for watches to replay and resume.

use std::ops::Bound;

use super::store::Stored;
use super::{EtcdError, Event, EventKind, Events, KeyRange, KeyValue, Rev};
use crate::Revision;

impl super::EtcdStore {
    /// The changes to keys of `range` made after revision `after`, in revision then sub
    /// order: a page of at least `limit` events (0 = no limit) unless the feed ends first,
    /// never splitting a revision. Ask again with `after =`
    /// [`resume_after`](Events::resume_after) for the rest: no gap, no duplicate.
    /// `prev_kv` adds each change's previous live version.
    ///
    /// etcd's watch `start_revision` s is `after = s - 1`. Starting *at* the compact
    /// revision c (`after = c - 1`) is allowed, as etcd allows it: the puts at c are there,
    /// without a previous kv, the deletes at c are not (compaction removes their tombstones and
    /// the versions before; neither is returned even while a stepwise compaction has not
    /// reached them yet, so every replica answers alike).
    /// Starting below c: [`EtcdError::Compacted`].
    pub fn events_since(
        &self,
        after: Revision,
        range: &KeyRange,
        limit: usize,
        prev_kv: bool,
    ) -> Result<Events, EtcdError> {
        if after.saturating_add(1) < self.compact_revision {
            return Err(EtcdError::Compacted {
                compact_revision: self.compact_revision,
            });
        }
        // The revision whose deletes compaction took (only when starting at it).
        let gone_deletes = (after < self.compact_revision).then_some(self.compact_revision);
        let mut page = Events {
            events: Vec::new(),
            resume_after: after.max(self.last_write),
            more: false,
        };
        let from = Bound::Excluded(Rev {
            main: after,
            sub: u32::MAX,
        });
        let mut feed = self.by_rev.range((from, Bound::Unbounded)).peekable();
        while let Some((rev, key)) = feed.next() {
            if range.contains(key) {
                let mut event = self.event(key, *rev, prev_kv);
                // At the compact revision itself its deletes are gone, and so are the versions
                // before its puts — however far a stepwise compaction got.
                let at_compact = gone_deletes == Some(rev.main);
                if at_compact {
                    event.prev_kv = None;
                }
                if !(at_compact && event.kind == EventKind::Delete) {
                    page.events.push(event);
                }
            }
            let revision_ends = feed.peek().is_none_or(|(next, _)| next.main != rev.main);
            if limit > 0 && page.events.len() >= limit && revision_ends {
                page.resume_after = rev.main;
                page.more = feed.peek().is_some();
                break;
            }
        }
        Ok(page)
    }

    /// Where a watcher that has seen every change up to `after` may read on from: `after`,
    /// or the compact revision when compaction passed `after` but removed no write made after
    /// it (the watcher missed nothing, whatever revisions lock commands, lease keep-alives or
    /// failed txns took meanwhile). etcd never cancels a synced watcher for compaction; a
    /// watcher that would miss a compacted write still is ([`events_since`](Self::events_since)).
    /// Node-local knowledge: after a snapshot install or a restart it is conservative.
    pub fn synced_position(&self, after: Revision) -> Revision {
        if after < self.compact_revision && self.compacted_writes.0 <= after {
            self.compact_revision
        } else {
            after
        }
    }

    fn event(&self, key: &[u8], rev: Rev, prev_kv: bool) -> Event {
        let (kind, kv) = match self.kv(key, rev) {
            Some(kv) => (EventKind::Put, kv),
            None => (
                EventKind::Delete,
                KeyValue {
                    key: key.to_vec(),
                    mod_revision: rev.main,
                    ..KeyValue::default()
                },
            ),
        };
        let prev_kv = if prev_kv {
            self.versions
                .range((
                    Bound::Included((key.to_vec(), 0, 0)),
                    Bound::Excluded((key.to_vec(), rev.main, rev.sub)),
                ))
                .next_back()
                .and_then(|((_, main, sub), stored)| match stored {
                    Stored::Put { .. } => self.kv(
                        key,
                        Rev {
                            main: *main,
                            sub: *sub,
                        },
                    ),
                    Stored::Tombstone => None,
                })
        } else {
            None
        };
        Event { kind, kv, prev_kv }
    }
}
