//! The client's address, kept as text for `x-forwarded-for` and the access log for the
//! connection's whole life (parked or not).

use std::io::Write as _;
use std::net::IpAddr;

/// The client's address as `x-forwarded-for` writes it.
pub(super) struct PeerIp {
    text: [u8; 48],
    len: usize,
}

impl PeerIp {
    pub(super) fn new(ip: IpAddr) -> PeerIp {
        let mut text = [0u8; 48];
        let mut cursor = std::io::Cursor::new(&mut text[..]);
        let _ = write!(cursor, "{ip}");
        let len = cursor.position() as usize;
        PeerIp { text, len }
    }

    pub(super) fn get(&self) -> &[u8] {
        &self.text[..self.len]
    }
}
