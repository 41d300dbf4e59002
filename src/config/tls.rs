//! `[tls]`: TLS on the data listener (certificate chain and key in PEM, optional client
//! certificates checked against a CA), and the CA bundle for `https://` workers. The
//! certificate and key paths default to Dynamo's `--tls-cert-path`/`DYN_TLS_CERT_PATH`
//! and `--tls-key-path`/`DYN_TLS_KEY_PATH`. Validation only checks the shape; the files
//! are read when the server starts or reloads (`crate::tls::load`).

use std::path::PathBuf;

use serde::Serialize;
use toml::Spanned;

use super::file::FileTls;
use super::validate::Validator;
use super::{ConfigError, HostPort, Overrides};

pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// The TLS listener and its certificate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TlsListener {
    /// Its own address beside the plain `listen`; `None`: `listen` itself speaks TLS.
    pub listen: Option<HostPort>,
    /// Certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// The leaf's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// Clients must present a certificate signed by one of these CAs (PEM).
    pub client_ca: Option<PathBuf>,
    pub handshake_timeout_ms: u64,
}

/// `[tls]` as validated.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct TlsConfig {
    pub listener: Option<TlsListener>,
    /// CAs trusted for `https://` workers (PEM); `None`: the system's trust store.
    pub upstream_ca: Option<PathBuf>,
}

impl Validator<'_> {
    pub(super) fn tls(&self, f: &Option<FileTls>, o: &Overrides) -> Result<TlsConfig, ConfigError> {
        let empty = FileTls::default();
        let t = f.as_ref().unwrap_or(&empty);
        let path = |key: &str, v: &Option<Spanned<String>>, dflt: &Option<String>| match v {
            Some(s) if s.get_ref().trim().is_empty() => {
                self.err(format!("tls.{key}"), Some(s.span()), "must be a file path")
            }
            Some(s) => Ok(Some(PathBuf::from(s.get_ref()))),
            None => Ok(dflt.clone().map(PathBuf::from)),
        };
        let cert = path("cert", &t.cert, &o.tls_cert_path)?;
        let key = path("key", &t.key, &o.tls_key_path)?;
        let client_ca = path("client_ca", &t.client_ca, &None)?;
        let upstream_ca = path("upstream_ca", &t.upstream_ca, &None)?;
        let listener = match (cert, key) {
            (Some(cert), Some(key)) => Some(TlsListener {
                listen: match &t.listen {
                    Some(s) => Some(
                        HostPort::parse(s.get_ref())
                            .or_else(|msg| self.err("tls.listen", Some(s.span()), msg))?,
                    ),
                    None => None,
                },
                cert,
                key,
                client_ca,
                handshake_timeout_ms: self.positive(
                    "tls.handshake_timeout_ms",
                    &t.handshake_timeout_ms,
                    DEFAULT_HANDSHAKE_TIMEOUT_MS,
                )?,
            }),
            (None, None) if t.listen.is_none() && client_ca.is_none() => None,
            (None, None) => {
                return self.err(
                    "tls",
                    None,
                    "`listen` and `client_ca` need `cert` and `key` (or --tls-cert-path and --tls-key-path)",
                );
            }
            (Some(_), None) => {
                return self.err(
                    "tls.key",
                    None,
                    "`cert` is set but `key` is not (DYN_TLS_KEY_PATH)",
                );
            }
            (None, Some(_)) => {
                return self.err(
                    "tls.cert",
                    None,
                    "`key` is set but `cert` is not (DYN_TLS_CERT_PATH)",
                );
            }
        };
        Ok(TlsConfig {
            listener,
            upstream_ca,
        })
    }
}
