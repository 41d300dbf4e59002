//! The TLS record layer (`tls::record::Keys`) after a handshake: the first byte picks
//! TLS 1.2 or 1.3 and the cipher (AES-256-GCM or ChaCha20-Poly1305). Arbitrary bytes
//! opened as records never panic: an opened record lies within the buffer and its content
//! within the record. And the rest of the input, sealed by one side (cut into writes by
//! its second byte), opens on the other as exactly those bytes, in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rustls::ConnectionTrafficSecrets;
use rustls::crypto::cipher::{AeadKey, Iv};
use spillway::tls::record::{APPLICATION_DATA, Keys, Version};

fn keys(control: u8) -> Keys {
    let version = if control & 1 == 0 { Version::Tls12 } else { Version::Tls13 };
    let (key, iv) = (AeadKey::from([control; 32]), Iv::new([7; 12]));
    let secrets = if control & 2 == 0 {
        ConnectionTrafficSecrets::Aes256Gcm { key, iv }
    } else {
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv }
    };
    Keys::new(version, u64::from(control >> 2), &secrets).expect("supported suite")
}

fuzz_target!(|data: &[u8]| {
    let [control, cut, rest @ ..] = data else { return };
    // Arbitrary bytes as records.
    let mut rx = keys(*control);
    let mut wire = rest.to_vec();
    let mut pos = 0;
    while let Ok(Some(opened)) = rx.open(&mut wire[pos..]) {
        assert!(opened.len >= 5 && pos + opened.len <= wire.len());
        assert!(opened.plain.start >= 5 && opened.plain.end <= opened.len);
        pos += opened.len;
    }
    // Sealed, then opened: the same bytes.
    let (mut tx, mut rx) = (keys(*control), keys(*control));
    let step = usize::from(*cut).max(1) * 97;
    let mut sealed = Vec::new();
    for chunk in rest.chunks(step) {
        tx.seal(APPLICATION_DATA, chunk, &mut sealed).expect("seal");
    }
    let mut got = Vec::new();
    let mut pos = 0;
    while pos < sealed.len() {
        let opened = rx.open(&mut sealed[pos..]).expect("open").expect("whole record");
        assert_eq!(opened.typ, APPLICATION_DATA);
        got.extend_from_slice(&sealed[pos..][opened.plain.clone()]);
        pos += opened.len;
    }
    assert_eq!(got, rest);
});
