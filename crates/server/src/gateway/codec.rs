//! JSON to and from etcd's messages, generically, by their descriptors (prost-reflect over
//! [`fenced_proto::FILE_DESCRIPTOR_SET`]), with grpc-gateway's mapping as etcd 3.5 serves
//! it: proto field names (`create_revision`, `ID`, `TTL`) in answers, and either the proto
//! or the JSON (lowerCamel) name accepted in requests; `bytes` as base64; 64-bit integers
//! as strings in answers (numbers or strings accepted); enums by name in answers (names or
//! numbers accepted); fields at their default left out of answers (grpc-gateway's
//! `EmitDefaults` off); unknown request fields ignored. And gRPC's message framing, since
//! the gateway calls the gRPC services themselves.

use std::sync::OnceLock;

use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, MethodDescriptor,
    SerializeOptions,
};
use tonic::Status;

const SERIALIZE: SerializeOptions = SerializeOptions::new()
    .use_proto_field_name(true)
    .stringify_64_bit_integers(true)
    .use_enum_numbers(false)
    .skip_default_fields(true);

const DESERIALIZE: DeserializeOptions = DeserializeOptions::new().deny_unknown_fields(false);

/// The descriptors of fenced-proto's files; `None` (logged) if they cannot be read, which a
/// test rules out.
fn pool() -> Option<&'static DescriptorPool> {
    static POOL: OnceLock<Option<DescriptorPool>> = OnceLock::new();
    POOL.get_or_init(
        || match DescriptorPool::decode(fenced_proto::FILE_DESCRIPTOR_SET) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::error!("the gateway's descriptors do not decode: {e}");
                None
            }
        },
    )
    .as_ref()
}

/// The method `service`/`method` (e.g. `etcdserverpb.KV`, `Range`).
pub fn method(service: &str, method: &str) -> Option<MethodDescriptor> {
    pool()?
        .get_service_by_name(service)?
        .methods()
        .find(|m| m.name() == method)
}

/// One JSON value (a request object) as the message `desc`, encoded. `null` and an
/// empty body are the empty message, as grpc-gateway reads them.
pub fn json_to_proto(desc: &MessageDescriptor, json: serde_json::Value) -> Result<Bytes, Status> {
    let json = if json.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        json
    };
    let msg = DynamicMessage::deserialize_with_options(desc.clone(), json, &DESERIALIZE)
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(Bytes::from(msg.encode_to_vec()))
}

/// The first JSON value of `body` (grpc-gateway decodes one and ignores what follows);
/// `null` if it is empty.
pub fn first_json(body: &[u8]) -> Result<serde_json::Value, Status> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::Value::Null);
    }
    let mut values = serde_json::Deserializer::from_slice(body).into_iter::<serde_json::Value>();
    match values.next() {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(Status::invalid_argument(e.to_string())),
        None => Ok(serde_json::Value::Null),
    }
}

/// The message `desc` in `encoded`, as JSON.
pub fn proto_to_json(desc: &MessageDescriptor, encoded: &[u8]) -> Result<Vec<u8>, Status> {
    let msg = DynamicMessage::decode(desc.clone(), encoded)
        .map_err(|e| Status::internal(format!("gateway: undecodable answer: {e}")))?;
    let mut out = serde_json::Serializer::new(Vec::with_capacity(encoded.len() * 2));
    msg.serialize_with_options(&mut out, &SERIALIZE)
        .map_err(|e| Status::internal(format!("gateway: answer as JSON: {e}")))?;
    Ok(out.into_inner())
}

/// `{"result": <message as JSON>}` and a newline: one message of a streamed answer.
pub fn stream_result(desc: &MessageDescriptor, encoded: &[u8]) -> Result<Vec<u8>, Status> {
    let json = proto_to_json(desc, encoded)?;
    let mut out = Vec::with_capacity(json.len() + 12);
    out.extend_from_slice(b"{\"result\":");
    out.extend_from_slice(&json);
    out.extend_from_slice(b"}\n");
    Ok(out)
}

/// A gRPC length-prefixed message (uncompressed).
pub fn frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    b.put_slice(message);
    b.freeze()
}

/// Takes whole gRPC messages off the front of a buffer of response bytes.
#[derive(Default)]
pub struct Deframer {
    buf: BytesMut,
}

impl Deframer {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole message, if the buffer holds one.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Status::internal(
                "gateway: a compressed answer (none was asked for)",
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if self.buf.len() - 5 < len {
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Whether bytes of an incomplete message are left.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::routes::ROUTES;

    #[test]
    fn every_route_names_a_method_of_the_vendored_protos() {
        for r in ROUTES {
            assert!(
                method(r.service, r.method).is_some(),
                "{} -> {}/{}",
                r.path,
                r.service,
                r.method
            );
        }
    }

    #[test]
    fn json_maps_as_grpc_gateway_does() {
        let m = method("etcdserverpb.KV", "Range").unwrap();
        // Proto and JSON names, numbers as strings, an enum by name, an unknown field.
        let req = serde_json::json!({"key": "Zm9v", "range_end": "Zm9w", "limit": "5",
            "sortOrder": "DESCEND", "keys_only": true, "bogus": 1});
        let encoded = json_to_proto(&m.input(), req).unwrap();
        let back: serde_json::Value =
            serde_json::from_slice(&proto_to_json(&m.input(), &encoded).unwrap()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"key": "Zm9v", "range_end": "Zm9w", "limit": "5",
                "sort_order": "DESCEND", "keys_only": true})
        );
        // A wrong type is InvalidArgument.
        let e = json_to_proto(&m.input(), serde_json::json!({"key": 1})).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        // An empty body is the empty message; the first of two values is read.
        assert!(first_json(b"  ").unwrap().is_null());
        assert_eq!(
            first_json(br#"{"a":1}{"b":2}"#).unwrap(),
            serde_json::json!({"a": 1})
        );
    }

    #[test]
    fn frames_round_trip_in_pieces() {
        let mut d = Deframer::default();
        let f = [frame(b"hello"), frame(b""), frame(b"world")].concat();
        let mut got = Vec::new();
        for chunk in f.chunks(3) {
            d.push(chunk);
            while let Some(m) = d.next_message().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![&b"hello"[..], b"", b"world"]);
        assert!(d.is_empty());
    }
}
