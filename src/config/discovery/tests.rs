use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, &Overrides::default())
}

const DNS: &str = "[[models]]\nname = \"m\"\n[models.dns]\nname = \"engines.svc.local.\"\nport = 8000\nserver = \"127.0.0.1:5353\"\n[models.discovered]\nengine_request_limit = 4\ndp_size = 2\n";

const ETCD: &str = "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:9\"\nname = \"listed\"\n[models.etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\nprefix = \"/w/m/\"\n";

#[test]
fn sources_parse() {
    let c = parse(DNS).unwrap();
    let d = c.models[0].discovery.as_ref().unwrap();
    assert_eq!(
        d.source,
        DiscoverySource::Dns {
            name: "engines.svc.local".into(),
            port: Some(8000),
            server: Some(HostPort::parse("127.0.0.1:5353").unwrap()),
            interval_ms: DEFAULT_DNS_INTERVAL_MS,
            nxdomain_hold_ms: DEFAULT_DNS_NXDOMAIN_HOLD_MS,
        }
    );
    assert_eq!(d.template.engine_request_limit, Some(4));
    let held = parse(&DNS.replace("port = 8000\n", "port = 8000\nnxdomain_hold_ms = 0\n")).unwrap();
    let DiscoverySource::Dns {
        nxdomain_hold_ms, ..
    } = &held.models[0].discovery.as_ref().unwrap().source
    else {
        panic!("dns")
    };
    assert_eq!(*nxdomain_hold_ms, 0);
    assert_eq!(d.template.dp_size, 2);
    assert!(c.models[0].workers.is_empty() && c.workers.is_empty());
    let srv = parse(&DNS.replace(
        "port = 8000\nserver = \"127.0.0.1:5353\"",
        "srv = true\nserver = \"::1\"",
    ))
    .unwrap();
    let DiscoverySource::Dns { port, server, .. } =
        &srv.models[0].discovery.as_ref().unwrap().source
    else {
        panic!("dns")
    };
    assert_eq!((*port, server.as_ref().unwrap().port), (None, 53));
    let c = parse(ETCD).unwrap();
    assert_eq!(
        c.models[0].discovery.as_ref().unwrap().source.kind(),
        "etcd"
    );
    assert_eq!(c.models[0].workers, vec![0]);
}

#[test]
fn source_errors() {
    let cases: &[(&str, &str)] = &[
        (
            &DNS.replace("port = 8000\n", ""),
            "models[0].dns (line 4): set `port`",
        ),
        (
            &DNS.replace("port = 8000\n", "port = 8000\nsrv = true\n"),
            "set `port` or `srv = true`, not both",
        ),
        (
            &DNS.replace("port = 8000", "port = 0"),
            "models[0].dns.port (line 5): must be from 1 to 65535",
        ),
        (
            &DNS.replace("127.0.0.1:5353", "dns.local"),
            "models[0].dns.server (line 6): must be an IP address",
        ),
        (
            &DNS.replace("dp_size = 2", "url = \"http://a:1\""),
            "models[0].discovered.url (line 9): a found worker's URL",
        ),
        (
            &DNS.replace("dp_size = 2", "request_queue_limit = 1"),
            "models[0].discovered.request_queue_limit (line 9): must be at least 2",
        ),
        (
            &ETCD.replace("[\"http://127.0.0.1:2379\"]", "[]"),
            "models[0].etcd.endpoints (line 7): must name at least one",
        ),
        (
            &ETCD.replace("http://127.0.0.1:2379", "127.0.0.1:2379"),
            "must start with http://",
        ),
        (
            &ETCD.replace("\"/w/m/\"", "\"\""),
            "models[0].etcd.prefix (line 8): must not be empty",
        ),
        (
            &format!("{ETCD}[models.dns]\nname = \"x\"\nport = 1\n"),
            "a model finds workers with one source",
        ),
        (
            "[[models]]\nname = \"m\"\n[models.discovered]\ndp_size = 1\n",
            "add a `dns` or `etcd` source",
        ),
        (
            "[[models]]\nname = \"m\"\n",
            "has no workers (list some, or find them",
        ),
        (
            "[[models]]\nname = \"m\"\n[[models.workers]]\nname = \"a\"\n",
            "models[0].workers[0].url: missing",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}\n=> {e}\n(want {want})");
    }
}

