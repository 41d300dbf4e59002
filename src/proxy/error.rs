//! The errors of the two boundaries a proxied request crosses, each knowing its HTTP
//! status, its label (Dynamo's `error_type`) and whether a retry is safe:
//! - [`RequestError`]: why Spillway answers the client itself. [`RequestError::write`] is
//!   the one place such an answer is rendered.
//! - [`AttemptError`]: why one attempt on one worker ended without a response; the
//!   forwarder tries another worker exactly when it is retry-safe.

use std::borrow::Cow;

use super::core::FRESH_REQUEST_ID_LEN;
use crate::admission::{AT_CAPACITY, QUEUE_TIMEOUT};
use crate::http::HttpError;
use crate::http::canned::{messages, write_error};
use crate::http::limits::MAX_REQUEST_ID_LEN;
use crate::route::peek::PeekError;
use crate::state::Responses;
use crate::state::counters::{MigrationReason, Outcome};

const _: () = assert!(FRESH_REQUEST_ID_LEN <= MAX_REQUEST_ID_LEN);

/// A worker-local refusal (semantics §6): the request may move to another worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Engine slots and queue full here.
    AtCapacity,
    /// Waited in this worker's queue past `request_queue_timeout_ms`.
    QueueTimeout,
    /// The worker answered 529 (or the overload status).
    UpstreamOverloaded,
    /// The worker answered 503.
    UpstreamUnavailable,
}

impl Refusal {
    pub fn reason(self) -> MigrationReason {
        match self {
            Refusal::AtCapacity => MigrationReason::WorkerAtCapacity,
            Refusal::QueueTimeout => MigrationReason::QueueTimeout,
            Refusal::UpstreamOverloaded => MigrationReason::UpstreamOverloaded,
            Refusal::UpstreamUnavailable => MigrationReason::UpstreamUnavailable,
        }
    }

    /// What the client gets when no other worker takes the request.
    pub fn to_client(self) -> RequestError {
        match self {
            Refusal::UpstreamUnavailable => RequestError::Unavailable,
            r => RequestError::WorkerOverloaded(r),
        }
    }
}

/// Why the client is answered by Spillway instead of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The head or body cannot be read as one unambiguous request: answer and close.
    Framing(HttpError),
    /// No route for the path.
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    /// The body is not a JSON object with a usable top-level `model`.
    BadBody(PeekError),
    MissingModel,
    UnknownModel,
    /// Every eligible worker is busy (pool-wide; never migrated).
    Overloaded,
    /// Worker-local refusals left no worker to migrate to, or the limit is spent.
    WorkerOverloaded(Refusal),
    /// Direct routing: the pinned worker is busy.
    DirectBusy,
    /// No worker can serve at all.
    Unavailable,
    DirectMissingHeader,
    DirectUnknownWorker,
    BadGateway(&'static str),
    GatewayTimeout,
}

impl RequestError {
    /// The status the client gets; `overload` is the configured overload status.
    pub fn status(&self, overload: u16) -> u16 {
        use RequestError::*;
        match self {
            Framing(e) => e.status(),
            NotFound | UnknownModel | DirectUnknownWorker => 404,
            MethodNotAllowed { .. } => 405,
            BadBody(_) | MissingModel | DirectMissingHeader => 400,
            Overloaded | WorkerOverloaded(_) | DirectBusy => overload,
            Unavailable => 503,
            BadGateway(_) => 502,
            GatewayTimeout => 504,
        }
    }

    /// How the request is counted (`dynamo_frontend_requests_total{error_type}`).
    pub fn outcome(&self) -> Outcome {
        use RequestError::*;
        match self {
            Overloaded | WorkerOverloaded(_) | DirectBusy => Outcome::Overload,
            Unavailable => Outcome::Unavailable,
            Framing(_) | BadBody(_) | MissingModel | DirectMissingHeader => Outcome::Validation,
            MethodNotAllowed { .. } => Outcome::Validation,
            NotFound | UnknownModel | DirectUnknownWorker => Outcome::NotFound,
            BadGateway(_) => Outcome::Internal,
            GatewayTimeout => Outcome::ResponseTimeout,
        }
    }

