//! Workers found at run time (`[models.dns]`, `[models.etcd]`) and load over NATS
//! (`[nats]`): their settings checked, the value of an etcd key read, and a configuration
//! with what the sources found added ([`Config::with_found`]). Pure: the sources' I/O is
//! the control thread's ([`crate::fleet`]).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::addr::redacted;
use super::file::{FileDns, FileEtcd, FileModel, FileNats, FileWorker};
use super::validate::Validator;
use super::workers::Key;
use super::*;
use crate::http::limits::MAX_DP_SIZE;

pub const DEFAULT_DNS_INTERVAL_MS: u64 = 5_000;
/// How long a name may not exist (NXDOMAIN) before its workers leave: HAProxy's `hold nx`.
pub const DEFAULT_DNS_NXDOMAIN_HOLD_MS: u64 = 30_000;
pub const DEFAULT_NATS_PORT: u16 = 4222;
pub const DEFAULT_NATS_PUBLISH_INTERVAL_MS: u64 = 50;

/// How a model finds its workers beside the listed ones.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Discovery {
    pub source: DiscoverySource,
    /// The settings every found worker gets (its endpoint here is a placeholder).
    pub template: WorkerConfig,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoverySource {
    /// A name resolved every `interval_ms`: its A/AAAA records with `port`, or its SRV
    /// records (`port` = `None`).
    Dns {
        name: String,
        port: Option<u16>,
        /// `None`: the first nameserver of /etc/resolv.conf.
        server: Option<HostPort>,
        interval_ms: u64,
        /// A name that does not exist (NXDOMAIN) for this long has no workers (a
        /// Kubernetes headless Service scaled to zero); until then, the last good set.
        nxdomain_hold_ms: u64,
    },
    /// The keys under `prefix`, read and then watched.
    Etcd {
        endpoints: Vec<HostPort>,
        prefix: String,
    },
}

impl DiscoverySource {
    /// `dns` or `etcd`, for labels and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            DiscoverySource::Dns { .. } => "dns",
            DiscoverySource::Etcd { .. } => "etcd",
        }
    }
}

/// `[nats]`: where load events come from and go to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NatsConfig {
    pub server: HostPort,
    /// Subject (wildcards allowed) whose messages are applied as `POST /load` bodies.
    pub subscribe: Option<String>,
    /// Subject this Spillway publishes its workers' effective load to.
    pub publish: Option<String>,
    pub publish_interval_ms: u64,
    /// Publish as one worker of this name whose ranks are this Spillway's workers' ranks
    /// in order (a node edge seen by a front door); `None`: each worker as itself.
    pub publish_as: Option<String>,
    /// Subject on which front-door replicas share what each routed: this Spillway
    /// publishes its own routed load there every `publish_interval_ms` and folds its
    /// peers' into the `tracked` source.
    pub replica_sync: Option<String>,
}

/// A worker a source found: its name, endpoint and what it says of its capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub name: String,
    pub endpoint: HostPort,
    /// Its etcd value's URL is `https://`.
    pub tls: bool,
    pub capacity: Capacity,
}

/// What an etcd value may say of a worker; unset fields keep the template's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Capacity {
    pub dp_size: Option<u32>,
    pub kv_total_blocks: Option<u64>,
    pub max_num_batched_tokens: Option<u64>,
    pub engine_request_limit: Option<u32>,
}

/// An etcd key's value: `{"url": "http://host:port", "name": ..., capacity fields}`;
/// other fields are ignored (registries hold more than Spillway reads).
#[derive(Debug, Deserialize)]
struct EtcdValue {
    url: String,
    name: Option<String>,
    #[serde(flatten)]
    capacity: Capacity,
}

