//! `etcdserverpb.Auth`: `Authenticate` logs an etcd client in as one of fenced's users
//! (`etcdctl --user NAME:PASSWORD`, the same users and passwords as RESP's `AUTH` and
//! `fenced.v1.Auth`), and `AuthStatus` says whether users are on. The token goes back as the
//! `token` metadata, which [`Users::caller`](crate::users::Users::caller) accepts. Users,
//! roles and their permissions are not managed through etcd's API: they live in
//! `--acl-file` (docs/operations.md, "Users and permissions"); those calls answer
//! `UNIMPLEMENTED`.

use fenced_proto::etcd::etcdserverpb as epb;
use tonic::{Request, Status};

use epb::auth_server::Auth;

use super::{EtcdApi, Reply};

fn managed_in_acl_file(call: &str) -> Status {
    Status::unimplemented(format!(
        "fenced does not serve etcd's Auth.{call}: users and their permissions are fenced's \
         --acl-file (Redis ACL rules; docs/operations.md, \"Users and permissions\")"
    ))
}

#[tonic::async_trait]
impl Auth for EtcdApi {
    async fn authenticate(
        &self,
        req: Request<epb::AuthenticateRequest>,
    ) -> Reply<epb::AuthenticateResponse> {
        let r = req.into_inner();
        let token = self.users.authenticate(&r.name, &r.password)?;
        Ok(tonic::Response::new(epb::AuthenticateResponse {
            header: self.header_now(),
            token,
        }))
    }

    /// Enabled when a call without a token does not run as an open `default` user.
    async fn auth_status(
        &self,
        _req: Request<epb::AuthStatusRequest>,
    ) -> Reply<epb::AuthStatusResponse> {
        Ok(tonic::Response::new(epb::AuthStatusResponse {
            header: self.header_now(),
            enabled: !self.users.open(),
            auth_revision: 0,
        }))
    }

    async fn auth_enable(
        &self,
        _req: Request<epb::AuthEnableRequest>,
    ) -> Reply<epb::AuthEnableResponse> {
        Err(managed_in_acl_file("AuthEnable"))
    }

    async fn auth_disable(
        &self,
        _req: Request<epb::AuthDisableRequest>,
    ) -> Reply<epb::AuthDisableResponse> {
        Err(managed_in_acl_file("AuthDisable"))
    }

    async fn user_add(
        &self,
        _req: Request<epb::AuthUserAddRequest>,
    ) -> Reply<epb::AuthUserAddResponse> {
        Err(managed_in_acl_file("UserAdd"))
    }

    async fn user_get(
        &self,
        _req: Request<epb::AuthUserGetRequest>,
    ) -> Reply<epb::AuthUserGetResponse> {
        Err(managed_in_acl_file("UserGet"))
    }

    async fn user_list(
        &self,
        _req: Request<epb::AuthUserListRequest>,
    ) -> Reply<epb::AuthUserListResponse> {
        Err(managed_in_acl_file("UserList"))
    }

    async fn user_delete(
        &self,
        _req: Request<epb::AuthUserDeleteRequest>,
    ) -> Reply<epb::AuthUserDeleteResponse> {
        Err(managed_in_acl_file("UserDelete"))
    }

    async fn user_change_password(
        &self,
        _req: Request<epb::AuthUserChangePasswordRequest>,
    ) -> Reply<epb::AuthUserChangePasswordResponse> {
        Err(managed_in_acl_file("UserChangePassword"))
    }

    async fn user_grant_role(
        &self,
        _req: Request<epb::AuthUserGrantRoleRequest>,
    ) -> Reply<epb::AuthUserGrantRoleResponse> {
        Err(managed_in_acl_file("UserGrantRole"))
    }

    async fn user_revoke_role(
        &self,
        _req: Request<epb::AuthUserRevokeRoleRequest>,
    ) -> Reply<epb::AuthUserRevokeRoleResponse> {
        Err(managed_in_acl_file("UserRevokeRole"))
    }

    async fn role_add(
        &self,
        _req: Request<epb::AuthRoleAddRequest>,
    ) -> Reply<epb::AuthRoleAddResponse> {
        Err(managed_in_acl_file("RoleAdd"))
    }

    async fn role_get(
        &self,
        _req: Request<epb::AuthRoleGetRequest>,
    ) -> Reply<epb::AuthRoleGetResponse> {
        Err(managed_in_acl_file("RoleGet"))
    }

    async fn role_list(
        &self,
        _req: Request<epb::AuthRoleListRequest>,
    ) -> Reply<epb::AuthRoleListResponse> {
        Err(managed_in_acl_file("RoleList"))
    }

    async fn role_delete(
        &self,
        _req: Request<epb::AuthRoleDeleteRequest>,
    ) -> Reply<epb::AuthRoleDeleteResponse> {
        Err(managed_in_acl_file("RoleDelete"))
    }

    async fn role_grant_permission(
        &self,
        _req: Request<epb::AuthRoleGrantPermissionRequest>,
    ) -> Reply<epb::AuthRoleGrantPermissionResponse> {
        Err(managed_in_acl_file("RoleGrantPermission"))
    }

    async fn role_revoke_permission(
        &self,
        _req: Request<epb::AuthRoleRevokePermissionRequest>,
    ) -> Reply<epb::AuthRoleRevokePermissionResponse> {
        Err(managed_in_acl_file("RoleRevokePermission"))
    }
}
