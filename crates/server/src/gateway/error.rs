//! How the gateway answers an error: grpc-gateway's HTTP status for the gRPC code and its
//! body `{"error": <message>, "code": <gRPC code>, "message": <message>}`, with the call's
//! own message (etcd's texts, the same a gRPC client gets).

use axum::body::Body;
use axum::response::Response;
use http::{HeaderValue, StatusCode};
use tonic::{Code, Status};

/// grpc-gateway's `HTTPStatusFromCode` (v1.16, the line etcd 3.5 uses).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        // Deliberately not 412 (grpc-gateway's comment: a different meaning in HTTP).
        Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::Aborted => StatusCode::CONFLICT,
        Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The error body of a unary answer (and of a streamed one that failed before its first
/// message).
pub fn body(status: &Status) -> Vec<u8> {
    // Written by hand to keep grpc-gateway's field order (serde_json's maps sort keys).
    let m = json_string(status.message());
    format!(
        r#"{{"error":{m},"code":{},"message":{m}}}"#,
        status.code() as i32
    )
    .into_bytes()
}

/// The error object a streamed answer ends with, after messages were sent (or alone, as
/// the whole answer, when the call failed first): grpc-gateway's stream error chunk.
pub fn stream_chunk(status: &Status) -> Vec<u8> {
    let http = http_status(status.code());
    format!(
        r#"{{"error":{{"grpc_code":{},"http_code":{},"message":{},"http_status":{}}}}}"#,
        status.code() as i32,
        http.as_u16(),
        json_string(status.message()),
        json_string(http.canonical_reason().unwrap_or("")),
    )
    .into_bytes()
    .into_iter()
    .chain(*b"\n")
    .collect()
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// The whole error response for `status`.
pub fn response(status: &Status) -> Response {
    json_response(http_status(status.code()), body(status))
}

/// A JSON response with etcd's gateway headers.
pub fn json_response(code: StatusCode, body: Vec<u8>) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    cors(r.headers_mut());
    r
}

/// A plain-text response (Go's `http.Error`), with etcd's gateway headers.
pub fn text_response(code: StatusCode, text: &'static str) -> Response {
    let mut r = Response::new(Body::from(text));
    *r.status_mut() = code;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    cors(r.headers_mut());
    r
}

/// The CORS headers etcd's gateway puts on every answer.
pub fn cors(h: &mut http::HeaderMap) {
    h.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, GET, OPTIONS, PUT, DELETE"),
    );
    h.insert(
        "access-control-allow-headers",
        HeaderValue::from_static("accept, content-type, authorization"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_etcds_shape_and_status() {
        let s = Status::out_of_range("etcdserver: mvcc: required revision is a future revision");
        assert_eq!(http_status(s.code()), StatusCode::BAD_REQUEST);
        let raw = String::from_utf8(body(&s)).unwrap();
        assert!(raw.starts_with(r#"{"error":"etcdserver: mvcc"#), "{raw}");
        let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(v["code"], 11);
        assert_eq!(v["error"], v["message"]);
        assert_eq!(v["error"], s.message());
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status(Code::NotFound), StatusCode::NOT_FOUND);
    }
}
