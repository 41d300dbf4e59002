use super::*;

/// Keys for suite 0 (AES-128-GCM), 1 (AES-256-GCM) or 2 (ChaCha20-Poly1305).
fn keys(version: Version, suite: u8, seq: u64) -> Keys {
    let (alg, key): (&'static Algorithm, &[u8]) = match suite {
        0 => (&AES_128_GCM, &[1; 16]),
        1 => (&AES_256_GCM, &[2; 32]),
        _ => (&CHACHA20_POLY1305, &[3; 32]),
    };
    Keys::with(alg, key, [7; NONCE_LEN], version, seq).unwrap()
}

/// A sender's and a receiver's keys for the same direction.
fn pair(version: Version, suite: u8) -> (Keys, Keys) {
    (keys(version, suite, 5), keys(version, suite, 5))
}

fn all() -> impl Iterator<Item = (Version, u8)> {
    [Version::Tls12, Version::Tls13]
        .into_iter()
        .flat_map(|v| (0..3).map(move |s| (v, s)))
}

/// Opens every record of `wire` in turn; returns the content of each.
fn open_all(rx: &mut Keys, mut wire: Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < wire.len() {
        let opened = rx.open(&mut wire[pos..]).unwrap().expect("a whole record");
        out.push((opened.typ, wire[pos..][opened.plain.clone()].to_vec()));
        pos += opened.len;
    }
    out
}

#[test]
fn seal_then_open_every_suite_and_version() {
    for (version, suite) in all() {
        let (mut tx, mut rx) = pair(version, suite);
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, b"GET / HTTP/1.1\r\n\r\n", &mut wire)
            .unwrap();
        tx.seal(APPLICATION_DATA, b"second", &mut wire).unwrap();
        let expected = tx.sealed_len(18) + tx.sealed_len(6);
        assert_eq!(wire.len(), expected, "{version:?} {suite}");
        let opened = open_all(&mut rx, wire);
        assert_eq!(
            opened,
            vec![
                (APPLICATION_DATA, b"GET / HTTP/1.1\r\n\r\n".to_vec()),
                (APPLICATION_DATA, b"second".to_vec())
            ],
            "{version:?} {suite}"
        );
        assert_eq!((tx.seq(), rx.seq()), (7, 7));
    }
}

#[test]
fn large_writes_split_into_full_records() {
    for (version, suite) in all() {
        let (mut tx, mut rx) = pair(version, suite);
        let content: Vec<u8> = (0..40_000u32).map(|i| i as u8).collect();
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, &content, &mut wire).unwrap();
        let opened = open_all(&mut rx, wire);
        let sizes: Vec<usize> = opened.iter().map(|(_, c)| c.len()).collect();
        assert_eq!(sizes, vec![16_384, 16_384, 7_232]);
        let joined: Vec<u8> = opened.into_iter().flat_map(|(_, c)| c).collect();
        assert_eq!(joined, content);
    }
}

#[test]
fn incomplete_records_wait_and_tampered_ones_fail() {
    for (version, suite) in all() {
        let (mut tx, mut rx) = pair(version, suite);
        let mut wire = Vec::new();
        tx.seal(APPLICATION_DATA, b"hello", &mut wire).unwrap();
        for cut in [0, 3, HEADER_LEN, wire.len() - 1] {
            assert_eq!(rx.open(&mut wire.clone()[..cut]), Ok(None));
        }
        let mut bad = wire.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(rx.open(&mut bad), Err(RecordError::BadRecord));
    }
}

#[test]
fn wrong_sequence_or_key_fails() {
    let (mut tx, mut rx) = pair(Version::Tls13, 0);
    let mut wire = Vec::new();
    tx.seal(APPLICATION_DATA, b"one", &mut wire).unwrap();
    let mut skipped = Vec::new();
    tx.seal(APPLICATION_DATA, b"two", &mut skipped).unwrap();
    // Reordered: the receiver expects the first record's number.
    assert_eq!(rx.open(&mut skipped), Err(RecordError::BadRecord));
    let mut other = keys(Version::Tls13, 1, 5);
    assert_eq!(other.open(&mut wire), Err(RecordError::BadRecord));
}

#[test]
fn tls13_inner_type_and_padding() {
    let (mut tx, mut rx) = pair(Version::Tls13, 2);
    let mut wire = Vec::new();
    tx.seal(ALERT, &[1, 0], &mut wire).unwrap();
    assert_eq!(open_all(&mut rx, wire), vec![(ALERT, vec![1, 0])]);
    // An unprotected change_cipher_spec is skipped; another clear type is refused.
    let mut ccs = [CHANGE_CIPHER_SPEC, 3, 3, 0, 1, 1];
    let opened = rx.open(&mut ccs).unwrap().unwrap();
    assert_eq!((opened.len, opened.plain.len()), (6, 0));
    let mut clear = [
        HANDSHAKE, 3, 3, 0, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    assert_eq!(
        rx.open(&mut clear),
        Err(RecordError::UnexpectedType(HANDSHAKE))
    );
}

#[test]
fn oversized_records_and_exhausted_keys_are_refused() {
    let (_, mut rx) = pair(Version::Tls13, 0);
    let mut huge = [APPLICATION_DATA, 3, 3, 0x48, 0x01];
    assert_eq!(rx.open(&mut huge), Err(RecordError::TooLong(0x4801)));
    let mut tx = keys(Version::Tls13, 0, RECORD_LIMIT);
    assert_eq!(
        tx.seal(APPLICATION_DATA, b"x", &mut Vec::new()),
        Err(RecordError::Exhausted)
    );
}

#[test]
fn sealing_into_a_buffer_with_room_does_not_grow_it() {
    let (mut tx, _) = pair(Version::Tls12, 0);
    let mut out = Vec::with_capacity(tx.sealed_len(1000));
    let cap = out.capacity();
    tx.seal(APPLICATION_DATA, &[9; 1000], &mut out).unwrap();
    assert_eq!(out.capacity(), cap);
}
