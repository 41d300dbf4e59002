//! The worker sources' tasks on the control thread: `dns` re-resolves a name every
//! interval; `etcd` reads a prefix, then watches it from the next revision (reading it
//! again after any error). Each reports to [`super::fleet::Fleet`] and stops when its
//! model's source changes (its epoch is no longer current).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::Control;
use super::generation::FoundMember;
use crate::config::{DiscoverySource, Found, HostPort};
use crate::fleet::{dns, etcd};
use crate::runtime::clock;
use crate::runtime::resolve::lookup_off_loop;

/// A DNS lookup's time limit (with its one retry).
const DNS_TIMEOUT: Duration = Duration::from_secs(2);
/// An etcd request's time limit (the range, the watch's creation).
const ETCD_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait after a failed etcd session, doubled up to the maximum.
const ETCD_BACKOFF: Duration = Duration::from_millis(500);
const ETCD_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A watch's changes are reported at most this often (the generation is built at most
/// every `BUILD_INTERVAL_MS` anyway).
const REPORT_INTERVAL_MS: u64 = 50;
/// A watch silent this long gets a check that etcd still answers: a hung etcd, or one
/// cut off without a reset, sends nothing and closes nothing, and the watch would wait
/// for it (keeping the last good set, but saying nothing about it) until TCP gave up.
const WATCH_SILENCE: Duration = Duration::from_secs(5);
/// How often a task blocked on a watch checks whether it is still current.
const STALE_CHECK: Duration = Duration::from_millis(500);

type Shared = Rc<RefCell<Control>>;
type Members = Vec<FoundMember>;

/// Starts the tasks of sources (and of NATS) that have none, and folds found workers in;
/// runs for the life of the control thread.
pub async fn supervise(control: Shared) {
    loop {
        super::fanout::start(&control);
        let starts = control.borrow_mut().fleet.to_start();
        for (model, spec, epoch) in starts {
            match spec {
                DiscoverySource::Dns {
                    name,
                    port,
                    server,
                    interval_ms,
                    nxdomain_hold_ms,
                } => {
                    let settings = DnsSettings {
                        name,
                        port,
                        server,
                        interval: Duration::from_millis(interval_ms),
                        nxdomain_hold: Duration::from_millis(nxdomain_hold_ms),
                    };
                    monoio::spawn(dns_source(control.clone(), model, epoch, settings));
                }
                DiscoverySource::Etcd { endpoints, prefix } => {
                    monoio::spawn(etcd_source(
                        control.clone(),
                        model,
                        epoch,
                        endpoints,
                        prefix,
                    ));
                }
            }
        }
        super::fleet::build_found(&control, clock::now_ms()).await;
        monoio::time::sleep(Duration::from_millis(super::fleet::BUILD_INTERVAL_MS / 2)).await;
    }
}

fn current(control: &Shared, model: &str, epoch: u64) -> bool {
    control.borrow().fleet.current(model, epoch)
}

fn report(control: &Shared, model: &str, epoch: u64, result: Result<Members, String>) -> bool {
    control.borrow_mut().fleet.update(model, epoch, result)
}

/// A `dns` source's settings (`[models.dns]`).
struct DnsSettings {
    name: String,
    port: Option<u16>,
    server: Option<HostPort>,
    interval: Duration,
    nxdomain_hold: Duration,
}

async fn dns_source(control: Shared, model: String, epoch: u64, s: DnsSettings) {
    // Since when the name has not existed (NXDOMAIN at every resolution).
    let mut missing_since: Option<std::time::Instant> = None;
    // The hold ended and the name's workers left.
    let mut gone = false;
    while current(&control, &model, epoch) {
        let result = match dns_members(&s.name, s.port, s.server.as_ref()).await {
            Err(dns::DnsError::NoSuchName { name }) => {
                let since = *missing_since.get_or_insert_with(clock::now);
                let hold_ms = s.nxdomain_hold.as_millis() as u64;
                if clock::since(since) < s.nxdomain_hold {
                    Err(format!(
                        "`{name}` does not exist (NXDOMAIN); its workers stay for up to nxdomain_hold_ms = {hold_ms}"
                    ))
                } else {
                    // An answer: the name has no workers (a headless Service scaled to zero).
                    if !std::mem::replace(&mut gone, true) {
                        tracing::warn!(
                            model,
                            name,
                            hold_ms,
                            "the name has not existed for nxdomain_hold_ms: its workers leave"
                        );
                    }
                    Ok(Members::new())
                }
            }
            other => {
                (missing_since, gone) = (None, false);
                other.map_err(|e| e.to_string())
            }
        };
        if !report(&control, &model, epoch, result) {
            return;
        }
        monoio::time::sleep(s.interval).await;
    }
}

/// One resolution: A/AAAA with the configured port, or SRV (named `target:port`).
async fn dns_members(
    name: &str,
    port: Option<u16>,
    server: Option<&HostPort>,
) -> Result<Members, dns::DnsError> {
    let server = match server.and_then(HostPort::literal) {
        Some(s) => s,
        None => match monoio::spawn_blocking(dns::system_server).await {
            Ok(r) => r?,
            Err(_) => {
                let why = "reading /etc/resolv.conf was cancelled";
                return Err(dns::DnsError::Other(why.into()));
            }
        },
    };
    let endpoint = |a: SocketAddr| HostPort {
        host: a.ip().to_string(),
        port: a.port(),
    };
    match port {
        Some(port) => {
            let addrs = dns::lookup_addrs(server, name, port, DNS_TIMEOUT).await?;
            Ok(addrs
                .into_iter()
                .map(|a| Arc::new((Found::at(endpoint(a)), a)))
                .collect())
        }
        None => {
            let targets = dns::lookup_srv(server, name, DNS_TIMEOUT).await?;
            Ok(targets
                .into_iter()
                .map(|t| {
                    let mut f = Found::at(endpoint(t.addr));
                    f.name = format!("{}:{}", t.host, t.addr.port());
                    Arc::new((f, t.addr))
                })
                .collect())
        }
    }
}

