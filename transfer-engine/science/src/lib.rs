//! Campaign science: the measurements that reproduce the reference WAN
//! results, and the report that shows them. Built on the engine's library
//! API (`longhaul-engine`): a sweep cell is a [`SendOptions`] value run with
//! [`client::run`], advice starts from [`probe::measure`].
//!
//! - [`sweep`] (`longhaul sweep`): window x streams matrices and
//!   message-length sweeps (messages mode), with optional background load
//!   ([`load`]); results as CSV ([`csv`]) and JSON.
//! - [`advise`] (`longhaul advise`): buffer x streams from the
//!   bandwidth-delay product and both ends' socket buffer limits.
//! - [`report`] (`longhaul report`): an HTML page of figures ([`charts`])
//!   from result files ([`results`]) and optionally Prometheus
//!   ([`prometheus`]).
//!
//! Its errors are its own ([`Error`]): a failed transfer keeps the
//! engine's, what only science meets (Prometheus, its files) is named here.
//!
//! [`SendOptions`]: longhaul_engine::client::SendOptions
//! [`client::run`]: longhaul_engine::client::run
//! [`probe::measure`]: longhaul_engine::probe::measure

pub mod advise;
pub mod charts;
pub mod csv;
pub mod error;
pub mod load;
pub mod prometheus;
pub mod report;
pub mod results;
pub mod sweep;

pub use error::{Error, Result};
