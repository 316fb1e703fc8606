//! The longhaul transfer engine's ends as a library: what `longhaul serve`
//! and `longhaul send` do, for the `longhaul` binary (transfer-engine/cli)
//! and for campaign science (transfer-engine/science), which drive it
//! through [`client::run`], [`server::Server`] and [`probe::measure`].
//!
//! The engine is four crates (docs/architecture.md has one line per
//! module); each imports only the ones below it:
//!
//! - `longhaul-core`: the wire, control connections and the handshake,
//!   streams and their data workers, the data phase of a session, the
//!   memory plane, the session registry and the stats API's server;
//! - `longhaul-disk`: disk-to-disk mode, a data plane on the core;
//! - `longhaul-iperf3`: iperf3's protocol (a server of many tests at once
//!   and a client) on the core's streams and registry;
//! - this crate: the ends. [`planes`] chooses a mode's plane (memory, disk,
//!   messages); [`client`] (`send`), [`server`] (`serve`) and [`probe`]
//!   (ping/pong over the control connection) run sessions with it.
//!
//! What the binary, science and the tests use of the core, disk mode and
//! iperf3 is re-exported here (`longhaul_engine::messages`,
//! `longhaul_engine::planes::disk`, `longhaul_engine::iperf3`), so they
//! name one crate; the rest of the core stays out of this crate's API.

pub mod client;
pub mod planes;
pub mod probe;
pub mod server;

// What the binary, science and the tests name through this crate.
pub use longhaul_core::{
    attach, auth, connection, cpus, frame, handshake, limits, membench, messages, send_report,
    sockopt, workers,
};
// The rest of the core, by the short names this crate's modules use.
use longhaul_core::{
    datapath, error, logline, memory, registry, sending, session, stats_http, stream,
};
pub use longhaul_core::{Error, Result, PROTOCOL_VERSION, SOFTWARE_VERSION};
pub use longhaul_iperf3 as iperf3;
