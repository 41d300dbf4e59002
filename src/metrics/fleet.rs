//! The fleet's series: worker sources (`spillway_discovery_*`) and load over NATS
//! (`spillway_nats_*`).

use super::families::{Families, labels};
use crate::monitor::{Control, Fleet, NatsRole};

pub(super) fn families(f: &mut Families, control: &Control) {
    let fleet = &control.fleet;
    let per_source = |get: &dyn Fn(&str, &crate::monitor::SourceState) -> f64| {
        fleet
            .sources
            .iter()
            .map(|(model, s)| {
                let l = labels(&[("model", model.as_str()), ("source", s.spec.kind())]);
                (l, get(model, s))
            })
            .collect::<Vec<_>>()
    };
    f.gauge(
        "spillway_discovery_up",
        "Whether the model's worker source answered its last lookup (0: failed or not yet; the last good membership stays)",
        per_source(&|_, s| f64::from(u8::from(s.up == Some(true)))),
    );
    f.gauge(
        "spillway_discovery_members",
        "Workers the model's source holds now",
        per_source(&|m, _| fleet.members(m) as f64),
    );
    f.counter(
        "spillway_discovery_errors_total",
        "Failed lookups, reads or watches of the model's worker source",
        per_source(&|_, s| s.errors as f64),
    );
    f.counter(
        "spillway_discovery_changes_total",
        "Membership changes the model's worker source reported",
        per_source(&|_, s| s.updates as f64),
    );
    let n = &fleet.nats;
    if n.config.is_none() {
        return;
    }
    let c = |on: bool| f64::from(u8::from(on));
    f.gauge(
        "spillway_nats_connected",
        "Whether the NATS connection of each role is up",
        NatsRole::ALL.map(|r| (labels(&[("role", r.label())]), c(n.is_up(r)))),
    );
    f.counter(
        "spillway_nats_messages_total",
        "Load messages received and published over NATS",
        [
            (labels(&[("direction", "received")]), n.received as f64),
            (labels(&[("direction", "published")]), n.published as f64),
        ],
    );
    f.counter(
        "spillway_nats_load_events_total",
        "Received load events: applied, or skipped for a worker this Spillway does not have",
        [
            (labels(&[("result", "applied")]), n.applied as f64),
            (labels(&[("result", "unknown_worker")]), n.unknown as f64),
        ],
    );
    f.counter(
        "spillway_nats_invalid_messages_total",
        "Received messages that were not valid load events (refused whole)",
        [(Vec::new(), n.invalid as f64)],
    );
    f.counter(
        "spillway_nats_errors_total",
        "NATS connections that failed or were lost",
        [(Vec::new(), n.errors as f64)],
    );
    if n.config.as_ref().is_some_and(|c| c.replica_sync.is_some()) {
        replica_sync(f, fleet, control.monitor.peers.peers());
    }
}

/// `spillway_nats_replica_*`: the replica sync's traffic and the peers it hears.
fn replica_sync(f: &mut Families, fleet: &Fleet, peers: usize) {
    let n = &fleet.nats;
    f.counter(
        "spillway_nats_replica_messages_total",
        "Routed-load messages between front-door replicas: peers' applied, refused as invalid, this replica's published",
        [
            (labels(&[("direction", "received")]), n.peer_received as f64),
            (labels(&[("direction", "invalid")]), n.peer_invalid as f64),
            (labels(&[("direction", "published")]), n.peer_published as f64),
        ],
    );
    f.gauge(
        "spillway_nats_replica_peers",
        "Peer replicas heard from within their silence limit (their routed load counts here)",
        [(Vec::new(), peers as f64)],
    );
}
