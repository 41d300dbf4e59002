//! The admin `/busy_threshold` bodies on arbitrary bytes: `POST` (set or get: model and
//! thresholds, validated) and `DELETE` (model), and the `application/json` check on an
//! arbitrary `Content-Type`. A body is accepted with valid thresholds or refused with 400
//! (not JSON, invalid values) or 422 (wrong shape); the content type is accepted or 415.
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::admin::Request;
use spillway::fuzzing::{parse_delete, parse_post};
use spillway::http::Method;

fn request<'a>(method: Method, content_type: &'a [u8], body: &'a [u8]) -> Request<'a> {
    Request {
        method,
        path: b"/busy_threshold",
        content_type: Some(content_type),
        authorization: None,
        body,
    }
}

fuzz_target!(|data: &[u8]| {
    let json = b"application/json; charset=utf-8";
    match parse_post(&request(Method::Post, json, data)) {
        Ok(update) => {
            assert!(update.thresholds.validate().is_ok());
            let merged = update.thresholds.merged(&update.thresholds);
            assert_eq!(merged, update.thresholds);
        }
        Err(e) => assert!(matches!(e.status(), 400 | 422), "{e}: {}", e.status()),
    }
    match parse_delete(&request(Method::Delete, json, data)) {
        Ok(_) => {}
        Err(e) => assert!(matches!(e.status(), 400 | 422), "{e}: {}", e.status()),
    }
    if let Err(e) = request(Method::Post, data, b"{}").require_json() {
        assert_eq!(e.status(), 415);
    }
});
