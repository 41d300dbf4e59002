#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![allow(clippy::disallowed_methods)] // a load generator times itself
//! The new-connection client of `bench/tls/run.sh`: CONNS threads, each in a closed loop of
//! connect, full TLS 1.3 handshake, one `POST /v1/chat/completions` with
//! `Connection: close`, read the answer to the server's close, for SECONDS. Prints one line
//! of `key=value` figures (connections, 200s, errors, rate, latency percentiles, what was
//! negotiated).
//!
//! It exists because the OpenSSL 3.0 client in wrk spends more CPU per handshake (460–600 µs
//! here) than any server under test, so on one load CPU wrk, not the proxy, set the rate. This one
//! uses rustls with ring, offers no session (resumption disabled: every handshake is full),
//! and by default does not check the server's certificate or its handshake signature: the
//! server's work is the same, the client's is a key share and the transcript. `--ca FILE`
//! verifies both against that CA instead.
//!
//! `cargo build --release --example tls_connect`;
//! `target/release/examples/tls_connect 127.0.0.1:PORT SECONDS CONNS [--ca CA.pem]
//! [--suite TLS13_AES_128_GCM_SHA256]` (`--suite`: offer that one suite only).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustls::client::Resumption;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, StreamOwned};

const BODY: &str = r#"{"model":"bench-model","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":8}"#;

/// Accepts any certificate and handshake signature (the benchmark's default; see above).
#[derive(Debug)]
struct NoVerify(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_schemes()
    }
}

fn config(ca: Option<&str>, suite: Option<&str>) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(name) = suite {
        provider
            .cipher_suites
            .retain(|s| format!("{:?}", s.suite()) == name);
        assert!(!provider.cipher_suites.is_empty(), "no suite {name}");
    }
    let provider = Arc::new(provider);
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3");
    let mut config = match ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(path).expect("read --ca") {
                roots.add(cert.expect("parse --ca")).expect("add --ca");
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        None => {
            let algs = provider.signature_verification_algorithms;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(algs)))
                .with_no_client_auth()
        }
    };
    config.resumption = Resumption::disabled();
    Arc::new(config)
}

/// What one thread saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    errors: u64,
    latencies_us: Vec<u32>,
    negotiated: Option<String>,
    first_error: Option<String>,
}

/// Whether `buf` holds a whole response: head, then Content-Length bytes of body.
fn complete(buf: &[u8]) -> bool {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    buf.len() >= end + 4 + len
}

/// One connection: handshake, request, the whole answer, then read to the server's close.
fn one(
    addr: SocketAddr,
    config: &Arc<ClientConfig>,
    request: &[u8],
    buf: &mut Vec<u8>,
) -> Result<Option<String>, String> {
    let tcp = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    tcp.set_nodelay(true).ok();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let name = ServerName::try_from("localhost").expect("server name");
    let conn = ClientConnection::new(config.clone(), name).map_err(|e| e.to_string())?;
    let mut tls = StreamOwned::new(conn, tcp);
    tls.write_all(request).map_err(|e| format!("write: {e}"))?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    while !complete(buf) {
        match tls.read(&mut chunk) {
            Ok(0) => return Err("closed before the whole answer".into()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    if !buf.starts_with(b"HTTP/1.1 200") {
        let line = String::from_utf8_lossy(&buf[..buf.len().min(40)]).into_owned();
        return Err(format!("status: {line}"));
    }
    let negotiated = format!(
        "protocol={:?} suite={:?} group={:?}",
        tls.conn.protocol_version(),
        tls.conn.negotiated_cipher_suite().map(|s| s.suite()),
        tls.conn.negotiated_key_exchange_group().map(|g| g.name()),
    );
    // The server closes (it answered `Connection: close`): wait for that, so the close
    // is the server's, as with any HTTP/1.1 client that reads to the end.
    while let Ok(n) = tls.read(&mut chunk) {
        if n == 0 {
            break;
        }
    }
    Ok(Some(negotiated))
}

fn worker(addr: SocketAddr, config: Arc<ClientConfig>, stop: Arc<AtomicBool>) -> Tally {
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    let mut t = Tally::default();
    let mut buf = Vec::with_capacity(4096);
    while !stop.load(Ordering::Relaxed) {
        let start = Instant::now();
        match one(addr, &config, request.as_bytes(), &mut buf) {
            Ok(neg) => {
                t.ok += 1;
                let us = start.elapsed().as_micros();
                t.latencies_us.push(u32::try_from(us).unwrap_or(u32::MAX));
                if t.negotiated.is_none() {
                    t.negotiated = neg;
                }
            }
            Err(e) => {
                t.errors += 1;
                t.first_error.get_or_insert(e);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    t
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 || args.iter().any(|a| a == "--bench" || a == "--help") {
        eprintln!("usage: tls_connect HOST:PORT SECONDS CONNS [--ca CA.pem] [--suite NAME]");
        return;
    }
    let addr: SocketAddr = args[0].parse().expect("HOST:PORT");
    let secs: f64 = args[1].parse().expect("SECONDS");
    let conns: usize = args[2].parse().expect("CONNS");
    let flag = |name: &str| {
        let i = args.iter().position(|a| a == name)?;
        Some(args.get(i + 1).expect("a value after the flag").as_str())
    };
    let ca = flag("--ca");
    let config = config(ca, flag("--suite"));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let (config, stop) = (config.clone(), stop.clone());
            std::thread::spawn(move || worker(addr, config, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    for t in threads {
        let t = t.join().expect("worker");
        all.ok += t.ok;
        all.errors += t.errors;
        all.latencies_us.extend(t.latencies_us);
        all.negotiated = all.negotiated.or(t.negotiated);
        all.first_error = all.first_error.or(t.first_error);
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.latencies_us.sort_unstable();
    let pct = |q: f64| {
        let n = all.latencies_us.len();
        if n == 0 {
            return 0;
        }
        all.latencies_us[((n as f64 * q) as usize).min(n - 1)]
    };
    println!(
        "ok={} errors={} elapsed_s={elapsed:.3} rate={:.1} p50_us={} p90_us={} p99_us={} verify={} {}",
        all.ok,
        all.errors,
        all.ok as f64 / elapsed,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        if ca.is_some() { "ca" } else { "none" },
        all.negotiated.unwrap_or_default(),
    );
    if let Some(e) = all.first_error {
        println!("first_error={e}");
    }
}
