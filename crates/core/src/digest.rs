//! A digest of the replicated state, for the divergence alarm: replicas that applied the same
//! log prefix must have equal digests at the same log index.
//!
//! The digest hashes the state's canonical encoding — the same bincode bytes a snapshot holds
//! (every table is an ordered map, so the bytes depend only on the contents) — streamed into
//! the hash without building them in memory. Compute it on an O(1) copy-on-write clone
//! ([`StateMachine::clone`]) off the apply path: it walks the whole state.
//!
//! **One exception: addresses in stored replies.** Before the deterministic rules
//! ([`crate::Semantics::DETERMINISTIC`]), a Lua script could answer `tostring({})` or a
//! function, and the reply kept in the replicated dedup table was `table: 0x55d0…` — a
//! different address on every replica. Those records outlive an upgrade (until the client's
//! newer requests replace them), so hashing them as they are would raise a false alarm right
//! after one. Inside a digest, the text of every stored reply ([`crate::kv::Reply`]'s status,
//! error and bulk strings) is hashed with the digits of each `table: 0x…`, `function: 0x…`,
//! `thread: 0x…` and `userdata: 0x…` dropped. Only replies: an address in a keyspace value is
//! a real divergence (a follower would serve it) and is hashed as it is. Cost: one scan of
//! each reply's text for `: 0x`; a copy only for the (old) replies that hold one. The snapshot
//! encoding is unchanged: the canonical form exists only while [`StateMachine::digest`] runs,
//! on its thread.

use std::cell::Cell;
use std::io;

use bincode::Options;
use serde::Serializer;
use xxhash_rust::xxh3::Xxh3;

use crate::StateMachine;

/// A 64-bit digest of a state (XXH3 of its canonical encoding).
pub type StateDigest = u64;

thread_local! {
    /// Set while this thread serializes a state for a digest.
    static DIGESTING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`DIGESTING`] when the digest ends, even by a panic.
struct Digesting;

impl Digesting {
    fn start() -> Digesting {
        DIGESTING.with(|d| d.set(true));
        Digesting
    }
}

impl Drop for Digesting {
    fn drop(&mut self) {
        DIGESTING.with(|d| d.set(false));
    }
}

fn digesting() -> bool {
    DIGESTING.with(Cell::get)
}

/// The type names Lua prints before an address.
const ADDRESS_OWNERS: [&[u8]; 4] = [b"table", b"function", b"thread", b"userdata"];

/// `text` with the hex digits after every `<owner>: 0x` dropped, or `None` if it holds none.
fn without_addresses(text: &[u8]) -> Option<Vec<u8>> {
    const MARK: &[u8] = b": 0x";
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i + MARK.len() <= text.len() {
        if &text[i..i + MARK.len()] != MARK
            || !ADDRESS_OWNERS.iter().any(|o| text[..i].ends_with(o))
        {
            i += 1;
            continue;
        }
        let digits_from = i + MARK.len();
        let digits = text[digits_from..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        let buf = out.get_or_insert_with(|| Vec::with_capacity(text.len()));
        buf.extend_from_slice(&text[copied..digits_from]);
        copied = digits_from + digits;
        i = copied;
    }
    let mut buf = out?;
    buf.extend_from_slice(&text[copied..]);
    Some(buf)
}

/// `serialize_with` of [`crate::kv::Reply`]'s text fields: as is, except inside a digest.
#[allow(clippy::ptr_arg)] // serde passes the field
pub(crate) fn reply_text<S: Serializer>(text: &String, s: S) -> Result<S::Ok, S::Error> {
    if digesting() {
        if let Some(canonical) = without_addresses(text.as_bytes()) {
            return s.serialize_str(&String::from_utf8_lossy(&canonical));
        }
    }
    s.serialize_str(text)
}

/// `serialize_with` of [`crate::kv::Reply::Bulk`]: as is, except inside a digest.
#[allow(clippy::ptr_arg)] // serde passes the field
pub(crate) fn reply_bytes<S: Serializer>(bytes: &Vec<u8>, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    if digesting() {
        if let Some(canonical) = without_addresses(bytes) {
            return canonical.serialize(s);
        }
    }
    bytes.serialize(s)
}

struct HashWriter<'a>(&'a mut Xxh3);

impl io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl StateMachine {
    /// The digest of this state: equal for equal states, whichever replica built them.
    pub fn digest(&self) -> StateDigest {
        let mut hasher = Xxh3::new();
        let _digesting = Digesting::start();
        // The snapshot body, etcd keyspace included (version 2) once it was touched.
        // Serializing plain maps and integers into a hasher cannot fail.
        let _ = self.write_body(
            bincode::DefaultOptions::new()
                .with_fixint_encoding()
                .allow_trailing_bytes(),
            HashWriter(&mut hasher),
        );
        hasher.digest()
    }
}

