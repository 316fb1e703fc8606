//! longhaul-exporter: Prometheus metrics for longhaul transfers, for any
//! program's TCP flows on the transfer ports, and for disk IO per RAID
//! controller.
//!
//! Layers: [`cli`] turns flags into a [`cli::Config`]; [`collector`] holds
//! the registry and runs a scrape; [`collectors`] are the collectors (one
//! file each) built on [`sock_diag`] (with [`flows`] for stable TCP series),
//! [`diskstats`], [`httpclient`] and [`storcli`]; [`metrics`] encodes a
//! scrape; [`http`] serves it.

pub mod cli;
pub mod collector;
pub mod collectors;
pub mod diskstats;
pub mod flows;
pub mod http;
pub mod httpclient;
pub mod metrics;
pub mod ports;
pub mod sock_diag;
pub mod storcli;

/// Logs one line to stderr (the journal, under systemd).
pub fn log(msg: &str) {
    eprintln!("longhaul-exporter: {msg}");
}
