use super::*;

fn b64(s: &[u8]) -> String {
    STANDARD.encode(s)
}

fn kv(key: &str, value: &[u8], rev: i64, lease: i64) -> Kv {
    Kv {
        key: key.into(),
        value: value.to_vec(),
        mod_revision: rev,
        lease,
    }
}

#[test]
fn prefix_end_follows_etcd() {
    let cases: &[(&[u8], &[u8])] = &[
        (b"a", b"b"),
        (b"/workers/", b"/workers0"),
        (b"a\xff", b"b"),
        (b"a\xfe\xff\xff", b"a\xff"),
        (b"\xff\xff", b"\0"),
        (b"", b"\0"),
    ];
    for (prefix, end) in cases {
        assert_eq!(prefix_end(prefix), *end, "prefix {prefix:?}");
    }
}

#[test]
fn request_bodies() {
    let range: serde_json::Value = serde_json::from_slice(&range_body("/w/")).unwrap();
    assert_eq!(range["key"], b64(b"/w/"));
    assert_eq!(range["range_end"], b64(b"/w0"));
    let all: serde_json::Value = serde_json::from_slice(&range_body("")).unwrap();
    assert_eq!(all["key"], b64(b"\0"));
    assert_eq!(all["range_end"], b64(b"\0"));
    let count: serde_json::Value = serde_json::from_slice(&count_body("/w/")).unwrap();
    assert_eq!(count["key"], b64(b"/w/"));
    assert_eq!(count["range_end"], b64(b"/w0"));
    assert_eq!(count["count_only"], true);
    let watch: serde_json::Value = serde_json::from_slice(&watch_body("/w/", 42)).unwrap();
    let create = &watch["create_request"];
    assert_eq!(create["key"], b64(b"/w/"));
    assert_eq!(create["range_end"], b64(b"/w0"));
    assert_eq!(create["start_revision"], "42");
}

#[test]
fn range_table() {
    let k = b64(b"/w/a");
    let v = b64(b"http://10.0.0.1:8000");
    type Case = (String, Result<(i64, Vec<Kv>), ()>);
    let cases: Vec<Case> = vec![
        (r#"{"header":{"revision":"1"}}"#.into(), Ok((1, vec![]))),
        (
            format!(
                r#"{{"header":{{"revision":"7"}},"kvs":[{{"key":"{k}","value":"{v}","mod_revision":"5","lease":"99"}},{{"key":"{k}","mod_revision":6}}],"count":"2"}}"#
            ),
            Ok((
                7,
                vec![
                    kv("/w/a", b"http://10.0.0.1:8000", 5, 99),
                    kv("/w/a", b"", 6, 0),
                ],
            )),
        ),
        // A key that is not UTF-8 is skipped.
        (
            format!(
                r#"{{"header":{{"revision":"3"}},"kvs":[{{"key":"{}","value":"{v}"}}]}}"#,
                b64(b"/w/\xff")
            ),
            Ok((3, vec![])),
        ),
        (r#"{"kvs":[]}"#.into(), Err(())),
        (r#"{"header":{}}"#.into(), Err(())),
        (r#"{"header":{"revision":"x1"}}"#.into(), Err(())),
        (
            r#"{"header":{"revision":"2"},"kvs":[{"key":"!!!"}]}"#.into(),
            Err(()),
        ),
        (
            format!(r#"{{"header":{{"revision":"2"}},"kvs":[{{"key":"{k}","value":"%%"}}]}}"#),
            Err(()),
        ),
        (
            r#"{"header":{"revision":"2"},"kvs":[{"value":"eA=="}]}"#.into(),
            Err(()),
        ),
        (r#"{"header":{"revision":"2"},"kvs":{}}"#.into(), Err(())),
        (r#"{"error":"bad","code":3}"#.into(), Err(())),
        ("not json".into(), Err(())),
        (String::new(), Err(())),
    ];
    for (body, want) in cases {
        assert_eq!(
            decode_range(body.as_bytes()).map_err(|_| ()),
            want,
            "{body}"
        );
    }
}

#[test]
fn watch_table() {
    let k = b64(b"/w/a");
    let put = format!(r#"{{"kv":{{"key":"{k}","value":"eA==","mod_revision":"5"}}}}"#);
    let del = format!(r#"{{"type":"DELETE","kv":{{"key":"{k}","mod_revision":"6"}}}}"#);
    let head = r#""header":{"revision":"6"}"#;
    let events = |events: Vec<Event>| {
        Ok(WatchMsg::Events {
            revision: 6,
            events,
        })
    };
    let cases: Vec<(String, Result<WatchMsg, EtcdError>)> = vec![
        (
            format!(r#"{{"result":{{{head},"created":true}}}}"#),
            Ok(WatchMsg::Created),
        ),
        (
            format!(r#"{{"result":{{{head},"events":[{put},{del}]}}}}"#),
            events(vec![
                Event::Put(kv("/w/a", b"x", 5, 0)),
                Event::Delete {
                    key: "/w/a".into(),
                    mod_revision: 6,
                },
            ]),
        ),
        (
            format!(r#"{{"result":{{{head},"events":[{}]}}}}"#, put.replace("{\"kv\"", "{\"type\":\"PUT\",\"kv\"")),
            events(vec![Event::Put(kv("/w/a", b"x", 5, 0))]),
        ),
        // A progress notification: no events.
        (format!(r#"{{"result":{{{head}}}}}"#), events(vec![])),
        (
            r#"{"result":{"header":{},"canceled":true,"compact_revision":"3"}}"#.into(),
            Err(EtcdError::Compacted(3)),
        ),
        (
            r#"{"result":{"header":{"revision":"9"},"canceled":true,"cancel_reason":"gone"}}"#
                .into(),
            Err(EtcdError::Server("watch canceled: gone".into())),
        ),
        (
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"no leader","http_status":"Service Unavailable"}}"#.into(),
            Err(EtcdError::Server("no leader".into())),
        ),
        (
            r#"{"error":"boom"}"#.into(),
            Err(EtcdError::Server("boom".into())),
        ),
    ];
    for (object, want) in cases {
        assert_eq!(decode_watch(object.as_bytes()), want, "{object}");
    }
}

#[test]
fn watch_garbage_is_an_error() {
    let k = b64(b"/w/a");
    for object in [
        String::new(),
        "{".into(),
        "[]".into(),
        r#"{"other":1}"#.into(),
        r#"{"result":{"events":[]}}"#.into(),
        r#"{"result":{"header":{"revision":"2"},"events":[{"type":"PUT"}]}}"#.into(),
        format!(
            r#"{{"result":{{"header":{{"revision":"2"}},"events":[{{"type":"MOVE","kv":{{"key":"{k}"}}}}]}}}}"#
        ),
        r#"{"result":{"header":{"revision":"2"},"events":[{"kv":{"key":"*"}}]}}"#.into(),
        r#"{"result":{"header":{"revision":"2"},"canceled":true,"compact_revision":"z"}}"#.into(),
        r#"{"result":{"header":{"revision":2.5}}}"#.into(),
    ] {
        assert!(decode_watch(object.as_bytes()).is_err(), "{object}");
    }
}
