//! Spillway's test kit, shared by `tests/` and `bench/`: fake workers on port 0 and what
//! they had open at once, misbehaving workers scripted byte by byte, a raw HTTP/1.1
//! client, the proxy started in-process from a TOML snippet, admin calls, a counting
//! allocator, seeded randomness, llama.cpp's own server with a tiny model, and the rule
//! for tests that need an outside tool.
//!
//! A test writes `use spillway_testkit::*;` for the common items re-exported here.

#![deny(unsafe_code)]
// A test kit reports a broken expectation the way a test does: by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Tests time what they observe; only the proxy's own code must go through its clock.
#![allow(clippy::disallowed_methods)]

pub mod admin;
pub mod alloc;
pub mod client;
pub mod dns;
pub mod etcd;
pub mod llamacpp;
pub mod nats;
pub mod overlap;
pub mod proxy;
pub mod rng;
pub mod script;
pub mod tls;
pub mod tools;
pub mod upstream;
pub mod wait;

pub use admin::{
    admin_call, admin_get, admin_post, counters_back_to_zero, metric_value, metrics,
    promtool_problems, scrape, scrape_family,
};
pub use client::{Client, Response, chat, get, once, post, post_with, spawn_request, tagged};
pub use overlap::{Handled, most_open_at_once};
pub use proxy::{
    ConfigFile, ServerHandle, model, proxy, proxy_file, proxy_with, test_head, worker_name,
};
pub use rng::{Rng, seed};
pub use script::{Script, scripted};
pub use upstream::{
    Held, Reply, SSE_HEAD, Seen, Step, Upstream, chunk, echo_upstream, json_response, upstream,
    upstream_at, upstream_on,
};
pub use wait::eventually;
