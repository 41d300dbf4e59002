//! Stage: a connection to the worker carrying the request. The newest pooled connection
//! on which nothing arrived while it idled, when there is one, else a new one within
//! `connect_timeout_ms`; a failed connect marks the worker down with backoff. A reused
//! connection that fails before any byte of the response (the write, or a close or reset
//! before the head) is retried once on a fresh connection to the same worker: the worker
//! closed it while idle, which says nothing of the worker, and the request did not reach
//! it. Nothing else is ever replayed.

use std::io;
use std::time::Duration;

use rustls::pki_types::ServerName;

use super::core::CoreCtx;
use super::error::AttemptError;
use crate::http::Limits;
use crate::runtime::clock;
use crate::runtime::stream::Upstream;
use crate::runtime::tls_io::{handshake, split};
use crate::state::Worker;
use crate::state::counters::add;

const CLOSED: AttemptError = AttemptError::BadGateway("the worker closed the connection");

/// A connection that carries the request, and whether it came from the pool.
#[derive(Debug)]
pub(super) struct Sent {
    pub stream: Upstream,
    pub reused: bool,
}

/// Connects (or reuses) and sends the request prepared in `out`.
pub(super) async fn connect_and_send(
    ctx: &CoreCtx,
    worker: &Worker,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<Sent, AttemptError> {
    let now = clock::now_ms();
    let taken = ctx
        .pools
        .borrow_mut()
        .take(worker.state.slot, now, limits.pool_idle_timeout_ms);
    add(&ctx.counters().upstream_idle_closed, taken.stirred);
    let Some(mut stream) = taken.stream else {
        return send_fresh(ctx, worker, out, limits).await;
    };
    match send(&mut stream, out).await {
        Ok(()) => Ok(Sent {
            stream,
            reused: true,
        }),
        Err(e) => retry_fresh(ctx, worker, out, limits, &e.to_string()).await,
    }
}

/// The request again, on a fresh connection, after the pooled one it went out on failed
/// before any response byte (`why`).
pub(super) async fn retry_fresh(
    ctx: &CoreCtx,
    worker: &Worker,
    out: &mut Vec<u8>,
    limits: &Limits,
    why: &str,
) -> Result<Sent, AttemptError> {
    tracing::debug!(worker = %worker.cfg.name, error = why, "pooled connection failed before any response byte; retrying on a fresh one");
    add(&ctx.counters().upstream_reuse_retries, 1);
    send_fresh(ctx, worker, out, limits).await
}

async fn send_fresh(
    ctx: &CoreCtx,
    worker: &Worker,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<Sent, AttemptError> {
    let mut stream = connect(ctx, worker, clock::now_ms(), limits).await?;
    if let Err(e) = send(&mut stream, out).await {
        tracing::warn!(worker = %worker.cfg.name, error = %e, "sending the request failed");
        return Err(CLOSED);
    }
    Ok(Sent {
        stream,
        reused: false,
    })
}

/// Writes the request (head and body) kept in `out`; `out` keeps it for a migration.
async fn send(stream: &mut Upstream, out: &mut Vec<u8>) -> io::Result<()> {
    let (res, buf) = stream.write_all(std::mem::take(out)).await;
    *out = buf;
    res
}

async fn connect(
    ctx: &CoreCtx,
    worker: &Worker,
    now: u64,
    limits: &Limits,
) -> Result<Upstream, AttemptError> {
    let timeout = Duration::from_millis(limits.connect_timeout_ms);
    let error = match monoio::time::timeout(timeout, open(ctx, worker)).await {
        Ok(Ok(stream)) => {
            worker.state.mark_up();
            add(&ctx.counters().upstream_connects, 1);
            return Ok(stream);
        }
        Ok(Err(e)) => e,
        Err(_) => "connect timed out".to_string(),
    };
    let backoff = worker.state.mark_down(
        now,
        limits.worker_down_backoff_ms,
        limits.worker_down_backoff_max_ms,
    );
    add(&ctx.counters().upstream_connect_failures, 1);
    tracing::warn!(worker = %worker.cfg.name, url = %worker.cfg.url, %error, backoff_ms = backoff, "worker unreachable; marked down");
    Err(AttemptError::Unreachable)
}

/// A new connection to the worker: TCP, then for an `https://` worker the TLS handshake
/// (SNI and certificate check against its host). The error says which step failed.
async fn open(ctx: &CoreCtx, worker: &Worker) -> Result<Upstream, String> {
    let mut stream = Upstream::connect(worker.addr)
        .await
        .map_err(|e| e.to_string())?;
    if !worker.cfg.tls {
        return Ok(stream);
    }
    let failed = |e: String| {
        add(&ctx.counters().upstream_tls_failures, 1);
        format!("TLS: {e}")
    };
    let config = (ctx.shared.tls.load().upstream.clone())
        .ok_or_else(|| failed("no client configuration (reload to load tls.upstream_ca)".into()))?;
    let name = ServerName::try_from(worker.cfg.endpoint.host.clone())
        .map_err(|e| failed(e.to_string()))?;
    let established = handshake::connect(stream.tcp_mut(), config, name)
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok(stream.secure(Box::new(split(established))))
}
