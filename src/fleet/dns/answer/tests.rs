use super::*;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SRV};
use std::net::{Ipv4Addr, Ipv6Addr};

fn n(s: &str) -> Name {
    fqdn(s).unwrap()
}

fn a(name: &str, ip: [u8; 4]) -> Record {
    Record::from_rdata(n(name), 30, RData::A(A(Ipv4Addr::from(ip))))
}

fn aaaa(name: &str, ip: &str) -> Record {
    let ip: Ipv6Addr = ip.parse().unwrap();
    Record::from_rdata(n(name), 30, RData::AAAA(AAAA(ip)))
}

fn cname(name: &str, target: &str) -> Record {
    Record::from_rdata(n(name), 30, RData::CNAME(CNAME(n(target))))
}

fn srv(name: &str, target: &str, port: u16) -> Record {
    Record::from_rdata(n(name), 30, RData::SRV(SRV::new(0, 5, port, n(target))))
}

/// A reply to `id`'s `rtype` question for `name`, through the wire and back.
fn reply(
    id: u16,
    name: &str,
    rtype: RecordType,
    answers: Vec<Record>,
    extra: Vec<Record>,
) -> Message {
    let mut msg = Message::response(id, OpCode::Query);
    msg.add_query(Query::query(n(name), rtype));
    msg.add_answers(answers);
    msg.add_additionals(extra);
    decode(&msg.to_vec().unwrap()).unwrap()
}

fn sock(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn query_round_trips_with_recursion_desired() {
    let bytes = query_bytes(0x1234, &n("svc.test"), RecordType::AAAA).unwrap();
    let msg = decode(&bytes).unwrap();
    assert_eq!(msg.metadata.id, 0x1234);
    assert_eq!(msg.metadata.message_type, MessageType::Query);
    assert!(msg.metadata.recursion_desired);
    assert_eq!(msg.queries.len(), 1);
    assert_eq!(msg.queries[0].name(), &n("svc.test."));
    assert_eq!(msg.queries[0].query_type(), RecordType::AAAA);
}

#[test]
fn fqdn_adds_the_root_and_rejects_garbage() {
    assert_eq!(fqdn("a.test").unwrap(), fqdn("a.test.").unwrap());
    assert!(fqdn("a.test").unwrap().is_fqdn());
    assert!(fqdn("a..test").is_err());
}

#[test]
fn reply_must_match_id_name_type_and_be_a_response() {
    let msg = reply(7, "a.test", RecordType::A, vec![], vec![]);
    assert!(answers(&msg, 7, &n("a.test"), RecordType::A));
    assert!(
        answers(&msg, 7, &n("A.TEST"), RecordType::A),
        "names compare case-blind"
    );
    assert!(!answers(&msg, 8, &n("a.test"), RecordType::A));
    assert!(!answers(&msg, 7, &n("b.test"), RecordType::A));
    assert!(!answers(&msg, 7, &n("a.test"), RecordType::AAAA));
    let mut query = msg.clone();
    query.metadata.message_type = MessageType::Query;
    assert!(!answers(&query, 7, &n("a.test"), RecordType::A));
}

#[test]
fn rcodes_map_to_errors() {
    let with = |rcode| {
        let mut msg = reply(1, "a.test", RecordType::A, vec![], vec![]);
        msg.metadata.response_code = rcode;
        check_rcode(&msg, "a.test")
    };
    assert_eq!(with(ResponseCode::NoError), Ok(()));
    assert_eq!(
        with(ResponseCode::NXDomain),
        Err(DnsError::NoSuchName {
            name: "a.test".into()
        })
    );
    for rcode in [ResponseCode::ServFail, ResponseCode::Refused] {
        let Err(DnsError::Server { name, rcode: text }) = with(rcode) else {
            panic!("{rcode:?} is a server error");
        };
        assert_eq!(name, "a.test");
        assert_eq!(text, rcode.to_string());
    }
}

#[test]
fn addresses_of_the_name_only() {
    let msg = reply(
        1,
        "a.test",
        RecordType::A,
        vec![
            a("a.test", [10, 0, 0, 1]),
            a("other.test", [10, 0, 0, 9]),
            aaaa("a.test", "::1"),
        ],
        vec![],
    );
    let got = answer_addrs(&msg, &n("a.test"), 80);
    assert_eq!(got, vec![sock("10.0.0.1:80"), sock("[::1]:80")]);
    let empty = reply(1, "a.test", RecordType::A, vec![], vec![]);
    assert!(answer_addrs(&empty, &n("a.test"), 80).is_empty());
}

#[test]
fn cname_chains_are_followed_and_loops_end() {
    let msg = reply(
        1,
        "www.test",
        RecordType::A,
        vec![
            cname("www.test", "mid.test"),
            cname("mid.test", "real.test"),
            a("real.test", [10, 0, 0, 2]),
            a("unrelated.test", [10, 0, 0, 3]),
        ],
        vec![],
    );
    assert_eq!(
        answer_addrs(&msg, &n("www.test"), 8080),
        vec![sock("10.0.0.2:8080")]
    );
    let looped = reply(
        1,
        "x.test",
        RecordType::A,
        vec![cname("x.test", "y.test"), cname("y.test", "x.test")],
        vec![],
    );
    assert!(answer_addrs(&looped, &n("x.test"), 1).is_empty());
}

#[test]
fn srv_targets_take_additional_addresses() {
    let msg = reply(
        1,
        "_http._tcp.svc.test",
        RecordType::SRV,
        vec![
            srv("_http._tcp.svc.test", "w1.test", 8001),
            srv("_http._tcp.svc.test", "w2.test", 8002),
            srv("_other._tcp.svc.test", "w3.test", 8003),
        ],
        vec![a("w1.test", [10, 0, 0, 1]), aaaa("w1.test", "::1")],
    );
    let got = srv_records(&msg, &n("_http._tcp.svc.test"));
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].target, n("w1.test"));
    assert_eq!(got[0].port, 8001);
    assert_eq!(
        got[0].known,
        vec![
            "10.0.0.1".parse::<IpAddr>().unwrap(),
            "::1".parse().unwrap()
        ]
    );
    assert_eq!(got[1].target, n("w2.test"));
    assert!(got[1].known.is_empty(), "w2 must be looked up");
}

#[test]
fn srv_target_root_means_unavailable() {
    let msg = reply(
        1,
        "_none._tcp.test",
        RecordType::SRV,
        vec![Record::from_rdata(
            n("_none._tcp.test"),
            30,
            RData::SRV(SRV::new(0, 0, 0, Name::root())),
        )],
        vec![],
    );
    assert!(srv_records(&msg, &n("_none._tcp.test")).is_empty());
}

#[test]
fn host_text_drops_the_root_dot() {
    assert_eq!(host_text(&n("w1.test")), "w1.test");
    assert_eq!(host_text(&Name::root()), ".");
}
