//! longhaul-exporter: Prometheus metrics for longhaul transfers, for any
//! program's TCP flows on the transfer ports, and for disk IO per RAID
//! controller.
//!
//! Layers, bottom to top: [`config`] holds every setting and [`metrics`]
//! the scrape's model and its encoding; [`json`] reads JSON as it streams
//! in, within bounds, and [`stats`] the engine's stats API with it;
//! [`collector`] says what a collector is and what one collection reads
//! once for all of them; the collectors ([`collectors`], one file each)
//! read the configuration and are built on [`sock_diag`] (with [`flows`]
//! for stable TCP series), [`diskstats`], [`ports`], [`stats`] and
//! [`storcli`]; [`scrape`] holds their
//! registry and runs a scrape; [`http`] serves it; [`cli`] turns flags into
//! a [`config::Config`]. No collector imports the CLI or the registry.

pub mod cli;
pub mod collector;
pub mod collectors;
pub mod config;
pub mod diskstats;
pub mod flows;
pub mod http;
pub mod httpclient;
pub mod json;
pub mod metrics;
pub mod ports;
pub mod scrape;
pub mod sock_diag;
pub mod stats;
pub mod storcli;

/// Logs one line to stderr (the journal, under systemd), after an RFC 3339
/// UTC timestamp as the engine's log has it: the exporter also runs in
/// containers and under plain shells, where nothing else stamps the line.
pub fn log(msg: &str) {
    longhaul_units::log("longhaul-exporter", msg);
}
