//! Integration tests of the `longhaul` binary on loopback, port 0.
//!
//! One test binary, one module per topic. Every test starts its own server
//! (so tests run in parallel without sharing state) and kills it on drop.

// A test reads as one scenario, top to bottom: the workspace's bound on a
// function's length (clippy.toml) is for the code under test.
#![allow(clippy::too_many_lines)]

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod cli;
mod display;
mod hardening;
mod robustness;
mod stats_api;
mod transfer;
