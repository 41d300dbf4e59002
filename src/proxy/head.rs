//! Stage: read a request head. Between requests a connection may idle for
//! `idle_timeout_ms` (then it closes quietly); once a head has started it must complete
//! within `header_read_timeout_ms` (else 408 and close).

use std::future::Future;
use std::time::{Duration, Instant};

use super::conn::Conn;
use super::watch::Reader;
use crate::http::HttpError;
use crate::http::request::parse_request;
use crate::runtime::clock;
use crate::runtime::reader::ReadDone;

pub(super) enum HeadRead {
    Ready,
    /// The client closed or idled out between requests.
    Closed,
    Bad(HttpError),
}

impl Conn {
    pub(super) async fn read_head<F: Future<Output = ReadDone>>(
        &mut self,
        mut reader: Reader<'_, F>,
    ) -> HeadRead {
        let limits = &self.snap.config.limits;
        let mut started: Option<Instant> = None;
        loop {
            if !reader.buf().is_empty() && !reader.is_reading() {
                started.get_or_insert_with(clock::now);
                let (max_head, max_body) = (limits.max_header_bytes, limits.max_body_bytes as u64);
                match parse_request(reader.buf(), max_head, max_body, &mut self.head) {
                    Ok(true) => return HeadRead::Ready,
                    Ok(false) => {}
                    Err(e) => return HeadRead::Bad(e),
                }
            }
            let wait = match started {
                None => Duration::from_millis(limits.idle_timeout_ms),
                Some(t) => Duration::from_millis(limits.header_read_timeout_ms)
                    .saturating_sub(clock::since(t)),
            };
            match monoio::time::timeout(wait, reader.as_mut().fill()).await {
                Ok(Ok(0)) | Ok(Err(_)) => return HeadRead::Closed,
                Ok(Ok(_)) => {}
                Err(_) if started.is_some() => return HeadRead::Bad(HttpError::HeaderTimeout),
                Err(_) => return HeadRead::Closed,
            }
        }
    }
}
