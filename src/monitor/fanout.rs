//! Load over NATS on the control thread. Subscribed, each message is a `POST /load` body
//! (one event or an array); events for workers this Spillway has are applied as pushed
//! load, others are counted and skipped (one subject carries a whole fleet's load). Once
//! the messages of one read are applied, the busy set is evaluated again for their
//! workers only and published at once if it changed (the tick catches such load when it
//! turns stale). Publishing, every interval this Spillway's workers' effective load goes
//! out as one array: each worker as itself, or (with
//! `publish_as`) as one worker whose ranks are all its workers' ranks, the way a front
//! door sees a node edge. With `replica_sync`, front-door replicas share what each routed:
//! every interval this replica publishes its own routed load (its cores' tracked cells,
//! never what it heard) and applies its peers' ([`super::peers`]).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use ring::rand::{SecureRandom, SystemRandom};
use serde::Serialize;

use super::Control;
use super::fleet::NatsRole;
use super::load::parse_events;
use super::peers::{PEER_SILENCE_INTERVALS, RoutedEntry, RoutedMessage};
use crate::config::{HostPort, NatsConfig};
use crate::fleet::nats::{Publisher, Subscriber};
use crate::runtime::clock;
use crate::runtime::resolve::lookup_off_loop;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
const STALE_CHECK: Duration = Duration::from_millis(500);
const CLIENT_NAME: &str = "spillway";

type Shared = Rc<RefCell<Control>>;

/// One rank's effective load as a load event.
#[derive(Debug, Serialize)]
struct OutEvent<'a> {
    worker_id: &'a str,
    dp_rank: usize,
    dp_size: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    active_decode_blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    active_prefill_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_used_blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kv_total_blocks: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_num_batched_tokens: Option<u64>,
}

impl Control {
    /// Applies one received message.
    pub fn apply_nats(&mut self, payload: &[u8]) {
        let n = &mut self.fleet.nats;
        n.received += 1;
        let events = match parse_events(payload) {
            Ok(e) => e,
            Err(e) => {
                n.invalid += 1;
                return tracing::debug!(error = %e, "NATS load message is not a load event");
            }
        };
        let snap = self.shared.snapshot.load_full();
        let touched = &mut self.fleet.nats.touched;
        match self
            .monitor
            .table
            .push_known(&snap, &events, clock::now_ms(), touched)
        {
            Ok((applied, unknown)) => {
                let n = &mut self.fleet.nats;
                n.applied += applied as u64;
                n.unknown += unknown as u64;
            }
            Err(e) => {
                self.fleet.nats.invalid += 1;
                tracing::debug!(error = %e, "NATS load message refused");
            }
        }
    }

    /// Publishes what the messages applied since the last call changed, evaluating their
    /// workers' members only.
    pub fn flush_nats(&mut self) {
        if self.fleet.nats.touched.is_empty() {
            return;
        }
        let snap = self.shared.snapshot.load_full();
        let mut touched = std::mem::take(&mut self.fleet.nats.touched);
        self.monitor
            .publish_slots(&self.shared, &snap, clock::now_ms(), &touched);
        touched.clear();
        // Kept for its storage.
        self.fleet.nats.touched = touched;
    }

    /// This Spillway's workers' effective load, as a `POST /load` array.
    pub fn load_message(&self, publish_as: Option<&str>) -> Vec<u8> {
        let snap = self.shared.snapshot.load_full();
        let now = clock::now_ms();
        let reports = self.monitor.report(&snap, now);
        let total: usize = reports.iter().map(|r| r.ranks.len()).sum();
        let mut events = Vec::with_capacity(total);
        for r in &reports {
            for rank in &r.ranks {
                let l = &rank.load;
                events.push(OutEvent {
                    worker_id: publish_as.unwrap_or(&r.worker_id),
                    dp_rank: if publish_as.is_some() {
                        events.len()
                    } else {
                        rank.dp_rank
                    },
                    dp_size: if publish_as.is_some() {
                        total
                    } else {
                        r.ranks.len()
                    },
                    active_decode_blocks: l.active_decode_blocks,
                    active_prefill_tokens: l.active_prefill_tokens,
                    kv_used_blocks: l.kv_used_blocks,
                    kv_total_blocks: l.kv_total_blocks,
                    max_num_batched_tokens: l.max_num_batched_tokens,
                });
            }
        }
        serde_json::to_vec(&events).unwrap_or_default()
    }

