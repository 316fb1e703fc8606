//! longhaul transfer engine: the library half of the `longhaul` binary.
//!
//! The modules follow the protocol layers, bottom to top:
//!
//! - [`frame`]: length-prefixed, magic-tagged frames on the control connection.
//! - [`connection`]: a control TCP connection that reads and writes frames.
//! - [`messages`]: every typed control message, enumerated in one place.
//! - [`auth`] and [`attach`]: the challenge-response handshake and the header a
//!   data connection sends to join a session.
//! - [`session`]: what both ends agree on (stream layout, byte budgets, the
//!   end-of-session report) and the check that the two ends agree on totals.
//! - [`datapath`]: per-stream data sources and sinks (memory mode: a pattern
//!   buffer and a discarding sink); [`stream`] runs one worker per stream.
//! - [`handshake`]: the protocol's side of admission (`longhaul-admission`):
//!   first messages, the server's half of the token handshake, attach.
//! - [`server`] (`longhaul serve`) and [`client`] (`longhaul send`).
//!
//! Around them: [`sockopt`] (buffers, congestion control, pacing, TCP_INFO),
//! [`pacer`] (in-process rate limit), [`cpu`] (/proc/stat and rusage),
//! [`registry`] + [`stats_http`] (the stats API), [`report`] (human and JSON
//! output), [`cli`] and [`units`] (argument parsing), [`membench`],
//! [`logline`] (timestamped server log lines), [`memory`] (handing freed
//! memory back after a session), and
//! [`modes`] (which data plane serves which mode: the hook for disk mode).
//!
//! [`science`]: `longhaul sweep`, `advise` and `report`, and messages mode
//! (the message-length sweeps' data plane).

pub mod attach;
pub mod auth;
pub mod cli;
pub mod client;
pub mod connection;
pub mod cpu;
pub mod datapath;
pub mod disk;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod logline;
pub mod membench;
pub mod memory;
pub mod messages;
pub mod modes;
pub mod pacer;
pub mod registry;
pub mod report;
pub mod science;
pub mod server;
pub mod session;
pub mod sockopt;
pub mod stats_http;
pub mod stream;
pub mod units;

pub use error::{Error, Result};

/// Version of the control protocol. Bumped on any incompatible change to
/// frames, messages or the attach header; both ends refuse a mismatch.
///
/// 2: the client sends `StreamsReport` during the data phase, which a
/// version-1 server would reject as an unknown message in mid-run; the bump
/// turns that into a clear version mismatch at the handshake.
pub const PROTOCOL_VERSION: u32 = 2;

/// Software version reported in the handshake and the stats API.
pub const SOFTWARE_VERSION: &str = env!("CARGO_PKG_VERSION");
