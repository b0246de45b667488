//! Who calls the gRPC client API, and what they may do: the users of `--acl-file` /
//! `--requirepass` (the very users RESP's `AUTH` checks), on the gRPC port too.
//!
//! * **Authentication: password → token.** `fenced.v1.Auth/Authenticate {user, password}`
//!   returns an opaque random token (32 bytes from the OS, hex); later calls send it as the
//!   metadata header `authorization: Bearer <token>`. Tokens live in this node's memory
//!   only (as SHA-256 digests), for [`Users::ttl`] from when they were issued (default 5
//!   minutes, `--auth-token-ttl-ms`): a client authenticates on every node it calls, and
//!   again after a token expired or the node restarted (it gets `UNAUTHENTICATED`). The
//!   Rust client does all of that by itself.
//! * **No token**: the call runs as the `default` user if it is `on` and `nopass` — which,
//!   without an ACL file and without `--requirepass`, is `nopass ~* &* +@all`: a cluster
//!   without users stays open exactly as before. Otherwise `UNAUTHENTICATED`.
//! * **Permissions**: every call names the command of the core command table it stands for
//!   and the keys or lock names it touches, and [`Users::permit`] asks
//!   [`fenced_resp::acl::User::permit`] — the same function RESP's commands go through — so
//!   `~lock:a*` limits lock names over gRPC exactly as it limits keys (and `LOCK.*`) over
//!   RESP. The table is in docs/operations.md ("Users and permissions").
//! * **Administration**: membership changes and force-unlock call [`Users::require_admin`]:
//!   the caller must be an administrator, a user allowed `ACL` and `CONFIG` (`+@admin` or
//!   `+@all`; [`fenced_resp::acl::User::is_admin`]). Every new administrative RPC (snapshot, leader step-down, …) calls it first.
//! * `Cluster.Status`, the gRPC health service and `Auth.Authenticate` need no token (like
//!   etcd's `Status`); the node-to-node services are guarded by TLS client certificates, not
//!   by users.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fenced_resp::acl::{Acl, Denied, User};
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::time::Instant;
use tonic::{Request, Status};

/// The metadata header that carries a token: `authorization: Bearer <token>`.
pub const AUTHORIZATION: &str = "authorization";

/// The metadata key etcd clients send their token in (bare, no `Bearer`).
pub const ETCD_TOKEN: &str = "token";

/// Default `--auth-token-ttl-ms` (etcd's `--auth-token-ttl` default, 300 s).
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(300);

/// At most this many live tokens per node; past it (after dropping the expired ones)
/// `Authenticate` answers `RESOURCE_EXHAUSTED` instead of growing without bound.
const MAX_TOKENS: usize = 100_000;

/// Redis's `WRONGPASS` text, without its prefix.
const WRONGPASS: &str = "invalid username-password pair or user is disabled";

struct Issued {
    user: Arc<User>,
    expires: Instant,
}

/// The users of a node and the tokens it issued.
pub struct Users {
    acl: Arc<Acl>,
    /// Who a call without a token runs as: `default` if it is `on` and `nopass`.
    anonymous: Option<Arc<User>>,
    ttl: Duration,
    /// By SHA-256 of the token.
    tokens: Mutex<HashMap<[u8; 32], Issued>>,
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Users {
    pub fn new(acl: Arc<Acl>, ttl: Duration) -> Users {
        Users {
            anonymous: acl.initial_user(),
            acl,
            ttl,
            tokens: Mutex::new(HashMap::new()),
        }
    }

    /// How long a token is valid after `Authenticate`.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Issued>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Auth.Authenticate`: a new token for `user` (empty: `default`) if `password` is one
    /// of its passwords (or it is `nopass`) and it is `on`. A refusal changes nothing.
    pub fn authenticate(&self, user: &str, password: &str) -> Result<String, Status> {
        let name = if user.is_empty() { "default" } else { user };
        let Some(u) = self.acl.authenticate(name.as_bytes(), password.as_bytes()) else {
            return Err(Status::unauthenticated(WRONGPASS));
        };
        // A secret: drawn from the OS, never through the node's seedable generator
        // (`fenced_raft_types::rng`), whatever a simulator seeds.
        let mut raw = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut raw);
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut tokens = self.tokens();
        if tokens.len() >= MAX_TOKENS {
            tokens.retain(|_, t| t.expires > now);
            if tokens.len() >= MAX_TOKENS {
                return Err(Status::resource_exhausted(format!(
                    "this node holds {MAX_TOKENS} live tokens; retry after some expire"
                )));
            }
        }
        tokens.insert(
            digest(&token),
            Issued {
                user: u,
                expires: now + self.ttl,
            },
        );
        Ok(token)
    }