#[cfg(test)]
mod tests {
    use super::without_addresses;
    use crate::kv::KvCommand;
    use crate::{Batch, Command, Request, RequestId, Semantics, StateMachine};

    fn open(seq: u64) -> Batch {
        Batch::one(Request {
            time_ms: 1_000 * seq,
            client: Some(RequestId { client_id: 1, seq }),
            cmd: Command::OpenSession { ttl_ms: 10_000 },
        })
    }

    #[test]
    fn equal_states_have_equal_digests_and_any_change_shows() {
        let (mut a, mut b) = (StateMachine::new(), StateMachine::new());
        assert_eq!(a.digest(), b.digest());
        a.apply_batch(1, &open(1));
        assert_ne!(a.digest(), b.digest());
        b.apply_batch(1, &open(1));
        assert_eq!(a.digest(), b.digest());
        // The digest is of the encoding a snapshot holds (replies aside, see below).
        let restored = StateMachine::from_bytes(&a.to_bytes()).expect("decodes");
        assert_eq!(restored.digest(), a.digest());
        b.apply_batch(2, &open(2));
        assert_ne!(a.digest(), b.digest());
    }

    fn eval(seq: u64, script: &str, semantics: Semantics) -> Batch {
        let argv = vec![b"EVAL".to_vec(), script.as_bytes().to_vec(), b"0".to_vec()];
        Batch {
            requests: vec![Request {
                time_ms: 1_000 * seq,
                client: Some(RequestId { client_id: 1, seq }),
                cmd: Command::Kv(KvCommand::Batch(vec![argv])),
            }],
            semantics,
        }
    }

    #[test]
    fn addresses_in_stored_replies_do_not_change_the_digest() {
        // Entries applied before the deterministic rules: their replies, kept in the dedup
        // table, show addresses — different ones on each replica.
        let old = [
            "return function() end",
            "return {ok = tostring({})}",
            "error(function() end)",
            "return {tostring({}), {tostring(type) .. ' and ' .. tostring(coroutine.running())}}",
            "return redis.error_reply('thread: 0x' .. string.sub(tostring({}), 10))",
        ];
        let (mut a, mut b) = (StateMachine::new(), StateMachine::new());
        let mut seq = 0;
        for script in old {
            seq += 1;
            a.apply_batch(seq, &eval(seq, script, Semantics::REVISIONS));
            b.apply_batch(seq, &eval(seq, script, Semantics::REVISIONS));
        }
        assert_ne!(
            a.to_bytes(),
            b.to_bytes(),
            "the replies hold different addresses"
        );
        assert_eq!(a.digest(), b.digest());
        // Other differences in a reply still show.
        let (mut c, mut d) = (a.clone(), b.clone());
        c.apply_batch(
            seq + 1,
            &eval(seq + 1, "return 'table: 0x1'", Semantics::REVISIONS),
        );
        d.apply_batch(
            seq + 1,
            &eval(seq + 1, "return 'table: 0y1'", Semantics::REVISIONS),
        );
        assert_ne!(c.digest(), d.digest());
        // An address in a keyspace value is a real divergence: a follower would serve it.
        let set = "redis.call('SET', 'k', tostring({})) return 1";
        a.apply_batch(seq + 1, &eval(seq + 1, set, Semantics::REVISIONS));
        b.apply_batch(seq + 1, &eval(seq + 1, set, Semantics::REVISIONS));
        assert_ne!(a.digest(), b.digest());
        // The snapshot encoding is untouched by a digest taken before it.
        assert_eq!(StateMachine::from_bytes(&a.to_bytes()).expect("decodes"), a);
    }

    #[test]
    fn canonical_reply_text_drops_only_address_digits() {
        let canon = |s: &str| {
            without_addresses(s.as_bytes()).map(|b| String::from_utf8_lossy(&b).into_owned())
        };
        assert_eq!(canon("table: 0x55d0c8a3c2a0"), Some("table: 0x".into()));
        assert_eq!(
            canon("ERR user_script:1: a function: 0x7f00ab and userdata: 0x1, thread: 0xfz"),
            Some("ERR user_script:1: a function: 0x and userdata: 0x, thread: 0xz".into())
        );
        assert_eq!(canon("table: 1"), None);
        assert_eq!(canon("pointer: 0x1234"), None);
        assert_eq!(canon("0x1234 table: 0"), None);
        assert_eq!(canon(""), None);
    }
}
