//! A handshake over a TCP stream with rustls' unbuffered API, on the connection's core:
//! records in, records out, until rustls could write application data. Then the session
//! moves to our record layer ([`crate::tls::Session`]); what the peer already sent after
//! its Finished (often the first request) comes back as plaintext and as the records not
//! yet complete.

use std::io;
use std::sync::Arc;

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;
use rustls::pki_types::ServerName;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};
use rustls::{ClientConfig, ServerConfig, client::UnbufferedClientConnection};

use crate::tls::record::{HANDSHAKE, MAX_RECORD};
use crate::tls::session::{Kernel, Started};
use crate::tls::{Session, TlsError};

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The first bytes were not a TLS record (a plain HTTP request on the TLS port).
    #[error("not TLS: the peer spoke plain text")]
    NotTls,
    #[error("the peer closed during the handshake")]
    Closed,
    #[error("unexpected handshake state")]
    Unexpected,
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Tls(#[from] TlsError),
}

impl From<rustls::Error> for HandshakeError {
    fn from(e: rustls::Error) -> Self {
        HandshakeError::Tls(TlsError::Rustls(e))
    }
}

/// A finished handshake.
pub struct Established {
    pub session: Started,
    /// Application data that arrived with the handshake.
    pub plain: Vec<u8>,
    /// Bytes of records not complete yet.
    pub cipher: Vec<u8>,
    /// The negotiated ALPN protocol, if any.
    pub alpn: Option<Vec<u8>>,
}

/// rustls' two unbuffered connections, for one handshake loop.
trait Unbuffered {
    type Data;
    fn process<'c, 'i>(
        &'c mut self,
        incoming: &'i mut [u8],
    ) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn finish(self) -> Result<Finished, rustls::Error>;
}

/// What a finished handshake hands over: the secrets, rustls' post-handshake state, ALPN.
type Finished = (rustls::ExtractedSecrets, Kernel, Option<Vec<u8>>);

/// The two sides differ only in their types and in which [`Kernel`] they become.
macro_rules! unbuffered {
    ($conn:ty, $data:ty, $kernel:path) => {
        impl Unbuffered for $conn {
            type Data = $data;
            fn process<'c, 'i>(
                &'c mut self,
                incoming: &'i mut [u8],
            ) -> UnbufferedStatus<'c, 'i, Self::Data> {
                self.process_tls_records(incoming)
            }
            fn finish(self) -> Result<Finished, rustls::Error> {
                let alpn = self.alpn_protocol().map(<[u8]>::to_vec);
                let (secrets, kernel) = self.dangerous_into_kernel_connection()?;
                Ok((secrets, $kernel(kernel), alpn))
            }
        }
    };
}

unbuffered!(
    UnbufferedServerConnection,
    rustls::server::ServerConnectionData,
    Kernel::Server
);
unbuffered!(
    UnbufferedClientConnection,
    rustls::client::ClientConnectionData,
    Kernel::Client
);

/// The server side, on an accepted stream.
pub async fn accept(
    stream: &mut TcpStream,
    config: Arc<ServerConfig>,
) -> Result<Established, HandshakeError> {
    let conn = UnbufferedServerConnection::new(config)?;
    run(stream, conn, true).await
}

/// The client side, on a connected stream, checking the certificate against `name`.
pub async fn connect(
    stream: &mut TcpStream,
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
) -> Result<Established, HandshakeError> {
    let conn = UnbufferedClientConnection::new(config, name)?;
    run(stream, conn, false).await
}

enum Step {
    Again,
    Read,
    Write,
    Done,
}

/// Appends a handshake record to `outgoing`.
fn encode<D>(e: &mut rustls::unbuffered::EncodeTlsData<'_, D>, outgoing: &mut Vec<u8>) {
    let used = outgoing.len();
    outgoing.resize(used + 4096, 0);
    loop {
        match e.encode(&mut outgoing[used..]) {
            Ok(n) => {
                outgoing.truncate(used + n);
                return;
            }
            Err(EncodeError::InsufficientSize(s)) => outgoing.resize(used + s.required_size, 0),
            Err(EncodeError::AlreadyEncoded) => {
                outgoing.truncate(used);
                return;
            }
        }
    }
}

/// One read appended to `incoming`; end of stream is an error here.
async fn read(stream: &mut TcpStream, mut incoming: Vec<u8>) -> Result<Vec<u8>, HandshakeError> {
    if incoming.capacity() - incoming.len() < MAX_RECORD {
        incoming.reserve(MAX_RECORD);
    }
    let len = incoming.len();
    let (res, slice) = stream.read(incoming.slice_mut(len..)).await;
    if res? == 0 {
        return Err(HandshakeError::Closed);
    }
    Ok(slice.into_inner())
}

async fn run<C: Unbuffered>(
    stream: &mut TcpStream,
    mut conn: C,
    server: bool,
) -> Result<Established, HandshakeError> {
    let mut incoming = Vec::with_capacity(MAX_RECORD);
    let mut outgoing = Vec::with_capacity(4096);
    let mut plain = Vec::new();
    // A server checks the first byte it gets: a ClientHello's record, or plain text.
    let mut first_byte = server;
    loop {
        if first_byte && let Some(&b) = incoming.first() {
            if b != HANDSHAKE {
                return Err(HandshakeError::NotTls);
            }
            first_byte = false;
        }
        let UnbufferedStatus { mut discard, state } = conn.process(&mut incoming);
        let step = match state? {
            ConnectionState::EncodeTlsData(mut e) => {
                encode(&mut e, &mut outgoing);
                Step::Again
            }
            ConnectionState::TransmitTlsData(t) => {
                t.done();
                Step::Write
            }
            ConnectionState::BlockedHandshake => Step::Read,
            ConnectionState::ReadTraffic(mut r) => {
                while let Some(record) = r.next_record() {
                    let record = record?;
                    discard += record.discard;
                    plain.extend_from_slice(record.payload);
                }
                Step::Again
            }
            ConnectionState::WriteTraffic(_) => Step::Done,
            ConnectionState::PeerClosed | ConnectionState::Closed => {
                return Err(HandshakeError::Closed);
            }
            // Early data (never enabled) and states rustls may add.
            _ => return Err(HandshakeError::Unexpected),
        };
        incoming.drain(..discard.min(incoming.len()));
        match step {
            Step::Again => {}
            Step::Write => {
                let (res, buf) = stream.write_all(std::mem::take(&mut outgoing)).await;
                res?;
                outgoing = buf;
                outgoing.clear();
            }
            Step::Read => incoming = read(stream, incoming).await?,
            Step::Done => break,
        }
    }
    if !outgoing.is_empty() {
        let (res, _) = stream.write_all(outgoing).await;
        res?;
    }
    let (secrets, kernel, alpn) = conn.finish()?;
    Ok(Established {
        session: Session::start(secrets, kernel)?,
        plain,
        cipher: incoming,
        alpn,
    })
}
