//! The errors of the two boundaries a proxied request crosses, each knowing its HTTP
//! status, its label (Dynamo's `error_type`) and whether a retry is safe:
//! - [`RequestError`]: why Spillway answers the client itself. [`RequestError::write`] is
//!   the one place such an answer is rendered. Refusals also say which knob refused, the
//!   measured value, its threshold and the setting that tunes it.
//! - [`AttemptError`]: why one attempt on one worker ended without a response; the
//!   forwarder tries another worker exactly when it is retry-safe.

use std::borrow::Cow;

use crate::admission::{AT_CAPACITY, DEADLINE, QUEUE_TIMEOUT};
use crate::admission::{ROOM_EVICTED, ROOM_FULL, ROOM_TENANT_FULL, ROOM_TIMEOUT};
use crate::config::PoolRole;
use crate::http::HttpError;
use crate::http::canned::{ErrorAnswer, Field, messages, write_error};
use crate::route::peek::PeekError;
use crate::shed::{Class, Knob, Why};
use crate::state::Snapshot;
use crate::state::counters::{MigrationReason, Outcome, RetryReason};

/// A refusal: worker-local (docs/behaviour.md §1.12, §9.1), after which the request may
/// move to another worker, or the model's waiting room's (§8.12), which ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The model's waiting room full. `retry_after`: the room's predicted wait for a
    /// newcomer, in whole seconds (at least 1), when its pace is known.
    RoomFull { retry_after: Option<u32> },
    /// Waited in the model's waiting room past `waiting_room_timeout_ms` (or predicted
    /// to); `retry_after` as for [`Refusal::RoomFull`].
    RoomTimeout { retry_after: Option<u32> },
    /// Evicted from the model's full waiting room by a more important request;
    /// `retry_after` as for [`Refusal::RoomFull`].
    RoomEvicted { retry_after: Option<u32> },
    /// The request's tenant holds its share of the model's waiting room already;
    /// `retry_after` as for [`Refusal::RoomFull`].
    TenantFull { retry_after: Option<u32> },
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
            Refusal::AtCapacity
            | Refusal::RoomFull { .. }
            | Refusal::RoomEvicted { .. }
            | Refusal::TenantFull { .. } => MigrationReason::WorkerAtCapacity,
            Refusal::QueueTimeout | Refusal::RoomTimeout { .. } => MigrationReason::QueueTimeout,
            Refusal::UpstreamOverloaded => MigrationReason::UpstreamOverloaded,
            Refusal::UpstreamUnavailable => MigrationReason::UpstreamUnavailable,
        }
    }

    pub fn knob(self) -> Knob {
        match self {
            Refusal::AtCapacity | Refusal::RoomFull { .. } => Knob::QueueFull,
            Refusal::RoomEvicted { .. } => Knob::Evicted,
            Refusal::TenantFull { .. } => Knob::TenantShare,
            Refusal::QueueTimeout | Refusal::RoomTimeout { .. } => Knob::QueueTimeout,
            Refusal::UpstreamOverloaded => Knob::UpstreamOverloaded,
            Refusal::UpstreamUnavailable => Knob::Unreachable,
        }
    }

    /// What the client gets when no other worker takes the request.
    pub fn to_client(self, why: Option<Why>) -> RequestError {
        match self {
            Refusal::UpstreamUnavailable => RequestError::Unavailable,
            r => RequestError::Refused(r, why),
        }
    }
}