    /// The label of [`RequestError::outcome`].
    pub fn label(&self) -> &'static str {
        self.outcome().error_type()
    }

    /// True when no engine worked on the request and the refusal is transient: the
    /// client (or a proxy in front) may send it again, here or elsewhere. These answers
    /// carry `Retry-After`.
    pub fn retry_safe(&self) -> bool {
        use RequestError::*;
        matches!(
            self,
            Overloaded | WorkerOverloaded(_) | DirectBusy | Unavailable
        )
    }

    /// Counted in `dynamo_frontend_model_rejection_total`.
    pub fn is_rejection(&self) -> bool {
        self.outcome() == Outcome::Overload
    }

    /// The connection's framing is in doubt: close after answering.
    pub fn closes_connection(&self) -> bool {
        matches!(self, RequestError::Framing(_))
    }

    /// Appends the whole response to `out`: pre-rendered for the common refusals, else
    /// rendered now. HEAD requests get no body.
    pub fn write(
        &self,
        responses: &Responses,
        out: &mut Vec<u8>,
        request_id: &[u8],
        keep_alive: bool,
        with_body: bool,
    ) {
        use RequestError::*;
        let canned = match self {
            NotFound => &responses.not_found,
            UnknownModel => &responses.model_not_found,
            Overloaded => &responses.overloaded,
            WorkerOverloaded(Refusal::QueueTimeout) => &responses.queue_timeout,
            WorkerOverloaded(_) => &responses.worker_at_capacity,
            DirectBusy => &responses.direct_busy,
            Unavailable => &responses.unavailable,
            _ => {
                let allow = match self {
                    MethodNotAllowed { allow } => Some(*allow),
                    _ => None,
                };
                let (status, message) = (self.status(0), self.message());
                write_error(
                    out, status, &message, allow, request_id, keep_alive, with_body,
                );
                return;
            }
        };
        canned.write(out, request_id, keep_alive, with_body);
    }

    /// The `message` of the answer's JSON body.
    pub fn message(&self) -> Cow<'static, str> {
        use RequestError::*;
        match self {
            Framing(e) => e.to_string().into(),
            BadBody(PeekError::NotObject | PeekError::Syntax) => {
                "Request body must be a JSON object".into()
            }
            BadBody(e) => e.to_string().into(),
            MissingModel => "Missing required field `model` in the request body".into(),
            MethodNotAllowed { .. } => "Method not allowed".into(),
            DirectMissingHeader => {
                "The x-worker-id header is required in direct routing mode".into()
            }
            DirectUnknownWorker => "Worker not found".into(),
            BadGateway(why) => (*why).into(),
            GatewayTimeout => "The worker did not respond in time".into(),
            NotFound => messages::NOT_FOUND.into(),
            UnknownModel => messages::MODEL_NOT_FOUND.into(),
            Overloaded => messages::OVERLOADED.into(),
            DirectBusy => messages::DIRECT_BUSY.into(),
            WorkerOverloaded(Refusal::QueueTimeout) => QUEUE_TIMEOUT.into(),
            WorkerOverloaded(_) => AT_CAPACITY.into(),
            Unavailable => messages::UNAVAILABLE.into(),
        }
    }
}

/// Why one attempt on one worker ended without a response for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptError {
    /// The worker refused before doing any work: migrate (counted, limited).
    Refused(Refusal),
    /// Connecting failed: the worker is marked down; fail over (not a migration).
    Unreachable,
    /// The client left while the request waited or ran.
    ClientGone,
    /// No response head within `upstream_first_byte_timeout_ms`.
    Timeout,
    /// The request may have reached the engine but no usable response came back.
    BadGateway(&'static str),
    /// The response broke after bytes reached the client: nothing left but to close.
    Broken(Outcome),
}

impl AttemptError {
    /// Another worker may take the request: nothing reached an engine that works on it.
    pub fn retry_safe(&self) -> bool {
        matches!(self, AttemptError::Refused(_) | AttemptError::Unreachable)
    }

    pub fn status(&self, overload: u16) -> Option<u16> {
        self.to_client().map(|e| e.status(overload))
    }

    pub fn label(&self) -> &'static str {
        self.outcome().error_type()
    }

    pub fn outcome(&self) -> Outcome {
        match self {
            AttemptError::ClientGone => Outcome::Cancelled,
            AttemptError::Broken(o) => *o,
            e => e.to_client().map_or(Outcome::Internal, |c| c.outcome()),
        }
    }

    /// The answer the client gets when this is the last word, or `None` when the client
    /// is gone or already has part of a response.
    pub fn to_client(self) -> Option<RequestError> {
        match self {
            AttemptError::Refused(r) => Some(r.to_client()),
            AttemptError::Unreachable => Some(RequestError::Unavailable),
            AttemptError::Timeout => Some(RequestError::GatewayTimeout),
            AttemptError::BadGateway(why) => Some(RequestError::BadGateway(why)),
            AttemptError::ClientGone | AttemptError::Broken(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_labels_and_retry_safety() {
        let cases = [
            (RequestError::Overloaded, 529, "overload", true),
            (
                RequestError::WorkerOverloaded(Refusal::QueueTimeout),
                529,
                "overload",
                true,
            ),
            (RequestError::Unavailable, 503, "unavailable", true),
            (RequestError::UnknownModel, 404, "not_found", false),
            (RequestError::MissingModel, 400, "validation", false),
            (
                RequestError::Framing(HttpError::BodyTimeout),
                408,
                "validation",
                false,
            ),
            (RequestError::BadGateway("x"), 502, "internal", false),
            (RequestError::GatewayTimeout, 504, "response_timeout", false),
        ];
        for (e, status, label, retry) in cases {
            assert_eq!(
                (e.status(529), e.label(), e.retry_safe()),
                (status, label, retry),
                "{e:?}"
            );
        }
        assert!(AttemptError::Refused(Refusal::AtCapacity).retry_safe());
        assert!(AttemptError::Unreachable.retry_safe());
        assert!(!AttemptError::BadGateway("x").retry_safe());
        assert_eq!(AttemptError::Timeout.status(529), Some(504));
        assert_eq!(AttemptError::ClientGone.label(), "cancelled");
        assert_eq!(
            Refusal::UpstreamUnavailable.to_client(),
            RequestError::Unavailable
        );
    }

    #[test]
    fn one_place_renders_every_answer() {
        let config = crate::config::Config::parse(
            "[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n",
            &crate::config::Overrides::default(),
        )
        .unwrap();
        let snap = crate::state::Snapshot::standalone(config, 1).unwrap();
        let mut out = Vec::new();
        RequestError::Framing(HttpError::BodyTimeout).write(
            &snap.responses,
            &mut out,
            b"r",
            false,
            true,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("HTTP/1.1 408 Request Timeout\r\n"),
            "{text}"
        );
        assert!(
            text.contains("timed out reading the request body"),
            "{text}"
        );
        let mut out = Vec::new();
        RequestError::MethodNotAllowed { allow: "POST" }.write(
            &snap.responses,
            &mut out,
            b"r",
            true,
            true,
        );
        assert!(String::from_utf8(out).unwrap().contains("allow: POST\r\n"));
    }
}
