//! Spillway: a load-shedding HTTP/1.1 edge proxy for LLM inference fleets.
//!
//! Modules in the order a request meets them: [`config`] → [`core`] (thread-per-core
//! runtime, accept, connection) → [`http`] (sans-io codec) → [`route`] (model lookup,
//! router modes) → [`shed`] (busy rule) → [`upstream`] (pools, forwarding, streaming) →
//! [`monitor`] (load state, busy publication) → [`admin`] → [`metrics`]. Beside the proxy,
//! [`mock`] is a simulated inference engine to put behind it (`spillway mock-engine`).

#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod cli;
pub mod config;
pub mod core;
pub mod demo;
pub mod http;
pub mod metrics;
pub mod mock;
pub mod monitor;
pub mod route;
pub mod shed;
pub mod upstream;

pub use crate::config::{Config, Overrides};
pub use crate::core::{ServerHandle, start};
