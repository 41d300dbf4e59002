use super::*;

const MAX: usize = 1024;

fn msg<'a>(
    subject: &'a str,
    sid: u64,
    reply_to: Option<&'a str>,
    payload: &'a [u8],
) -> ServerOp<'a> {
    ServerOp::Msg {
        subject,
        sid,
        reply_to,
        payload,
    }
}

#[test]
fn wire_table() {
    let complete: &[(&[u8], ServerOp<'_>, usize)] = &[
        (b"PING\r\n", ServerOp::Ping, 6),
        (b"ping\r\n", ServerOp::Ping, 6),
        (b"PONG\r\nPING\r\n", ServerOp::Pong, 6),
        (b"pOnG \r\n", ServerOp::Pong, 7),
        (b"+OK\r\n", ServerOp::Ok, 5),
        (
            b"-ERR 'Unknown Protocol Operation'\r\n",
            ServerOp::Err("Unknown Protocol Operation"),
            35,
        ),
        (b"-err 'x'\r\n", ServerOp::Err("x"), 10),
        (
            b"INFO {\"max_payload\":5}\r\n",
            ServerOp::Info("{\"max_payload\":5}"),
            24,
        ),
        (b"info\t{}\r\n", ServerOp::Info("{}"), 9),
        (b"MSG a.b 1 3\r\nabc\r\n", msg("a.b", 1, None, b"abc"), 18),
        (
            b"msg a.b 9 r.1 3\r\nabc\r\n",
            msg("a.b", 9, Some("r.1"), b"abc"),
            22,
        ),
        (b"MSG  a  2\t0\r\n\r\n", msg("a", 2, None, b""), 15),
        (b"MSG a 1 2\r\n\r\n\r\n", msg("a", 1, None, b"\r\n"), 15),
    ];
    for (input, want, used) in complete {
        let got = parse(input, MAX).unwrap_or_else(|e| panic!("{input:?}: {e}"));
        assert_eq!(
            got,
            Some((want.clone(), *used)),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    let partial: &[&[u8]] = &[
        b"",
        b"PI",
        b"PING\r",
        b"MSG a 1 3\r\nab",
        b"MSG a 1 3\r\nabc\r",
        b"INFO {",
    ];
    for input in partial {
        assert_eq!(
            parse(input, MAX),
            Ok(None),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    let refused: &[&[u8]] = &[
        b"\r\n",
        b"PING\n",
        b"\n",
        b"BOGUS\r\n",
        b"PINGX\r\n",
        b"PING x\r\n",
        b"INFO\r\n",
        b"HMSG a 1 10 12\r\n",
        b"MSG a 1\r\n",
        b"MSG a 1 r 3 x\r\nabc\r\n",
        b"MSG a x 3\r\nabc\r\n",
        b"MSG a 1 -3\r\nabc\r\n",
        b"MSG a 1 1025\r\n",
        b"MSG a 1 99999999999999999999999\r\n",
        b"MSG a 1 3\r\nabcd\r\n",
        b"MSG \xff 1 0\r\n\r\n",
    ];
    for input in refused {
        assert!(
            parse(input, MAX).is_err(),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn control_line_is_bounded() {
    let mut long = b"INFO ".to_vec();
    long.resize(MAX_CONTROL_LINE, b'x');
    assert_eq!(parse(&long, MAX), Ok(None));
    long.extend_from_slice(b"\r\n");
    assert!(matches!(
        parse(&long, MAX),
        Ok(Some((ServerOp::Info(_), _)))
    ));
    let mut too_long = long[..MAX_CONTROL_LINE].to_vec();
    too_long.extend_from_slice(b"xx");
    assert!(parse(&too_long, MAX).is_err());
    assert!(parse(&vec![b'x'; 1 << 20], MAX).is_err());
}

#[test]
fn payload_bound_is_the_callers() {
    let input = b"MSG a 1 5\r\nhello\r\n";
    assert!(parse(input, 4).is_err());
    assert!(parse(input, 5).unwrap().is_some());
}

/// Every op of a buffer, parsed as it arrives cut at `cut`.
fn ops_cut_at(stream: &[u8], cut: usize) -> Vec<String> {
    let mut buf = Vec::new();
    let mut ops = Vec::new();
    for piece in [&stream[..cut], &stream[cut..]] {
        buf.extend_from_slice(piece);
        while let Some((op, used)) = parse(&buf, MAX).unwrap() {
            ops.push(format!("{op:?}"));
            buf.drain(..used);
        }
    }
    assert!(buf.is_empty(), "left over at cut {cut}");
    ops
}

#[test]
fn splits_at_every_byte() {
    let stream: &[u8] = b"INFO {\"server_id\":\"x\"}\r\n+OK\r\nPING\r\nMSG load.a 1 5\r\nhello\r\n\
        MSG load.b 1 inbox.7 0\r\n\r\nPONG\r\n-ERR 'Stale Connection'\r\nMSG x 2 2\r\n\r\n\r\n";
    let whole = ops_cut_at(stream, stream.len());
    assert_eq!(whole.len(), 8);
    for cut in 0..=stream.len() {
        assert_eq!(ops_cut_at(stream, cut), whole, "cut at {cut}");
    }
}

#[test]
fn subjects_are_validated() {
    for ok in ["a", "load.>", "load.*.x", "_INBOX.1"] {
        assert!(validate_subject(ok).is_ok(), "{ok}");
    }
    for refused in ["", "a b", "a\tb", "a\r\n", "a\0"] {
        assert!(validate_subject(refused).is_err(), "{refused:?}");
    }
    assert!(validate_subject(&"a".repeat(MAX_CONTROL_LINE)).is_err());
}

#[test]
fn writes() {
    let mut out = Vec::new();
    write_sub(&mut out, "load.>", 1).unwrap();
    write_pub(&mut out, "load.a", b"hi").unwrap();
    write_pub(&mut out, "e", b"").unwrap();
    out.extend_from_slice(PING);
    assert_eq!(
        out,
        b"SUB load.> 1\r\nPUB load.a 2\r\nhi\r\nPUB e 0\r\n\r\nPING\r\n"
    );
    assert!(write_pub(&mut out, "a b", b"").is_err());
    assert!(write_sub(&mut out, "", 1).is_err());

    let mut connect = Vec::new();
    write_connect(&mut connect, "edge \"1\"", "0.1.0");
    let line = std::str::from_utf8(&connect).unwrap();
    let json = line
        .strip_prefix("CONNECT ")
        .unwrap()
        .strip_suffix("\r\n")
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["name"], "edge \"1\"");
    assert_eq!(v["verbose"], false);
    assert_eq!(v["pedantic"], false);
    assert_eq!(v["echo"], false);
    assert_eq!(v["headers"], false);
    assert_eq!(v["protocol"], 1);
    assert_eq!(v["lang"], "rust");
}

#[test]
fn info_payload_bound() {
    assert_eq!(info_max_payload("{\"max_payload\":2048}"), Ok(2048));
    assert_eq!(info_max_payload("{}"), Ok(DEFAULT_MAX_PAYLOAD));
    assert_eq!(
        info_max_payload("{\"max_payload\":1e30}"),
        Ok(DEFAULT_MAX_PAYLOAD)
    );
    assert_eq!(
        info_max_payload("{\"max_payload\":18446744073709551615}"),
        Ok(MAX_PAYLOAD_CEILING)
    );
    assert!(info_max_payload("nope").is_err());
}