/// Why the client is answered by Spillway instead of a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
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
    /// Every eligible worker is busy (pool-wide; never migrated); why the least busy one is.
    Overloaded(Option<Why>),
    /// Worker-local refusals left no worker to migrate to, or the limit is spent.
    Refused(Refusal, Option<Why>),
    /// Direct routing: the pinned worker is busy.
    DirectBusy(Option<Why>),
    /// No worker can serve at all.
    Unavailable,
    DirectMissingHeader,
    DirectUnknownWorker,
    BadGateway(&'static str),
    GatewayTimeout,
    /// The worker answered this 5xx and the request was retried, but no other worker
    /// could take it (docs/behaviour.md §22.5).
    WorkerFailed(u16),
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
            Overloaded(_) | Refused(..) | DirectBusy(_) => overload,
            Unavailable => 503,
            BadGateway(_) => 502,
            GatewayTimeout => 504,
            WorkerFailed(status) => *status,
        }
    }

    /// How the request is counted (`dynamo_frontend_requests_total{error_type}`).
    pub fn outcome(&self) -> Outcome {
        use RequestError::*;
        match self {
            Overloaded(_) | Refused(..) | DirectBusy(_) => Outcome::Overload,
            Unavailable => Outcome::Unavailable,
            Framing(_) | BadBody(_) | MissingModel | DirectMissingHeader => Outcome::Validation,
            MethodNotAllowed { .. } => Outcome::Validation,
            NotFound | UnknownModel | DirectUnknownWorker => Outcome::NotFound,
            BadGateway(_) | WorkerFailed(_) => Outcome::Internal,
            GatewayTimeout => Outcome::ResponseTimeout,
        }
    }

    /// The label of [`RequestError::outcome`].
    pub fn label(&self) -> &'static str {
        self.outcome().error_type()
    }

    /// True when no engine worked on the request and the answer is transient (an
    /// overload, a refusal, nothing reachable): the client (or a proxy in front) may send
    /// it again, here or elsewhere. These answers carry `Retry-After` and name the knob.
    pub fn client_may_retry(&self) -> bool {
        self.knob().is_some()
    }

    /// The knob that refused the request, for refusals.
    pub fn knob(&self) -> Option<Knob> {
        use RequestError::*;
        match self {
            Overloaded(why) | DirectBusy(why) => Some(why.map_or(Knob::QueueFull, |w| w.knob)),
            Refused(r, why) => Some(why.map_or(r.knob(), |w| w.knob)),
            Unavailable => Some(Knob::Unreachable),
            _ => None,
        }
    }

    /// The measured value and threshold behind a refusal, when known.
    pub fn why(&self) -> Option<Why> {
        match self {
            RequestError::Overloaded(why)
            | RequestError::DirectBusy(why)
            | RequestError::Refused(_, why) => *why,
            _ => None,
        }
    }

    /// Counted in `dynamo_frontend_model_rejection_total`.
    pub fn answers_overloaded(&self) -> bool {
        self.outcome() == Outcome::Overload
    }

    /// The connection's framing is in doubt: close after answering.
    pub fn closes_connection(&self) -> bool {
        matches!(self, RequestError::Framing(_))
    }

    /// Appends the whole response to `out`. HEAD requests get no body. A refusal's body
    /// names the request's `class`.
    pub fn write(
        &self,
        snap: &Snapshot,
        (class, pool): (Class, Option<PoolRole>),
        out: &mut Vec<u8>,
        request_id: &[u8],
        keep_alive: bool,
        with_body: bool,
    ) {
        use RequestError::*;
        let canned = match self {
            NotFound => &snap.responses.not_found,
            UnknownModel => &snap.responses.model_not_found,
            _ if self.client_may_retry() => {
                let who = (class, pool);
                return self.write_refusal(snap, who, out, request_id, keep_alive, with_body);
            }
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

    /// A refusal: Dynamo's body plus `knob`, `value`, `threshold`, `setting` and `class`,
    /// with `Retry-After`. Every body has all five, whatever its knob: figures Spillway
    /// does not have are `null` (docs/behaviour.md §7.5). A disaggregated model's refusal
    /// also names its `pool` (§23).
    fn write_refusal(
        &self,
        snap: &Snapshot,
        (class, pool): (Class, Option<PoolRole>),
        out: &mut Vec<u8>,
        request_id: &[u8],
        keep_alive: bool,
        with_body: bool,
    ) {
        let config = &snap.config;
        let status = self.status(config.overload_status_code);
        let kind = match self {
            RequestError::Unavailable => "Service Unavailable",
            _ => "Overloaded",
        };
        let knob = self.knob().unwrap_or(Knob::QueueFull);
        let (setting, retry_after) = match *self {
            RequestError::Refused(Refusal::RoomFull { retry_after }, _) => {
                ("waiting_room_size", retry_after)
            }
            RequestError::Refused(Refusal::RoomTimeout { retry_after }, _) => {
                ("waiting_room_timeout_ms", retry_after)
            }
            RequestError::Refused(Refusal::RoomEvicted { retry_after }, _) => {
                ("waiting_room_size", retry_after)
            }
            RequestError::Refused(Refusal::TenantFull { retry_after }, _) => {
                ("tenant_room_share", retry_after)
            }
            _ => (knob.setting(), None),
        };
        let why = self.why();
        let fields = [
            ("knob", Field::Str(knob.label())),
            ("value", why.map_or(Field::Null, |w| Field::Num(w.value))),
            (
                "threshold",
                why.map_or(Field::Null, |w| Field::Num(w.threshold)),
            ),
            ("setting", Field::Str(setting)),
            ("class", Field::Str(class.label())),
            ("pool", Field::Str(pool.map_or("", |p| p.worker_type(true)))),
        ];
        let fields = &fields[..fields.len() - usize::from(pool.is_none())];
        let mut retry = itoa::Buffer::new();
        let retry_after = retry_after.unwrap_or(config.retry_after_secs);
        let headers = [("retry-after", retry.format(retry_after))];
        let message = self.message();
        let answer = ErrorAnswer {
            status,
            message: &message,
            kind,
            fields,
            headers: &headers,
        };
        answer.write(out, request_id, keep_alive, with_body);
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
            WorkerFailed(status) => format!(
                "The worker failed the request (status {status}) and no other worker could take it"
            )
            .into(),
            NotFound => messages::NOT_FOUND.into(),
            UnknownModel => messages::MODEL_NOT_FOUND.into(),
            Overloaded(_) => messages::OVERLOADED.into(),
            DirectBusy(_) => messages::DIRECT_BUSY.into(),
            Refused(_, Some(w)) if w.knob == Knob::Deadline => DEADLINE.into(),
            Refused(Refusal::QueueTimeout, _) => QUEUE_TIMEOUT.into(),
            Refused(Refusal::RoomFull { .. }, _) => ROOM_FULL.into(),
            Refused(Refusal::RoomTimeout { .. }, _) => ROOM_TIMEOUT.into(),
            Refused(Refusal::RoomEvicted { .. }, _) => ROOM_EVICTED.into(),
            Refused(Refusal::TenantFull { .. }, _) => ROOM_TENANT_FULL.into(),
            Refused(..) => AT_CAPACITY.into(),
            Unavailable => messages::UNAVAILABLE.into(),
        }
    }
}

