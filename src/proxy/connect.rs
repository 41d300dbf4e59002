//! Stage: a connection to the worker carrying the request. The newest pooled connection
//! when there is one (a write failure on it, before any byte of the request went out, is
//! retried once on a fresh connection: nothing else is ever replayed), else a new one
//! within `connect_timeout_ms`; a failed connect marks the worker down with backoff.

use std::io;
use std::time::Duration;

use monoio::net::TcpStream;
use rustls::pki_types::ServerName;

use super::core::CoreCtx;
use super::error::AttemptError;
use crate::http::Limits;
use crate::runtime::clock;
use crate::runtime::stream::Upstream;
use crate::runtime::tls::{handshake, split};
use crate::state::Worker;
use crate::state::counters::add;

const CLOSED: AttemptError = AttemptError::BadGateway("the worker closed the connection");

/// Connects (or reuses) and sends the request prepared in `out`.
pub(super) async fn connect_and_send(
    ctx: &CoreCtx,
    worker: &Worker,
    out: &mut Vec<u8>,
    limits: &Limits,
) -> Result<Upstream, AttemptError> {
    let now = clock::now_ms();
    let pooled = ctx
        .pools
        .borrow_mut()
        .take(worker.state.slot, now, limits.pool_idle_timeout_ms);
    let reused = pooled.is_some();
    let mut stream = match pooled {
        Some(s) => s,
        None => connect(ctx, worker, now, limits).await?,
    };
    let Err(e) = send(&mut stream, out).await else {
        return Ok(stream);
    };
    if !reused {
        tracing::warn!(worker = %worker.cfg.name, error = %e, "sending the request failed");
        return Err(CLOSED);
    }
    // A kept-alive connection the worker closed under us: retry once, fresh.
    tracing::debug!(worker = %worker.cfg.name, error = %e, "pooled connection failed on write; retrying fresh");
    add(&ctx.counters().upstream_reuse_retries, 1);
    let mut stream = connect(ctx, worker, clock::now_ms(), limits).await?;
    send(&mut stream, out).await.map_err(|_| CLOSED)?;
    Ok(stream)
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
    let mut stream = TcpStream::connect_addr(worker.addr)
        .await
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    if !worker.cfg.tls {
        return Ok(Upstream::Plain(stream));
    }
    let failed = |e: String| {
        add(&ctx.counters().upstream_tls_failures, 1);
        format!("TLS: {e}")
    };
    let config = (ctx.shared.tls.load().upstream.clone())
        .ok_or_else(|| failed("no client configuration (reload to load tls.upstream_ca)".into()))?;
    let name = ServerName::try_from(worker.cfg.endpoint.host.clone())
        .map_err(|e| failed(e.to_string()))?;
    let established = handshake::connect(&mut stream, config, name)
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok(Upstream::Tls(stream, Box::new(split(established))))
}