#[test]
fn nats_settings() {
    let base = "[nats]\nurl = \"nats://127.0.0.1\"\nsubscribe = \"load.>\"\n";
    let c = parse(base).unwrap();
    let n = c.nats.unwrap();
    assert_eq!(n.server.to_string(), "127.0.0.1:4222");
    assert_eq!((n.subscribe.as_deref(), n.publish), (Some("load.>"), None));
    let c = parse("[nats]\nurl = \"nats.local:4300\"\npublish = \"load.node-a\"\npublish_as = \"node-a\"\npublish_interval_ms = 20\n").unwrap();
    let n = c.nats.unwrap();
    assert_eq!(
        (
            n.server.port,
            n.publish_interval_ms,
            n.publish_as.as_deref()
        ),
        (4300, 20, Some("node-a"))
    );
    let c = parse("[nats]\nurl = \"127.0.0.1\"\nreplica_sync = \"spillway.routed\"\n").unwrap();
    let n = c.nats.unwrap();
    assert_eq!(
        (n.replica_sync.as_deref(), n.subscribe, n.publish),
        (Some("spillway.routed"), None, None)
    );
    let cases: &[(&str, &str)] = &[
        (
            "[nats]\nurl = \"nats://127.0.0.1\"\n",
            "nats (line 2): set at least one of `subscribe`, `publish` and `replica_sync`",
        ),
        (
            "[nats]\nurl = \"nats://\"\nsubscribe = \"a\"\n",
            "nats.url (line 2)",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\nsubscribe = \"a b\"\n",
            "nats.subscribe (line 3): must be a NATS subject",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\nsubscribe = \"load.*\"\npublish = \"load.a\"\n",
            "nats.publish (line 4): `load.a` is within `nats.subscribe`",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\npublish = \"a\"\npublish_interval_ms = 0\n",
            "nats.publish_interval_ms (line 4): must be greater than 0",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\nreplica_sync = \"routed.>\"\n",
            "nats.replica_sync (line 3): must be one subject, without wildcards",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\nsubscribe = \"load.>\"\nreplica_sync = \"load.routed\"\n",
            "nats.replica_sync (line 4): `load.routed` is within `nats.subscribe`",
        ),
        (
            "[nats]\nurl = \"127.0.0.1\"\npublish = \"x\"\nreplica_sync = \"x\"\n",
            "nats.replica_sync (line 4): `x` is within `nats.publish`",
        ),
    ];
    for (text, want) in cases {
        let e = parse(text).unwrap_err().to_string();
        assert!(e.contains(want), "{text}\n=> {e}\n(want {want})");
    }
}

#[test]
fn subjects_match_like_nats() {
    for (pattern, subject, hit) in [
        ("a.b", "a.b", true),
        ("a.*", "a.b", true),
        ("a.*", "a.b.c", false),
        ("a.>", "a.b.c", true),
        ("a.>", "a", false),
        (">", "a", true),
        ("a.b", "a.c", false),
        ("*.b", "a.b", true),
    ] {
        assert_eq!(
            subject_matches(pattern, subject),
            hit,
            "{pattern} {subject}"
        );
    }
}