    /// The user a call runs as: its token's, or without one the anonymous `default` user
    /// (see the module docs). `UNAUTHENTICATED` otherwise.
    ///
    /// etcd clients send their token (from `etcdserverpb.Auth/Authenticate`) as the bare
    /// `token` metadata ([`ETCD_TOKEN`]); it is looked up the same way, and an unknown or
    /// expired one is etcd's "invalid auth token".
    pub fn caller<T>(&self, req: &Request<T>) -> Result<Arc<User>, Status> {
        self.caller_of(req.metadata().as_ref(), true)
    }

    /// Whether a call's headers name a caller ([`Users::caller`] would succeed), read
    /// before its body is ([`crate::pre_auth`]); an expired token is left for the handler
    /// to report.
    pub fn has_caller(&self, headers: &http::HeaderMap) -> bool {
        self.caller_of(headers, false).is_ok()
    }

    /// [`Users::caller`] of a call's headers; `forget` drops an expired token found.
    fn caller_of(&self, headers: &http::HeaderMap, forget: bool) -> Result<Arc<User>, Status> {
        if headers.get(AUTHORIZATION).is_none() {
            if let Some(value) = headers.get(ETCD_TOKEN) {
                let token = value
                    .to_str()
                    .map_err(|_| Status::unauthenticated("etcdserver: invalid auth token"))?;
                // etcd's text, on which etcd clients log in again and retry: a token of
                // another node (or of this one before a restart) is unknown here.
                return self
                    .user_of(token.trim(), forget)
                    .map_err(|_| Status::unauthenticated("etcdserver: invalid auth token"));
            }
        }
        let Some(value) = headers.get(AUTHORIZATION) else {
            return self.anonymous.clone().ok_or_else(|| {
                Status::unauthenticated(
                    "authentication required: this node has users (--acl-file or \
                     --requirepass); call fenced.v1.Auth/Authenticate with a user and \
                     password and send the token as the 'authorization: Bearer <token>' \
                     header",
                )
            });
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| {
                Status::unauthenticated(
                    "malformed 'authorization' header: expected 'Bearer <token>'",
                )
            })?;
        self.user_of(token, forget)
    }

    /// Whether a call without a token runs as a `default` user (open, or with limits).
    pub fn open(&self) -> bool {
        self.anonymous.is_some()
    }

    /// The user of a token this node issued, if it has not expired.
    fn user_of(&self, token: &str, forget: bool) -> Result<Arc<User>, Status> {
        let now = Instant::now();
        let mut tokens = self.tokens();
        let key = digest(token);
        match tokens.get(&key) {
            Some(t) if t.expires > now => Ok(t.user.clone()),
            Some(_) => {
                if forget {
                    tokens.remove(&key);
                }
                Err(Status::unauthenticated(
                    "the token has expired: authenticate again (fenced.v1.Auth/Authenticate)",
                ))
            }
            None => Err(Status::unauthenticated(
                "unknown token: authenticate again (tokens are kept in memory by the node \
                 that issued them: another node, or this one before a restart, does not \
                 know it)",
            )),
        }
    }

    /// **The** permission check of a gRPC call: its caller ([`Users::caller`]) may run
    /// `command` (the core command table's name of what the call does, e.g. `LOCK.ACQUIRE`)
    /// on `keys` (its lock names or keys) — [`User::permit`], the same check as RESP's.
    /// `PERMISSION_DENIED` names the user, the command and the key.
    pub fn permit<T>(
        &self,
        req: &Request<T>,
        command: &str,
        keys: &[&[u8]],
    ) -> Result<Arc<User>, Status> {
        let user = self.caller(req)?;
        user.permit(command, keys).map_err(denied)?;
        Ok(user)
    }

    /// **The** check of every administrative call (membership changes, force-unlock,
    /// snapshots, leader step-down, …): its caller must be an administrator, a user allowed
    /// every command of `@admin` (`+@admin` or `+@all`; [`User::is_admin`]). `call` names
    /// the call in the refusal, e.g. `"Cluster.MemberAdd"`. Call it first in the handler:
    ///
    /// ```ignore
    /// let _admin = self.users.require_admin(&req, "Cluster.SnapshotSave")?;
    /// ```
    ///
    /// `UNAUTHENTICATED` without a valid token (and no open `default` user),
    /// `PERMISSION_DENIED` naming the user and the call when it is not an administrator.
    pub fn require_admin<T>(&self, req: &Request<T>, call: &str) -> Result<Arc<User>, Status> {
        let user = self.caller(req)?;
        user.require_admin(call).map_err(denied)?;
        Ok(user)
    }
}

