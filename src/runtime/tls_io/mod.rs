//! TLS over monoio streams: the handshake ([`handshake`]), then each direction's record
//! work beside the stream it runs on. [`Rx`] opens the records a read brought into its
//! own ciphertext buffer and appends their plaintext to the caller's buffer; [`Tx`] seals
//! a write's plaintext into its own buffer, which then goes out whole. Both buffers are
//! the connection's, reused for every request.

pub mod handshake;

use std::io;
use std::rc::Rc;

use crate::tls::record::{
    ALERT, APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE, HEADER_LEN, Keys, MAX_RECORD,
    RecordError,
};
use crate::tls::{Session, TlsError};

/// Spare room a ciphertext read asks for.
const CIPHER_READ_SPARE: usize = 4096;

/// An alert's description byte for close_notify (RFC 8446 §6.1).
const CLOSE_NOTIFY: u8 = 0;

fn invalid(e: impl Into<TlsError>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.into())
}

/// The receiving direction of a TLS session.
pub struct Rx {
    keys: Keys,
    session: Rc<Session>,
    /// Ciphertext read but not opened yet (an incomplete record).
    cipher: Vec<u8>,
    /// Plaintext that came with the handshake, handed out first.
    early: Vec<u8>,
    /// The peer sent close_notify.
    closed: bool,
}

impl std::fmt::Debug for Rx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rx")
            .field("buffered", &self.cipher.len())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

/// The sending direction of a TLS session.
pub struct Tx {
    keys: Keys,
    session: Rc<Session>,
    /// The last write's records.
    pub sealed: Vec<u8>,
}

impl std::fmt::Debug for Tx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

/// Both directions of a finished handshake.
pub fn split(est: handshake::Established) -> (Rx, Tx) {
    let (session, rx, tx) = est.session;
    let mut cipher = est.cipher;
    cipher.reserve(MAX_RECORD + CIPHER_READ_SPARE);
    let rx = Rx {
        keys: rx,
        session: session.clone(),
        cipher,
        early: est.plain,
        closed: false,
    };
    let tx = Tx {
        keys: tx,
        session,
        sealed: Vec::with_capacity(4096),
    };
    (rx, tx)
}

impl Rx {
    /// Opens the complete records buffered, appending their application data to `buf`
    /// (a record whose content would not fit in `buf`'s spare room waits for the next
    /// call once something was produced). Returns the bytes appended.
    pub fn open_into(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        let mut produced = 0;
        if !self.early.is_empty() {
            buf.extend_from_slice(&self.early);
            produced = self.early.len();
            self.early = Vec::new();
        }
        let Rx {
            keys,
            session,
            cipher,
            closed,
            ..
        } = self;
        let mut pos = 0;
        while !*closed {
            let rest = &mut cipher[pos..];
            if produced > 0
                && let Some(h) = rest.first_chunk::<HEADER_LEN>()
                && buf.capacity() - buf.len() < usize::from(u16::from_be_bytes([h[3], h[4]]))
            {
                break;
            }
            let Some(opened) = keys.open(rest).map_err(invalid)? else {
                break;
            };
            let content = &rest[opened.plain.clone()];
            match opened.typ {
                APPLICATION_DATA => {
                    buf.extend_from_slice(content);
                    produced += content.len();
                }
                ALERT if content.get(1) == Some(&CLOSE_NOTIFY) => *closed = true,
                ALERT => {
                    let detail = format!("TLS alert {:?} from the peer", content.get(1));
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, detail));
                }
                HANDSHAKE => session.received(content, keys).map_err(invalid)?,
                CHANGE_CIPHER_SPEC => {}
                other => return Err(invalid(RecordError::UnexpectedType(other))),
            }
            pos += opened.len;
        }
        cipher.drain(..pos);
        Ok(produced)
    }

    /// The peer ended the session (close_notify).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The ciphertext buffer for the next read, with spare room; and where its bytes start.
    pub fn read_buf(&mut self) -> (Vec<u8>, usize) {
        if self.cipher.capacity() - self.cipher.len() < CIPHER_READ_SPARE {
            self.cipher.reserve(MAX_RECORD.max(CIPHER_READ_SPARE));
        }
        let len = self.cipher.len();
        (std::mem::take(&mut self.cipher), len)
    }

    /// The buffer back after a read.
    pub fn read_done(&mut self, cipher: Vec<u8>) {
        self.cipher = cipher;
    }

    /// Bytes read elsewhere (a parked connection's probe) that belong to the record stream.
    pub fn absorb(&mut self, bytes: &[u8]) {
        self.cipher.extend_from_slice(bytes);
    }

    /// Gives the ciphertext buffer's memory back while the connection idles (unless it
    /// holds part of a record); the next read takes a new one.
    pub fn park(&mut self) {
        if self.cipher.is_empty() {
            self.cipher = Vec::new();
        }
    }
}

impl Tx {
    /// Seals `plain` into [`Tx::sealed`] (replacing what it held), after a key update the
    /// peer asked for.
    pub fn seal(&mut self, plain: &[u8]) -> io::Result<()> {
        self.sealed.clear();
        self.session
            .before_write(&mut self.keys, &mut self.sealed)
            .map_err(invalid)?;
        self.keys
            .seal(APPLICATION_DATA, plain, &mut self.sealed)
            .map_err(invalid)
    }

    /// Gives the write buffer's memory back while the connection idles.
    pub fn park(&mut self) {
        self.sealed = Vec::new();
    }

    /// Seals a close_notify alert into [`Tx::sealed`].
    pub fn close_notify(&mut self) -> io::Result<()> {
        self.sealed.clear();
        (self.keys)
            .seal(ALERT, &[1, CLOSE_NOTIFY], &mut self.sealed)
            .map_err(invalid)
    }
}
