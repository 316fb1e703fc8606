//! Integration tests: the real `longhaul-exporter` binary on 127.0.0.1:0,
//! fed the fixture disk server (tests/fixtures/sysfs-server at the workspace root, shared
//! with the topology crate) and fake engines; one module per topic.

mod bad_input;
mod common;
mod fixtures;
mod http;
mod prometheus;
mod tcp_labels;
mod web_config;
