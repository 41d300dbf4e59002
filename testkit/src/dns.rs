//! dnsmasq as a DNS server for tests: A/AAAA records from a hosts file it re-reads on
//! SIGHUP, SRV records from flags, on 127.0.0.1 and a free port, killed on drop. Names
//! under `test.` that it does not know are NXDOMAIN (`--local=/test/`).

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use spillway::fleet::dns::{
    RecordType, answer_addrs, answers, check_rcode, decode, fqdn, query_bytes,
};

use crate::tools::skip_missing_tool;

const DNSMASQ: &str = "/usr/sbin/dnsmasq";
/// How long dnsmasq may take to answer after a start or a SIGHUP (2 busy cores).
const READY_WITHIN: Duration = Duration::from_secs(20);

/// One SRV record: `name` (e.g. `_http._tcp.svc.test`) points at `target` (`.` means
/// the service is unavailable) and `port`.
#[derive(Debug, Clone)]
pub struct Srv {
    pub name: String,
    pub target: String,
    pub port: u16,
    pub priority: u16,
    pub weight: u16,
}

/// What dnsmasq serves: address records (hosts file) and SRV records.
#[derive(Debug, Clone, Default)]
pub struct Records {
    pub hosts: Vec<(String, Vec<IpAddr>)>,
    pub srv: Vec<Srv>,
}

impl Records {
    pub fn new() -> Records {
        Records::default()
    }

    /// `name` gets these addresses (v4 and/or v6, as text).
    pub fn host(mut self, name: &str, ips: &[&str]) -> Records {
        let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        self.hosts.push((name.to_owned(), ips));
        self
    }

    /// An SRV record of `name` for `target`:`port` (priority 0, weight 5).
    pub fn srv(mut self, name: &str, target: &str, port: u16) -> Records {
        self.srv.push(Srv {
            name: name.to_owned(),
            target: target.to_owned(),
            port,
            priority: 0,
            weight: 5,
        });
        self
    }
}

/// A running dnsmasq; see the module doc.
pub struct Dnsmasq {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
    /// What the hosts file holds now, name → addresses.
    hosts: Vec<(String, Vec<IpAddr>)>,
}

