//! A request head from arbitrary bytes, under the data listener's default limits and the
//! admin listener's: accepted heads keep their offsets inside the head and frame their
//! body unambiguously; a head is self-delimiting (its own bytes parse the same).
#![no_main]

use libfuzzer_sys::fuzz_target;
use spillway::http::Limits;
use spillway::http::limits::MAX_ADMIN_HEAD;
use spillway::http::request::{RequestHead, parse_request};
use spillway_fuzz::check_request_head;

fn one(data: &[u8], max_header: usize, max_body: u64) {
    let mut head = RequestHead::default();
    match parse_request(data, max_header, max_body, &mut head) {
        Ok(true) => {
            check_request_head(data, &head, max_header, max_body);
            let mut again = RequestHead::default();
            let own = &data[..head.head_len];
            assert_eq!(
                parse_request(own, max_header, max_body, &mut again),
                Ok(true)
            );
            assert_eq!(again.head_len, head.head_len);
            assert_eq!(again.body, head.body);
            assert_eq!(again.keep_alive, head.keep_alive);
            assert_eq!(again.headers.skip, head.headers.skip);
        }
        Ok(false) => assert!(data.len() < max_header),
        Err(e) => assert!(matches!(e.status(), 400 | 413 | 431 | 501 | 505), "{e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    one(data, limits.max_header_bytes, limits.max_body_bytes as u64);
    one(data, MAX_ADMIN_HEAD, u64::MAX);
    one(data, 64, 16);
});
