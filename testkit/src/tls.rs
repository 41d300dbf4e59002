//! A test PKI: a CA and certificates it signs (for `localhost` and 127.0.0.1 by default,
//! or other names, or already expired), written as PEM files in a scratch directory, and
//! rustls client configurations that trust the CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose,
    date_time_ymd,
};

/// A CA in `dir` (`ca.pem`), with a server certificate for `localhost` and 127.0.0.1
/// (`cert.pem`, `key.pem`).
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "Spillway test CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, issuer.pem()).unwrap();
        let mut pki = Pki {
            dir: dir.to_path_buf(),
            ca,
            cert: PathBuf::new(),
            key: PathBuf::new(),
            issuer,
        };
        (pki.cert, pki.key) = pki.leaf("cert", &["localhost", "127.0.0.1"], false);
        pki
    }

    /// A certificate for `names` signed by the CA (valid now, or expired in 2021), as
    /// `<stem>.pem` and `<stem>.key.pem`.
    pub fn leaf(&self, stem: &str, names: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path) = (
            self.dir.join(format!("{stem}.pem")),
            self.dir.join(format!("{stem}.key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    }

    /// A client configuration trusting this CA (ALPN `http/1.1`).
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        client_config_for(&self.ca)
    }
}

/// A client configuration trusting the CAs in `ca` (ALPN `http/1.1`).
pub fn client_config_for(ca: &Path) -> Arc<rustls::ClientConfig> {
    let config = spillway::tls::material::client_config(Some(ca)).unwrap();
    Arc::new(config)
}
