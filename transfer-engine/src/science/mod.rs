//! Campaign science: the measurements that reproduce the reference WAN
//! results, and the report that shows them.
//!
//! - [`msgplane`]: messages mode, the data plane of the message-length
//!   sweeps (request/response latency, streaming throughput, CPU per message).
//! - [`sweep`] (`longhaul sweep`): window x streams matrices and
//!   message-length sweeps, with optional background load ([`load`]).
//! - [`advise`] (`longhaul advise`): RTT over the control connection, both
//!   ends' socket buffer limits ([`limits`]), buffer x streams from the
//!   bandwidth-delay product.
//! - [`report`] (`longhaul report`): an HTML page with SVG figures
//!   ([`figures`]) from result files ([`results`]) and optionally
//!   Prometheus ([`prometheus`]).
//! - [`args`]: the command lines of the three subcommands.

pub mod advise;
pub mod args;
pub mod figures;
pub mod limits;
pub mod load;
pub mod msgplane;
pub mod prometheus;
pub mod report;
pub mod results;
pub mod sweep;

use std::io::Write;

use crate::error::{Error, Result};

pub use args::Command;

/// Runs a science subcommand, printing to `out`.
pub fn run(cmd: &Command, out: &mut dyn Write) -> Result<()> {
    let w = |out: &mut dyn Write, text: String| {
        writeln!(out, "{text}").map_err(|e| Error::io("writing the output", e))
    };
    match cmd {
        Command::Sweep(o) => sweep::main(o, out),
        Command::Advise(o) => {
            let a = advise::run(o)?;
            let text = if o.json {
                serde_json::to_string(&a).unwrap_or_default()
            } else {
                a.human()
            };
            w(out, text)
        }
        Command::Report(o) => {
            let path = report::run(o)?;
            w(out, format!("report written to {}", path.display()))
        }
    }
}
