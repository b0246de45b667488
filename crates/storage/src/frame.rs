//! Checksummed, versioned records. Every value fenced keeps in sled is stored as
//!
//! ```text
//! [format version: u8][crc32 of the payload: u32 LE][payload: bincode]
//! ```
//!
//! so a flipped bit is noticed when the value is read (never decoded into a wrong entry), and a
//! value written by a newer, unknown format is refused with its own message instead of being
//! read as garbage.

use crate::StoreError;

/// The format of records this build writes.
pub const VERSION: u8 = 1;
const HEADER: usize = 5;

/// Wrap `payload` into a record.
pub fn seal(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.push(VERSION);
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of a record, after checking its version and checksum.
pub fn unseal<'a>(what: &'static str, record: &'a [u8]) -> Result<&'a [u8], StoreError> {
    let Some((&version, rest)) = record.split_first() else {
        return Err(StoreError::Checksum {
            what,
            detail: "empty record".into(),
        });
    };
    if version != VERSION {
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
    let actual = crc32fast::hash(payload);
    if stored != actual {
        return Err(StoreError::Checksum {
            what,
            detail: format!("stored crc32 {stored:08x}, computed {actual:08x}"),
        });
    }
    Ok(payload)
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
        rec[0] = 2;
        match unseal("log entry", &rec) {
            Err(StoreError::UnknownFormat { found: 2, .. }) => {}
            other => panic!("{other:?}"),
        }
        rec[0] = 0xff;
        assert!(matches!(
            unseal("log entry", &rec),
            Err(StoreError::Checksum { .. })
        ));
    }
}