#[test]
fn etcd_values() {
    let f = Found::from_etcd(
        "/w/m/e1",
        "/w/m/",
        br#"{"url":"http://10.0.0.1:8000","dp_size":8,"kv_total_blocks":4096,"engine_request_limit":32,"extra":{"x":1}}"#,
    )
    .unwrap();
    assert_eq!(
        (f.name.as_str(), f.endpoint.to_string()),
        ("e1", "10.0.0.1:8000".to_string())
    );
    assert_eq!(
        f.capacity,
        Capacity {
            dp_size: Some(8),
            kv_total_blocks: Some(4096),
            max_num_batched_tokens: None,
            engine_request_limit: Some(32)
        }
    );
    let named = Found::from_etcd(
        "/w/m/e1",
        "/w/m/",
        br#"{"url":"http://h:1","name":" eng "}"#,
    )
    .unwrap();
    assert_eq!(named.name, "eng");
    for (value, want) in [
        (&b"not json"[..], "key `/w/m/e1`: expected"),
        (br#"{"name":"a"}"#, "missing field `url`"),
        (
            br#"{"url":"ftp://h:1"}"#,
            "must start with http:// or https://",
        ),
        (
            br#"{"url":"http://h:1","dp_size":0}"#,
            "dp_size must be between 1 and",
        ),
        (
            br#"{"url":"http://h:1","engine_request_limit":0}"#,
            "engine_request_limit must be at least 1",
        ),
        (br#"{"url":"http://h:1","dp_size":-1}"#, "invalid value"),
    ] {
        let e = Found::from_etcd("/w/m/e1", "/w/m/", value).unwrap_err();
        assert!(e.contains(want), "{e} (want {want})");
    }
    assert!(
        Found::from_etcd("/w/m/", "/w/m/", br#"{"url":"http://h:1"}"#)
            .unwrap_err()
            .contains("no name")
    );
}

/// Issue 26, item 9: an etcd value whose URL has credentials leaves its worker out, and
/// the reason (logged as the warning "etcd worker entry ignored") never shows them.
#[test]
fn etcd_value_with_credentials_is_refused_without_showing_them() {
    for value in [
        &br#"{"url":"http://user:s3cr3t@10.0.0.1:8000"}"#[..],
        br#"{"url":"https://s3cr3t@10.0.0.1"}"#,
        br#"{"url":"http://user:s3cr3t@10.0.0.1:8000/base","dp_size":2}"#,
    ] {
        let e = Found::from_etcd("/w/m/e1", "/w/m/", value).unwrap_err();
        assert!(
            e.starts_with("key `/w/m/e1`: `http") && e.contains("://***@10.0.0.1"),
            "{e}"
        );
        assert!(
            e.contains("credentials in a worker URL are not supported"),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "{e}");
    }
}

fn found(name: &str, port: u16) -> (Found, SocketAddr) {
    let endpoint = HostPort::parse(&format!("127.0.0.1:{port}")).unwrap();
    let mut f = Found::at(endpoint);
    f.name = name.into();
    f.capacity.dp_size = Some(4);
    (f, format!("127.0.0.1:{port}").parse().unwrap())
}

#[test]
fn found_workers_join_after_listed_ones() {
    let c = parse(&format!(
        "{ETCD}[models.discovered]\nengine_request_limit = 8\n"
    ))
    .unwrap();
    let addrs = Addrs::literals(&c).unwrap();
    let mut map = BTreeMap::new();
    // A second model's source cannot take `listed`'s name for another endpoint.
    map.insert(
        "m".to_string(),
        vec![found("a", 10), found("b", 11), found("listed", 12)],
    );
    map.insert("gone".to_string(), vec![found("z", 13)]);
    let (next, next_addrs, skipped) = c.with_found(&addrs, &map);
    let names: Vec<&str> = next.models[0]
        .workers
        .iter()
        .map(|&i| next.workers[i].name.as_str())
        .collect();
    assert_eq!(names, ["listed", "a", "b"]);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert!(skipped[0].contains("`listed`"));
    assert_eq!(next.workers.len(), next_addrs.workers.len());
    let a = &next.workers[1];
    assert_eq!(
        (a.url.as_str(), a.dp_size, a.engine_request_limit),
        ("http://127.0.0.1:10", 4, Some(8))
    );
    assert_eq!(next_addrs.workers[2].addr, "127.0.0.1:11".parse().unwrap());
    assert_eq!(next_addrs.workers[2].metrics, next_addrs.workers[2].addr);
    // Nothing found: the file's configuration unchanged.
    let (same, _, none) =
        c.with_found(&addrs, &BTreeMap::<String, Vec<(Found, SocketAddr)>>::new());
    assert_eq!((same, none.len()), (c, 0));
}