impl Dnsmasq {
    /// Starts dnsmasq serving `records`, and returns once it answers. `None` (the test
    /// skips) when dnsmasq is not installed, outside CI.
    pub fn start(records: &Records) -> Option<Dnsmasq> {
        if !Path::new(DNSMASQ).exists() {
            skip_missing_tool("dnsmasq", format!("{DNSMASQ} is missing"));
            return None;
        }
        let dir = crate::tools::scratch_dir("dnsmasq");
        write_hosts(&dir, &records.hosts);
        let mut last = String::new();
        // A free port can be taken between the probe and dnsmasq's bind: try again.
        for _ in 0..5 {
            let port = free_port();
            let mut child = spawn(&dir, port, records);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match wait_ready(&mut child, addr) {
                Ok(()) => {
                    let hosts = records.hosts.clone();
                    return Some(Dnsmasq {
                        child,
                        addr,
                        dir,
                        hosts,
                    });
                }
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let stderr = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
                    last = format!("{why}; stderr: {}; log: {}", stderr.trim(), read_log(&dir));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("dnsmasq did not start: {last}");
    }

    /// Where it listens (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces every address record with `hosts` (name, ip) and SIGHUPs dnsmasq; returns
    /// once it answers the new set (names no longer listed answer no address).
    pub fn set_hosts(&mut self, hosts: &[(&str, &str)]) {
        let mut grouped: Vec<(String, Vec<IpAddr>)> = Vec::new();
        for (name, ip) in hosts {
            let ip: IpAddr = ip.parse().unwrap();
            match grouped.iter_mut().find(|(n, _)| n == name) {
                Some((_, ips)) => ips.push(ip),
                None => grouped.push(((*name).to_owned(), vec![ip])),
            }
        }
        let mut expect = grouped.clone();
        for (name, _) in &self.hosts {
            if !expect.iter().any(|(n, _)| n == name) {
                expect.push((name.clone(), Vec::new()));
            }
        }
        write_hosts(&self.dir, &grouped);
        self.hosts = grouped;
        let hup = Command::new("kill")
            .arg("-HUP")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(hup.success(), "kill -HUP dnsmasq failed");
        let end = Instant::now() + READY_WITHIN;
        while !expect
            .iter()
            .all(|(name, ips)| serves(self.addr, name, ips))
        {
            assert!(
                Instant::now() < end,
                "dnsmasq did not pick up the new hosts {hosts:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn(dir: &Path, port: u16, records: &Records) -> Child {
    let mut cmd = Command::new(DNSMASQ);
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--no-poll",
        "--listen-address=127.0.0.1",
        "--bind-interfaces",
        "--local=/test/",
        "--log-queries",
    ])
    .arg(format!("--port={port}"))
    .arg(format!("--addn-hosts={}", dir.join("hosts").display()))
    .arg(format!("--pid-file={}", dir.join("pid").display()))
    .arg(format!("--log-facility={}", dir.join("log").display()));
    if running_as_root() {
        // dnsmasq drops root for `nobody` by default; stay who we are instead.
        cmd.arg("--user=root");
    }
    for s in &records.srv {
        cmd.arg(format!(
            "--srv-host={},{},{},{},{}",
            s.name, s.target, s.port, s.priority, s.weight
        ));
    }
    // Why it could not start (a port taken, say) goes to stderr, before its log opens.
    let stderr = std::fs::File::create(dir.join("stderr")).unwrap();
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

fn running_as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

fn write_hosts(dir: &Path, hosts: &[(String, Vec<IpAddr>)]) {
    let mut text = String::new();
    for (name, ips) in hosts {
        for ip in ips {
            text.push_str(&format!("{ip} {name}\n"));
        }
    }
    // Written whole, then renamed: dnsmasq never reads half a file.
    let tmp = dir.join("hosts.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join("hosts")).unwrap();
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default()
}

/// A port free for both UDP and TCP on 127.0.0.1 (dnsmasq binds both): a UDP port the
/// kernel chose can be a TCP port in use, e.g. another test's connection's local port.
fn free_port() -> u16 {
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP on 127.0.0.1 in 50 tries");
}

/// Waits until dnsmasq answers a query, or says why not (it exited, or time ran out).
fn wait_ready(child: &mut Child, addr: SocketAddr) -> Result<(), String> {
    let end = Instant::now() + READY_WITHIN;
    while Instant::now() < end {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("dnsmasq exited: {status}"));
        }
        if query(addr, "ready.test", RecordType::A).is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err("dnsmasq did not answer in time".into())
}

/// Whether `addr` answers exactly `ips` for `name` (A and AAAA together).
fn serves(addr: SocketAddr, name: &str, ips: &[IpAddr]) -> bool {
    let mut got = Vec::new();
    for rtype in [RecordType::A, RecordType::AAAA] {
        match query(addr, name, rtype) {
            Some(found) => got.extend(found),
            None => return false,
        }
    }
    let mut want = ips.to_vec();
    got.sort();
    want.sort();
    want.dedup();
    got == want
}

/// One blocking query: `Some(addresses)` for a reply (an NXDOMAIN is `Some(empty)`),
/// `None` when there was none within 250 ms or the server failed.
pub fn query(addr: SocketAddr, name: &str, rtype: RecordType) -> Option<Vec<IpAddr>> {
    let qname = fqdn(name).unwrap();
    let socket = UdpSocket::bind("127.0.0.1:0").ok()?;
    socket.connect(addr).ok()?;
    socket
        .set_read_timeout(Some(Duration::from_millis(250)))
        .ok()?;
    let id = 0x5a5a;
    socket.send(&query_bytes(id, &qname, rtype).unwrap()).ok()?;
    let mut buf = [0u8; 4096];
    loop {
        let n = match socket.recv(&mut buf) {
            // A thread that ran io_uring can see EINTR from its task work: not an answer.
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            got => got.ok()?,
        };
        let Some(msg) = decode(&buf[..n]) else {
            continue;
        };
        if !answers(&msg, id, &qname, rtype) {
            continue;
        }
        return match check_rcode(&msg, name) {
            Ok(()) => Some(
                answer_addrs(&msg, &qname, 0)
                    .iter()
                    .map(|a| a.ip())
                    .collect(),
            ),
            Err(spillway::fleet::dns::DnsError::NoSuchName { .. }) => Some(Vec::new()),
            Err(_) => None,
        };
    }
}