    /// Applies a peer replica's routed load (this replica's own, echoed, is skipped;
    /// workers this Spillway does not have are too). The tick folds it in.
    pub fn apply_routed(&mut self, payload: &[u8]) {
        let n = &mut self.fleet.nats;
        let msg = match RoutedMessage::parse(payload) {
            Ok(m) => m,
            Err(e) => {
                n.peer_invalid += 1;
                return tracing::debug!(error = %e, "NATS message is not a replica's routed load");
            }
        };
        if *msg.replica == *self.fleet.replica_id {
            return;
        }
        n.peer_received += 1;
        let interval = n.config.as_ref().map_or(0, |c| c.publish_interval_ms);
        let until = clock::now_ms() + PEER_SILENCE_INTERVALS * interval;
        let snap = self.shared.snapshot.load_full();
        let routed = msg.routed.iter().filter_map(|e| {
            let w = snap.worker_named(&e.worker_id)?;
            Some((w.state.slot, e.load()))
        });
        let known = self.monitor.peers.peers();
        self.monitor.peers.replace(&msg.replica, routed, until);
        if self.monitor.peers.peers() > known {
            tracing::info!(peer = %msg.replica, "a peer replica shares its routed load");
        }
    }

    /// What this replica routed and has not finished, per worker (non-zero only), as
    /// its peers read it.
    pub fn routed_message(&self) -> Vec<u8> {
        let snap = self.shared.snapshot.load_full();
        let routed = snap
            .workers
            .iter()
            .filter_map(|w| {
                let load = w.state.routed_totals();
                (load != Default::default()).then(|| RoutedEntry::new(&w.cfg.name, load))
            })
            .collect();
        let msg = RoutedMessage {
            replica: self.fleet.replica_id.as_str().into(),
            routed,
        };
        serde_json::to_vec(&msg).unwrap_or_default()
    }
}

/// A fresh id for this process among front-door replicas: 64 random bits in hex.
fn new_replica_id() -> String {
    let mut bytes = [0u8; 8];
    // Without the system's random source, the process id and the time still differ
    // between replicas.
    if SystemRandom::new().fill(&mut bytes).is_err() {
        let fallback = u64::from(std::process::id()) << 32 ^ clock::now_ms();
        bytes = fallback.to_le_bytes();
    }
    format!("{:016x}", u64::from_le_bytes(bytes))
}

/// Starts the NATS tasks when `[nats]` is set and they are not running.
pub(super) fn start(control: &Shared) {
    let mut c = control.borrow_mut();
    if c.fleet.replica_id.is_empty() {
        c.fleet.replica_id = new_replica_id();
    }
    let n = &mut c.fleet.nats;
    let Some(cfg) = n.config.clone().filter(|_| !n.running) else {
        return;
    };
    n.running = true;
    let epoch = n.epoch;
    drop(c);
    let task = |role, subject: &String| Task {
        control: control.clone(),
        epoch,
        role,
        subject: subject.clone(),
    };
    if let Some(subject) = &cfg.subscribe {
        monoio::spawn(subscribe(
            task(NatsRole::Subscribe, subject),
            cfg.server.clone(),
        ));
    }
    if let Some(subject) = &cfg.publish {
        monoio::spawn(publish(task(NatsRole::Publish, subject), cfg.clone()));
    }
    if let Some(subject) = &cfg.replica_sync {
        let id = control.borrow().fleet.replica_id.clone();
        tracing::info!(replica = %id, subject, "sharing routed load with peer replicas over NATS");
        let sub = task(NatsRole::PeerSubscribe, subject);
        monoio::spawn(subscribe(sub, cfg.server.clone()));
        monoio::spawn(publish(task(NatsRole::PeerPublish, subject), cfg.clone()));
    }
}

