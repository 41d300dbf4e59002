//! The TLS record layer after the handshake, as kernel TLS would run it: rustls negotiates
//! the session and hands over each direction's traffic secret and sequence number
//! ([`Keys::new`]); records are then sealed and opened here, in place, with ring's AEAD.
//! Nothing allocates: [`Keys::seal`] appends to a caller's buffer, [`Keys::open`] decrypts
//! inside the caller's buffer. TLS 1.3 and TLS 1.2 with the AEAD suites rustls offers
//! (AES-128/256-GCM, ChaCha20-Poly1305).

use std::ops::Range;

use ring::aead::{
    AES_128_GCM, AES_256_GCM, Aad, Algorithm, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce,
    UnboundKey,
};
use rustls::ConnectionTrafficSecrets;

/// A record's header: content type, legacy version, length.
pub const HEADER_LEN: usize = 5;
/// The most plaintext one record carries.
pub const MAX_PLAINTEXT: usize = 16_384;
/// The most bytes one record can take on the wire, header included (RFC 8446 §5.2).
pub const MAX_RECORD: usize = HEADER_LEN + MAX_PLAINTEXT + 256;
const TAG_LEN: usize = 16;
/// TLS 1.2 GCM's explicit nonce, carried in each record.
const EXPLICIT_NONCE_LEN: usize = 8;

/// Record content types (RFC 8446 §5.1).
pub const CHANGE_CIPHER_SPEC: u8 = 20;
pub const ALERT: u8 = 21;
pub const HANDSHAKE: u8 = 22;
pub const APPLICATION_DATA: u8 = 23;

/// Records sealed under one key before the connection must rekey or close: AES-GCM's
/// confidentiality limit for TLS 1.3 (RFC 8446 §5.5, 2^24.5 full records), rounded down.
pub const RECORD_LIMIT: u64 = 23_726_566;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record of {0} bytes is over the limit")]
    TooLong(usize),
    #[error("record failed authentication")]
    BadRecord,
    #[error("unexpected record type {0}")]
    UnexpectedType(u8),
    #[error("too many records under one key")]
    Exhausted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nonces {
    /// TLS 1.3, and TLS 1.2 ChaCha20: the IV XOR the sequence number.
    Xor,
    /// TLS 1.2 GCM: a 4-byte salt and an explicit 8-byte nonce in every record.
    Explicit,
}

/// One direction's key and sequence number.
pub struct Keys {
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
    seq: u64,
    version: Version,
    nonces: Nonces,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("version", &self.version)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

/// A record opened in place: `len` bytes of the buffer were the record; its content
/// is `buf[plain]`, of type `typ`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub len: usize,
    pub typ: u8,
    pub plain: Range<usize>,
}

