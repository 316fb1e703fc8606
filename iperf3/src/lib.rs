//! iperf3's protocol: longhaul as an iperf3 server that runs many tests at
//! once (`server`, `longhaul serve --iperf3-listen`) and as an iperf3
//! client (`client`, `longhaul send --protocol iperf3`). docs/iperf3.md
//! describes the protocol as implemented here, what is supported and
//! what is refused.
//!
//! Layers, bottom to top:
//!
//! - `wire`: the cookie, the state bytes, the length-prefixed JSON
//!   blocks, iperf3's error codes, the UDP connect message.
//! - `params`, `results`, `auth`: the parameter block and the
//!   server's limits, the results block, the RSA credentials.
//! - `udp`: the datagram header, loss and jitter, the UDP loops and the
//!   server's UDP port.
//! - `control`: the control connection's reader and writes.
//! - `streams`: one end's data streams: TCP through the engine's
//!   `longhaul_core::stream` and memory plane, UDP through `udp`.
//! - `server` and `client`: the two ends.
//!
//! Nothing here was copied from iperf3; the protocol facts come from its
//! documentation and from watching Debian's iperf3 3.12 on loopback.

mod auth;
mod client;
mod control;
mod params;
mod results;
mod server;
mod streams;
mod udp;
mod wire;

// What the ends (`longhaul-engine`) and the `longhaul` binary use: the
// server and its options, the client and its test, the flags' limits.
pub use auth::{ServerAuth, DEFAULT_SKEW};
pub use client::{run_client, TestOptions};
pub use params::{ServerLimits, Transport, MAX_TIME};
pub use server::{
    default_pending_per_source, default_tests_per_source, Iperf3Options, Iperf3Server,
    DEFAULT_MAX_TESTS,
};

// The core's modules by their short names, as the engine's own modules
// name them (`crate::stream`).
use longhaul_core::{
    connection, cpu, datapath, error, limits, logline, memory, memory_plane, messages, pacer,
    registry, send_report, sending, session, sockopt, stream, ticks,
};