/// One NATS connection's task: what it is for and the settings' epoch it runs under.
struct Task {
    control: Shared,
    epoch: u64,
    /// What it is for, and so what it carries: load events or routed load.
    role: NatsRole,
    subject: String,
}

impl Task {
    fn current(&self) -> bool {
        current(&self.control, self.epoch)
    }

    fn set_up(&self, up: bool) -> bool {
        self.control.borrow_mut().fleet.nats.set_up(self.role, up)
    }

    /// Logs and counts a failed session, once per outage.
    fn failed(&self, was_up: bool, e: &str) {
        let mut c = self.control.borrow_mut();
        if c.fleet.nats.epoch == self.epoch {
            c.fleet.nats.errors += 1;
        }
        let role = self.role.label();
        if was_up {
            tracing::warn!(role, error = %e, "NATS connection lost; reconnecting");
        } else {
            tracing::debug!(role, error = %e, "NATS connection failed; retrying");
        }
    }

    /// Runs `session` again after each failure, with backoff, while the epoch is current.
    async fn supervise<F: Future<Output = Result<(), String>>>(&self, session: impl Fn() -> F) {
        let mut backoff = BACKOFF;
        while self.current() {
            let result = session().await;
            let was_up = self.set_up(false);
            match result {
                Ok(()) => return,
                Err(e) => self.failed(was_up, &e),
            }
            if was_up {
                backoff = BACKOFF;
            }
            monoio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

fn current(control: &Shared, epoch: u64) -> bool {
    control.borrow().fleet.nats.epoch == epoch
}

async fn stale(control: &Shared, epoch: u64) {
    while current(control, epoch) {
        monoio::time::sleep(STALE_CHECK).await;
    }
}

async fn subscribe(task: Task, server: HostPort) {
    let session = || async {
        let (control, subject) = (&task.control, &task.subject);
        let addr = lookup_off_loop(&server).await.map_err(|e| e.to_string())?;
        let mut sub = Subscriber::connect(addr, CLIENT_NAME, subject, CONNECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        task.set_up(true);
        tracing::info!(server = %server, subject, role = task.role.label(), "subscribed over NATS");
        loop {
            let msg = monoio::select! {
                m = sub.next() => m.map_err(|e| e.to_string())?,
                _ = stale(control, task.epoch) => return Ok(()),
            };
            let mut c = control.borrow_mut();
            match task.role {
                NatsRole::PeerSubscribe => c.apply_routed(&msg.payload),
                _ => {
                    c.apply_nats(&msg.payload);
                    // Messages that came in one read are applied together, then published.
                    if !sub.buffered() {
                        c.flush_nats();
                    }
                }
            }
        }
    };
    task.supervise(session).await;
}

async fn publish(task: Task, cfg: NatsConfig) {
    let interval = Duration::from_millis(cfg.publish_interval_ms);
    let session = || async {
        let (control, subject) = (&task.control, &task.subject);
        let addr = lookup_off_loop(&cfg.server)
            .await
            .map_err(|e| e.to_string())?;
        let mut p = Publisher::connect(addr, CLIENT_NAME, CONNECT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        task.set_up(true);
        tracing::info!(server = %cfg.server, subject, role = task.role.label(), "publishing over NATS");
        while task.current() {
            let body = match task.role {
                NatsRole::PeerPublish => control.borrow().routed_message(),
                _ => control.borrow().load_message(cfg.publish_as.as_deref()),
            };
            p.publish(subject, &body).await.map_err(|e| e.to_string())?;
            {
                let n = &mut control.borrow_mut().fleet.nats;
                match task.role {
                    NatsRole::PeerPublish => n.peer_published += 1,
                    _ => n.published += 1,
                }
            }
            monoio::time::sleep(interval).await;
        }
        Ok(())
    };
    task.supervise(session).await;
}
