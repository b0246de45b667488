//! Payload encoding of the node-to-node transport.
//!
//! Each `fenced.raft.v1` message carries one openraft request, response or error encoded with
//! bincode 1.3 (serde). The options are fixed here and used by both ends: little-endian varint
//! integers, trailing bytes rejected, and a size limit of [`MAX_MESSAGE_SIZE`] so that a
//! corrupted length prefix can never make the decoder allocate more than a gRPC message may
//! hold.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{TransportError, MAX_MESSAGE_SIZE};

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(MAX_MESSAGE_SIZE as u64)
}

/// Encodes `value` for a `data`/`error` field.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, TransportError> {
    options().serialize(value).map_err(TransportError::Encode)
}

/// Decodes a `data`/`error` field. Never panics on malformed input.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, TransportError> {
    options().deserialize(bytes).map_err(TransportError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_garbage() {
        let v: Vec<u64> = vec![1, 2, 300, u64::MAX];
        let bytes = encode(&v).expect("encode");
        assert_eq!(decode::<Vec<u64>>(&bytes).expect("decode"), v);

        // Trailing bytes are rejected.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode::<Vec<u64>>(&longer).is_err());

        // A huge length prefix fails cleanly instead of allocating.
        let huge = [0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert!(decode::<Vec<u8>>(&huge).is_err());
        assert!(decode::<Vec<u8>>(&[]).is_err());
    }
}
