//! Spillway: a load-shedding HTTP/1.1 edge proxy for LLM inference fleets.
//!
//! Modules in the order a request meets them: [`config`] → [`core`] (thread-per-core
//! runtime, accept, connection) → [`http`] (sans-io codec) → [`route`] (model lookup,
//! router modes) → [`shed`] (busy rule) → [`admission`] (engine slots and queue) →
//! [`upstream`] (pools, forwarding, streaming) → [`monitor`] (load state, busy
//! publication) → [`admin`] → [`metrics`]. Around them: [`cli`], [`demo`] and [`mock`]
//! (a simulated inference engine). ARCHITECTURE.md has the map and the invariants.

#![forbid(unsafe_code)]

pub mod admin;
pub mod admission;
pub mod config;
pub mod core;
pub mod http;
pub mod metrics;
pub mod monitor;
pub mod route;
pub mod shed;
pub mod upstream;

pub mod cli;
pub mod demo;
pub mod mock;

pub use crate::config::{Config, Overrides};
pub use crate::core::{ServerHandle, start};
