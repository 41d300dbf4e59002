//! Stage: read a request head. Between requests a connection may idle for
//! `idle_timeout_ms` (then it closes quietly), parked without buffers after
//! `buffer_release_ms`; once a head has started it must complete within
//! `header_read_timeout_ms` (else 408 and close).

use std::time::{Duration, Instant};

use super::session::Session;
use super::watch::Reader;
use crate::http::HttpError;
use crate::http::request::parse_request;
use crate::runtime::clock;

pub(super) enum HeadRead {
    Ready,
    /// The client closed or idled out between requests.
    Closed,
    /// Nothing arrived for `buffer_release_ms` since this instant: time to park.
    Idle(Instant),
    Bad(HttpError),
}

pub(super) async fn read_head(s: &mut Session, mut reader: Reader<'_>) -> HeadRead {
    let limits = &s.snap.config.limits;
    let mut started: Option<Instant> = None;
    let idle = Duration::from_millis(limits.idle_timeout_ms);
    let release = Duration::from_millis(limits.buffer_release_ms);
    loop {
        if !reader.buf().is_empty() && !reader.is_reading() {
            started.get_or_insert_with(clock::now);
            let (max_head, max_body) = (limits.max_header_bytes, limits.max_body_bytes as u64);
            match parse_request(reader.buf(), max_head, max_body, &mut s.head) {
                Ok(true) => return HeadRead::Ready,
                Ok(false) => {}
                Err(e) => return HeadRead::Bad(e),
            }
        }
        // Unstarted, this is the first wait: it begins now.
        let wait = match started {
            None => release.min(idle),
            Some(t) => {
                Duration::from_millis(limits.header_read_timeout_ms).saturating_sub(clock::since(t))
            }
        };
        match monoio::time::timeout(wait, reader.as_mut().fill()).await {
            Ok(Ok(0)) | Ok(Err(_)) => return HeadRead::Closed,
            Ok(Ok(_)) => {}
            Err(_) if started.is_some() => return HeadRead::Bad(HttpError::HeaderTimeout),
            Err(_) if release < idle => {
                // The wait began `release` ago (a release of days from config must not
                // reach past the clock's origin).
                let now = clock::now();
                return HeadRead::Idle(now.checked_sub(release).unwrap_or(now));
            }
            Err(_) => return HeadRead::Closed,
        }
    }
}
