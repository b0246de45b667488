//! TLS for fenced, in one place (rustls with the *ring* provider).
//!
//! A node started with `--tls-cert`, `--tls-key` and `--tls-ca` ([`ServerTls`]):
//!
//! * serves **gRPC** (client API and node-to-node Raft on the same port) and **RESP** over TLS
//!   only — no plaintext listener is left;
//! * asks every client for a certificate. Ordinary API clients may go without one (unless
//!   `--tls-require-client-cert`); their certificates are checked against `--tls-client-ca`
//!   if given, else against `--tls-ca`. The node-to-node services (Raft and forwarding)
//!   refuse any caller whose certificate does not chain to `--tls-ca` ([`PeerCertCheck`]):
//!   holding a certificate of the node CA is what makes a caller a member. With a separate
//!   client CA, a client certificate therefore never passes for a node;
//! * presents its own certificate when it calls other nodes ([`ServerTls::peer_client`]) and
//!   verifies theirs against the same CA (by the address it dials: a node certificate must
//!   name every address peers and clients use for it, as DNS or IP subject-alt-names).
//!
//! Clients ([`ClientTls`]) trust a CA file, may present an identity, and may override the
//! name they verify.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

pub use tokio_rustls::server::TlsStream;
pub use tokio_rustls::TlsAcceptor;

/// Why TLS settings could not be loaded.
#[derive(thiserror::Error, Debug)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("{what} {path}: {reason}")]
    Pem {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// PEM text and where it came from (for error messages).
#[derive(Clone)]
struct Pem {
    bytes: Vec<u8>,
    origin: String,
}

/// Only the origin: a private key must not end up in a log through `{:?}`.
impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pem({})", self.origin)
    }
}

impl Pem {
    fn read(what: &'static str, path: &Path) -> Result<Pem, TlsError> {
        let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
            what,
            path: path.display().to_string(),
            source,
        })?;
        Ok(Pem {
            bytes,
            origin: path.display().to_string(),
        })
    }

    fn certs(&self, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bad = |reason: String| TlsError::Pem {
            what,
            path: self.origin.clone(),
            reason,
        };
        let certs = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(bad("holds no PEM certificate".into()));
        }
        Ok(certs)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.bytes).map_err(|e| TlsError::Pem {
            what: "key",
            path: self.origin.clone(),
            reason: format!("no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(ca: &Pem) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    add_roots(&mut roots, ca, "CA")?;
    Ok(roots)
}

/// Adds every certificate of `pem` (`what`, for errors) to `roots` as a trust anchor.
fn add_roots(
    roots: &mut rustls::RootCertStore,
    pem: &Pem,
    what: &'static str,
) -> Result<(), TlsError> {
    for c in pem.certs(what)? {
        roots.add(c).map_err(|e| TlsError::Pem {
            what,
            path: pem.origin.clone(),
            reason: format!("unusable trust anchor: {e}"),
        })?;
    }
    Ok(())
}

/// A node's TLS settings: its certificate and key, and the CA its peers' (and clients')
/// certificates are checked against.
#[derive(Clone, Debug)]
pub struct ServerTls {
    cert: Pem,
    key: Pem,
    ca: Pem,
    /// CA of client certificates, when not the node CA.
    client_ca: Option<Pem>,
    require_client_cert: bool,
}

impl ServerTls {
    /// Read and check the three PEM files: every problem (missing file, no certificate, key
    /// not matching the certificate) is reported now, not at the first handshake.
    pub fn load(cert: &Path, key: &Path, ca: &Path) -> Result<ServerTls, TlsError> {
        let tls = ServerTls {
            cert: Pem::read("certificate", cert)?,
            key: Pem::read("key", key)?,
            ca: Pem::read("CA", ca)?,
            client_ca: None,
            require_client_cert: false,
        };
        tls.rustls_server()?;
        tls.client_port_acceptor()?;
        tls.peer_check()?;
        Ok(tls)
    }

    /// Check API and RESP clients' certificates against this CA instead of the node CA, so
    /// that no client certificate can pass for a node's.
    pub fn with_client_ca(mut self, client_ca: &Path) -> Result<ServerTls, TlsError> {
        let pem = Pem::read("client CA", client_ca)?;
        roots(&pem)?;
        self.client_ca = Some(pem);
        Ok(self)
    }

    /// The CA that client certificates (RESP) must chain to.
    fn clients_ca(&self) -> &Pem {
        self.client_ca.as_ref().unwrap_or(&self.ca)
    }

    /// Refuse clients (gRPC and RESP) that present no CA-signed certificate.
    pub fn require_client_cert(mut self, yes: bool) -> Self {
        self.require_client_cert = yes;
        self
    }

    /// The interceptor for the node-to-node services: callers must present a certificate
    /// that chains to the node CA.
    pub fn peer_check(&self) -> Result<PeerCertCheck, TlsError> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots(&self.ca)?),
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(format!("peer verifier: {e}")))?;
        Ok(PeerCertCheck {
            nodes: Some(verifier),
        })
    }

    /// For this node's calls to other nodes (Raft, forwarding): trust the CA, present the
    /// node's own certificate.
    pub fn peer_client(&self) -> ClientTlsConfig {
        ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca.bytes))
            .identity(Identity::from_pem(&self.cert.bytes, &self.key.bytes))
    }

    /// For the RESP listener.
    pub fn resp_acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        Ok(TlsAcceptor::from(Arc::new(self.rustls_server()?)))
    }

    /// For the client port (gRPC and HTTP on one listener, `fenced-server`'s
    /// `client_port`): callers are clients or other nodes, so certificates of either CA
    /// are accepted here (the node-to-node services check theirs against the node CA with
    /// [`PeerCertCheck`]), and ALPN offers `h2` and `http/1.1` — gRPC clients pick the
    /// first, HTTP/1.1 clients (curl, Python `requests`) the second.
    pub fn client_port_acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let mut roots = roots(&self.ca)?;
        if let Some(c) = &self.client_ca {
            add_roots(&mut roots, c, "client CA")?;
        }
        let mut config = self.server_config(roots)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }

    fn rustls_server(&self) -> Result<rustls::ServerConfig, TlsError> {
        self.server_config(roots(self.clients_ca())?)
    }

    /// A server configuration presenting this node's certificate, checking clients'
    /// certificates against `roots` (required only with `--tls-require-client-cert`).
    fn server_config(
        &self,
        roots: rustls::RootCertStore,
    ) -> Result<rustls::ServerConfig, TlsError> {
        let provider = provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        );
        let verifier = if self.require_client_cert {
            verifier
        } else {
            verifier.allow_unauthenticated()
        }
        .build()
        .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.cert.certs("certificate")?, self.key.key()?)
            .map_err(|e| {
                TlsError::Config(format!(
                    "certificate {} with key {}: {e}",
                    self.cert.origin, self.key.origin
                ))
            })
    }
}