/// A refusal as gRPC's `PERMISSION_DENIED`.
pub fn denied(d: Denied) -> Status {
    Status::permission_denied(d.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    const FILE: &str = "\
user default off
user alice on >alicepw ~lock:a* -@all +@fencing +@string +@connection
user admin on >adminpw +@all ~*
";

    fn users(ttl: Duration) -> Users {
        let acl = Acl::parse(FILE, "users.acl", None).unwrap_or_else(|e| panic!("{e}"));
        Users::new(Arc::new(acl), ttl)
    }

    fn with_token(token: &str) -> Request<()> {
        let mut r = Request::new(());
        let v = format!("Bearer {token}")
            .parse()
            .unwrap_or_else(|e| panic!("{e}"));
        r.metadata_mut().insert(AUTHORIZATION, v);
        r
    }

    fn login(u: &Users, user: &str, pass: &str) -> String {
        u.authenticate(user, pass)
            .unwrap_or_else(|e| panic!("{user}: {e}"))
    }

    #[test]
    fn tokens_name_their_user_and_bad_passwords_get_nothing() {
        let u = users(DEFAULT_TOKEN_TTL);
        for (user, pass) in [("alice", "nope"), ("nobody", "x"), ("", "alicepw")] {
            let e = u.authenticate(user, pass).err().map(|s| s.code());
            assert_eq!(e, Some(Code::Unauthenticated), "{user}");
        }
        assert!(u.tokens().is_empty(), "a refusal issued no token");
        let t = login(&u, "alice", "alicepw");
        assert_eq!(t.len(), 64);
        let req = with_token(&t);
        assert_eq!(
            u.caller(&req).map(|x| x.name().to_owned()).ok(),
            Some("alice".into())
        );
        assert!(u.permit(&req, "LOCK.ACQUIRE", &[b"lock:a1"]).is_ok());
        let s = u
            .permit(&req, "LOCK.ACQUIRE", &[b"lock:b"])
            .err()
            .unwrap_or_else(|| Status::ok(""));
        assert_eq!(s.code(), Code::PermissionDenied);
        assert!(
            s.message().contains("alice") && s.message().contains("lock:b"),
            "{s:?}"
        );
        let s = u
            .require_admin(&req, "Cluster.MemberAdd")
            .err()
            .unwrap_or_else(|| Status::ok(""));
        assert_eq!(s.code(), Code::PermissionDenied);
        assert!(s.message().contains("Cluster.MemberAdd"), "{s:?}");
        let admin = with_token(&login(&u, "admin", "adminpw"));
        assert!(u.require_admin(&admin, "Cluster.MemberAdd").is_ok());
    }

    #[test]
    fn without_a_valid_token_calls_are_unauthenticated() {
        let u = users(DEFAULT_TOKEN_TTL);
        let anon = Request::new(());
        for r in [&anon, &with_token("feedbeef")] {
            let s = u.caller(r).err().unwrap_or_else(|| Status::ok(""));
            assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
        }
        let mut bad = Request::new(());
        bad.metadata_mut().insert(
            AUTHORIZATION,
            "Basic abc".parse().unwrap_or_else(|e| panic!("{e}")),
        );
        assert_eq!(
            u.caller(&bad).err().map(|s| s.code()),
            Some(Code::Unauthenticated)
        );
        // Expired tokens are refused (and forgotten).
        let short = users(Duration::ZERO);
        let t = login(&short, "alice", "alicepw");
        let s = short
            .caller(&with_token(&t))
            .err()
            .unwrap_or_else(|| Status::ok(""));
        assert_eq!(s.code(), Code::Unauthenticated);
        assert!(s.message().contains("expired"), "{s:?}");
        assert!(short.tokens().is_empty());
    }

    #[test]
    fn without_users_everything_stays_open() {
        for pass in [None, Some("pw")] {
            let u = Users::new(Arc::new(Acl::new(pass)), DEFAULT_TOKEN_TTL);
            let anon = Request::new(());
            let open = u.require_admin(&anon, "Cluster.MemberAdd");
            // Only --requirepass closes the port (its default user has a password).
            assert_eq!(open.is_ok(), pass.is_none(), "{pass:?}");
            if let Some(p) = pass {
                let t = login(&u, "", p);
                assert!(u.require_admin(&with_token(&t), "x").is_ok());
                assert!(u.permit(&with_token(&t), "LOCK.ACQUIRE", &[b"any"]).is_ok());
            } else {
                assert!(u.permit(&anon, "LOCK.ACQUIRE", &[b"any"]).is_ok());
            }
        }
    }
}
