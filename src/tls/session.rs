//! A TLS session after its handshake: each direction's [`Keys`] belong to the half that
//! uses them; what both halves share (rustls' [`KernelConnection`], which derives the next
//! secrets, and a key update the peer asked us for) is one [`Session`] behind an `Rc` on
//! the connection's core. Post-handshake messages: KeyUpdate (both sides),
//! NewSessionTicket (from a server to us as a client); anything else ends the session.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{ExtractedSecrets, ProtocolVersion};

use super::TlsError;
use super::record::{HANDSHAKE, Keys, Version};

const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
/// KeyUpdate with `update_not_requested` (RFC 8446 §4.6.3).
const KEY_UPDATE_NOT_REQUESTED: [u8; 5] = [KEY_UPDATE, 0, 0, 1, 0];

/// rustls' post-handshake state, from either side.
pub enum Kernel {
    Server(KernelConnection<ServerConnectionData>),
    Client(KernelConnection<ClientConnectionData>),
}

impl Kernel {
    fn version(&self) -> ProtocolVersion {
        match self {
            Kernel::Server(k) => k.protocol_version(),
            Kernel::Client(k) => k.protocol_version(),
        }
    }

    fn update(&mut self, tx: bool) -> Result<(u64, rustls::ConnectionTrafficSecrets), TlsError> {
        Ok(match (self, tx) {
            (Kernel::Server(k), true) => k.update_tx_secret()?,
            (Kernel::Server(k), false) => k.update_rx_secret()?,
            (Kernel::Client(k), true) => k.update_tx_secret()?,
            (Kernel::Client(k), false) => k.update_rx_secret()?,
        })
    }
}

/// What the two halves of a TLS connection share.
pub struct Session {
    kernel: RefCell<Kernel>,
    version: Version,
    /// The peer asked for a key update: the write half sends ours before its next record.
    key_update_due: Cell<bool>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// A session's shared part and each direction's keys: (session, receive, transmit).
pub type Started = (Rc<Session>, Keys, Keys);

impl Session {
    /// Takes over from rustls once the handshake is done.
    pub fn start(secrets: ExtractedSecrets, kernel: Kernel) -> Result<Started, TlsError> {
        let version = match kernel.version() {
            ProtocolVersion::TLSv1_3 => Version::Tls13,
            ProtocolVersion::TLSv1_2 => Version::Tls12,
            _ => return Err(TlsError::UnsupportedSuite),
        };
        let keys = |(seq, s): &(u64, rustls::ConnectionTrafficSecrets)| {
            Keys::new(version, *seq, s).ok_or(TlsError::UnsupportedSuite)
        };
        let rx = keys(&secrets.rx)?;
        let tx = keys(&secrets.tx)?;
        let session = Session {
            kernel: RefCell::new(kernel),
            version,
            key_update_due: Cell::new(false),
        };
        Ok((Rc::new(session), rx, tx))
    }

    /// Handles the handshake messages of one record received after the handshake.
    pub fn received(&self, mut msgs: &[u8], rx: &mut Keys) -> Result<(), TlsError> {
        while let [typ, a, b, c, rest @ ..] = msgs {
            let len = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
            let Some(body) = rest.get(..len) else {
                return Err(TlsError::UnexpectedMessage(*typ));
            };
            match (*typ, &mut *self.kernel.borrow_mut()) {
                (KEY_UPDATE, kernel) if self.version == Version::Tls13 => {
                    let requested = match body {
                        [0] => false,
                        [1] => true,
                        _ => return Err(TlsError::UnexpectedMessage(KEY_UPDATE)),
                    };
                    let (seq, secrets) = kernel.update(false)?;
                    *rx =
                        Keys::new(self.version, seq, &secrets).ok_or(TlsError::UnsupportedSuite)?;
                    if requested {
                        self.key_update_due.set(true);
                    }
                }
                (NEW_SESSION_TICKET, Kernel::Client(k)) => k.handle_new_session_ticket(body)?,
                (other, _) => return Err(TlsError::UnexpectedMessage(other)),
            }
            msgs = &rest[len..];
        }
        if msgs.is_empty() {
            Ok(())
        } else {
            Err(TlsError::UnexpectedMessage(msgs[0]))
        }
    }

    /// Before the write half seals data: the key update the peer asked for, if any (our
    /// KeyUpdate under the old key, then the new key).
    pub fn before_write(&self, tx: &mut Keys, out: &mut Vec<u8>) -> Result<(), TlsError> {
        if !self.key_update_due.replace(false) {
            return Ok(());
        }
        tx.seal(HANDSHAKE, &KEY_UPDATE_NOT_REQUESTED, out)?;
        let (seq, secrets) = self.kernel.borrow_mut().update(true)?;
        *tx = Keys::new(self.version, seq, &secrets).ok_or(TlsError::UnsupportedSuite)?;
        Ok(())
    }
}
