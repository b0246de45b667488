//! `fenced.v1.Auth`: a user's password for a token ([`crate::users`]).

use fenced_proto::v1 as pb;
use tonic::Request;

use fenced_proto::v1::auth_server::Auth;

use super::{Api, Reply};

#[tonic::async_trait]
impl Auth for Api {
    async fn authenticate(
        &self,
        req: Request<pb::AuthenticateRequest>,
    ) -> Reply<pb::AuthenticateResponse> {
        let r = req.into_inner();
        let token = self.users.authenticate(&r.user, &r.password)?;
        Ok(tonic::Response::new(pb::AuthenticateResponse {
            token,
            ttl_ms: self.users.ttl().as_millis() as u64,
        }))
    }
}
