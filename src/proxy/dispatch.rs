//! Stage: dispatch a request by path and method. `POST /v1/*` is proxied; `GET
//! /v1/models` is answered from the snapshot; the rest gets 404 or 405. Local answers read
//! and discard the body first, so the connection stays in step.

use super::body::BodyError;
use super::body::read_body;
use super::error::RequestError;
use super::log::Target;
use super::log::log_local;
use super::request::proxy;
use super::session::Session;
use super::watch::Reader;
use crate::http::limits::INITIAL_READ_BUF;
use crate::http::{BodyFraming, Method};
use crate::route::Endpoint;

/// What a request is, by its path and method.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Route {
    Proxy(Endpoint),
    Models,
    Local(RequestError),
}

impl Route {
    pub(super) fn of(path: &[u8], method: Method) -> Route {
        match (path, method) {
            (b"/v1/models", Method::Get | Method::Head) => Route::Models,
            (b"/v1/models", _) => {
                Route::Local(RequestError::MethodNotAllowed { allow: "GET, HEAD" })
            }
            (p, Method::Post) if p.starts_with(b"/v1/") => Route::Proxy(Endpoint::from_path(p)),
            (p, _) if p.starts_with(b"/v1/") => {
                Route::Local(RequestError::MethodNotAllowed { allow: "POST" })
            }
            _ => Route::Local(RequestError::NotFound),
        }
    }
}

/// Serves one request whose head is parsed. Returns whether the connection stays open.
pub(super) async fn dispatch(s: &mut Session, reader: Reader<'_>) -> bool {
    match Route::of(s.head.path(reader.buf()), s.head.method) {
        Route::Proxy(endpoint) => proxy(s, reader, endpoint).await,
        Route::Models => local(s, reader, None).await,
        Route::Local(e) => local(s, reader, Some(e)).await,
    }
}

/// Answers locally (`None`: the model list) after reading and discarding the body.
async fn local(s: &mut Session, mut reader: Reader<'_>, error: Option<RequestError>) -> bool {
    let started = crate::runtime::clock::now();
    let target = Target::of(&s.head, reader.buf());
    let with_body = s.head.method != Method::Head;
    // Do not invite a body we would discard: answer and close.
    let invited = !(s.head.body != BodyFraming::None && s.head.expect_continue);
    let keep = invited && s.head.keep_alive;
    if invited {
        match read_body(s, reader.as_mut()).await {
            Ok(body) => reader.as_mut().consume(body.request_end, INITIAL_READ_BUF),
            Err(BodyError::Closed) => return false,
            Err(BodyError::Bad(e)) => return s.answer_malformed(e).await,
        }
    }
    let status = error.map_or(200, |e| e.status(s.snap.config.overload_status_code));
    let (keep, bytes_out) = match error {
        Some(e) => s.answer_counted(e, keep, with_body).await,
        None => {
            let out = &mut s.io.to_client;
            out.clear();
            let models = &s.snap.responses.models;
            models.write(out, s.request_id.get(), keep, with_body);
            s.io.write_counted(keep).await
        }
    };
    log_local(s, &target, status, started, 0, bytes_out);
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let not_allowed = |allow| Route::Local(RequestError::MethodNotAllowed { allow });
        let cases = [
            (&b"/v1/models"[..], Method::Get, Route::Models),
            (b"/v1/models", Method::Head, Route::Models),
            (b"/v1/models", Method::Post, not_allowed("GET, HEAD")),
            (
                b"/v1/chat/completions",
                Method::Post,
                Route::Proxy(Endpoint::ChatCompletions),
            ),
            (b"/v1/rerank", Method::Post, Route::Proxy(Endpoint::Other)),
            (b"/v1/completions", Method::Get, not_allowed("POST")),
            (
                b"/health",
                Method::Get,
                Route::Local(RequestError::NotFound),
            ),
        ];
        for (path, method, want) in cases {
            assert_eq!(Route::of(path, method), want, "{path:?} {method:?}");
        }
    }
}