impl Found {
    /// Reads an etcd key's value. The name defaults to the key without the prefix.
    pub fn from_etcd(key: &str, prefix: &str, value: &[u8]) -> Result<Found, String> {
        let v: EtcdValue =
            serde_json::from_slice(value).map_err(|e| format!("key `{key}`: {e}"))?;
        let (endpoint, tls) = parse_worker_url(&v.url).map_err(|e| format!("key `{key}`: {e}"))?;
        let name = match v.name.as_deref().map(str::trim) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => key.strip_prefix(prefix).unwrap_or(key).to_string(),
        };
        if name.is_empty() {
            return Err(format!("key `{key}`: the worker has no name"));
        }
        let c = v.capacity;
        if c.dp_size.is_some_and(|d| d == 0 || d > MAX_DP_SIZE) {
            return Err(format!(
                "key `{key}`: dp_size must be between 1 and {MAX_DP_SIZE}"
            ));
        }
        if c.engine_request_limit == Some(0) {
            return Err(format!(
                "key `{key}`: engine_request_limit must be at least 1"
            ));
        }
        Ok(Found {
            name,
            endpoint,
            tls,
            capacity: c,
        })
    }

    /// A worker at a resolved address (a DNS answer): named after its endpoint.
    pub fn at(endpoint: HostPort) -> Found {
        Found {
            name: endpoint.to_string(),
            endpoint,
            tls: false,
            capacity: Capacity::default(),
        }
    }
}

impl WorkerConfig {
    /// The worker `found` becomes under this template.
    fn discovered(&self, found: &Found) -> WorkerConfig {
        let c = found.capacity;
        WorkerConfig {
            name: found.name.clone(),
            url: match found.tls {
                true => format!("https://{}", found.endpoint),
                false => format!("http://{}", found.endpoint),
            },
            tls: found.tls,
            endpoint: found.endpoint.clone(),
            metrics: found.endpoint.clone(),
            dp_size: c.dp_size.unwrap_or(self.dp_size),
            kv_total_blocks: c.kv_total_blocks.or(self.kv_total_blocks),
            max_num_batched_tokens: c.max_num_batched_tokens.or(self.max_num_batched_tokens),
            engine_request_limit: c.engine_request_limit.or(self.engine_request_limit),
            ..self.clone()
        }
    }
}

impl Config {
    /// This configuration with each model's found workers (with their resolved
    /// addresses) after its listed ones; also the reasons any was left out (a name
    /// already used by a different worker).
    pub fn with_found<L: AsRef<[M]>, M: std::borrow::Borrow<(Found, SocketAddr)>>(
        &self,
        addrs: &Addrs,
        found: &BTreeMap<String, L>,
    ) -> (Config, Addrs, Vec<String>) {
        let mut config = self.clone();
        let mut addrs = addrs.clone();
        let mut skipped = Vec::new();
        let mut by_name: HashMap<String, usize> = config
            .workers
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), i))
            .collect();
        for m in &mut config.models {
            let (Some(d), Some(list)) = (&m.discovery, found.get(&m.name)) else {
                continue;
            };
            for (f, addr) in list.as_ref().iter().map(M::borrow) {
                let w = d.template.discovered(f);
                match by_name.get(&w.name) {
                    Some(&i) if config.workers[i] == w => {
                        if !m.workers.contains(&i) {
                            m.workers.push(i);
                        }
                    }
                    Some(_) => skipped.push(format!(
                        "model `{}`: found worker `{}` ({}) is left out: its name is taken by another worker",
                        m.name, w.name, w.url
                    )),
                    None => {
                        by_name.insert(w.name.clone(), config.workers.len());
                        m.workers.push(config.workers.len());
                        config.workers.push(w);
                        addrs.workers.push(WorkerAddrs {
                            addr: *addr,
                            metrics: *addr,
                        });
                    }
                }
            }
        }
        (config, addrs, skipped)
    }
}

/// A DNS server: an IP literal, with an optional port (53).
fn dns_server(text: &str) -> Option<HostPort> {
    if let Ok(ip) = text.parse::<std::net::IpAddr>() {
        return Some(HostPort {
            host: ip.to_string(),
            port: 53,
        });
    }
    HostPort::parse(text)
        .ok()
        .filter(|hp| hp.literal().is_some())
}

