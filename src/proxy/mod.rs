//! The proxy pipeline: what one core does with its connections. The request's story, one
//! file per stage, in the order a request meets them; each file imports only files after
//! it in this list:
//!
//! `accept` (connection limit) → `conn` (bursts of requests, parked between them) →
//! `head` (read the head) → `dispatch` (by path and method) → `request` (the body, the
//! model, the upstream head) → `body` → `forward` (pick, attempt, migrate) → `room` (the
//! model's waiting room, which picks again when a slot comes back) → `pick` →
//! `attempt`: `admit` → `connect` (reuse or connect, send) → `response` (the worker's
//! head) → `relay` (stream it back).
//!
//! What the stages share, below them: `exchange` (one proxied request's facts and client
//! side), `session` (what a connection carries through a burst, and Spillway's own
//! answers), `log` (the access log's hooks), `guards` (what gives capacity back on drop),
//! `keeper` (the core's once-a-second and on-watch task), `core` (what a core owns),
//! `pool` (kept-alive upstream connections), `park` (idle client connections without
//! buffers), `peer`, `handshake` (a TLS listener's handshake), `watch` (waiting while the client
//! is watched) and `error` (the errors of the client and upstream boundaries).

mod accept;
mod admit;
mod attempt;
mod body;
mod bootstrap;
mod collect;
mod conn;
mod connect;
mod core;
mod dispatch;
mod error;
mod exchange;
mod forward;
mod guards;
mod handshake;
mod head;
mod keeper;
mod log;
mod park;
mod peer;
mod pick;
mod pool;
mod relay;
mod request;
mod response;
mod room;
mod session;
mod stages;
mod watch;

pub use accept::{Listener, run};
pub use core::{CoreCtx, SnapshotRef};
pub use error::{AttemptError, Refusal, RequestError};
pub use pool::Pools;
