//! Spillway: a load-shedding HTTP/1.1 edge proxy for LLM inference fleets.
//!
//! Modules in layers; each imports only from the layers below it (checked by
//! `tests/architecture.rs`, drawn in ARCHITECTURE.md):
//! 1. decision code, pure: [`http`] (sans-io codec), [`shed`] (busy rule), [`admission`]
//!    (engine slots and queue), [`route`] (model scan, router modes), [`health`]
//!    (outlier ejection, check rise and fall);
//! 2. [`config`]: the file and its validation; [`tls`]: rustls configurations from it, and
//!    the record layer that takes over after each handshake;
//! 3. [`state`]: what the threads share (snapshot, busy set, per-worker atomics, counters);
//! 4. [`runtime`]: runtimes, CPU placement, listeners, the clock, the client read slot,
//!    name resolution;
//!    [`accesslog`]: the access log's per-core buffers and its writer thread;
//! 5. [`fleet`]: clients of the fleet's servers (DNS, etcd, NATS) for the control thread;
//! 6. what runs on it: [`monitor`] (load, busy publication, reload), [`metrics`]
//!    (exposition), [`admin`] (control API), [`proxy`] (the data path);
//! 7. [`server`]: the wiring that starts it all.

#![forbid(unsafe_code)]

pub mod admission;
pub mod health;
pub mod http;
pub mod route;
pub mod shed;

pub mod config;

pub mod tls;

pub mod state;

pub mod runtime;

pub mod accesslog;

pub mod fleet;

pub mod admin;
pub mod metrics;
pub mod monitor;
pub mod proxy;

pub mod server;

pub use crate::config::{Config, ConfigSource, Overrides};
pub use crate::server::{ServerHandle, start};

/// Pure parsers that are not otherwise public, for the targets in `fuzz/`. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::admin::thresholds::{Update, parse_delete, parse_post};
    pub use crate::fleet::nats::proto as nats_proto;
}