/// `nats://host[:port]` (or `host[:port]`); the port defaults to 4222. Credentials are
/// refused (the client does not authenticate), and no message quotes them.
fn nats_server(text: &str) -> Result<HostPort, String> {
    if text.contains('@') {
        return Err(format!(
            "`{}`: credentials in the NATS URL are not supported: Spillway does not send them",
            redacted(text)
        ));
    }
    let rest = text
        .strip_prefix("nats://")
        .unwrap_or(text)
        .trim_end_matches('/');
    HostPort::parse(rest)
        .or_else(|_| HostPort::parse(&format!("{rest}:{DEFAULT_NATS_PORT}")))
        .map_err(|_| format!("`{text}` is not a nats://host:port address"))
}

/// Whether NATS delivers `subject` to a subscription on `pattern` (`*` matches one
/// token, a final `>` one or more).
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some(a), Some(b)) if a == "*" || a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A subject: non-empty, no whitespace (NATS's rule).
fn subject_ok(s: &str) -> bool {
    !s.is_empty() && !s.contains(char::is_whitespace)
}

impl Validator<'_> {
    /// `[nats]`.
    pub(super) fn nats(&self, n: &Option<FileNats>) -> Result<Option<NatsConfig>, ConfigError> {
        let Some(n) = n else { return Ok(None) };
        let server = nats_server(n.url.get_ref())
            .or_else(|msg| self.err("nats.url", Some(n.url.span()), msg))?;
        let subject = |key: &str, v: &Option<Spanned<String>>| match v {
            Some(s) if !subject_ok(s.get_ref()) => self.err(
                format!("nats.{key}"),
                Some(s.span()),
                "must be a NATS subject (not empty, no spaces)",
            ),
            Some(s) => Ok(Some(s.get_ref().clone())),
            None => Ok(None),
        };
        let (subscribe, publish, replica_sync) = (
            subject("subscribe", &n.subscribe)?,
            subject("publish", &n.publish)?,
            subject("replica_sync", &n.replica_sync)?,
        );
        if subscribe.is_none() && publish.is_none() && replica_sync.is_none() {
            let msg = "set at least one of `subscribe`, `publish` and `replica_sync`";
            return self.err("nats", Some(n.url.span()), msg);
        }
        if let Some(sync) = &replica_sync {
            let span = n.replica_sync.as_ref().map(|s| s.span());
            if sync.split('.').any(|t| t == "*" || t == ">") {
                let msg = "must be one subject, without wildcards (every replica publishes to it)";
                return self.err("nats.replica_sync", span, msg);
            }
            let clash = [(&subscribe, "subscribe"), (&publish, "publish")]
                .into_iter()
                .find_map(|(s, key)| s.as_ref().filter(|s| subject_matches(s, sync)).map(|_| key));
            if let Some(key) = clash {
                let msg = format!(
                    "`{sync}` is within `nats.{key}`: routed load and load events need subjects of their own"
                );
                return self.err("nats.replica_sync", span, msg);
            }
        }
        if let (Some(sub), Some(publ)) = (&subscribe, &publish)
            && subject_matches(sub, publ)
        {
            let msg = format!(
                "`{publ}` is within `nats.subscribe` (`{sub}`): this Spillway would read its own load back as its workers' reports"
            );
            return self.err("nats.publish", n.publish.as_ref().map(|s| s.span()), msg);
        }
        let publish_as = match &n.publish_as {
            Some(s) if s.get_ref().trim().is_empty() => {
                return self.err("nats.publish_as", Some(s.span()), "must not be empty");
            }
            Some(s) => Some(s.get_ref().trim().to_string()),
            None => None,
        };
        Ok(Some(NatsConfig {
            server,
            subscribe,
            publish,
            publish_interval_ms: self.positive(
                "nats.publish_interval_ms",
                &n.publish_interval_ms,
                DEFAULT_NATS_PUBLISH_INTERVAL_MS,
            )?,
            publish_as,
            replica_sync,
        }))
    }

    /// A model's `dns` or `etcd` source and its `discovered` template.
    pub(super) fn discovery(
        &self,
        key: Key<'_>,
        m: &FileModel,
        o: &Overrides,
    ) -> Result<Option<Discovery>, ConfigError> {
        let source = match (&m.dns, &m.etcd) {
            (Some(_), Some(e)) => {
                let msg = "a model finds workers with one source: `dns` or `etcd`";
                return self.err(key("etcd"), Some(e.prefix.span()), msg);
            }
            (Some(d), None) => self.dns(key, d)?,
            (None, Some(e)) => self.etcd(key, e)?,
            (None, None) if m.discovered.is_some() => {
                let msg = "`discovered` sets found workers' keys: add a `dns` or `etcd` source";
                return self.err(key("discovered"), None, msg);
            }
            (None, None) => return Ok(None),
        };
        let t = m.discovered.as_ref();
        let tkey = |k: &str| key(&format!("discovered.{k}"));
        let fixed = [
            ("url", t.and_then(|t| t.url.as_ref().map(|s| s.span()))),
            ("name", t.and_then(|t| t.name.as_ref().map(|s| s.span()))),
            (
                "metrics_url",
                t.and_then(|t| t.metrics_url.as_ref().map(|s| s.span())),
            ),
        ];
        if let Some((k, span)) = fixed.into_iter().find(|(_, s)| s.is_some()) {
            let msg = "a found worker's URL, name and metrics come from the source";
            return self.err(tkey(k), span, msg);
        }
        let placeholder = HostPort {
            host: "0.0.0.0".into(),
            port: 1,
        };
        let default = FileWorker::default();
        let mut template = self.worker_at(t.unwrap_or(&default), placeholder, o, &tkey)?;
        // What `check-config` shows for the fields each found worker fills in.
        (template.name, template.url) = ("(found)".into(), "(found)".into());
        Ok(Some(Discovery { source, template }))
    }

    fn dns(&self, key: Key<'_>, d: &FileDns) -> Result<DiscoverySource, ConfigError> {
        let name = d.name.get_ref().trim().trim_end_matches('.').to_string();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return self.err(key("dns.name"), Some(d.name.span()), "must be a DNS name");
        }
        let srv = d.srv.as_ref().is_some_and(|s| *s.get_ref());
        let port = match (&d.port, srv) {
            (Some(p), false) if *p.get_ref() > 0 => Some(*p.get_ref()),
            (Some(p), false) => {
                return self.err(key("dns.port"), Some(p.span()), "must be from 1 to 65535");
            }
            (Some(p), true) => {
                let msg = "SRV records carry their own ports: set `port` or `srv = true`, not both";
                return self.err(key("dns.port"), Some(p.span()), msg);
            }
            (None, true) => None,
            (None, false) => {
                let msg = "set `port` (the workers' port, for A/AAAA records) or `srv = true`";
                return self.err(key("dns"), Some(d.name.span()), msg);
            }
        };
        let server = match &d.server {
            Some(s) => match dns_server(s.get_ref()) {
                Some(hp) => Some(hp),
                None => {
                    let msg = "must be an IP address, with an optional port";
                    return self.err(key("dns.server"), Some(s.span()), msg);
                }
            },
            None => None,
        };
        Ok(DiscoverySource::Dns {
            name,
            port,
            server,
            interval_ms: self.positive(
                &key("dns.interval_ms"),
                &d.interval_ms,
                DEFAULT_DNS_INTERVAL_MS,
            )?,
            nxdomain_hold_ms: d
                .nxdomain_hold_ms
                .as_ref()
                .map_or(DEFAULT_DNS_NXDOMAIN_HOLD_MS, |v| *v.get_ref()),
        })
    }

    fn etcd(&self, key: Key<'_>, e: &FileEtcd) -> Result<DiscoverySource, ConfigError> {
        if e.endpoints.get_ref().is_empty() {
            return self.err(
                key("etcd.endpoints"),
                Some(e.endpoints.span()),
                "must name at least one endpoint",
            );
        }
        let endpoints = e
            .endpoints
            .get_ref()
            .iter()
            .map(|u| parse_http_url(u))
            .collect::<Result<Vec<_>, _>>()
            .or_else(|msg| self.err(key("etcd.endpoints"), Some(e.endpoints.span()), msg))?;
        let prefix = e.prefix.get_ref().clone();
        if prefix.is_empty() {
            let msg = "must not be empty (a model's workers live under their own prefix)";
            return self.err(key("etcd.prefix"), Some(e.prefix.span()), msg);
        }
        Ok(DiscoverySource::Etcd { endpoints, prefix })
    }
}

#[cfg(test)]
mod tests;
