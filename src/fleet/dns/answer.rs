//! The pure half of a lookup: the query message, whether a reply answers it, the reply's
//! response code, and the addresses and SRV targets it carries. No I/O.

use std::net::{IpAddr, SocketAddr};

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use super::DnsError;

/// How many CNAME links are followed before the chain is cut (loops, long chains).
const MAX_CNAME_LINKS: usize = 16;

/// `name` as a fully qualified DNS name (a trailing dot is added where missing).
pub fn fqdn(name: &str) -> Result<Name, DnsError> {
    let mut parsed =
        Name::from_ascii(name).map_err(|e| DnsError::Other(format!("bad name `{name}`: {e}")))?;
    parsed.set_fqdn(true);
    Ok(parsed)
}

/// The wire bytes of a standard query for `name`'s `rtype` records, recursion desired.
pub fn query_bytes(id: u16, name: &Name, rtype: RecordType) -> Result<Vec<u8>, DnsError> {
    let mut msg = Message::new(id, MessageType::Query, OpCode::Query);
    msg.metadata.recursion_desired = true;
    msg.add_query(Query::query(name.clone(), rtype));
    msg.to_vec()
        .map_err(|e| DnsError::Other(format!("encoding the query: {e}")))
}

/// A message decoded from wire bytes; `None` when they are not one.
pub fn decode(bytes: &[u8]) -> Option<Message> {
    Message::from_vec(bytes).ok()
}

/// Whether `msg` is the response to our query `id` for `name`'s `rtype` records.
pub fn answers(msg: &Message, id: u16, name: &Name, rtype: RecordType) -> bool {
    msg.metadata.message_type == MessageType::Response
        && msg.metadata.id == id
        && msg.queries.len() == 1
        && msg.queries[0].query_type() == rtype
        && msg.queries[0].name() == name
}

/// NOERROR is an answer (possibly empty); NXDOMAIN says the name does not exist; every
/// other code is the server's failure (SERVFAIL, REFUSED, ...).
pub fn check_rcode(msg: &Message, name: &str) -> Result<(), DnsError> {
    match msg.metadata.response_code {
        ResponseCode::NoError => Ok(()),
        ResponseCode::NXDomain => Err(DnsError::NoSuchName {
            name: name.to_owned(),
        }),
        rcode => Err(DnsError::Server {
            name: name.to_owned(),
            rcode: rcode.to_string(),
        }),
    }
}

/// `name` and every name its CNAME chain in `records` leads to.
fn chain<'a>(name: &Name, records: impl Iterator<Item = &'a Record> + Clone) -> Vec<Name> {
    let mut names = vec![name.clone()];
    for _ in 0..MAX_CNAME_LINKS {
        let next = records.clone().find_map(|r| match &r.data {
            RData::CNAME(target) if names.contains(&r.name) && !names.contains(&target.0) => {
                Some(target.0.clone())
            }
            _ => None,
        });
        match next {
            Some(target) => names.push(target),
            None => break,
        }
    }
    names
}

/// The A and AAAA addresses of `names` among `records`.
fn addrs_of<'a>(names: &[Name], records: impl Iterator<Item = &'a Record>) -> Vec<IpAddr> {
    records
        .filter(|r| names.contains(&r.name))
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(aaaa) => Some(IpAddr::V6(aaaa.0)),
            _ => None,
        })
        .collect()
}

/// The addresses the answer section gives `name` (directly or through its CNAMEs), with
/// `port`; records for other names do not count.
pub fn answer_addrs(msg: &Message, name: &Name, port: u16) -> Vec<SocketAddr> {
    let names = chain(name, msg.answers.iter());
    addrs_of(&names, msg.answers.iter())
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// One SRV record of the queried name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrvRecord {
    /// The target, fully qualified.
    pub target: Name,
    pub port: u16,
    /// The target's addresses found in the same reply (answer or additional section).
    pub known: Vec<IpAddr>,
}

/// The SRV records of `name` (or its CNAME targets) in `msg`, with each target's
/// addresses from the reply. A target of "." (the service is explicitly unavailable)
/// gives no record.
pub fn srv_records(msg: &Message, name: &Name) -> Vec<SrvRecord> {
    let names = chain(name, msg.answers.iter());
    let everything = msg.answers.iter().chain(msg.additionals.iter());
    msg.answers
        .iter()
        .filter(|r| names.contains(&r.name))
        .filter_map(|r| match &r.data {
            RData::SRV(srv) if !srv.target.is_root() => Some(srv),
            _ => None,
        })
        .map(|srv| {
            let targets = chain(&srv.target, everything.clone());
            SrvRecord {
                target: srv.target.clone(),
                port: srv.port,
                known: addrs_of(&targets, everything.clone()),
            }
        })
        .collect()
}

/// A target name as configs and logs write it: no trailing dot.
pub fn host_text(name: &Name) -> String {
    let text = name.to_ascii();
    match text.strip_suffix('.') {
        Some(host) if !host.is_empty() => host.to_owned(),
        _ => text,
    }
}

#[cfg(test)]
mod tests;
