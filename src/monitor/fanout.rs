//! Load over NATS on the control thread. Subscribed, each message is a `POST /load` body
//! (one event or an array); events for workers this Spillway has are applied as pushed
//! load, others are counted and skipped (one subject carries a whole fleet's load). Once
//! the messages of one read are applied, the busy set is evaluated again for their
//! workers only and published at once if it changed (the tick catches such load when it
//! turns stale). Publishing, every interval this Spillway's workers' effective load goes
//! out as one array: each worker as itself, or (with
//! `publish_as`) as one worker whose ranks are all its workers' ranks, the way a front
//! door sees a node edge.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use serde::Serialize;

use super::Control;
use super::load::parse_events;
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
}

/// Starts the NATS tasks when `[nats]` is set and they are not running.
pub(super) fn start(control: &Shared) {
    let mut c = control.borrow_mut();
    let n = &mut c.fleet.nats;
    let Some(cfg) = n.config.clone().filter(|_| !n.running) else {
        return;
    };
    n.running = true;
    let epoch = n.epoch;
    drop(c);
    if let Some(subject) = cfg.subscribe.clone() {
        monoio::spawn(subscribe(
            control.clone(),
            epoch,
            cfg.server.clone(),
            subject,
        ));
    }
    if let Some(subject) = cfg.publish.clone() {
        monoio::spawn(publish(control.clone(), epoch, cfg, subject));
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

/// Logs and counts a failed session, once per outage.
fn failed(control: &Shared, epoch: u64, role: &str, was_up: bool, e: &str) {
    let mut c = control.borrow_mut();
    if c.fleet.nats.epoch == epoch {
        c.fleet.nats.errors += 1;
    }
    if was_up {
        tracing::warn!(role, error = %e, "NATS connection lost; reconnecting");
    } else {
        tracing::debug!(role, error = %e, "NATS connection failed; retrying");
    }
}

async fn subscribe(control: Shared, epoch: u64, server: HostPort, subject: String) {
    let mut backoff = BACKOFF;
    while current(&control, epoch) {
        let session = async {
            let addr = lookup_off_loop(&server).await.map_err(|e| e.to_string())?;
            let mut sub = Subscriber::connect(addr, CLIENT_NAME, &subject, CONNECT_TIMEOUT)
                .await
                .map_err(|e| e.to_string())?;
            control.borrow_mut().fleet.nats.subscribed = true;
            tracing::info!(server = %server, subject, "subscribed to load over NATS");
            loop {
                let msg = monoio::select! {
                    m = sub.next() => m.map_err(|e| e.to_string())?,
                    _ = stale(&control, epoch) => return Ok(()),
                };
                let mut c = control.borrow_mut();
                c.apply_nats(&msg.payload);
                // Messages that came in one read are applied together, then published.
                if !sub.buffered() {
                    c.flush_nats();
                }
            }
        };
        let result: Result<(), String> = session.await;
        let was_up = std::mem::take(&mut control.borrow_mut().fleet.nats.subscribed);
        match result {
            Ok(()) => return,
            Err(e) => failed(&control, epoch, "subscribe", was_up, &e),
        }
        if was_up {
            backoff = BACKOFF;
        }
        monoio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

async fn publish(control: Shared, epoch: u64, cfg: NatsConfig, subject: String) {
    let interval = Duration::from_millis(cfg.publish_interval_ms);
    let mut backoff = BACKOFF;
    while current(&control, epoch) {
        let session = async {
            let addr = lookup_off_loop(&cfg.server)
                .await
                .map_err(|e| e.to_string())?;
            let mut p = Publisher::connect(addr, CLIENT_NAME, CONNECT_TIMEOUT)
                .await
                .map_err(|e| e.to_string())?;
            control.borrow_mut().fleet.nats.publishing = true;
            tracing::info!(server = %cfg.server, subject, "publishing load over NATS");
            while current(&control, epoch) {
                let body = control.borrow().load_message(cfg.publish_as.as_deref());
                p.publish(&subject, &body)
                    .await
                    .map_err(|e| e.to_string())?;
                control.borrow_mut().fleet.nats.published += 1;
                monoio::time::sleep(interval).await;
            }
            Ok(())
        };
        let result: Result<(), String> = session.await;
        let was_up = std::mem::take(&mut control.borrow_mut().fleet.nats.publishing);
        match result {
            Ok(()) => return,
            Err(e) => failed(&control, epoch, "publish", was_up, &e),
        }
        if was_up {
            backoff = BACKOFF;
        }
        monoio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
