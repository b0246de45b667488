//! etcd's JSON gateway on the client port: the grpc-gateway API etcd 3.5 serves beside gRPC
//! (`POST /v3/kv/range` with `{"key": "Zm9v"}` …), for clients that never speak gRPC
//! (`curl`, `etcd3gw`, HA managers), and etcd's `GET /version` and `GET /health`.
//!
//! * [`routes`]: every etcd v3 RPC at its grpc-gateway path, under `/v3` and `/v3beta`.
//! * [`codec`]: JSON to and from the messages, generically by their descriptors
//!   (prost-reflect), with grpc-gateway's conventions.
//! * [`call`]: a request is made the gRPC call and **sent to the gRPC services themselves**
//!   (the same router the gRPC clients reach), so the handlers, permissions, limits and
//!   error texts are the gRPC API's; the answer is read back as JSON.
//! * [`error`]: errors as `{"error", "code", "message"}` with grpc-gateway's HTTP statuses.
//! * [`endpoints`]: `/version` and `/health`.
//!
//! **Credentials.** Gateway clients send the token `Auth/Authenticate` gave them in the
//! `Authorization` header, bare (etcd's gateway passes it on as the `token` metadata) or as
//! `Bearer <token>`; [`normalize_token`] makes the bare form the `token` header before the
//! limits before login ([`crate::pre_auth`]) look at the request, so a logged-in gateway
//! client is not held to an unauthenticated call's limits, and one without a token is.

pub mod call;
pub mod codec;
pub mod endpoints;
pub mod error;
pub mod routes;

use std::sync::Arc;

use axum::routing::{any, get};
use http::{HeaderMap, HeaderValue};
use tonic::service::Routes;
use tower_layer::Layer;

use crate::metrics::grpc::GrpcMetricsLayer;

use crate::node::Node;

/// The gateway's routes and `/version`, `/health`, calling the gRPC services in `grpc`
/// through the client API's metrics layer (`metrics`).
pub fn router(grpc: Routes, metrics: GrpcMetricsLayer, node: Node) -> axum::Router {
    let grpc = metrics.layer(grpc);
    let mut router = axum::Router::new();
    for r in routes::ROUTES {
        let Some(method) = codec::method(r.service, r.method) else {
            tracing::error!(
                "gateway: {}/{} is not in the descriptors; {} not served",
                r.service,
                r.method,
                r.path
            );
            continue;
        };
        let uri = match http::Uri::try_from(format!("/{}/{}", r.service, r.method)) {
            Ok(u) => u,
            Err(e) => {
                tracing::error!("gateway: {}: {e}", r.path);
                continue;
            }
        };
        let target = Arc::new(call::Target {
            grpc: grpc.clone(),
            uri,
            method,
        });
        for prefix in routes::PREFIXES {
            let target = target.clone();
            router = router.route(
                &format!("{prefix}{}", r.path),
                any(move |req: axum::extract::Request| call::handle(target, req)),
            );
        }
    }
    // A path under a prefix that no route has: grpc-gateway's own 404 (not Go's mux's).
    for prefix in routes::PREFIXES {
        router = router.route(
            &format!("{prefix}/{{*rest}}"),
            any(|| async { error::text_response(http::StatusCode::NOT_FOUND, "Not Found\n") }),
        );
    }
    let endpoints = axum::Router::new()
        .route("/version", get(endpoints::version))
        .route("/health", get(endpoints::health))
        // etcd serves its Prometheus families on the client port too (without a token, as
        // etcd does); the same text as the metrics port's.
        .route("/metrics", get(crate::metrics::metrics))
        .with_state(node);
    router.merge(endpoints)
}

/// Whether `path` is one the gateway serves (its JSON errors, not gRPC's, are the answer
/// there).
pub fn is_gateway_path(path: &str) -> bool {
    routes::PREFIXES.iter().any(|p| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// A bare `Authorization: <token>` (how etcd's gateway clients send it) as the `token`
/// header etcd's gRPC clients use; `Authorization: Bearer <token>` stays as it is.
pub fn normalize_token(headers: &mut HeaderMap) {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return;
    };
    let bearer = value
        .as_bytes()
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case(b"bearer "));
    if bearer {
        return;
    }
    let value: HeaderValue = value.clone();
    headers.remove(http::header::AUTHORIZATION);
    headers.insert(crate::users::ETCD_TOKEN, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_authorization_is_the_etcd_token() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("abc.def"));
        normalize_token(&mut h);
        assert_eq!(h.get("token").unwrap(), "abc.def");
        assert!(h.get("authorization").is_none());
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer xyz"));
        normalize_token(&mut h);
        assert_eq!(h.get("authorization").unwrap(), "Bearer xyz");
        assert!(h.get("token").is_none());
        assert!(is_gateway_path("/v3/kv/range"));
        assert!(is_gateway_path("/v3beta/watch"));
        assert!(!is_gateway_path("/v3alpha/kv/range"));
        assert!(!is_gateway_path("/v3x"));
        assert!(!is_gateway_path("/etcdserverpb.KV/Range"));
    }
}
