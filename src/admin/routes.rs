//! The admin routes: which handler answers which method and path, the bearer-token check
//! of mutating calls, and the `/load` and `/reload` handlers.

use std::cell::RefCell;
use std::sync::atomic::Ordering;

use super::thresholds;
use super::{AdminError, Reply};
use crate::http::Method;
use crate::monitor::load::{PushError, parse_events};
use crate::monitor::{Control, reload};
use crate::runtime::clock;

/// The parts of an admin request handlers look at.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: Method,
    pub path: &'a [u8],
    pub content_type: Option<&'a [u8]>,
    pub authorization: Option<&'a [u8]>,
    pub body: &'a [u8],
}

impl Request<'_> {
    /// Whether the request may change state: with a token configured, it must carry
    /// `Authorization: Bearer <token>`, compared in constant time.
    fn authorized(&self, token: Option<&str>) -> bool {
        use subtle::ConstantTimeEq as _;
        let Some(token) = token else { return true };
        let presented = self
            .authorization
            .and_then(bearer_token)
            .unwrap_or_default();
        bool::from(presented.ct_eq(token.as_bytes()))
    }

    /// 415 unless the body is declared JSON (`application/json`, any parameters).
    pub fn require_json(&self) -> Result<(), AdminError> {
        let ct = self.content_type.unwrap_or_default();
        let essence = ct
            .split(|&b| b == b';')
            .next()
            .unwrap_or_default()
            .trim_ascii();
        if essence.eq_ignore_ascii_case(b"application/json") {
            Ok(())
        } else {
            Err(AdminError::NotJson)
        }
    }

    fn mutating(&self) -> bool {
        matches!(
            (self.method, self.path),
            (Method::Post | Method::Delete, b"/busy_threshold")
                | (Method::Post, b"/load" | b"/reload")
        )
    }
}

/// The token of a `Bearer` credential: the scheme in any case (RFC 9110 §11.1), then one
/// or more spaces (§11.4), then the token (trimmed).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(b"bearer".len())?;
    if !scheme.eq_ignore_ascii_case(b"bearer") || rest.first() != Some(&b' ') {
        return None;
    }
    Some(rest.trim_ascii())
}

/// Answers one admin request.
pub(super) async fn respond(control: &RefCell<Control>, req: &Request<'_>) -> Reply {
    let result = if req.mutating() && !authorized(control, req) {
        Err(AdminError::Unauthorized)
    } else if (req.method, req.path) == (Method::Post, b"/reload") {
        reload(control)
            .await
            .map(|generation| Reply::json(200, &serde_json::json!({ "generation": generation })))
            .map_err(AdminError::from)
    } else {
        route(control, req)
    };
    result.unwrap_or_else(Reply::from)
}

fn authorized(control: &RefCell<Control>, req: &Request<'_>) -> bool {
    let c = control.borrow();
    let snap = c.shared.snapshot.load();
    req.authorized(snap.config.admin_token.as_deref())
}

fn route(control: &RefCell<Control>, req: &Request<'_>) -> Result<Reply, AdminError> {
    let draining = control.borrow().shared.draining.load(Ordering::Relaxed);
    let status = |name: &str| {
        let (code, status) = if draining {
            (503, "draining")
        } else {
            (200, name)
        };
        Ok(Reply::json(code, &serde_json::json!({ "status": status })))
    };
    match (req.method, req.path) {
        (Method::Get | Method::Head, b"/health") => status("healthy"),
        (Method::Get | Method::Head, b"/live") => status("live"),
        (Method::Get | Method::Head, b"/metrics") => Ok(Reply::text(
            "text/plain; version=0.0.4; charset=utf-8",
            crate::metrics::render(&control.borrow()),
        )),
        (Method::Get, b"/busy_threshold") => Ok(thresholds::list(&control.borrow())),
        (Method::Post, b"/busy_threshold") => thresholds::post(&mut control.borrow_mut(), req),
        (Method::Delete, b"/busy_threshold") => thresholds::delete(&mut control.borrow_mut(), req),
        (Method::Post, b"/load") => push_load(&mut control.borrow_mut(), req),
        (Method::Get, b"/load") => Ok(load_state(&control.borrow())),
        (Method::Get, b"/workers") => Ok(workers(&control.borrow())),
        (
            _,
            b"/health" | b"/live" | b"/metrics" | b"/busy_threshold" | b"/load" | b"/reload"
            | b"/workers",
        ) => Err(AdminError::MethodNotAllowed),
        _ => Err(AdminError::NotFound("Not found".into())),
    }
}

/// `POST /load`: one load event or an array; all checked before any is applied.
fn push_load(control: &mut Control, req: &Request<'_>) -> Result<Reply, AdminError> {
    req.require_json()?;
    let events = parse_events(req.body)
        .map_err(|e| AdminError::Invalid(format!("Invalid load event: {e}")))?;
    let snap = control.shared.snapshot.load_full();
    let n = control
        .monitor
        .table
        .push(&snap, &events, clock::now_ms())
        .map_err(|e| match e {
            PushError::UnknownWorker(_) => AdminError::NotFound(e.to_string()),
            PushError::Invalid(_) => AdminError::Invalid(e.to_string()),
        })?;
    control.republish();
    Ok(Reply::json(200, &serde_json::json!({ "accepted": n })))
}

/// `GET /load`: what the monitor currently believes, per worker and rank.
fn load_state(control: &Control) -> Reply {
    let snap = control.shared.snapshot.load_full();
    let workers = control.monitor.report(&snap, clock::now_ms());
    let generation = control.monitor.published().generation;
    Reply::json(
        200,
        &serde_json::json!({ "generation": generation, "workers": workers }),
    )
}

/// `GET /workers`: each worker's health (docs/behaviour.md §22.8).
fn workers(control: &Control) -> Reply {
    let snap = control.shared.snapshot.load_full();
    let workers = control.monitor.health.view(&snap);
    let generation = control.monitor.published().generation;
    Reply::json(
        200,
        &serde_json::json!({ "generation": generation, "now_ms": clock::now_ms(), "workers": workers }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 26, item 10: the scheme matches in any case, one or more spaces follow it.
    #[test]
    fn bearer_scheme_in_any_case() {
        let req = |auth: &'static str| Request {
            method: Method::Post,
            path: b"/load",
            content_type: None,
            authorization: Some(auth.as_bytes()),
            body: b"",
        };
        for ok in [
            "Bearer s3cret",
            "bearer s3cret",
            "BEARER s3cret",
            "bEaReR s3cret",
            "Bearer   s3cret",
            "Bearer s3cret ",
        ] {
            assert!(req(ok).authorized(Some("s3cret")), "{ok:?}");
        }
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "Bearers3cret",
            "Bearer\ts3cret",
            "Basic s3cret",
            "Bearer",
            "Bearer ",
            "s3cret",
            "",
        ] {
            assert!(!req(bad).authorized(Some("s3cret")), "{bad:?}");
        }
        assert!(req("anything").authorized(None));
    }
}
