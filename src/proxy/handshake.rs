//! Stage, before a TLS connection's first request: the handshake, on the connection's
//! core, within `tls.handshake_timeout_ms`, with the certificate current when it starts.
//! Plain text on the TLS port gets a plain-text 400 (as nginx answers it); every other
//! failure closes the connection. Both are counted.

use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::{AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;

use super::core::CoreCtx;
use crate::config::DEFAULT_HANDSHAKE_TIMEOUT_MS;
use crate::http::canned::{messages, write_error};
use crate::runtime::stream::{ClientRead, ClientWrite};
use crate::runtime::tls_io::handshake::{self, HandshakeError};
use crate::runtime::tls_io::split;
use crate::state::counters::add;

/// The connection's halves once the handshake is done; `None`: it failed (and closed).
pub(super) async fn handshake(
    ctx: &CoreCtx,
    mut stream: TcpStream,
    peer: SocketAddr,
) -> Option<(ClientRead, ClientWrite)> {
    let config = ctx.shared.tls.load().server.clone()?;
    let timeout_ms = (ctx.snapshot().config.tls.listener.as_ref())
        .map_or(DEFAULT_HANDSHAKE_TIMEOUT_MS, |l| l.handshake_timeout_ms);
    let done = monoio::time::timeout(
        Duration::from_millis(timeout_ms),
        handshake::accept(&mut stream, config),
    )
    .await;
    let error = match done {
        Ok(Ok(established)) => {
            add(&ctx.counters().tls_handshakes, 1);
            let (rx, tx) = split(established);
            let (read, write) = stream.into_split();
            return Some((
                ClientRead::Tls(read, Box::new(rx)),
                ClientWrite::Tls(write, Box::new(tx)),
            ));
        }
        Ok(Err(HandshakeError::NotTls)) => {
            let mut out = Vec::with_capacity(256);
            write_error(
                &mut out,
                400,
                messages::PLAIN_HTTP_ON_TLS,
                None,
                b"-",
                false,
                true,
            );
            let _ = stream.write_all(out).await;
            HandshakeError::NotTls.to_string()
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no finished handshake within {timeout_ms} ms"),
    };
    add(&ctx.counters().tls_handshake_failures, 1);
    tracing::debug!(%peer, %error, "TLS handshake failed");
    None
}
