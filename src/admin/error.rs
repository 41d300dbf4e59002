//! The admin boundary's answers: [`Reply`] (status, content type, body) and
//! [`AdminError`], each error knowing its status, label and retry safety; every error
//! becomes a reply in one place, with the admin API's `{"error": message}` shape
//! (docs/behaviour.md §14.9).

use serde::Serialize;

use crate::http::HttpError;
use crate::monitor::ReloadError;

/// An admin response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// Adds `WWW-Authenticate: Bearer` (401).
    pub www_authenticate: bool,
}

impl Reply {
    pub fn json(status: u16, value: &impl Serialize) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(value).unwrap_or_default(),
            www_authenticate: false,
        }
    }

    pub fn text(content_type: &'static str, body: Vec<u8>) -> Reply {
        Reply {
            status: 200,
            content_type,
            body,
            www_authenticate: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The head cannot be parsed (its own status: 400, 431, 505...).
    #[error("{0}")]
    Http(HttpError),
    #[error("Content-Length required")]
    LengthRequired,
    #[error("Request body exceeds the limit of {0} bytes")]
    TooLarge(usize),
    #[error("Expected request with Content-Type application/json")]
    NotJson,
    /// Body not parsable as JSON.
    #[error("{0}")]
    BadJson(String),
    /// Well-formed JSON of the wrong shape or types (422, as axum answers).
    #[error("{0}")]
    WrongShape(String),
    /// A value that fails validation.
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("Missing or invalid bearer token")]
    Unauthorized,
    #[error("Method not allowed")]
    MethodNotAllowed,
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// Over `admin_max_connections`.
    #[error("Too many admin connections")]
    TooManyConnections,
}

impl AdminError {
    pub fn status(&self) -> u16 {
        match self {
            AdminError::Http(e) => e.status(),
            AdminError::LengthRequired => 411,
            AdminError::TooLarge(_) => 413,
            AdminError::NotJson => 415,
            AdminError::BadJson(_) | AdminError::Invalid(_) | AdminError::Reload(_) => 400,
            AdminError::WrongShape(_) => 422,
            AdminError::NotFound(_) => 404,
            AdminError::Unauthorized => 401,
            AdminError::MethodNotAllowed => 405,
            AdminError::TooManyConnections => 503,
        }
    }

    /// A short name for logs.
    pub fn label(&self) -> &'static str {
        match self {
            AdminError::Http(_) => "malformed_request",
            AdminError::LengthRequired => "length_required",
            AdminError::TooLarge(_) => "too_large",
            AdminError::NotJson => "not_json",
            AdminError::BadJson(_) => "bad_json",
            AdminError::WrongShape(_) => "wrong_shape",
            AdminError::Invalid(_) => "invalid",
            AdminError::NotFound(_) => "not_found",
            AdminError::Unauthorized => "unauthorized",
            AdminError::MethodNotAllowed => "method_not_allowed",
            AdminError::Reload(_) => "reload_failed",
            AdminError::TooManyConnections => "too_many_connections",
        }
    }

    /// An interrupted reload may succeed when sent again unchanged; a refused connection
    /// did no work.
    pub fn retry_safe(&self) -> bool {
        matches!(
            self,
            AdminError::Reload(ReloadError::Cancelled | ReloadError::Busy)
                | AdminError::TooManyConnections
        )
    }

    /// The framing of the connection is in doubt: answer and close.
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            AdminError::Http(_)
                | AdminError::LengthRequired
                | AdminError::TooLarge(_)
                | AdminError::TooManyConnections
        )
    }
}

impl From<AdminError> for Reply {
    fn from(e: AdminError) -> Reply {
        let mut reply = Reply::json(e.status(), &serde_json::json!({ "error": e.to_string() }));
        reply.www_authenticate = matches!(e, AdminError::Unauthorized);
        reply
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_become_json_replies() {
        let r = Reply::from(AdminError::NotJson);
        assert_eq!(r.status, 415);
        assert_eq!(
            r.body,
            br#"{"error":"Expected request with Content-Type application/json"}"#
        );
        let r = Reply::from(AdminError::Unauthorized);
        assert!(r.status == 401 && r.www_authenticate);
        assert_eq!(AdminError::WrongShape("x".into()).status(), 422);
        assert_eq!(AdminError::Http(HttpError::HeaderTooLarge).status(), 431);
        assert!(AdminError::Reload(ReloadError::Cancelled).retry_safe());
        assert!(!AdminError::Reload(ReloadError::NoFile).retry_safe());
    }
}
