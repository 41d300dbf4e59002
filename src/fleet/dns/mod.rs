//! DNS lookups for the `dns` worker source: A/AAAA (with a configured port) or SRV, asked
//! of one server over UDP (TCP when the answer is truncated). Messages are encoded and
//! decoded by `hickory-proto`; the pure part (query, matching, rcode, answer → addresses)
//! is in `answer`, the transport here: a connected UDP socket per query, one retry within
//! the timeout, TCP with a 2-byte length prefix when the reply has the TC bit.

mod answer;
mod resolv;

use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::Message;
use hickory_proto::rr::Name;
use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
use monoio::net::TcpStream;
use monoio::net::udp::UdpSocket;

pub use answer::{
    SrvRecord, answer_addrs, answers, check_rcode, decode, fqdn, query_bytes, srv_records,
};
pub use hickory_proto::rr::RecordType;
pub use resolv::parse_resolv_conf;

/// The largest reply read over UDP (without EDNS a server sends at most 512 bytes).
const UDP_READ_BUF: usize = 4096;

/// Why a lookup gave no answer. Every error keeps the source's last good membership.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("DNS server {server} did not answer within {timeout_ms} ms")]
    Timeout { server: SocketAddr, timeout_ms: u64 },
    #[error("`{name}` does not exist (NXDOMAIN)")]
    NoSuchName { name: String },
    #[error("DNS server answered {rcode} for `{name}`")]
    Server { name: String, rcode: String },
    #[error("DNS: {0}")]
    Other(String),
}

/// One SRV target, its address resolved: `host` is the SRV target name (no trailing dot).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrvTarget {
    pub host: String,
    pub addr: SocketAddr,
}