/// Why one attempt on one worker ended without a response for the client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttemptError {
    /// The worker refused before doing any work: migrate (counted, limited).
    Refused(Refusal, Option<Why>),
    /// Connecting failed: the worker is marked down; fail over (not a migration).
    Unreachable,
    /// The client left while the request waited or ran.
    ClientGone,
    /// The client took nothing of a write for `client_send_timeout_ms`.
    ClientSendTimeout,
    /// No response head within `upstream_first_byte_timeout_ms` of the request's end.
    Timeout,
    /// The worker closed or reset the connection before any byte of a response: on a
    /// reused connection, the request is sent again on a fresh one.
    Hangup,
    /// The request may have reached the engine but no usable response came back.
    BadGateway(&'static str),
    /// The worker answered this 5xx (not a refusal) and a retry may follow: the
    /// response was dropped unread.
    WorkerFailed(u16),
    /// The worker was found hung while the request waited for its head.
    Stalled,
    /// The response broke after bytes reached the client: nothing left but to close.
    Broken(Outcome),
}

impl AttemptError {
    /// Another worker may take the request: nothing reached an engine that works on it.
    pub fn another_worker_may_try(&self) -> bool {
        matches!(self, AttemptError::Refused(..) | AttemptError::Unreachable)
    }

    /// Why another worker may try the request again although this one may have worked
    /// on it: nothing reached the client, and the worker failed (docs/behaviour.md §22.5).
    pub fn retry_reason(&self) -> Option<RetryReason> {
        match self {
            AttemptError::WorkerFailed(_) => Some(RetryReason::Status5xx),
            AttemptError::Hangup => Some(RetryReason::Reset),
            AttemptError::Timeout => Some(RetryReason::HeadTimeout),
            AttemptError::Stalled => Some(RetryReason::Stalled),
            AttemptError::BadGateway(_) => Some(RetryReason::Malformed),
            _ => None,
        }
    }

    /// What the attempt says of its worker's health: `Some(connect)` a failure (a failed
    /// connect or another), `None` nothing (a refusal, the client's doing).
    pub fn failure(&self) -> Option<bool> {
        match self {
            AttemptError::Unreachable => Some(true),
            AttemptError::Refused(..)
            | AttemptError::ClientGone
            | AttemptError::ClientSendTimeout => None,
            AttemptError::Broken(o) => (*o != Outcome::Cancelled).then_some(false),
            _ => Some(false),
        }
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
            AttemptError::ClientSendTimeout => Outcome::ClientSendTimeout,
            AttemptError::Broken(o) => *o,
            e => e.to_client().map_or(Outcome::Internal, |c| c.outcome()),
        }
    }

    /// The answer the client gets when this is the last word, or `None` when the client
    /// is gone or already has part of a response.
    pub fn to_client(self) -> Option<RequestError> {
        match self {
            AttemptError::Refused(r, why) => Some(r.to_client(why)),
            AttemptError::Unreachable => Some(RequestError::Unavailable),
            AttemptError::Timeout => Some(RequestError::GatewayTimeout),
            AttemptError::BadGateway(why) => Some(RequestError::BadGateway(why)),
            AttemptError::Hangup => Some(RequestError::BadGateway(
                "the worker closed the connection before responding",
            )),
            AttemptError::WorkerFailed(status) => Some(RequestError::WorkerFailed(status)),
            AttemptError::Stalled => Some(RequestError::GatewayTimeout),
            AttemptError::ClientGone
            | AttemptError::ClientSendTimeout
            | AttemptError::Broken(_) => None,
        }
    }
}

#[cfg(test)]
mod tests;
