//! Certificates for TLS tests: a CA made with rcgen and the PEM files it issues.

use std::path::{Path, PathBuf};

/// A CA and the PEM files made from it.
pub struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} CA"));
        let ca = params.self_signed(&ca_key).expect("CA certificate");
        let pki = Pki {
            dir: dir.to_owned(),
            ca,
            ca_key,
        };
        std::fs::write(pki.path(&format!("{name}-ca.pem")), pki.ca.pem()).expect("writing CA");
        pki
    }

    pub fn path(&self, file: &str) -> String {
        self.dir.join(file).display().to_string()
    }

    /// Issue `<file>.pem` and `<file>.key` for these subject-alt-names (IPs or DNS names).
    pub fn issue(&self, file: &str, sans: &[String]) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(sans.to_vec())
            .expect("params")
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("signing");
        let (c, k) = (
            self.path(&format!("{file}.pem")),
            self.path(&format!("{file}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("writing certificate");
        std::fs::write(&k, key.serialize_pem()).expect("writing key");
        (c, k)
    }
}
