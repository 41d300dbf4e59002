//! Addresses as the file writes them (`host:port`, `http://host:port`), parsed without
//! resolving anything: validation is pure. Names are resolved later, off the cores and
//! off the monitor's loop ([`crate::runtime::resolve`]), into [`Addrs`].

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use super::Config;

/// A host (name or IP literal) and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

impl HostPort {
    /// `host:port`, `[v6]:port` or an IP socket address; no DNS.
    pub fn parse(text: &str) -> Result<HostPort, String> {
        if let Ok(a) = text.parse::<SocketAddr>() {
            return Ok(HostPort {
                host: a.ip().to_string(),
                port: a.port(),
            });
        }
        let bad = || format!("`{text}` is not a host:port address");
        let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        if host.is_empty() || host.contains([':', '/', ' ', '[', ']']) {
            return Err(bad());
        }
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }

    /// The socket address when the host is an IP literal (nothing to resolve).
    pub fn literal(&self) -> Option<SocketAddr> {
        let ip: IpAddr = self.host.parse().ok()?;
        Some(SocketAddr::new(ip, self.port))
    }
}

impl std::str::FromStr for HostPort {
    type Err = String;

    fn from_str(text: &str) -> Result<HostPort, String> {
        HostPort::parse(text)
    }
}

impl fmt::Display for HostPort {
    /// As a `Host` header or URL authority writes it (IPv6 in brackets).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl serde::Serialize for HostPort {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Why a worker URL with credentials is refused (nginx and HAProxy take none in an
/// upstream address either).
const WORKER_CREDENTIALS: &str = "credentials in a worker URL are not supported: Spillway \
    does not send them to the worker; the client's own Authorization header is forwarded";

/// Why another `http://` URL (a `metrics_url`, an etcd endpoint) with credentials is.
const URL_CREDENTIALS: &str =
    "credentials in this URL are not supported: Spillway does not send them";

/// `http://host:port[/]` → its host and port. HTTPS, credentials and base paths are
/// refused with a reason.
pub fn parse_http_url(url: &str) -> Result<HostPort, String> {
    match parse_url(url, URL_CREDENTIALS)? {
        (hp, false) => Ok(hp),
        (_, true) => Err(format!(
            "`{}`: only http:// is supported here",
            redacted(url)
        )),
    }
}

/// A worker's `http://` or `https://host:port[/]` → its host and port, and whether it
/// speaks TLS. Credentials (`user:pw@`), base paths and queries are refused with a
/// reason; no message quotes the credentials.
pub fn parse_worker_url(url: &str) -> Result<(HostPort, bool), String> {
    parse_url(url, WORKER_CREDENTIALS)
}

/// `url` for messages, its userinfo (everything between the scheme's `://` and the last
/// `@`, even a `/` that a password should have percent-encoded) replaced by `***`.
pub(crate) fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    let start = match url.split_once("://") {
        Some((scheme, _)) if scheme.bytes().all(|b| b.is_ascii_alphanumeric()) => scheme.len() + 3,
        _ => 0,
    };
    match url[start..].rfind('@') {
        Some(at) => format!("{}***{}", &url[..start], &url[start + at..]).into(),
        None => url.into(),
    }
}

/// [`parse_worker_url`], `credentials` the reason a URL with userinfo is refused. Every
/// error quotes the URL [`redacted`].
fn parse_url(url: &str, credentials: &str) -> Result<(HostPort, bool), String> {
    url_parts(url, credentials).map_err(|why| format!("`{}`{why}", redacted(url)))
}

/// What [`parse_url`] reads; an error is the message after the quoted URL.
fn url_parts(url: &str, credentials: &str) -> Result<(HostPort, bool), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!(" is not a URL: {e}"))?;
    let tls = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(" must start with http:// or https://".into()),
    };
    // The authority's own text: `http` also reads `user:pw@` into it.
    let authority = uri.authority().map_or("", |a| a.as_str());
    if authority.contains('@') {
        return Err(format!(": {credentials}"));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(": a base path is not supported; requests keep their own path".into());
    }
    if uri.query().is_some() {
        return Err(": a query string is not supported".into());
    }
    let host = uri.host().ok_or(" has no host")?;
    // `http` reports no port for one it cannot read as a u16 (`:80000`): read the
    // authority's own text, so that such a port is refused rather than taken as 80.
    let after_host = authority
        .rsplit_once(']')
        .map_or(authority, |(_, rest)| rest);
    let bad_port = ": the port must be a number from 1 to 65535";
    let port = match after_host.rsplit_once(':') {
        None if tls => 443,
        None => 80,
        Some((_, p)) => p.parse::<u16>().map_err(|_| bad_port)?,
    };
    if port == 0 {
        return Err(bad_port.into());
    }
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    Ok((HostPort { host, port }, tls))
}

