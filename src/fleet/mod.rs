//! Fleet membership and load fan-out through the servers fleets already run: DNS (a
//! Kubernetes headless Service works as-is), etcd (its v3 API through the JSON gateway)
//! and NATS (its text protocol). Clients only, run on the control thread, never on a core:
//! what they learn reaches the cores through the monitor's snapshot and busy set.

pub mod dns;
pub mod etcd;
pub mod nats;