async fn etcd_source(
    control: Shared,
    model: String,
    epoch: u64,
    endpoints: Vec<HostPort>,
    prefix: String,
) {
    let mut backoff = ETCD_BACKOFF;
    for n in 0usize.. {
        if !current(&control, &model, epoch) {
            return;
        }
        let endpoint = &endpoints[n % endpoints.len()];
        let session = match lookup_off_loop(endpoint).await.map_err(|e| e.to_string()) {
            Ok(addr) => {
                etcd_session(
                    &control,
                    &model,
                    epoch,
                    addr,
                    endpoint,
                    &prefix,
                    &mut backoff,
                )
                .await
            }
            Err(e) => Err(e),
        };
        match session {
            Ok(()) => return,
            Err(e) => {
                let e = format!("{endpoint}: {e}");
                if !report(&control, &model, epoch, Err(e)) {
                    return;
                }
            }
        }
        monoio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(ETCD_BACKOFF_MAX);
    }
}

/// Reads the prefix, then applies its watch until an error (returned) or until the task
/// is no longer current (`Ok`).
async fn etcd_session(
    control: &Shared,
    model: &str,
    epoch: u64,
    addr: SocketAddr,
    endpoint: &HostPort,
    prefix: &str,
    backoff: &mut Duration,
) -> Result<(), String> {
    let host = endpoint.to_string();
    let (revision, kvs) = etcd::range_prefix(addr, &host, prefix, ETCD_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    let mut members: BTreeMap<String, FoundMember> = BTreeMap::new();
    for kv in kvs {
        put(&mut members, prefix, &kv).await;
    }
    if !report(
        control,
        model,
        epoch,
        Ok(members.values().cloned().collect()),
    ) {
        return Ok(());
    }
    let mut watch = etcd::Watch::start(addr, &host, prefix, revision + 1, ETCD_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    *backoff = ETCD_BACKOFF;
    // When the members changed without being reported yet: changes are reported at most
    // every REPORT_INTERVAL_MS, so a burst of events costs one report, not one each.
    let mut changed_at: Option<u64> = None;
    // When the watch last proved etcd alive (its events, or an answered check).
    let mut heard = clock::now();
    loop {
        // One `next()` kept across the inner loop: dropping it mid-read breaks the watch.
        let mut next = std::pin::pin!(watch.next());
        let events = loop {
            let wait = changed_at
                .map(|t| REPORT_INTERVAL_MS.saturating_sub(clock::now_ms().saturating_sub(t)));
            monoio::select! {
                r = &mut next => break r.map_err(|e| e.to_string())?,
                _ = monoio::time::sleep(Duration::from_millis(wait.unwrap_or(0))), if wait.is_some() => {
                    changed_at = None;
                    let members = members.values().cloned().collect();
                    if !report(control, model, epoch, Ok(members)) {
                        return Ok(());
                    }
                }
                _ = stale(control, model, epoch) => return Ok(()),
                _ = monoio::time::sleep(WATCH_SILENCE.saturating_sub(clock::since(heard))) => {
                    etcd::check(addr, &host, prefix, ETCD_TIMEOUT).await.map_err(|e| {
                        format!(
                            "the watch was silent for {} s and etcd did not answer a check: {e}",
                            WATCH_SILENCE.as_secs()
                        )
                    })?;
                    heard = clock::now();
                }
            }
        };
        heard = clock::now();
        for event in events {
            match event {
                etcd::Event::Put(kv) => put(&mut members, prefix, &kv).await,
                etcd::Event::Delete { key, .. } => {
                    members.remove(&key);
                }
            }
        }
        changed_at.get_or_insert(clock::now_ms());
    }
}

/// A key's value as a member; a value that cannot be read is logged and leaves the key
/// out (its worker gets no requests until the value is fixed).
async fn put(members: &mut BTreeMap<String, FoundMember>, prefix: &str, kv: &etcd::Kv) {
    let found = match Found::from_etcd(&kv.key, prefix, &kv.value) {
        Ok(f) => f,
        Err(e) => {
            members.remove(&kv.key);
            return tracing::warn!(error = %e, "etcd worker entry ignored");
        }
    };
    match lookup_off_loop(&found.endpoint)
        .await
        .map_err(|e| e.to_string())
    {
        Ok(addr) => {
            members.insert(kv.key.clone(), Arc::new((found, addr)));
        }
        Err(e) => {
            members.remove(&kv.key);
            tracing::warn!(key = %kv.key, error = %e, "etcd worker entry ignored: its address does not resolve");
        }
    }
}

/// Resolves once the task's model source has changed.
async fn stale(control: &Shared, model: &str, epoch: u64) {
    while current(control, model, epoch) {
        monoio::time::sleep(STALE_CHECK).await;
    }
}
