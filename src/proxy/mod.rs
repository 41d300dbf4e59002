//! The proxy pipeline: what one core does with its connections. The request's story, one
//! file per stage, in the order a request meets them:
//!
//! `accept` (connection limit) → `conn` (keep-alive loop) → `head` (read the head) →
//! `dispatch` (by path and method) → `body` (read the body) → `request` (find the model)
//! → `forward` (pick, attempt, migrate) → `pick` → `attempt`: `admit` → `connect` (reuse
//! or connect, send) → `response` (read the worker's head) → `relay` (stream it back).
//!
//! Between bursts of requests an idle connection waits in `park`, without buffers.
//!
//! Around them: `core` (the core's own state), `watch` (waiting while the client is
//! watched), `pool` (keep-alive pools, the once-a-second sweep), `guards` (what gives
//! capacity back on drop),
//! `error` (the errors of the client and upstream boundaries, and their answers).

mod accept;
mod admit;
mod attempt;
mod body;
mod conn;
mod connect;
mod core;
mod dispatch;
mod error;
mod forward;
mod guards;
mod head;
mod log;
mod park;
mod pick;
mod pool;
mod relay;
mod request;
mod response;
mod tls;
mod watch;

pub use accept::{Listener, run};
pub use core::{CoreCtx, SnapshotRef};
pub use error::{AttemptError, Refusal, RequestError};
pub use pool::Pools;