/// The A and AAAA records of `name` with `port`, sorted and deduplicated. A name that
/// exists with no address records is `Ok(vec![])`. Both queries run at once, each
/// bounded by `timeout`.
pub async fn lookup_addrs(
    server: SocketAddr,
    name: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, DnsError> {
    let qname = fqdn(name)?;
    let (v4, v6) = monoio::join!(
        query(server, &qname, RecordType::A, timeout),
        query(server, &qname, RecordType::AAAA, timeout)
    );
    let mut addrs = Vec::new();
    for msg in [v4?, v6?] {
        check_rcode(&msg, name)?;
        addrs.extend(answer_addrs(&msg, &qname, port));
    }
    addrs.sort_unstable();
    addrs.dedup();
    Ok(addrs)
}

/// The SRV records of `name`, each target's addresses taken from the answer's additional
/// section or else looked up (A and AAAA), sorted and deduplicated. A target of "."
/// gives nothing, and so does a target that does not exist. The whole lookup is bounded
/// by `timeout`.
pub async fn lookup_srv(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Vec<SrvTarget>, DnsError> {
    match monoio::time::timeout(timeout, srv(server, name, timeout)).await {
        Ok(found) => found,
        Err(_) => Err(timed_out(server, timeout)),
    }
}

async fn srv(
    server: SocketAddr,
    name: &str,
    timeout: Duration,
) -> Result<Vec<SrvTarget>, DnsError> {
    let qname = fqdn(name)?;
    let msg = query(server, &qname, RecordType::SRV, timeout).await?;
    check_rcode(&msg, name)?;
    let mut found = Vec::new();
    for record in srv_records(&msg, &qname) {
        let host = answer::host_text(&record.target);
        let addrs = if record.known.is_empty() {
            match lookup_addrs(server, &host, record.port, timeout).await {
                Ok(addrs) => addrs,
                Err(DnsError::NoSuchName { .. }) => Vec::new(),
                Err(e) => return Err(e),
            }
        } else {
            let port = record.port;
            record
                .known
                .iter()
                .map(|&ip| SocketAddr::new(ip, port))
                .collect()
        };
        found.extend(addrs.into_iter().map(|addr| SrvTarget {
            host: host.clone(),
            addr,
        }));
    }
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// The first `nameserver` of `/etc/resolv.conf` (port 53): where lookups go when the
/// config names no server.
pub fn system_server() -> Result<SocketAddr, DnsError> {
    const PATH: &str = "/etc/resolv.conf";
    let text = std::fs::read_to_string(PATH)
        .map_err(|e| DnsError::Other(format!("reading {PATH}: {e}")))?;
    parse_resolv_conf(&text)
        .map(|ip| SocketAddr::new(ip, 53))
        .ok_or_else(|| DnsError::Other(format!("{PATH} names no nameserver")))
}

fn timed_out(server: SocketAddr, timeout: Duration) -> DnsError {
    DnsError::Timeout {
        server,
        timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

thread_local! {
    static QUERIES: Cell<u16> = const { Cell::new(0) };
}

/// A query id no outsider predicts from the previous one alone: a per-thread counter
/// mixed with the socket's ephemeral port (no clock, no RNG crate).
fn next_id(local_port: u16) -> u16 {
    let n = QUERIES.with(|c| {
        let n = c.get().wrapping_add(1);
        c.set(n);
        n
    });
    let mixed = u32::from(n).wrapping_mul(0x9E37_79B9) ^ u32::from(local_port).rotate_left(11);
    (mixed ^ (mixed >> 16)) as u16
}

/// One question answered: over UDP (sent twice at most within `timeout`), then over TCP
/// when the UDP reply was truncated. The reply matches the question; its rcode is the
/// caller's to judge.
async fn query(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
    timeout: Duration,
) -> Result<Message, DnsError> {
    match monoio::time::timeout(timeout, exchange(server, name, rtype, timeout)).await {
        Ok(reply) => reply,
        Err(_) => Err(timed_out(server, timeout)),
    }
}

async fn exchange(
    server: SocketAddr,
    name: &Name,
    rtype: RecordType,
    timeout: Duration,
) -> Result<Message, DnsError> {
    let io = |what: &str, e: std::io::Error| DnsError::Other(format!("{what} {server}: {e}"));
    let local: SocketAddr = match server.ip() {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).map_err(|e| io("udp bind for", e))?;
    socket
        .connect(server)
        .await
        .map_err(|e| io("udp connect", e))?;
    let port = socket.local_addr().map_err(|e| io("udp to", e))?.port();
    let id = next_id(port);
    let request = query_bytes(id, name, rtype)?;
    // First try: half the time; the retry reuses the socket and id, so a late first reply
    // still counts.
    let first = monoio::time::timeout(timeout / 2, udp_try(&socket, &request, id, name, rtype));
    let reply = match first.await {
        Ok(reply) => reply,
        Err(_) => udp_try(&socket, &request, id, name, rtype).await,
    }
    .map_err(|e| io("udp", e))?;
    if !reply.metadata.truncation {
        return Ok(reply);
    }
    tcp_try(server, &request, id, name, rtype)
        .await
        .map_err(|e| io("tcp", e))
}

/// Sends the query and reads until a reply that answers it (others are dropped).
async fn udp_try(
    socket: &UdpSocket,
    request: &[u8],
    id: u16,
    name: &Name,
    rtype: RecordType,
) -> std::io::Result<Message> {
    let (sent, _) = socket.send(request.to_vec()).await;
    sent?;
    let mut buf = Vec::with_capacity(UDP_READ_BUF);
    loop {
        buf.clear();
        let (got, back) = socket.recv(buf).await;
        buf = back;
        let n = got?;
        if let Some(msg) = decode(&buf[..n])
            && answers(&msg, id, name, rtype)
        {
            return Ok(msg);
        }
    }
}

/// The same query over TCP: a 2-byte length before each message.
async fn tcp_try(
    server: SocketAddr,
    request: &[u8],
    id: u16,
    name: &Name,
    rtype: RecordType,
) -> std::io::Result<Message> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut stream = TcpStream::connect_addr(server).await?;
    let len = u16::try_from(request.len()).map_err(|_| bad("query too long"))?;
    let mut framed = Vec::with_capacity(request.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(request);
    let (wrote, _) = stream.write_all(framed).await;
    wrote?;
    let (got, prefix) = stream.read_exact(vec![0u8; 2]).await;
    got?;
    let len = usize::from(u16::from_be_bytes([prefix[0], prefix[1]]));
    let (got, body) = stream.read_exact(vec![0u8; len]).await;
    got?;
    let msg = decode(&body).ok_or_else(|| bad("undecodable reply"))?;
    if answers(&msg, id, name, rtype) {
        Ok(msg)
    } else {
        Err(bad("reply does not answer the query"))
    }
}