/// A client's TLS settings: the CA to trust, optionally an identity, optionally the name to
/// verify instead of the dialled host.
#[derive(Clone, Debug)]
pub struct ClientTls {
    ca: Pem,
    identity: Option<(Pem, Pem)>,
    server_name: Option<String>,
}

impl ClientTls {
    /// Trust the CA certificates in `ca` (PEM file).
    pub fn load(ca: &Path) -> Result<ClientTls, TlsError> {
        let ca = Pem::read("CA", ca)?;
        roots(&ca)?;
        Ok(ClientTls {
            ca,
            identity: None,
            server_name: None,
        })
    }

    /// Present this certificate and key (needed when the cluster requires client
    /// certificates).
    pub fn with_identity(mut self, cert: &Path, key: &Path) -> Result<ClientTls, TlsError> {
        let cert = Pem::read("certificate", cert)?;
        let key = Pem::read("key", key)?;
        cert.certs("certificate")?;
        key.key()?;
        self.identity = Some((cert, key));
        Ok(self)
    }

    /// Verify the servers' certificates against this name instead of the dialled host.
    pub fn with_server_name(mut self, name: impl Into<String>) -> ClientTls {
        self.server_name = Some(name.into());
        self
    }

    /// For a tonic endpoint.
    pub fn grpc(&self) -> ClientTlsConfig {
        let mut c = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca.bytes));
        if let Some((cert, key)) = &self.identity {
            c = c.identity(Identity::from_pem(&cert.bytes, &key.bytes));
        }
        if let Some(name) = &self.server_name {
            c = c.domain_name(name.clone());
        }
        c
    }
}

/// A tonic interceptor for the node-to-node services: with TLS on, refuse callers whose
/// certificate does not chain to the node CA. Without TLS ([`PeerCertCheck::open`]) it lets
/// everything through, like the rest of a plaintext cluster (see the README on network trust).
#[derive(Clone)]
pub struct PeerCertCheck {
    nodes: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
}

impl PeerCertCheck {
    /// No check: a plaintext cluster.
    pub fn open() -> PeerCertCheck {
        PeerCertCheck { nodes: None }
    }

