//! `[tls]` as rustls configurations: the listener's certificate chain and key (with
//! optional client-certificate verification) and the trust roots for `https://` workers.
//! Files are read here, off the data path (at start, and by a reload on the control
//! thread's blocking pool); a missing, empty or unparsable file is an error naming it, and
//! the reload keeps the running material.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::TlsError;
use crate::config::{TlsConfig, TlsListener};

/// The only ALPN protocol the listener offers: Spillway speaks HTTP/1.1.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// What handshakes use; swapped whole on a reload.
#[derive(Debug, Clone, Default)]
pub struct Material {
    /// The listener's configuration (`[tls]` with `cert` and `key`).
    pub server: Option<Arc<ServerConfig>>,
    /// For `https://` workers: the configured CA bundle, else the system's roots (`None`
    /// only before the first load).
    pub upstream: Option<Arc<ClientConfig>>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_err(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Read {
        what,
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Every certificate in a PEM file (at least one).
pub fn certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| read_err(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| read_err(what, path, e))?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.display().to_string(),
            expected: "PEM certificate",
        });
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            what: "tls.key",
            path: path.display().to_string(),
            expected: "PEM private key",
        },
        e => read_err("tls.key", path, e),
    })
}

fn roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(what, path)? {
        roots.add(cert).map_err(|e| read_err(what, path, e))?;
    }
    Ok(roots)
}

/// The listener's configuration: TLS 1.3 and 1.2, rustls' default (AEAD-only) suites,
/// ALPN `http/1.1`, secrets handed to our record layer after the handshake.
pub fn server_config(l: &TlsListener) -> Result<ServerConfig, TlsError> {
    let chain = certificates("tls.cert", &l.cert)?;
    let key = private_key(&l.key)?;
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &l.client_ca {
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots("tls.client_ca", path)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Verifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(chain, key)?;
    // No session cache or tickets: rustls' cache is one mutex shared by every core, and
    // the cores keep no lock on their path.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    config.enable_secret_extraction = true;
    Ok(config)
}

/// The workers' client configuration: `ca` if given, else the system's trust store.
pub fn client_config(ca: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let roots = match ca {
        Some(path) => roots("tls.upstream_ca", path)?,
        None => {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            roots
        }
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    config.enable_secret_extraction = true;
    Ok(config)
}

/// Reads everything `[tls]` names. The client side is always ready: an `https://`
/// worker may also be found at run time (etcd).
pub fn load(tls: &TlsConfig) -> Result<Material, TlsError> {
    let server = match &tls.listener {
        Some(l) => Some(Arc::new(server_config(l)?)),
        None => None,
    };
    let upstream = Some(Arc::new(client_config(tls.upstream_ca.as_deref())?));
    Ok(Material { server, upstream })
}

#[cfg(test)]
mod tests;
