//! What every longhaul end and mode shares, as a library: the ends
//! (`longhaul-engine`), disk mode (`longhaul-disk`) and iperf3's protocol
//! build on it, and it knows none of them.
//!
//! Layers, bottom to top; each imports only from layers below it
//! (docs/architecture.md has one line per module):
//!
//! 1. Ground: [`error`], [`limits`] (every named timeout and limit),
//!    [`pacer`], [`cpu`], [`sockopt`], [`logline`], [`memory`], [`ticks`],
//!    [`membench`], [`cpus`] (CPU lists, NUMA nodes, worker placement),
//!    [`workers`] (the data workers: a few threads multiplexing every
//!    stream of the process with epoll).
//! 2. Wire: [`frame`] (length-prefixed frames), [`messages`] (every
//!    control message), [`auth`] and [`attach`] (tokens, proofs, the data
//!    connection's header), [`connection`] (a control connection),
//!    [`handshake`] (both halves of the handshake, and what a first message
//!    is for admission).
//! 3. Streams and sessions: [`datapath`] (the data plane interface:
//!    sources, sinks and what a mode adds), [`stream`] (how one stream
//!    runs), [`session`] (stream layout, the data phase, the checks both
//!    ends share), [`memory_plane`] (memory to memory), [`sending`] and
//!    [`send_report`] (what every sending client shares, its final report),
//!    [`registry`] (the sessions a server runs) and [`stats_http`] (the
//!    stats API's server).

pub mod attach;
pub mod auth;
pub mod connection;
pub mod cpu;
pub mod cpus;
pub mod datapath;
pub mod error;
pub mod frame;
pub mod handshake;
pub mod limits;
pub mod logline;
pub mod membench;
pub mod memory;
pub mod memory_plane;
pub mod messages;
pub mod pacer;
pub mod registry;
pub mod send_report;
pub mod sending;
pub mod session;
pub mod sockopt;
pub mod stats_http;
pub mod stream;
pub mod ticks;
pub mod workers;

pub use error::{Error, Result};

/// Version of the control protocol. Bumped on any incompatible change to
/// frames, messages or the attach header; both ends refuse a mismatch.
///
/// 2: the client sends `StreamsReport` during the data phase, which a
/// version-1 server would reject as an unknown message in mid-run; the bump
/// turns that into a clear version mismatch at the handshake.
///
/// 3: an end that checks files before its disk-mode answer sends
/// `ModeData {disk: working}` meanwhile, which a version-2 peer would
/// reject as a malformed disk message.
pub const PROTOCOL_VERSION: u32 = 3;

/// Software version reported in the handshake and the stats API.
pub const SOFTWARE_VERSION: &str = env!("CARGO_PKG_VERSION");
