//! One gateway request: its JSON as the gRPC request, a call to the gRPC service itself (the
//! same [`Routes`] the gRPC port serves, so the same handlers, token check, limits and
//! errors), and the gRPC answer as JSON.
//!
//! * **Unary** RPCs read the whole body (at most [`MAX_JSON_BODY`]), decode its first JSON
//!   value and answer the one message as a JSON object, or the error.
//! * **Streamed answers** (`watch`, `lease/keepalive`, `election/observe`,
//!   `maintenance/snapshot`) are newline-delimited `{"result": …}` objects on a chunked
//!   response, as grpc-gateway writes them; an error ends the stream with grpc-gateway's
//!   error chunk (and is the whole answer, with its HTTP status, if it came first).
//! * **Streamed requests** (`watch`, `lease/keepalive`): the body is a sequence of JSON
//!   objects, each sent as it arrives. A first one that does not decode is answered 500
//!   (`code` 2) before anything is called, as etcd's gateway does; the end of the body, or
//!   a later object that does not decode, closes the call's request side, as grpc-gateway
//!   does. What follows is the service's: a keep-alive stream answers what it was sent and
//!   ends; a watch goes on until the client goes away (`curl -d '{"create_request":…}'`
//!   keeps watching, as on etcd).

use std::sync::Arc;

use axum::body::Body as AxumBody;
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use prost::bytes::Bytes;
use prost_reflect::MethodDescriptor;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body as GrpcBody;
use tonic::service::Routes;
use tonic::Status;
use tower_service::Service;

use super::codec::{self, Deframer};
use super::error;
use crate::metrics::grpc::GrpcMetrics;

/// The most JSON a request body may hold: room for the largest etcd message
/// ([`crate::api::etcd::MAX_ETCD_MESSAGE`]) as base64 in JSON.
pub const MAX_JSON_BODY: usize = 3 * crate::api::etcd::MAX_ETCD_MESSAGE;

/// What a route calls.
pub struct Target {
    /// The gRPC routes inside the client API's metrics: a gateway call counts as the gRPC
    /// method it is (`fenced_grpc_requests_total{method="etcd.KV.Range"}`).
    pub grpc: GrpcMetrics<Routes>,
    /// `/<package.Service>/<Method>`.
    pub uri: http::Uri,
    pub method: MethodDescriptor,
}

