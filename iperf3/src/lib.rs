//! iperf3's protocol: longhaul as an iperf3 server that runs many tests at
//! once ([`server`], `longhaul serve --iperf3-listen`) and as an iperf3
//! client ([`client`], `longhaul send --protocol iperf3`). docs/iperf3.md
//! describes the protocol as implemented here, what is supported and
//! what is refused.
//!
//! Layers, bottom to top:
//!
//! - [`wire`]: the cookie, the state bytes, the length-prefixed JSON
//!   blocks, iperf3's error codes, the UDP connect message.
//! - [`params`], [`results`], [`auth`]: the parameter block and the
//!   server's limits, the results block, the RSA credentials.
//! - [`udp`]: the datagram header, loss and jitter, the UDP loops and the
//!   server's UDP port.
//! - [`control`]: the control connection's reader and writes.
//! - [`streams`]: one end's data streams: TCP through the engine's
//!   [`longhaul_core::stream`] and memory plane, UDP through [`udp`].
//! - [`server`] and [`client`]: the two ends.
//!
//! Nothing here was copied from iperf3; the protocol facts come from its
//! documentation and from watching Debian's iperf3 3.12 on loopback.

pub mod auth;
pub mod client;
pub mod control;
pub mod params;
pub mod results;
pub mod server;
pub mod streams;
pub mod udp;
pub mod wire;

// The core's modules by their short names, as the engine's own modules
// name them (`crate::stream`).
use longhaul_core::{
    connection, cpu, datapath, error, limits, logline, memory, memory_plane, messages, pacer,
    registry, send_report, sending, session, sockopt, stream, ticks,
};
