//! TLS for the data listener and for `https://` workers. rustls runs each handshake
//! (its unbuffered API, on the connection's core); then the session's traffic secrets
//! move to our own record layer ([`record`]), which seals and opens records in place as
//! kernel TLS would, so a kept-alive TLS connection allocates nothing per request.
//! [`material`] turns `[tls]` into rustls configurations (read at start and on every
//! reload, all or nothing); [`session`] is what both halves of a connection share after
//! the handshake (key updates, session tickets).

pub mod material;
pub mod record;
pub mod session;

pub use material::{Material, load};
pub use record::{Keys, RecordError, Version};
pub use session::Session;

/// Why TLS material could not be loaded, or a session could not go on.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {detail}")]
    Read {
        what: &'static str,
        path: String,
        detail: String,
    },
    #[error("{what} {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: String,
        expected: &'static str,
    },
    #[error("tls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("tls client verifier: {0}")]
    Verifier(String),
    #[error("tls record: {0}")]
    Record(#[from] RecordError),
    #[error("unexpected post-handshake message {0}")]
    UnexpectedMessage(u8),
    #[error("cipher suite not supported by the record layer")]
    UnsupportedSuite,
}
