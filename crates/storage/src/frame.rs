//! Checksummed, versioned records. Every log entry, the `purged` file's value, and every value
//! older layouts kept in sled is stored as
//!
//! ```text
//! [format version: u8][crc32 of the payload: u32 LE][payload: bincode]
//! ```
//!
//! so a flipped bit is noticed when the value is read (never decoded into a wrong entry), and a
//! value written by a newer, unknown format is refused with its own message instead of being
//! read as garbage.

use crate::StoreError;

/// The format of records this build writes. Version 2: log entries carry a
/// [`fenced_core::Batch`] and snapshots the store revision (tokens are revisions). Version 1
/// (entries of one request whose token was the log index) is still read, and converted.
pub const VERSION: u8 = 2;
/// The oldest format this build reads.
pub const OLDEST: u8 = 1;
const HEADER: usize = 5;

/// The checksum of a record: from version 2 on it covers the version byte too, so a damaged
/// version byte cannot make a record read in another layout.
fn checksum(version: u8, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    if version >= 2 {
        h.update(&[version]);
    }
    h.update(payload);
    h.finalize()
}

/// Wrap `payload` into a record.
pub fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(VERSION);
    out.extend_from_slice(&checksum(VERSION, payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a record, after checking its version and checksum (any version this build
/// reads; for records whose layout did not change between them).
pub fn unseal<'a>(what: &'static str, record: &'a [u8]) -> Result<&'a [u8], StoreError> {
    unseal_versioned(what, record).map(|(_, payload)| payload)
}

/// The format version and the payload of a record, after checking both.
pub fn unseal_versioned<'a>(
    what: &'static str,
    record: &'a [u8],
) -> Result<(u8, &'a [u8]), StoreError> {
    let Some((&version, rest)) = record.split_first() else {
        return Err(StoreError::Checksum {
            what,
            detail: "empty record".into(),
        });
    };
    if !(OLDEST..=VERSION).contains(&version) {
        // A later format would count up from here; any other first byte is damage.
        if !(VERSION + 1..=VERSION + 15).contains(&version) {
            return Err(StoreError::Checksum {
                what,
                detail: format!("bad header byte {version:#04x}"),
            });
        }
        return Err(StoreError::UnknownFormat {
            what,
            found: u32::from(version),
            supported: u32::from(VERSION),
        });
    }
    if rest.len() < HEADER - 1 {
        return Err(StoreError::Checksum {
            what,
            detail: format!(
                "record of {} bytes is shorter than its header",
                record.len()
            ),
        });
    }
    let (crc, payload) = rest.split_at(HEADER - 1);
    let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
    let actual = checksum(version, payload);
    if stored != actual {
        return Err(StoreError::Checksum {
            what,
            detail: format!("stored crc32 {stored:08x}, computed {actual:08x}"),
        });
    }
    Ok((version, payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_every_flipped_bit_is_caught() {
        let payload = b"an entry of the raft log".to_vec();
        let rec = seal(&payload);
        assert_eq!(unseal("t", &rec).expect("intact"), &payload[..]);
        for byte in 0..rec.len() {
            for bit in 0..8 {
                let mut bad = rec.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    unseal("t", &bad).is_err(),
                    "flip at {byte}.{bit} went unnoticed"
                );
            }
        }
        for len in 0..rec.len() {
            assert!(unseal("t", &rec[..len]).is_err(), "truncated to {len}");
        }
    }

    #[test]
    fn unknown_version_is_named() {
        let mut rec = seal(b"x");
        rec[0] = VERSION + 1;
        match unseal("log entry", &rec) {
            Err(StoreError::UnknownFormat { found, .. }) if found == u32::from(VERSION) + 1 => {}
            other => panic!("{other:?}"),
        }
        rec[0] = 0xff;
        assert!(matches!(
            unseal("log entry", &rec),
            Err(StoreError::Checksum { .. })
        ));
    }

    #[test]
    fn version_one_records_are_read_and_a_damaged_version_byte_is_caught() {
        let payload = b"written by fenced before revisions";
        let mut old = vec![1];
        old.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        old.extend_from_slice(payload);
        assert_eq!(unseal_versioned("t", &old).expect("v1"), (1, &payload[..]));
        // A version-2 record whose version byte became 1 fails its checksum.
        let mut rec = seal(payload);
        rec[0] = 1;
        assert!(matches!(
            unseal("t", &rec),
            Err(StoreError::Checksum { .. })
        ));
    }
}