impl Keys {
    /// Keys for one direction from rustls' secrets (`seq`: the next record's number).
    pub fn new(version: Version, seq: u64, secrets: &ConnectionTrafficSecrets) -> Option<Keys> {
        let (alg, key, iv) = match secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&CHACHA20_POLY1305, key, iv),
            _ => return None,
        };
        Keys::with(
            alg,
            key.as_ref(),
            iv.as_ref().try_into().ok()?,
            version,
            seq,
        )
    }

    fn with(
        alg: &'static Algorithm,
        key: &[u8],
        iv: [u8; NONCE_LEN],
        version: Version,
        seq: u64,
    ) -> Option<Keys> {
        let key = LessSafeKey::new(UnboundKey::new(alg, key).ok()?);
        let nonces = if version == Version::Tls12 && alg != &CHACHA20_POLY1305 {
            Nonces::Explicit
        } else {
            Nonces::Xor
        };
        Some(Keys {
            key,
            iv,
            seq,
            version,
            nonces,
        })
    }

    /// The next record's sequence number.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes a record adds to its content.
    pub fn overhead(&self) -> usize {
        HEADER_LEN
            + TAG_LEN
            + match (self.version, self.nonces) {
                (Version::Tls13, _) => 1,
                (Version::Tls12, Nonces::Explicit) => EXPLICIT_NONCE_LEN,
                (Version::Tls12, Nonces::Xor) => 0,
            }
    }

    /// The space `seal` needs for `len` bytes of content.
    pub fn sealed_len(&self, len: usize) -> usize {
        let records = len.div_ceil(MAX_PLAINTEXT).max(1);
        len + records * self.overhead()
    }

    fn xor_nonce(&self, seq: u64) -> [u8; NONCE_LEN] {
        let mut nonce = self.iv;
        for (n, s) in nonce[NONCE_LEN - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        nonce
    }

    fn next_seq(&mut self) -> Result<u64, RecordError> {
        if self.seq >= RECORD_LIMIT {
            return Err(RecordError::Exhausted);
        }
        self.seq += 1;
        Ok(self.seq - 1)
    }

    /// Appends `content` to `out` as records of type `typ` (at most [`MAX_PLAINTEXT`]
    /// each). `out` grows only when it has less spare room than [`Keys::sealed_len`].
    pub fn seal(&mut self, typ: u8, content: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        out.reserve(self.sealed_len(content.len()));
        let mut chunks = content.chunks(MAX_PLAINTEXT);
        let first = chunks.next().unwrap_or_default();
        for chunk in std::iter::once(first).chain(chunks) {
            self.seal_one(typ, chunk, out)?;
        }
        Ok(())
    }

    fn seal_one(&mut self, typ: u8, chunk: &[u8], out: &mut Vec<u8>) -> Result<(), RecordError> {
        let seq = self.next_seq()?;
        let start = out.len();
        let body_len = self.overhead() - HEADER_LEN + chunk.len();
        let (outer, nonce, aad) = match self.version {
            Version::Tls13 => {
                let header = header(APPLICATION_DATA, body_len);
                (
                    APPLICATION_DATA,
                    self.xor_nonce(seq),
                    AadBytes::from_slice(&header),
                )
            }
            Version::Tls12 => {
                let nonce = self.xor_nonce(seq);
                (
                    typ,
                    nonce,
                    AadBytes::from_slice(&aad12(seq, typ, chunk.len())),
                )
            }
        };
        out.extend_from_slice(&header(outer, body_len));
        if self.nonces == Nonces::Explicit {
            out.extend_from_slice(&nonce[NONCE_LEN - EXPLICIT_NONCE_LEN..]);
        }
        let sealed_from = out.len();
        out.extend_from_slice(chunk);
        if self.version == Version::Tls13 {
            out.push(typ);
        }
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                aad.aad(),
                &mut out[sealed_from..],
            )
            .map_err(|_| RecordError::BadRecord)?;
        out.extend_from_slice(tag.as_ref());
        debug_assert_eq!(out.len() - start, HEADER_LEN + body_len);
        Ok(())
    }

    /// Opens the first record of `buf` in place. `Ok(None)`: the record is not complete
    /// yet. A TLS 1.3 record's padding and inner type are stripped from `plain`.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Option<Opened>, RecordError> {
        let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let outer = head[0];
        let body_len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if body_len > MAX_RECORD - HEADER_LEN {
            return Err(RecordError::TooLong(body_len));
        }
        let len = HEADER_LEN + body_len;
        if buf.len() < len {
            return Ok(None);
        }
        let min = self.overhead() - HEADER_LEN;
        let skipped = self.version == Version::Tls13 && outer == CHANGE_CIPHER_SPEC;
        if body_len < min && !skipped {
            return Err(RecordError::BadRecord);
        }
        match self.version {
            Version::Tls13 => self.open13(&mut buf[..len], outer),
            Version::Tls12 => self.open12(&mut buf[..len], outer),
        }
        .map(Some)
    }

    fn open13(&mut self, record: &mut [u8], outer: u8) -> Result<Opened, RecordError> {
        if outer == CHANGE_CIPHER_SPEC {
            // Middlebox compatibility (RFC 8446 §5): unprotected and ignored.
            return Ok(Opened {
                len: record.len(),
                typ: CHANGE_CIPHER_SPEC,
                plain: HEADER_LEN..HEADER_LEN,
            });
        }
        if outer != APPLICATION_DATA {
            return Err(RecordError::UnexpectedType(outer));
        }
        let seq = self.next_seq()?;
        let (head, body) = record.split_at_mut(HEADER_LEN);
        let aad: [u8; HEADER_LEN] = head.try_into().map_err(|_| RecordError::BadRecord)?;
        let plain = self
            .key
            .open_in_place(
                Nonce::assume_unique_for_key(self.xor_nonce(seq)),
                Aad::from(aad),
                body,
            )
            .map_err(|_| RecordError::BadRecord)?;
        // The content, then the inner type, then zero padding.
        let Some(end) = plain.iter().rposition(|&b| b != 0) else {
            return Err(RecordError::BadRecord);
        };
        let typ = plain[end];
        Ok(Opened {
            len: record.len(),
            typ,
            plain: HEADER_LEN..HEADER_LEN + end,
        })
    }

    fn open12(&mut self, record: &mut [u8], typ: u8) -> Result<Opened, RecordError> {
        let seq = self.next_seq()?;
        let len = record.len();
        let explicit = if self.nonces == Nonces::Explicit {
            EXPLICIT_NONCE_LEN
        } else {
            0
        };
        let content_len = len - HEADER_LEN - explicit - TAG_LEN;
        let nonce = match self.nonces {
            Nonces::Xor => self.xor_nonce(seq),
            Nonces::Explicit => {
                let mut nonce = [0u8; NONCE_LEN];
                nonce[..4].copy_from_slice(&self.iv[..4]);
                nonce[4..].copy_from_slice(&record[HEADER_LEN..HEADER_LEN + EXPLICIT_NONCE_LEN]);
                nonce
            }
        };
        let from = HEADER_LEN + explicit;
        self.key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad12(seq, typ, content_len)),
                &mut record[from..],
            )
            .map_err(|_| RecordError::BadRecord)?;
        Ok(Opened {
            len,
            typ,
            plain: from..from + content_len,
        })
    }
}

/// Additional data by value: TLS 1.3's (the header) or TLS 1.2's (13 bytes).
struct AadBytes {
    bytes: [u8; 13],
    len: usize,
}

impl AadBytes {
    fn from_slice(s: &[u8]) -> AadBytes {
        let mut bytes = [0u8; 13];
        let len = s.len().min(13);
        bytes[..len].copy_from_slice(&s[..len]);
        AadBytes { bytes, len }
    }

    fn aad(&self) -> Aad<&[u8]> {
        Aad::from(&self.bytes[..self.len])
    }
}

fn header(typ: u8, body_len: usize) -> [u8; HEADER_LEN] {
    let [hi, lo] = (body_len as u16).to_be_bytes();
    [typ, 3, 3, hi, lo]
}

fn aad12(seq: u64, typ: u8, content_len: usize) -> [u8; 13] {
    let mut aad = [0u8; 13];
    aad[..8].copy_from_slice(&seq.to_be_bytes());
    aad[8] = typ;
    aad[9] = 3;
    aad[10] = 3;
    aad[11..].copy_from_slice(&(content_len as u16).to_be_bytes());
    aad
}

#[cfg(test)]
mod tests;