/// Answer one request to a route of `target`.
pub async fn handle(target: Arc<Target>, req: axum::extract::Request) -> Response {
    match *req.method() {
        Method::POST => {}
        // etcd's gateway answers a CORS preflight with its headers and nothing else.
        Method::OPTIONS => return error::text_response(StatusCode::OK, ""),
        _ => return error::text_response(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n"),
    }
    let (mut parts, body) = req.into_parts();
    super::normalize_token(&mut parts.headers);
    let outcome = if target.method.is_client_streaming() {
        streamed_request(&target, &parts, body).await
    } else {
        unary_request(&target, &parts, body).await
    };
    match outcome {
        Ok(r) => r,
        Err(status) => error::response(&status),
    }
}

async fn unary_request(
    target: &Target,
    parts: &http::request::Parts,
    body: AxumBody,
) -> Result<Response, Status> {
    let body = Limited::new(body, MAX_JSON_BODY)
        .collect()
        .await
        .map_err(body_error)?
        .to_bytes();
    let message = codec::json_to_proto(&target.method.input(), codec::first_json(&body)?)?;
    let inner = GrpcBody::new(Full::new(codec::frame(&message)));
    let resp = call(target, parts, inner).await;
    if target.method.is_server_streaming() {
        Ok(streamed_answer(target, resp).await)
    } else {
        unary_answer(target, resp).await
    }
}

async fn streamed_request(
    target: &Target,
    parts: &http::request::Parts,
    body: AxumBody,
) -> Result<Response, Status> {
    let input = target.method.input();
    let mut reader = JsonReader {
        body,
        buf: Vec::new(),
    };
    // etcd's gateway decodes the first message before calling, and answers one that does
    // not decode with 500 and code 2 (UNKNOWN).
    let first = match reader.next().await {
        Ok(Some(v)) => {
            Some(codec::json_to_proto(&input, v).map_err(|s| Status::unknown(s.message()))?)
        }
        Ok(None) => None,
        Err(ReadError::Json(e)) => return Err(Status::unknown(e.to_string())),
        Err(ReadError::Body(s)) => return Err(s),
    };
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Status>>(16);
    if let Some(m) = first {
        // The channel is new and has room.
        let _ = tx.try_send(Ok(Frame::data(codec::frame(&m))));
    }
    tokio::spawn(forward_requests(reader, input, tx));
    let inner = GrpcBody::new(StreamBody::new(ReceiverStream::new(rx)));
    let resp = call(target, parts, inner).await;
    Ok(streamed_answer(target, resp).await)
}

/// Send the rest of a streamed request's JSON objects to the call; dropping `tx` at the end
/// closes the call's request side.
async fn forward_requests(
    mut reader: JsonReader,
    input: prost_reflect::MessageDescriptor,
    tx: mpsc::Sender<Result<Frame<Bytes>, Status>>,
) {
    loop {
        let next = tokio::select! {
            n = reader.next() => n,
            () = tx.closed() => return,
        };
        let frame = match next {
            Ok(Some(v)) => match codec::json_to_proto(&input, v) {
                Ok(m) => Ok(Frame::data(codec::frame(&m))),
                Err(e) => {
                    tracing::debug!("gateway: a streamed request object does not decode: {e}");
                    return;
                }
            },
            Ok(None) => return,
            Err(ReadError::Json(e)) => {
                tracing::debug!("gateway: a streamed request is not JSON: {e}");
                return;
            }
            // The limits before login, or the connection failed: the call sees it as a
            // gRPC call would.
            Err(ReadError::Body(s)) => Err(s),
        };
        let failed = frame.is_err();
        if tx.send(frame).await.is_err() || failed {
            return;
        }
    }
}

/// The gRPC request for `target`, with the HTTP request's credentials and connection
/// information (peer address, TLS certificates), called on the gRPC routes.
async fn call(
    target: &Target,
    parts: &http::request::Parts,
    body: GrpcBody,
) -> http::Response<GrpcBody> {
    let mut req = http::Request::new(body);
    *req.method_mut() = Method::POST;
    *req.uri_mut() = target.uri.clone();
    *req.version_mut() = http::Version::HTTP_2;
    *req.extensions_mut() = parts.extensions.clone();
    let h = req.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    h.insert(http::header::TE, HeaderValue::from_static("trailers"));
    copy_credentials(&parts.headers, h);
    let mut grpc = target.grpc.clone();
    // The router is always ready (axum's); its error type is Infallible.
    match std::future::poll_fn(|cx| Service::<http::Request<GrpcBody>>::poll_ready(&mut grpc, cx))
        .await
    {
        Ok(()) => {}
        Err(never) => match never {},
    }
    match grpc.call(req).await {
        Ok(r) => r.map(GrpcBody::new),
        Err(never) => match never {},
    }
}

fn copy_credentials(from: &HeaderMap, to: &mut HeaderMap) {
    for name in [crate::users::AUTHORIZATION, crate::users::ETCD_TOKEN] {
        if let Some(v) = from.get(name) {
            to.insert(name, v.clone());
        }
    }
}

/// A unary call's answer as JSON, or its error.
async fn unary_answer(target: &Target, resp: http::Response<GrpcBody>) -> Result<Response, Status> {
    let mut answer = Answer::new(resp);
    let mut message = None;
    loop {
        match answer.next().await {
            Next::Message(m) => {
                if message.replace(m).is_some() {
                    return Err(Status::internal("gateway: two answers to a unary call"));
                }
            }
            Next::End(s) if s.code() == tonic::Code::Ok => break,
            Next::End(s) => return Err(s),
        }
    }
    let Some(message) = message else {
        return Err(Status::internal("gateway: no answer to a unary call"));
    };
    let json = codec::proto_to_json(&target.method.output(), &message)?;
    Ok(error::json_response(StatusCode::OK, json))
}

/// A streamed answer: waits for its first message (or its end) so that an error that came
/// first is the answer's status, then streams the rest from a task of its own, which ends
/// (dropping the call) when the client goes away.
async fn streamed_answer(target: &Target, resp: http::Response<GrpcBody>) -> Response {
    let output = target.method.output();
    let mut answer = Answer::new(resp);
    let first = match answer.next().await {
        Next::End(s) if s.code() == tonic::Code::Ok => {
            return error::json_response(StatusCode::OK, Vec::new())
        }
        Next::End(s) => {
            return error::json_response(error::http_status(s.code()), error::stream_chunk(&s))
        }
        Next::Message(m) => m,
    };
    let first = match codec::stream_result(&output, &first) {
        Ok(line) => line,
        Err(s) => {
            return error::json_response(error::http_status(s.code()), error::stream_chunk(&s))
        }
    };
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    tokio::spawn(async move {
        if tx.send(Ok(Bytes::from(first))).await.is_err() {
            return;
        }
        loop {
            let next = tokio::select! {
                n = answer.next() => n,
                () = tx.closed() => return,
            };
            let line = match next {
                Next::Message(m) => match codec::stream_result(&output, &m) {
                    Ok(line) => line,
                    Err(s) => error::stream_chunk(&s),
                },
                Next::End(s) if s.code() == tonic::Code::Ok => return,
                Next::End(s) => error::stream_chunk(&s),
            };
            let end = line.starts_with(b"{\"error\"");
            if tx.send(Ok(Bytes::from(line))).await.is_err() || end {
                return;
            }
        }
    });
    let mut r = Response::new(AxumBody::from_stream(ReceiverStream::new(rx)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    error::cors(r.headers_mut());
    r
}

enum Next {
    Message(Bytes),
    End(Status),
}

/// A gRPC answer read message by message.
struct Answer {
    body: GrpcBody,
    deframer: Deframer,
    /// A trailers-only answer's status (in its headers).
    ended: Option<Status>,
}

impl Answer {
    fn new(resp: http::Response<GrpcBody>) -> Answer {
        let (parts, body) = resp.into_parts();
        Answer {
            body,
            deframer: Deframer::default(),
            ended: Status::from_header_map(&parts.headers),
        }
    }

    async fn next(&mut self) -> Next {
        if let Some(s) = self.ended.take() {
            return Next::End(s);
        }
        loop {
            match self.deframer.next_message() {
                Ok(Some(m)) => return Next::Message(m),
                Ok(None) => {}
                Err(s) => return Next::End(s),
            }
            match self.body.frame().await {
                None => {
                    return Next::End(Status::unknown(
                        "gateway: the answer ended without a gRPC status",
                    ))
                }
                Some(Err(s)) => return Next::End(s),
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => self.deframer.push(&data),
                    Err(frame) => {
                        let status = frame
                            .trailers_ref()
                            .and_then(Status::from_header_map)
                            .unwrap_or_else(|| {
                                Status::unknown("gateway: the answer's trailers have no status")
                            });
                        return Next::End(status);
                    }
                },
            }
        }
    }
}

enum ReadError {
    Json(serde_json::Error),
    Body(Status),
}

/// JSON values read one by one off a request body as it arrives.
struct JsonReader {
    body: AxumBody,
    buf: Vec<u8>,
}

impl JsonReader {
    /// The next whole value; `None` at the end of the body.
    async fn next(&mut self) -> Result<Option<serde_json::Value>, ReadError> {
        loop {
            let start = self
                .buf
                .iter()
                .position(|b| !b.is_ascii_whitespace())
                .unwrap_or(self.buf.len());
            self.buf.drain(..start);
            if !self.buf.is_empty() {
                let mut values = serde_json::Deserializer::from_slice(&self.buf)
                    .into_iter::<serde_json::Value>();
                match values.next() {
                    Some(Ok(v)) => {
                        let used = values.byte_offset();
                        self.buf.drain(..used);
                        return Ok(Some(v));
                    }
                    Some(Err(e)) if !e.is_eof() => return Err(ReadError::Json(e)),
                    _ => {}
                }
            }
            if self.buf.len() > MAX_JSON_BODY {
                return Err(ReadError::Body(too_large()));
            }
            match self.body.frame().await {
                None if self.buf.is_empty() => return Ok(None),
                None => {
                    let e = serde_json::from_slice::<serde_json::Value>(&self.buf)
                        .err()
                        .map_or_else(
                            || Status::unknown("unexpected EOF"),
                            |e| Status::unknown(e.to_string()),
                        );
                    self.buf.clear();
                    return Err(ReadError::Body(e));
                }
                Some(Err(e)) => return Err(ReadError::Body(body_error(e.into()))),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

fn too_large() -> Status {
    Status::resource_exhausted(format!(
        "gateway: a request body may hold at most {MAX_JSON_BODY} bytes of JSON"
    ))
}

/// The status a request body's error stands for: the limits before login's own
/// ([`crate::pre_auth`]), the gateway's size limit, or a failed connection.
fn body_error(e: axum::BoxError) -> Status {
    if e.is::<http_body_util::LengthLimitError>() {
        return too_large();
    }
    let e = match e.downcast::<axum::Error>() {
        Ok(axum_error) => axum_error.into_inner(),
        Err(e) => e,
    };
    match e.downcast::<Status>() {
        Ok(s) => *s,
        Err(e) => Status::cancelled(format!("reading the request: {e}")),
    }
}