    fn allows(&self, chain: Option<&[CertificateDer<'static>]>) -> bool {
        let Some(verifier) = &self.nodes else {
            return true;
        };
        match chain {
            Some([leaf, intermediates @ ..]) => verifier
                .verify_client_cert(leaf, intermediates, rustls_pki_types::UnixTime::now())
                .is_ok(),
            _ => false,
        }
    }
}

impl std::fmt::Debug for PeerCertCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCertCheck")
            .field("tls", &self.nodes.is_some())
            .finish()
    }
}

impl tonic::service::Interceptor for PeerCertCheck {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let chain = req.peer_certs();
        if !self.allows(chain.as_deref().map(Vec::as_slice)) {
            return Err(tonic::Status::permission_denied(
                "node-to-node service: present a certificate of the cluster's node CA",
            ));
        }
        Ok(req)
    }
}

/// A lazily connecting tonic endpoint for `addr` (`host:port`, or a full URI): `https` with
/// `tls`, else `http`. Every gRPC client of fenced (peers, forwarding, the client library)
/// builds its endpoints here.
pub fn endpoint(
    addr: &str,
    tls: Option<&ClientTlsConfig>,
) -> Result<tonic::transport::Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let uri = match addr.split_once("://") {
        Some((_, rest)) => format!("{scheme}://{rest}"),
        None => format!("{scheme}://{addr}"),
    };
    let ep = tonic::transport::Endpoint::from_shared(uri).map_err(|e| e.to_string())?;
    match tls {
        Some(t) => ep.tls_config(t.clone()).map_err(|e| e.to_string()),
        None => Ok(ep),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, data: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, data).unwrap();
        p
    }

    fn ca_and_leaf() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["127.0.0.1".into()])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        (ca_cert.pem(), leaf.pem(), key.serialize_pem())
    }

    #[test]
    fn loads_a_matching_set() {
        let d = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf();
        let tls = ServerTls::load(
            &write(d.path(), "c.pem", &cert),
            &write(d.path(), "k.pem", &key),
            &write(d.path(), "ca.pem", &ca),
        )
        .unwrap();
        tls.resp_acceptor().unwrap();
        ClientTls::load(&write(d.path(), "ca2.pem", &ca))
            .unwrap()
            .with_identity(&d.path().join("c.pem"), &d.path().join("k.pem"))
            .unwrap();
    }

    #[test]
    fn peer_check_wants_a_node_ca_chain() {
        let d = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf();
        let (_, other_leaf, _) = ca_and_leaf();
        let tls = ServerTls::load(
            &write(d.path(), "c.pem", &cert),
            &write(d.path(), "k.pem", &key),
            &write(d.path(), "ca.pem", &ca),
        )
        .unwrap();
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        let check = tls.peer_check().unwrap();
        assert!(check.allows(Some(&[der(&cert)])), "a node certificate");
        assert!(!check.allows(Some(&[der(&other_leaf)])), "another CA's");
        assert!(!check.allows(Some(&[])), "an empty chain");
        assert!(!check.allows(None), "no certificate");
        assert!(PeerCertCheck::open().allows(None), "plaintext: no check");
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let d = tempfile::tempdir().unwrap();
        let (ca, cert, key) = ca_and_leaf();
        let (_, _, other_key) = ca_and_leaf();
        let k_path = write(d.path(), "k0.pem", &key);
        let tls = ServerTls::load(
            &write(d.path(), "c0.pem", &cert),
            &k_path,
            &write(d.path(), "ca0.pem", &ca),
        )
        .unwrap();
        let shown = format!("{tls:?}");
        assert!(
            !shown.contains("bytes") && shown.contains("Pem(") && shown.contains("k0.pem"),
            "{shown}"
        );
        let c = write(d.path(), "c.pem", &cert);
        let k = write(d.path(), "k.pem", &key);
        let a = write(d.path(), "ca.pem", &ca);
        let missing = d.path().join("missing.pem");
        let e = ServerTls::load(&missing, &k, &a).unwrap_err().to_string();
        assert!(
            e.contains("cannot read certificate") && e.contains("missing.pem"),
            "{e}"
        );
        let garbage = write(d.path(), "g.pem", "hello");
        let e = ServerTls::load(&garbage, &k, &a).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = ServerTls::load(&c, &garbage, &a).unwrap_err().to_string();
        assert!(e.contains("no PEM private key"), "{e}");
        let e = ClientTls::load(&garbage).unwrap_err().to_string();
        assert!(e.contains("CA"), "{e}");
        let wrong = write(d.path(), "w.pem", &other_key);
        let e = ServerTls::load(&c, &wrong, &a).unwrap_err().to_string();
        assert!(e.contains("with key"), "{e}");
    }
}