/// The socket addresses of one configuration: its listeners and, in
/// [`Config::workers`] order, each worker's and its metrics endpoint's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addrs {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// `tls.listen`, the TLS listener beside the plain one.
    pub tls_listen: Option<SocketAddr>,
    pub workers: Vec<WorkerAddrs>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerAddrs {
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
}

impl Addrs {
    /// The addresses of a configuration that names only IP literals (tests, benches);
    /// `None` when a name needs resolving.
    pub fn literals(config: &Config) -> Option<Addrs> {
        Addrs::with(config, |hp| hp.literal().ok_or(())).ok()
    }

    /// Builds the addresses with `lookup` for each endpoint, stopping at its first error.
    pub fn with<E>(
        config: &Config,
        mut lookup: impl FnMut(&HostPort) -> Result<SocketAddr, E>,
    ) -> Result<Addrs, E> {
        let mut workers = Vec::with_capacity(config.workers.len());
        for w in &config.workers {
            workers.push(WorkerAddrs {
                addr: lookup(&w.endpoint)?,
                metrics: lookup(&w.metrics)?,
            });
        }
        let tls_listen = match config.tls.listener.as_ref().and_then(|l| l.listen.as_ref()) {
            Some(hp) => Some(lookup(hp)?),
            None => None,
        };
        Ok(Addrs {
            listen: lookup(&config.listen)?,
            admin_listen: lookup(&config.admin_listen)?,
            tls_listen,
            workers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        let hp = HostPort::parse("127.0.0.1:80").unwrap();
        assert_eq!(hp.literal(), Some("127.0.0.1:80".parse().unwrap()));
        let hp = HostPort::parse("[::1]:8000").unwrap();
        assert_eq!(hp.host, "::1");
        assert_eq!(hp.to_string(), "[::1]:8000");
        let hp = HostPort::parse("engine.local:9000").unwrap();
        assert_eq!(
            (hp.host.as_str(), hp.port, hp.literal()),
            ("engine.local", 9000, None)
        );
        for bad in ["nope", "host:", ":80", "a:b:c", "h:99999", "h/x:1"] {
            assert!(HostPort::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn http_urls() {
        assert_eq!(
            parse_http_url("http://[::1]:81/").unwrap().to_string(),
            "[::1]:81"
        );
        assert_eq!(parse_http_url("http://w").unwrap().port, 80);
        assert!(parse_http_url("https://w").is_err());
        assert!(parse_http_url("http://w/base").is_err());
        assert!(parse_http_url("http://w/?q").is_err());
        assert!(parse_http_url("w:1").is_err());
        assert_eq!(parse_http_url("http://w:65535").unwrap().port, 65535);
        for bad in ["http://w:80000", "http://w:0", "http://w:65536/"] {
            let e = parse_http_url(bad).unwrap_err();
            assert!(
                e.contains("port must be a number from 1 to 65535"),
                "{bad}: {e}"
            );
        }
    }

    /// Issue 26, item 9: a worker URL with credentials is refused, and no message that
    /// quotes a URL shows its password.
    #[test]
    fn credentials_are_refused_and_never_quoted() {
        for url in [
            "http://user:s3cr3t@w:8000",
            "https://user:s3cr3t@w:8443/",
            "http://s3cr3t@w:8000",
        ] {
            let e = parse_worker_url(url).unwrap_err();
            assert!(e.contains(WORKER_CREDENTIALS), "{e}");
            assert!(e.contains("***@w:"), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
            let e = parse_http_url(url).unwrap_err();
            assert!(e.contains(URL_CREDENTIALS), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
        }
        // Every other refusal of a URL with userinfo hides it too.
        for (url, why) in [
            ("ftp://user:s3cr3t@w:1", "must start with http://"),
            ("http://user:s3cr3t@w:1/base", "not supported"),
            ("http://user:s3/cr3t@w:1", "not supported"),
            ("http://user:s3cr3t@w:99999", "credentials"),
            ("http://user:s3 cr3t@w:1", "is not a URL"),
            ("user:s3cr3t@w:1", "http://"),
        ] {
            let e = parse_worker_url(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("s3cr3t") && !e.contains("cr3t"), "{url}: {e}");
        }
        assert_eq!(redacted("http://w:1"), "http://w:1");
        assert_eq!(redacted("http://u:p@w:1/"), "http://***@w:1/");
        assert_eq!(redacted("u:p@w:1"), "***@w:1");
        assert_eq!(redacted("u:a://b@w:1"), "***@w:1");
    }
}
