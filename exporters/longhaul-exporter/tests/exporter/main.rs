//! Integration tests: the real `longhaul-exporter` binary on 127.0.0.1:0,
//! fed the fixture disk server (crates/topology/tests/fixtures/server, shared
//! with the topology crate) and fake engines; one module per topic.

mod bad_input;
mod common;
mod fixtures;
mod http;
mod prometheus;
